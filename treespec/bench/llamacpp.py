"""llama.cpp on the same GGUF files, as baseline methods of ``treespec.bench.compare``.

Plain decoding runs ``llama-completion`` and speculative decoding ``llama-speculative-simple`` (a draft
model proposing a chain of up to ``draft_max`` tokens), each as a subprocess per prompt, greedy
(``--temp 0``), exactly ``max_new_tokens`` tokens (``--ignore-eos``), the prompt given as the text the
tokenizer decodes its ids to. A method's seconds are llama.cpp's own timings of the call (prompt
evaluation plus decoding; the model's load and llama.cpp's warm-up run are excluded, as treespec's load and
compiles are), and its record keeps ``prefill_seconds`` apart so decoding alone can be compared too.
llama.cpp's sampling and printing between forwards are outside its timers: the seconds slightly favour it.

llama.cpp is not a dependency: ``find_binaries`` looks in a directory the user built (the experiment's
README says how) and says how to build it when the tools are missing.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .compare import Method

#: the tools a run needs, by role
TOOLS = {"plain": "llama-completion", "speculative": "llama-speculative-simple"}

#: how the tools were built for experiments/results/llamacpp-cpu (check out the commit its README names)
BUILD = ("cd llama.cpp  # a checkout of llama.cpp (ggml-org's) at the commit the report names\n"
         "cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF "
         "-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF\n"
         "cmake --build build -j2 --target llama-completion llama-speculative-simple")
BUILD_HINT = f"build llama.cpp ({'; '.join(BUILD.splitlines())}) and pass its build/bin directory"

_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNT = re.compile(r"(n_drafted|n_accept)\s*=\s*(\d+)")


def find_binaries(bin_dir: str | Path) -> dict[str, Path]:
    """The llama.cpp tools in ``bin_dir`` (``TOOLS``), or a ``FileNotFoundError`` that says how to build them."""
    found = {role: Path(bin_dir) / name for role, name in TOOLS.items()}
    missing = [str(p) for p in found.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"llama.cpp tools not found: {', '.join(missing)}; {BUILD_HINT}")
    return found


def version(bin_dir: str | Path) -> str:
    """What ``llama-completion --version`` says it is (its version, commit and compiler)."""
    done = subprocess.run([str(Path(bin_dir) / TOOLS["plain"]), "--version"], capture_output=True, text=True,
                          errors="replace", stdin=subprocess.DEVNULL)
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.startswith(("version", "built"))]
    return "; ".join(lines) or "unknown"


def parse_completion(log: str) -> dict[str, float]:
    """``llama-completion``'s timings (its perf lines; the last of each): ``prefill_seconds`` (the prompt's
    evaluation), ``decode_seconds`` (the rest of its total: decoding and sampling every token after the first),
    ``prompt_tokens`` and ``generated`` (tokens sampled: one per decode run, plus the prompt's)."""
    prompts, evals, totals = _PROMPT.findall(log), _EVAL.findall(log), _TOTAL.findall(log)
    if not prompts or not evals:
        raise ValueError(f"no llama.cpp timings in its output:\n{log[-2000:]}")
    (p_ms, p_n), (e_ms, e_n) = prompts[-1], evals[-1]
    total = float(totals[-1]) if totals else float(p_ms) + float(e_ms)
    return {"prefill_seconds": float(p_ms) / 1e3, "decode_seconds": (total - float(p_ms)) / 1e3,
            "prompt_tokens": int(p_n), "generated": int(e_n) + 1}


def parse_speculative(log: str) -> dict[str, float]:
    """``llama-speculative-simple``'s summary: ``prefill_seconds`` (the target's prompt), ``decode_seconds``
    (drafting and verifying), ``prompt_tokens``, ``generated`` (it may overshoot the tokens asked for by the
    last step's accepted draft), ``drafted`` and ``accepted`` draft tokens."""
    enc, dec = _ENCODED.search(log), _DECODED.search(log)
    if enc is None or dec is None:
        raise ValueError(f"no llama.cpp speculative summary in its output:\n{log[-2000:]}")
    counts = dict(_COUNT.findall(log))
    return {"prefill_seconds": float(enc.group(2)), "decode_seconds": float(dec.group(2)),
            "prompt_tokens": int(enc.group(1)), "generated": int(dec.group(1)),
            "drafted": int(counts.get("n_drafted", 0)), "accepted": int(counts.get("n_accept", 0))}


@dataclass(frozen=True)
class LlamaCpp:
    """Where the tools are and how they run: ``threads`` for every call (the same as treespec's),
    ``context`` tokens of KV cache."""

    bin_dir: Path
    threads: int
    context: int = 2048

    def call(self, tool: str, args: Sequence[str], prompt: str) -> tuple[str, str]:
        """Run ``tool`` on ``prompt`` with ``args``; returns (stdout, stderr). The prompt goes in as an argument,
        as is (``--no-escape``; a prompt file would lose its last newline: llama.cpp strips it)."""
        cmd = [str(self.bin_dir / tool), "-p", prompt, "--no-escape", "-t", str(self.threads), "-c", str(self.context),
               "--temp", "0", "--ignore-eos", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:1] + cmd[3:])} exited with {done.returncode}:\n{done.stderr[-2000:]}")
        return done.stdout, done.stderr


