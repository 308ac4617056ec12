"""The demo's whole path on tiny models (the real pair is what `make demo` runs)."""

import argparse
import json
import re

import pytest
import torch

from treespec.bench import compare, demo
from treespec.calibrate import vectors
from treespec.calibrate.tuning import Prediction
from treespec.models.tiny import ByteTokenizer, perturbed_copy, tiny_model


def test_demo_runs_and_reports(tmp_path, monkeypatch, capsys):
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.2)
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))  # the profile cache
    # --quick: HF eager only (the full run adds HF static cache + compile with inductor freezing, and HF assisted:
    # test_the_headline_names_the_fastest_of_what_ran checks its labels on records)
    args = argparse.Namespace(out=tmp_path, prompts=2, max_new_tokens=16, device="cpu", target="unused", quick=True)
    assert demo.run_demo(args, target, ByteTokenizer(128, max_tokens=48), draft) == 0
    out = capsys.readouterr().out
    assert "identical to hf-float32 (same precision) on 2/2 prompts" in out
    assert ("speedup over the fastest of the HF methods run here (hf-float32)" in out
            and "--quick: HF generate eager only" in out)
    assert "fastest HF generate" not in out and "(fastest HF method)" not in out
    # why this shape won: which of its sentences depends on the costs this machine measured (test below for each)
    assert re.search(r"^(Chosen: .* nodes|Plain decoding was chosen)", out, re.MULTILINE)
    assert "| warm-up call s |" in out  # every method's warm-up (its compiles) shown apart
    assert (tmp_path / "cache" / "profiles.json").exists()
    assert (tmp_path / "tree.png").stat().st_size > 0
    assert "speedup" in (tmp_path / "report.md").read_text()
    report = (tmp_path / "report.md").read_text()
    assert "| seconds per step |" in report and "prefill per prompt charged to both" in report


def test_prediction_table_charges_prefill_to_both_sides():
    """Hand-made records: 2 prompts of 10 tokens in 4 steps each, 1 s of prefill and 0.5 s per step;
    the prediction: tau 2.5, 0.5 s per step, plain decoding 0.4 s per token."""
    choice = Prediction(2.5, 0.5, 0.4, "rows")
    mine = [{"method": "treespec", "steps": 4, "tokens": 10, "seconds": 3.0, "prefill_seconds": 1.0,
             "drafting_seconds": 1.2, "verifying_seconds": 0.7, "engine_seconds": 0.1} for _ in range(2)]
    alone = [{"method": "hf-float32", "tokens": 10, "seconds": 5.0} for _ in range(2)]
    table = demo.predicted_and_measured(choice, mine + alone, "hf-float32")
    assert "| tokens per step (tau) | 2.50 | 2.50 |" in table
    assert "| seconds per step | 0.500 | 0.500 |" in table
    # predicted (1 + 9 * 0.4) / (1 + 10 / 2.5 * 0.5) = 4.6 / 3 (plain decoding's prefill gives its first token);
    # measured, HF's records without a prefill of their own: tok/s (20 / 6) / (20 / 10) = 5 / 3
    assert "1.00 s of prefill per prompt charged to both | 1.53x | 1.67x |" in table
    assert "paired ratios above" not in table  # HF's records hold no prefill: one measured speedup, no note
    with_prefill = [{**r, "prefill_seconds": 0.8} for r in alone]
    assert "the two measured speedups differ by the prefills' difference" in demo.predicted_and_measured(
        choice, mine + with_prefill, "hf-float32")
    assert demo.predicted_and_measured(choice, mine, "hf-float32") == ""  # nothing to compare with
    # a replayed prediction carries the range of a 2-prompt run: calibration prompts of tau 2 and 3 (2.5 pooled)
    replayed = Prediction(2.5, 0.5, 0.4, "replay", ((20, 10), (30, 10)))
    table = demo.predicted_and_measured(replayed, mine + alone, "hf-float32")
    assert "| tokens per step (tau) | 2.50 (90% of 2-prompt runs: 2.00-3.00) | 2.50 |" in table


