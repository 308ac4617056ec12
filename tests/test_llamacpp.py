"""llama.cpp as a baseline (treespec.bench.llamacpp): its timings and generated text read from its output, the
seconds it is charged, and a clear error where its tools are missing. The tools are stood in for by small
scripts that print what llama.cpp prints (its format strings), so CI needs no llama.cpp."""

import stat
import sys
from pathlib import Path

import pytest

from treespec.bench import llamacpp

# llama.cpp's perf lines, as common_perf_print and speculative-simple print them (with the log's time prefix)
COMPLETION_LOG = (
    """0.03.238.656 I common_perf_print:    sampling time =      15.37 ms
0.03.238.695 I common_perf_print:        load time =     923.65 ms
0.03.238.709 I common_perf_print: prompt eval time =      78.60 ms /     4 tokens (   19.65 ms per token,    50.89 tokens per second)
0.03.238.724 I common_perf_print:        eval time =    1862.22 ms /    63 runs   (   29.56 ms per token,    33.83 tokens per second)
0.03.238.737 I common_perf_print:       total time =    1962.58 ms /    67 tokens
""")  # noqa: E501 (llama.cpp's lines as printed)
SPECULATIVE_LOG = """0.05.144.932 I encoded    4 tokens in    0.094 seconds, speed:   42.380 t/s
0.05.144.951 I decoded   69 tokens in    3.287 seconds, speed:   20.989 t/s
0.05.144.977 I n_draft   = 4
0.05.144.990 I n_predict = 69
0.05.145.003 I n_drafted = 55
0.05.145.016 I n_accept  = 50
"""


class CharTokenizer:
    """One token per character: enough to turn text into ids and back."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_completion_timings_are_read_from_its_perf_lines():
    t = llamacpp.parse_completion(COMPLETION_LOG)
    assert t["prefill_seconds"] == pytest.approx(0.0786) and t["prompt_tokens"] == 4
    assert t["decode_seconds"] == pytest.approx(1.96258 - 0.0786)  # its total less the prompt: sampling included
    assert t["generated"] == 64  # one token per decode run, plus the prompt's
    with pytest.raises(ValueError, match="no llama.cpp timings"):
        llamacpp.parse_completion("llama_model_load: error loading model")


def test_speculative_summary_is_read():
    t = llamacpp.parse_speculative(SPECULATIVE_LOG)
    assert (t["prompt_tokens"], t["generated"], t["drafted"], t["accepted"]) == (4, 69, 55, 50)
    assert t["prefill_seconds"] == pytest.approx(0.094) and t["decode_seconds"] == pytest.approx(3.287)
    with pytest.raises(ValueError, match="speculative summary"):
        llamacpp.parse_speculative(COMPLETION_LOG)


@pytest.mark.parametrize("prompt", ["def f(x):\n", "\ndef g():\n    ", "<|im_start|>user\nhi<|im_end|>\n"])
def test_the_generated_text_follows_the_echoed_prompt(prompt):
    assert llamacpp.generated_text(f"\n\n{prompt}    return 1\n\n", prompt) == "    return 1"
    assert llamacpp.generated_text(f"{prompt}x\n\n\n", prompt) == "x\n"  # a generated newline is kept
    with pytest.raises(ValueError, match="did not echo the prompt"):
        llamacpp.generated_text(f"something else\n{prompt}x", prompt)


def test_missing_tools_say_how_to_build_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="cmake --build"):
        llamacpp.find_binaries(tmp_path)


def fake_tool(path: Path, generated: str, log: str) -> None:
    """A stand-in for a llama.cpp tool: echoes its -p prompt and ``generated``, prints ``log`` on stderr, and fails
    unless it was given --no-escape, greedy sampling and the thread count (2)."""
    path.write_text(f"""#!{sys.executable}