def _method(name: str, tokenizer: Any, call: Callable[[str, int], tuple[str, dict[str, Any]]],
            precision: str) -> Method:
    """A ``compare.Method`` around ``call(prompt text, n) -> (generated text, timings)``. Its seconds are the
    prompt's plus decoding's per token times ``n`` (llama.cpp's speculative decoding may overshoot ``n``), its
    record's ``tokens`` is ``n`` and its output the generated text tokenised again (``llamacpp_text`` keeps the
    text: compare outputs as text, a retokenisation may split tokens differently)."""

    def run(ids: list[int], n: int):
        text, t = call(tokenizer.decode(ids, skip_special_tokens=False), n)
        seconds = t["prefill_seconds"] + t["decode_seconds"] * (n - 1) / max(t["generated"] - 1, 1)
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        return tokens, seconds, {**t, "tokens": n, "tokens_per_second": n / seconds, "llamacpp_text": text}

    return Method(name, run, precision, True)


def plain_method(llama: LlamaCpp, model: Path, tokenizer: Any, *, name: str = "llamacpp") -> Method:
    """llama.cpp's plain decoding of ``model`` (``llama-completion``)."""

    def call(prompt: str, n: int):
        out, err = llama.call(TOOLS["plain"], ["-m", str(model), "-n", str(n), "-no-cnv", "--special"], prompt)
        return generated_text(out, prompt), parse_completion(err)

    return _method(name, tokenizer, call, f"gguf:{model.name}")


def speculative_method(llama: LlamaCpp, model: Path, draft: Path, tokenizer: Any, *, draft_max: int,
                       poll: int | None = None, p_min: float = 0.0, name: str | None = None) -> Method:
    """llama.cpp's speculative decoding of ``model`` with ``draft`` (``llama-speculative-simple``, ``draft-simple``):
    chains of up to ``draft_max`` drafted tokens, its threads' polling level ``poll`` (``--poll``, 0-100, the
    draft's too; None: llama.cpp's default, 50), drafting stopped where the draft's greedy token has a probability
    under ``p_min`` (``--spec-draft-p-min``; 0, llama.cpp's default, drafts ``draft_max`` always), its other
    settings at their defaults.

    The polling level matters here: after each graph llama.cpp's threads spin waiting for more work, and the
    target and the draft each have a pool of ``threads`` threads. Where those threads fill the cores, the pool
    that just ran spins on the cores the other one needs next: on 2 cores at the default level this tool decoded at
    half its speed at level 0 (``experiments/results/llamacpp-cpu-zen5-spec``)."""
    flags = ["-m", str(model), "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max)]
    flags += ["--poll", str(poll)] if poll is not None else []
    flags += ["--spec-draft-p-min", f"{p_min:g}"] if p_min else []

    def call(prompt: str, n: int):
        out, err = llama.call(TOOLS["speculative"], [*flags, "-n", str(n)], prompt)
        return generated_text(out, prompt), parse_speculative(err)

    suffix = (f"-poll{poll}" if poll is not None else "") + (f"-pmin{p_min:g}" if p_min else "")
    return _method(name or f"llamacpp-speculative-d{draft_max}{suffix}", tokenizer, call, f"gguf:{model.name}")


def generated_text(stdout: str, prompt: str) -> str:
    """The generated text of a llama.cpp tool's stdout: the prompt echoed first (after blank lines), then the
    generation, then a blank line the tool adds."""
    start = stdout.find(prompt)
    if start < 0 or stdout[:start].strip("\n"):
        raise ValueError(f"llama.cpp did not echo the prompt as given (special tokens printed?): {stdout[:200]!r}")
    return stdout[start + len(prompt):].removesuffix("\n\n")


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items ``a`` and ``b`` share (greedy agreement of two decodings)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