def test_a_predictions_tau_range_narrows_with_more_prompts_and_holds_the_calibrations_own_spread():
    """Prompts drawn from the calibration's: one prompt lands anywhere among its prompts' taus, many near the
    pooled tau; a run over the calibration prompts' own taus lies inside."""
    per_prompt = tuple((t, 10) for t in (20, 30, 40, 50, 60))  # taus 2..6, pooled 4
    p = Prediction(4.0, 0.5, 0.4, "replay", per_prompt)
    one, six, many = p.tau_range(1), p.tau_range(6), p.tau_range(100)
    assert one == (2.0, 6.0)
    assert one[0] < six[0] < many[0] < 4.0 < many[1] < six[1] < one[1] and many[1] - many[0] < 0.8
    assert p.tau_range(6) == six  # a fixed seed
    assert Prediction(4.0, 0.5, 0.4, "rows").tau_range(6) is None and "tau_range_90_one_prompt" in p.as_dict()
    with pytest.raises(ValueError, match="prompts >= 1"):
        p.tau_range(0)


def _records(method: str, seconds: float, baseline: bool = True, precision: str = "bfloat16") -> list[dict]:
    return [{"dataset": "humaneval", "prompt": p, "method": method, "precision": precision, "baseline": baseline,
             "tokens": 10, "seconds": seconds, "output": [1] * 10} for p in (100, 101, 102)]


def test_the_full_run_times_each_hf_method_a_user_would_pick_and_quick_hf_eager_alone():
    """Every HF method at its fastest: assisted generation in the setting fastest on prompts apart from the measured
    ones, which the report names; each setting's greedy output is HF's own greedy decoding."""
    from treespec.models.tiny import greedy_reference

    target = tiny_model("llama", vocab=32, hidden=32, layers=1)
    draft = perturbed_copy(target, 0.2)
    full, note = demo.baseline_methods(target, draft, quick=False, search=[("humaneval", 98, [1, 2, 3])],
                                       max_new_tokens=6)
    assert [m.name for m in full] == ["hf-float32", "hf-float32-static-compiled", "hf-assisted-float32"]
    assert all(m.baseline for m in full)
    assert note.startswith("HF assisted generation ran with ") and "HumanEval 98-98 (6 tokens each" in note
    kept = full[-1].run([4, 5], 6)[2]["assisted_setting"]
    assert f"ran with {kept}, the fastest" in note and all(s in note for s in compare.ASSISTED_SETTINGS)
    for setting in compare.ASSISTED_SETTINGS:
        tokens, _, _ = compare.hf_assisted_method(target, draft, setting=setting).run([4, 5, 6], 8)
        assert tokens == greedy_reference(target, [4, 5, 6], 8), setting
    assert demo.baseline_methods(target, draft, quick=True)[0][0].name == "hf-float32"
    with pytest.raises(ValueError, match="prompts to search"):
        demo.baseline_methods(target, draft, quick=False)


def test_hf_assisted_is_kept_in_its_fastest_setting(monkeypatch):
    """``compare.fastest_assisted_method`` times every setting on every search prompt (after one untimed call) and
    keeps the one of the most tokens per second; the method it returns runs that setting's configuration."""
    target = tiny_model("llama", vocab=32, hidden=32, layers=1)
    draft = perturbed_copy(target, 0.2)
    calls = []

    def timed(model, ids, n, assistant_model=None, assistant_config=None):
        calls.append(assistant_config)
        return [0] * n, 1.0 + abs(assistant_config.get("num_assistant_tokens", 20) - 3)  # 3 a step is fastest

    monkeypatch.setattr(compare, "hf_generate", timed)
    method, speeds = compare.fastest_assisted_method(target, draft, [[1, 2, 3], [4, 5]], 8)
    assert max(speeds, key=speeds.get) == "3 drafted tokens" and speeds["3 drafted tokens"] == 8.0
    assert calls[0] == {} and len(calls) == 1 + 2 * len(compare.ASSISTED_SETTINGS)
    assert method.run([1], 8)[2] == {"assisted_setting": "3 drafted tokens"}
    assert calls[-1] == compare.ASSISTED_SETTINGS["3 drafted tokens"] and calls[-1]["num_assistant_tokens"] == 3
    _, speeds = compare.fastest_assisted_method(target, draft, [[1]], 8, settings=["HF's default", "1 drafted token"])
    assert list(speeds) == ["HF's default", "1 drafted token"]