import sys
a = sys.argv[1:]
assert "--no-escape" in a and a[a.index("--temp") + 1] == "0" and a[a.index("-t") + 1] == "2", a
sys.stdout.write("\\n\\n" + a[a.index("-p") + 1] + {generated!r} + "\\n\\n")
sys.stderr.write({log!r})
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_methods_charge_prefill_plus_decoding_for_exactly_the_tokens_asked(tmp_path):
    fake_tool(tmp_path / "llama-completion", "abc", COMPLETION_LOG)
    fake_tool(tmp_path / "llama-speculative-simple", "abc", SPECULATIVE_LOG)
    assert set(llamacpp.find_binaries(tmp_path)) == {"plain", "speculative"}
    llama, tok, ids = llamacpp.LlamaCpp(tmp_path, threads=2), CharTokenizer(), [ord(c) for c in "\nhi\\n"]
    model = tmp_path / "m.gguf"
    tokens, seconds, rec = llamacpp.plain_method(llama, model, tok).run(ids, 64)
    assert tokens == [ord(c) for c in "abc"] and rec["llamacpp_text"] == "abc"
    assert seconds == pytest.approx(1.96258) and rec["tokens"] == 64 and rec["tokens_per_second"] == 64 / seconds
    m = llamacpp.speculative_method(llama, model, model, tok, draft_max=4)
    assert m.name == "llamacpp-speculative-d4" and m.baseline
    _, seconds, rec = m.run(ids, 64)
    # 69 tokens decoded where 64 were asked: charged decoding's per-token cost for the 63 after the first
    assert seconds == pytest.approx(0.094 + 3.287 * 63 / 68) and rec["accepted"] == 50
    fake_tool(tmp_path / "llama-completion", "abc", "no timings here")
    with pytest.raises(ValueError, match="no llama.cpp timings"):
        llamacpp.plain_method(llama, model, tok).run(ids, 8)


def test_the_speculative_search_tries_each_setting_and_keeps_the_fastest(tmp_path):
    """llama.cpp's speculative decoding is searched over draft-max x polling level x minimum draft probability
    (``experiments/bench_llamacpp.py``): each setting given reaches the tool (``--poll``, ``--spec-draft-p-min``) and
    names the method; the search keeps the fastest speculative candidate (never plain decoding, its reference),
    caches each candidate's speed, and a re-run with the tools gone measures nothing again."""
    import json
    import runpy

    bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_llamacpp.py"))
    fake_tool(tmp_path / "llama-completion", "abc", COMPLETION_LOG)  # 64 tokens in 1.96 s
    slow, fast = (SPECULATIVE_LOG.replace("3.287 seconds", f"{s} seconds") for s in ("6.500", "2.500"))
    (tmp_path / "llama-speculative-simple").write_text(f"""#!{sys.executable}
import sys
a = sys.argv[1:]
value = lambda flag: a[a.index(flag) + 1] if flag in a else None
chosen = (value("--spec-draft-n-max"), value("--poll"), value("--spec-draft-p-min")) == ("4", "0", "0.75")
sys.stdout.write("\\n\\n" + a[a.index("-p") + 1] + "abc\\n\\n")
sys.stderr.write({fast!r} if chosen else {slow!r})
""")
    (tmp_path / "llama-speculative-simple").chmod(0o755)
    llama, tok = llamacpp.LlamaCpp(tmp_path, threads=2), CharTokenizer()
    prompts = [("humaneval", 0, [ord(c) for c in "def f():\n"])]
    grid = [(d, p, m) for d in (0, 2, 4) for p in (None, 0) for m in (0.0, 0.75)]
    search = lambda g: bench["search_speculative"](llama, tmp_path / "t.gguf", tmp_path / "d.gguf", tok,  # noqa: E731
                                                    prompts, 64, g, tmp_path / "search.json")
    assert search(grid) == (4, 0, 0.75)  # plain (1.96 s) beats every speculative candidate here: it is not a choice
    found = json.loads((tmp_path / "search.json").read_text())
    assert len(found) == 9 and max(found, key=found.get) == "0" and "4-poll0-pmin0.75" in found
    assert [bench["search_name"](k) for k in ("0", "2", "4-poll0", "4-poll0-pmin0.75")] == [
        "plain", "draft-max 2", "draft-max 4 poll 0", "draft-max 4 poll 0 p-min 0.75"]
    assert llamacpp.speculative_method(llama, tmp_path, tmp_path, tok, draft_max=4, poll=0, p_min=0.75).name == \
        "llamacpp-speculative-d4-poll0-pmin0.75"
    for tool in ("llama-completion", "llama-speculative-simple"):
        (tmp_path / tool).unlink()
    assert search(grid) == (4, 0, 0.75)  # from the cache alone
    with pytest.raises(ValueError, match="no draft-max above 0"):
        search([(0, None, 0.0)])


def test_common_prefix():
    assert llamacpp.common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert llamacpp.common_prefix("abc", "abcd") == 3 and llamacpp.common_prefix([], [1]) == 0