def test_hf_assisteds_search_resumes_from_its_cache(monkeypatch, tmp_path):
    """With a cache file the figures measured before are read, not measured again: a resumed benchmark keeps the
    setting its records were made with."""
    target = tiny_model("llama", vocab=32, hidden=32, layers=1)
    draft = perturbed_copy(target, 0.2)
    cache, calls = tmp_path / "assisted.json", []

    def timed(model, ids, n, assistant_model=None, assistant_config=None):
        calls.append(assistant_config)
        return [0] * n, 1.0 + assistant_config.get("num_assistant_tokens", 20)

    monkeypatch.setattr(compare, "hf_generate", timed)
    first, speeds = compare.fastest_assisted_method(target, draft, [[1]], 8, cache=cache)
    assert json.loads(cache.read_text()) == speeds and len(calls) == 1 + len(compare.ASSISTED_SETTINGS)
    cache.write_text(json.dumps({**speeds, "6 drafted tokens": 100.0}))  # as if measured so on the first run
    again, _ = compare.fastest_assisted_method(target, draft, [[1]], 8, cache=cache)
    assert len(calls) == 1 + len(compare.ASSISTED_SETTINGS)  # nothing measured again
    assert again.run([1], 8)[2]["assisted_setting"] == "6 drafted tokens"


@pytest.mark.parametrize("ran, fastest", [(["hf-bfloat16"], "hf-bfloat16"),
                                          (["hf-bfloat16", "hf-bfloat16-static-compiled"],
                                           "hf-bfloat16-static-compiled"),
                                          (["hf-bfloat16", "hf-bfloat16-static-compiled", "hf-assisted-bfloat16"],
                                           "hf-assisted-bfloat16")])
def test_the_headline_names_the_fastest_of_what_ran(ran, fastest):
    """The label follows the methods that ran: the fastest of them, called "the fastest of the HF methods run
    here", never more (assisted, when fastest, is named beside the fastest plain decoding)."""
    speed = {"hf-bfloat16": 4.0, "hf-bfloat16-static-compiled": 3.0, "hf-assisted-bfloat16": 2.0}  # seconds
    records = [r for m in ran for r in _records(m, speed[m])] + _records("treespec", 1.0, baseline=False)
    summary = compare.summarize(records, "humaneval", {"treespec": 9.5})
    line = demo.headline_line(summary, quick=len(ran) == 1)
    assert line.startswith(f"speedup over the fastest of the HF methods run here ({fastest}): {speed[fastest]:.2f}")
    assert ("over the fastest plain HF decoding run here" in line) == (fastest == "hf-assisted-bfloat16")
    assert ("--quick" in line) == (len(ran) == 1)
    table = compare.markdown(summary)
    assert f"treespec vs {fastest} **(fastest of the HF methods run here)**" in table
    assert "| treespec | bfloat16 | 10.00" in table and "| 9.5 |" in table  # the warm-up apart, not in tok/s


def test_a_tuned_chain_is_set_beside_the_best_branching_tree():
    """Where width costs (a CPU), a chain wins by its cheaper levels: the report says by how much."""
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.tuning import Tuned
    from treespec.calibrate.vectors import default_acceptance

    acceptance = default_acceptance(None, 0.0)
    prof = Profile({1: 0.1, 8: 0.12, 16: 0.15}, {1: 0.03, 2: 0.045, 4: 0.07, 8: 0.12}, {}, 0.002)
    choice = prof.choose(acceptance, max_depth=8)
    assert choice.shape.max_width == 1  # a chain here
    text = demo.why_this_shape(Tuned(choice, prof), acceptance)
    shape, tau, seconds = prof.best_branching(acceptance, choice.shape.size, 8)
    assert shape.max_width >= 2 and shape.size <= choice.shape.size
    assert tau / seconds < choice.tau / prof.step_seconds(choice.shape)  # the chain was the faster prediction
    assert f"tau {tau:.2f} at {seconds:.3f} s per step" in text
    assert ("wider levels cost more" in text) == (tau > choice.tau) and ("accepts less" in text) == (tau <= choice.tau)


def test_the_best_branching_tree_is_searched_under_width_limits_too():
    """Where width costs, a tree narrower than Sequoia's unlimited one can be the fastest branching tree (the tuner
    searches width limits; ``best_branching`` searched depth limits alone and named a slower tree); acceptance rows
    under which a second child adds nothing have no branching tree."""
    from tree_builders import sequoia
    from treespec.calibrate.costs import Profile

    prof = Profile({1: 0.10, 2: 0.11, 4: 0.13, 8: 0.18, 12: 0.23, 16: 0.28},
                   {1: 0.03, 2: 0.045, 4: 0.07, 8: 0.12, 16: 0.22}, {}, 0.0)
    acceptance = [0.55, 0.2, 0.1, 0.05]
    shape, tau, seconds = prof.best_branching(acceptance, 10, 8)
    unlimited = max((sequoia(acceptance, 10, max_depth=d) for d in range(1, 9)),
                    key=lambda s: s.expected_tokens(acceptance) / prof.step_seconds(s))
    assert tau / seconds > unlimited.expected_tokens(acceptance) / prof.step_seconds(unlimited)
    assert shape.widths == (2,) and tau / seconds == pytest.approx(1.75 / 0.15)
    assert prof.best_branching([0.8], 6, 8) is None


def test_a_tuned_branching_tree_or_plain_decoding_says_so():
    """Where width is nearly free the chosen tree is itself the best branching one; where drafting never pays,
    plain decoding is named as the choice."""
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.tuning import Tuned
    from treespec.calibrate.vectors import default_acceptance

    acceptance = default_acceptance(None, 0.0)
    flat = Profile({1: 0.1, 8: 0.1, 16: 0.1, 32: 0.1}, {1: 0.01, 2: 0.01, 4: 0.01, 8: 0.01}, {}, 0.002)
    choice = flat.choose(acceptance, max_depth=8)
    assert choice.shape.max_width >= 2
    assert "the best branching tree of its budget" in demo.why_this_shape(Tuned(choice, flat), acceptance)
    dear = Profile({1: 0.1, 8: 0.5, 16: 0.9}, {1: 0.5, 2: 0.6, 4: 0.8, 8: 1.0}, {}, 0.002)
    choice = dear.choose(acceptance, max_depth=8)
    assert choice.shape.depth == 0
    assert demo.why_this_shape(Tuned(choice, dear), acceptance).startswith("Plain decoding was chosen")


def test_a_difference_at_a_tie_passes_and_one_where_a_token_leads_fails():
    """The demo exits 1 on a greedy difference from HF unless the target's top-2 logits are tied there at its
    precision (bfloat16 forwards over a tree and over one token round differently)."""
    import torch

    assert compare.near_tie(0.0, 20.0, torch.bfloat16) and compare.near_tie(0.25, 20.0, torch.bfloat16)
    assert not compare.near_tie(0.5, 20.0, torch.bfloat16)  # two bfloat16 steps near 20: 0.3125
    assert not compare.near_tie(0.25, 20.0, torch.float32)
    tie, lead = {"position": 3, "top2_gap": 0.0, "near_tie": True}, {"position": 5, "top2_gap": 1.5, "near_tie": False}
    assert "either token" in demo.divergence_lines([{"prompt": 104, **tie}], "bfloat16")
    both = demo.divergence_lines([{"prompt": 104, **tie}, {"prompt": 105, **lead}], "bfloat16")
    assert "HumanEval/105 differs from token 5" in both and "NOT a tie" in both and "exit status 1" in both
    # located on the target: a random float32 model's two tokens at the first difference are not tied
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    prompts = [("humaneval", 104, [1, 2, 3])]
    records = [{"method": "hf-float32", "prompt": 104, "output": [7, 8, 9]},
               {"method": "treespec", "prompt": 104, "output": [7, 8, 10]}]
    records = [{"dataset": "humaneval", **r} for r in records]
    summary = {"dataset": "humaneval",
               "agreement": {"treespec": {"against": "hf-float32", "mismatched_prompts": [104]}}}
    compare.locate_divergences(target, records, summary, lambda dataset, p: dict((i, t) for _, i, t in prompts)[p])
    found = {d["prompt"]: d for d in summary["agreement"]["treespec"]["divergences"]}
    assert found[104]["position"] == 2 and found[104]["tokens"] == [9, 10] and found[104]["near_tie"] is False


def test_a_quantised_target_rounds_at_bfloat16():
    """An int4 target's kernels take and return bfloat16 (its embeddings and norms are float32): two logits one
    bfloat16 step apart near 20 are a tie for it, not for a float32 model."""
    from treespec.models.quantized import quantize_int4

    floats = tiny_model("llama", vocab=128, hidden=64)
    assert compare.rounding_dtype(floats) == torch.float32
    quantised = quantize_int4(tiny_model("llama", vocab=128, hidden=64), group_size=32, twin="bfloat16")
    assert next(quantised.parameters()).dtype == torch.float32 and compare.rounding_dtype(quantised) == torch.bfloat16
    assert compare.near_tie(0.125, 20.0, compare.rounding_dtype(quantised))
    assert not compare.near_tie(0.125, 20.0, compare.rounding_dtype(floats))


def test_the_measured_speedup_charges_the_same_prefill_to_both_sides_when_hf_records_its_own():
    """HF's records carry their own prefill (``compare.hf_method``: time to the first new token); the measured speedup
    then charges treespec's prefill to both sides, as the prediction does, so only decoding differs: HF 5 s per
    prompt of which 2 s prefill decodes in 3 s, treespec in 2 s, (1 + 3) / (1 + 2) = 1.33x (not 5 / 3)."""
    choice = Prediction(2.5, 0.5, 0.4, "rows")
    mine = [{"method": "treespec", "steps": 4, "tokens": 10, "seconds": 3.0, "prefill_seconds": 1.0,
             "drafting_seconds": 1.2, "verifying_seconds": 0.7, "engine_seconds": 0.1} for _ in range(2)]
    alone = [{"method": "hf-float32", "tokens": 10, "seconds": 5.0, "prefill_seconds": 2.0} for _ in range(2)]
    table = demo.predicted_and_measured(choice, mine + alone, "hf-float32")
    assert "charged to both | 1.53x | 1.33x |" in table
    # the miss's source on its own row: plain decoding predicted 0.4 s per token, HF decoded its 9 tokens after the
    # first (its prefill's) in 3 s
    assert "decoding, seconds per token (HF generate, after its prefill and first token) | 0.400 | 0.333 |" in table
    without = [{k: v for k, v in r.items() if k != "prefill_seconds"} for r in alone]
    assert "decoding, seconds per token" not in demo.predicted_and_measured(choice, mine + without, "hf-float32")
    # 0.5 s of treespec's prefill the draft's, which plain decoding does not run: charged to treespec alone,
    # predicted (0.5 + 9 * 0.4) / 3 = 1.37x, measured (0.5 + 3) / 3 = 1.17x
    table = demo.predicted_and_measured(choice, mine + alone, "hf-float32", draft_prefill=0.5)
    assert ("0.50 s of the target's prefill per prompt charged to both and the draft's 0.50 s (predicted) to "
            "treespec | 1.37x | 1.17x |") in table


def test_the_demo_times_the_target_alone_just_before_its_runs(monkeypatch):
    """``retimed``: the prediction's plain decoding is HF's decoding timed now at the prompts' length (a forward
    made to take 0.03 s per decoded token reads 0.03 s, whatever the cached profile said), twice, the faster kept (a
    first call stalled to 0.08 s a token is not the figure); tau and the step stay."""
    import time

    target = tiny_model("llama", vocab=32, hidden=32, layers=1)
    real, contexts = target.forward, []

    def slowed(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids.shape[-1] > 1:
            contexts.append(ids.shape[-1])
        time.sleep(0.2 if ids.shape[-1] > 1 else 0.08 if len(contexts) == 1 else 0.03)  # the first call stalls
        return real(*args, **kwargs)

    monkeypatch.setattr(target, "forward", slowed)
    cached = Prediction(2.5, 0.5, 0.4, "rows")
    now = demo.retimed(cached, target, [list(range(1, 9)), list(range(1, 13))], tokens=5)
    assert 0.03 <= now.plain_seconds < 0.06 and contexts == [10, 10]  # timed twice, the faster kept
    assert (now.tau, now.step_seconds, now.model) == (2.5, 0.5, "rows")


def test_hf_alone_records_its_prefill():
    target = tiny_model("llama", vocab=32, hidden=32, layers=1)
    tokens, seconds, extra = compare.hf_method(target).run(list(range(1, 9)), 4)
    assert len(tokens) == 4 and 0 < extra["prefill_seconds"] < seconds


def test_every_method_warms_up_on_the_longest_prompt_with_the_runs_token_count(tmp_path):
    """The warm-up call (the same for every method, kept apart) runs the longest prompt and as many new tokens as
    the runs, so the caches it makes hold every timed run's; then each prompt, methods interleaved."""
    from treespec.bench import compare

    calls = []

    def method(name):
        def run(ids, n):
            calls.append((name, len(ids), n))
            return [0] * n, 1.0, {}
        return compare.Method(name, run, "float32", name == "hf")

    prompts = [("d", 0, [1] * 5), ("d", 1, [2] * 30), ("d", 2, [3] * 9)]
    compare.run([method("hf"), method("treespec")], prompts, 48, tmp_path / "results.jsonl")
    assert calls[:2] == [("hf", 30, 48), ("treespec", 30, 48)]
    assert calls[2:] == [(m, n, 48) for n in (5, 30, 9) for m in ("hf", "treespec")]
    assert {r["prompt"] for r in compare.read_records(compare.warmup_file(tmp_path / "results.jsonl"))} == {1}
    calls.clear()  # within a context that leaves the longest prompt 36 positions: the warm-up's 32 tokens fit it
    compare.run([method("hf")], prompts, 8, tmp_path / "short.jsonl", context=66)
    assert calls[0] == ("hf", 30, 32)
    calls.clear()  # 10 positions left: the warm-up makes what fits (never fewer than the runs' 8)
    compare.run([method("hf")], prompts, 8, tmp_path / "shorter.jsonl", context=40)
    assert calls[0] == ("hf", 30, 10)


class ChatBytes(ByteTokenizer):
    """A byte tokenizer with a chat template: a user turn becomes ``user: <text>\\nassistant:``."""

    chat_template = "user: {content}\nassistant:"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        text = self.chat_template.format(content=messages[0]["content"])
        return self(text)["input_ids"] if tokenize else text

    def __call__(self, text, add_special_tokens=True):
        return super().__call__(text)


def test_demo_chat_sends_sharegpt_turns_in_the_chat_template_sized_from_chats_acceptance(tmp_path, monkeypatch,
                                                                                          capsys):
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.2)
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    turns = tuple(f"turn {i}: say something short" for i in range(110))  # stand-in ShareGPT first turns
    asked, sized = [], []
    monkeypatch.setattr(demo, "dataset_prompts", lambda name: asked.append(name) or turns)
    shipped = vectors.acceptance_for_draft
    monkeypatch.setattr(vectors, "acceptance_for_draft", lambda *a, **kw: sized.append(kw) or shipped(*a, **kw))
    args = argparse.Namespace(out=tmp_path, prompts=2, max_new_tokens=12, device="cpu", target="unused", quick=True,
                              chat=True)
    assert demo.run_demo(args, target, ChatBytes(128, max_tokens=48), draft) == 0
    out = capsys.readouterr().out
    assert set(asked) == {"sharegpt"} and "ShareGPT/100 " in out and "ShareGPT/101 " in out
    assert [kw["chat"] for kw in sized] == [True]  # the tree sized from chat's shipped acceptance
    assert "ShareGPT first turns 100-101 as user turns in the chat template" in (tmp_path / "report.md").read_text()
    ids = demo.demo_prompts(ChatBytes(128), 1, chat=True)[0][2]
    assert ChatBytes(128).decode(ids).startswith("user: turn 100")
    # control: a tokenizer without a template is refused before any tuning
    with pytest.raises(ValueError, match="chat template"):
        demo.run_demo(args, target, ByteTokenizer(128, max_tokens=48), draft)


def test_a_benchmark_resumes_only_under_the_settings_its_records_were_made_with(tmp_path):
    """``compare.run`` keeps each record's settings (``max_new_tokens``, the script's own); a re-run into the same
    file resumes under them, and under others (or a method's other precision) is refused instead of mixing stale
    records into the report. Records kept before settings were resume as before."""
    calls = []

    def method(name, precision="float32"):
        return compare.Method(name, lambda ids, n: calls.append(name) or ([1] * n, 0.1, {}), precision, False)

    results, prompts = tmp_path / "results.jsonl", [("humaneval", 0, [1, 2, 3]), ("humaneval", 1, [4, 5])]
    compare.run([method("a")], prompts, 4, results, settings={"depth": 3})
    calls.clear()
    assert len(compare.run([method("a")], prompts, 4, results, settings={"depth": 3})) == 2 and calls == []
    with pytest.raises(ValueError, match="max_new_tokens 4 there, 8 now"):
        compare.run([method("a")], prompts, 8, results, settings={"depth": 3})
    with pytest.raises(ValueError, match="depth 3 there, 4 now"):
        compare.run([method("a")], prompts, 4, results, settings={"depth": 4})
    with pytest.raises(ValueError, match="records of a float32 target, and this run's is int4"):
        compare.run([method("a", "int4")], prompts, 4, results, settings={"depth": 3})
    old = tmp_path / "old.jsonl"
    old.write_text('{"dataset": "humaneval", "prompt": 0, "method": "a", "precision": "float32", "baseline": false, '
                   '"tokens": 4, "seconds": 0.1, "tokens_per_second": 40.0, "output": [1, 1, 1, 1]}\n')
    assert len(compare.run([method("a")], prompts, 4, old)) == 2


def test_hf_assisted_records_of_another_setting_are_run_again_not_mixed(tmp_path):
    """A file whose HF assisted records were made in another setting (before its fastest one was searched, or with
    the search cache removed): a re-run measures them again in this run's setting and returns only those; the
    other methods' records resume."""
    calls = []

    def method(name, setting=None):
        run = lambda ids, n: calls.append(name) or ([1] * n, 0.1, {"assisted_setting": setting} if setting else {})  # noqa: E731
        return compare.Method(name, run, "float32", True, setting)

    results, prompts = tmp_path / "results.jsonl", [("humaneval", 0, [1, 2, 3]), ("humaneval", 1, [4, 5])]
    compare.run([method("hf"), method("hf-assisted", "HF's default")], prompts, 4, results)
    calls.clear()
    records = compare.run([method("hf"), method("hf-assisted", "4 drafted tokens")], prompts, 4, results)
    assert calls == ["hf", "hf-assisted"] + ["hf-assisted"] * 2  # each method's warm-up, then the stale runs alone
    assert sorted((r["method"], r.get("assisted_setting")) for r in records) == [
        ("hf", None), ("hf", None), ("hf-assisted", "4 drafted tokens"), ("hf-assisted", "4 drafted tokens")]
    calls.clear()
    assert len(compare.run([method("hf"), method("hf-assisted", "4 drafted tokens")], prompts, 4, results)) == 4
    assert calls == []  # resumed: nothing left in this setting


def test_a_chain_beside_the_best_branching_tree_says_what_both_are_predicted_by():
    """Where width costs, a chain is chosen and set beside the best branching tree of its budget, both by the
    tuner's expectation over the acceptance rows (every level drafted): the line says so, for a reader who finds
    the prediction table's tau (the calibration walk replayed with the run's confidence stop) another figure."""
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.tuning import Tuned
    from treespec.calibrate.vectors import default_acceptance

    acceptance = default_acceptance(None, 0.0)
    dear_width = Profile({1: 0.1, 2: 0.13, 4: 0.19, 8: 0.31, 16: 0.55}, {1: 0.01, 2: 0.02, 4: 0.04, 8: 0.08, 16: 0.16},
                         {}, 0.0)
    choice = dear_width.choose(acceptance, max_depth=8)
    line = demo.why_this_shape(Tuned(choice, dear_width), acceptance)
    assert choice.shape.max_width == 1 and line.startswith("Chosen: a chain of")
    assert f"tau {choice.shape.expected_tokens(acceptance):.2f} at" in line
    assert "The best branching tree of the same budget" in line
    assert line.endswith("(Both by the tuner's expectation over the acceptance rows, every level drafted, the "
                         "confidence stop aside: the figures the trees were compared by.)")


def test_the_float32_baseline_runs_only_where_its_copy_fits(tmp_path, monkeypatch, capsys):
    """The sceptic's baseline loads the target again in float32 (6.6 GiB for the built-in one): on a machine without
    the memory the demo says so and runs the rest, where the copy would have ended it minutes in. The copy's size
    is the float32 model's, whatever the target's precision."""
    from treespec.common.machine import available_memory
    from treespec.models.precision import float32_bytes, to_precision

    def int4_target():
        return to_precision(tiny_model("llama", vocab=128, hidden=64, scale=6), "int4", twin="bfloat16")

    plain = tiny_model("llama", vocab=128, hidden=64, scale=6)
    target = int4_target()
    need = float32_bytes(target)
    assert need == float32_bytes(plain) == 4 * sum(p.numel() for p in plain.parameters())
    assert float32_bytes(to_precision(tiny_model("llama", vocab=128, hidden=64, scale=6), "int8")) == need
    assert demo.float32_baseline_refused(target, available=2 * need) is None
    said = demo.float32_baseline_refused(target, available=need)
    assert said.startswith("The float32 baseline (HF generate eager on the target loaded again in float32) was not "
                           "run") and "this machine has 0.0 GiB available" in said
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert available_memory(meminfo) == 20000000 * 1024
    # the whole demo on a machine of too little memory: the float32 copy is not loaded ("unused" is no model)
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "available_memory", lambda: need)
    args = argparse.Namespace(out=tmp_path / "out", prompts=1, max_new_tokens=8, device="cpu", target="unused",
                              quick=True)
    assert demo.run_demo(args, target, ByteTokenizer(128, max_tokens=48), perturbed_copy(plain, 0.2)) == 0
    out = capsys.readouterr().out
    assert "The float32 baseline (HF generate eager" in out and "hf-float32" not in out
    assert "identical to hf-int4 (same precision) on 1/1 prompts" in out
    assert "this machine has" in (tmp_path / "out" / "report.md").read_text()
