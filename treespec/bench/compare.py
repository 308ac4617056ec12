"""treespec beside the target alone, measured side by side: the loop behind ``treespec demo`` and
``experiments/bench_cpu.py``.

For each prompt, in turn (interleaved, so a drift in the machine's speed hits every method alike):
HF ``generate`` with the target in each baseline precision (greedy, same number of tokens), then
treespec. Records are appended to a JSONL file as they finish, and a re-run skips the (dataset,
prompt, method) already there. ``summarize`` turns the records into tok/s per method and
speedups with bootstrap intervals over prompts (paired per prompt), the headline being the
speedup over the *fastest* baseline, plus greedy agreement with HF in the same precision; a
mismatch is located and its top-2 logit gap printed, to tell a near-tie (bf16 rounding in a
batched forward) from a bug.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import intervals
from .baselines import ASSISTED_SETTINGS, fastest_compile_settings, hf_generate
from ..common.device import execution_device
from ..core.stats import GenerateOutput
from ..models.precision import CPU_ONLY, precision_of
from ..models.timing import TokenClock
from ..common.jsonl import append_record, read_records, repair_tail


#: new tokens of the warm-up call every method makes first (:func:`run`; its seconds: :func:`warmup_seconds`), at
#: least: several steps, because a compiled step compiles a graph when a step first reaches it (after a 4-token
#: warm-up the captured step's first timed prompt still compiled for 212 s: experiments/results/freezing-cpu)
WARMUP_TOKENS = 32


def warmup_file(results: Path) -> Path:
    """Where :func:`run` appends its warm-up records: beside ``results`` (``results.warmup.jsonl``), apart from
    the measured records."""
    return results.with_name(f"{results.stem}.warmup{results.suffix}")


def warmup_seconds(results: Path) -> dict[str, float]:
    """Each method's seconds in its latest warm-up call (its compiles and one-off setup), from beside ``results``."""
    path = warmup_file(results)
    return {r["method"]: r["seconds"] for r in read_records(path)} if path.exists() else {}


@dataclass
class Method:
    """One side of the comparison: ``run(ids, max_new_tokens) -> (new tokens, seconds, extra record fields)``."""

    name: str
    run: Callable[[list[int], int], tuple[list[int], float, dict[str, Any]]]
    precision: str  # of the target it decodes with (greedy agreement is checked within a precision)
    baseline: bool
    setting: str | None = None  # HF assisted generation's (its records' ``assisted_setting``): another is re-run


def hf_method(target: torch.nn.Module, name: str | None = None) -> Method:
    """HF ``generate`` with ``target`` alone (greedy, exactly ``max_new_tokens`` tokens). Its records carry
    ``prefill_seconds``: from the call to the first new token (the prompt's forward), as treespec's do."""
    precision = precision_of(target)

    def run(ids: list[int], n: int):
        clock = TokenClock(execution_device(target), every=False)  # the prefill's end alone
        start = time.perf_counter()
        tokens, seconds = hf_generate(target, ids, n, stopping_criteria=[clock])
        return tokens, seconds, {"prefill_seconds": clock.stamps[0] - start} if clock.stamps else {}

    return Method(name or f"hf-{precision}", run, precision, True)


def hf_compiled_method(target: torch.nn.Module, name: str | None = None, backend: str = "inductor") -> Method:
    """HF ``generate`` with a static cache and ``torch.compile`` (its fastest plain decoding: with inductor's
    weight freezing, ``baselines.fastest_compile_settings``), greedy. Its first call compiles (:func:`run`
    warms every method up alike). ``backend``: dynamo's (another than inductor only where a smoke run checks the
    plumbing, not the speed)."""
    precision = precision_of(target)

    def run(ids: list[int], n: int):
        with fastest_compile_settings():
            tokens, seconds = hf_generate(target, ids, n, static_compiled=True, compile_backend=backend)
        return tokens, seconds, {}

    return Method(name or f"hf-{precision}-static-compiled", run, precision, True)


def hf_assisted_method(target: torch.nn.Module, draft: torch.nn.Module, name: str | None = None,
                       setting: str = "HF's default", tokenizers: tuple[Any, Any] | None = None) -> Method:
    """HF assisted generation (its own speculative decoding with ``draft``), greedy, with one of
    :data:`ASSISTED_SETTINGS` (its records name it: ``assisted_setting``). ``tokenizers``: the target's and the
    draft's, for a draft with a vocabulary of its own (HF's universal assisted generation)."""
    precision, config = precision_of(target), ASSISTED_SETTINGS[setting]
    own = {} if tokenizers is None else {"tokenizer": tokenizers[0], "assistant_tokenizer": tokenizers[1]}

    def run(ids: list[int], n: int):
        tokens, seconds = hf_generate(target, ids, n, assistant_model=draft, assistant_config=config, **own)
        return tokens, seconds, {"assisted_setting": setting}

    return Method(name or f"hf-assisted-{precision}", run, precision, True, setting)


def fastest_assisted_method(target: torch.nn.Module, draft: torch.nn.Module, prompts: Sequence[list[int]], n: int,
                            name: str | None = None, settings: Sequence[str] = tuple(ASSISTED_SETTINGS),
                            on_setting: Callable[[str, float], None] | None = None, cache: Path | None = None,
                            tokenizers: tuple[Any, Any] | None = None) -> tuple[Method, dict[str, float]]:
    """HF assisted generation at its fastest here: each of ``settings`` (:data:`ASSISTED_SETTINGS`) timed on
    ``prompts`` (prompts apart from the measured ones), ``n`` new tokens each, after one untimed call; returns the
    method with the setting of the most tokens per second (mean over the prompts) and each setting's figure
    (``on_setting(setting, tok/s)`` as each is measured). ``cache``: a JSON file of the figures, read first and
    written as each is measured (a resumed run keeps the setting its records were made with). ``tokenizers``: as
    :func:`hf_assisted_method`'s."""
    if not prompts or not settings:
        raise ValueError("fastest_assisted_method: give at least one prompt and one setting to time")
    found = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    speeds = {s: found[s] for s in settings if s in found}
    if len(speeds) < len(settings):
        hf_assisted_method(target, draft, name, tokenizers=tokenizers).run(prompts[0], min(n, 8))  # one-off setup
    for setting in settings:
        if setting not in speeds:
            method = hf_assisted_method(target, draft, name, setting, tokenizers)
            speeds[setting] = sum(n / method.run(ids, n)[1] for ids in prompts) / len(prompts)
            if cache is not None:
                cache.write_text(json.dumps({**found, **speeds}, indent=1))
        if on_setting is not None:
            on_setting(setting, speeds[setting])
    return hf_assisted_method(target, draft, name, max(speeds, key=speeds.get), tokenizers), speeds


def assisted_choice(speeds: dict[str, float], where: str, who: str = "HF assisted generation",
                    tokens: int | None = None) -> str:
    """The line a report gives :func:`fastest_assisted_method`'s choice: the setting kept, where the settings were
    timed (``tokens`` new tokens each, where given), and each one's tokens per second."""
    each = f"{tokens} tokens each, " if tokens is not None else ""
    return (f"{who} ran with {max(speeds, key=speeds.get)}, the fastest of its settings on {where} ({each}tok/s: "
            + ", ".join(f"{k} {v:.2f}" for k, v in speeds.items()) + ").")


def treespec_method(generate_one: Callable[[list[int], int], GenerateOutput], precision: str,
                    name: str = "treespec") -> Method:
    """treespec on one prompt: ``generate_one(ids, max_new_tokens)``, e.g. ``treespec.run`` with a recipe
    (fresh drafters per call); ``precision``: the target's. Records add the call's ``Stats.record()``."""

    def run(ids: list[int], n: int):
        out = generate_one(ids, n)
        return out.new_tokens, out.stats.seconds, out.stats.record()

    return Method(name, run, precision, False)


def first_divergence(target: torch.nn.Module, prompt: Sequence[int], a: Sequence[int], b: Sequence[int]
                     ) -> dict[str, Any] | None:
    """Where greedy outputs ``a`` and ``b`` first differ, and the target's top-2 logit gap there
    (teacher-forced on the common prefix, one plain forward): a gap near 0 is a near-tie."""
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if k is None:
        return None
    ids = torch.tensor([list(prompt) + list(a[:k])], device=next(target.parameters()).device)
    with torch.inference_mode():
        logits = target(input_ids=ids).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return {"position": k, "tokens": [int(a[k]), int(b[k])], "top2": top.indices.tolist(),
            "top2_gap": float(top.values[0] - top.values[1]),
            "near_tie": near_tie(float(top.values[0] - top.values[1]), float(top.values[0]), rounding_dtype(target))}


def rounding_dtype(model: torch.nn.Module) -> torch.dtype:
    """The precision ``model``'s products round at: bfloat16 for a quantised model (its int4 / int8 kernels take
    bfloat16 activations and return bfloat16, and its twins are bfloat16 layers), else its parameters' dtype."""
    return torch.bfloat16 if precision_of(model) in CPU_ONLY else next(model.parameters()).dtype


def locate_divergences(target: torch.nn.Module, records: Sequence[dict[str, Any]], summary: dict[str, Any],
                       prompt_ids: Callable[[str, int], list[int]]) -> None:
    """Each greedy mismatch of ``summary``'s agreement (:func:`summarize`), located: its agreement entry gets
    ``divergences``, per mismatched prompt ``{"prompt": p, **first_divergence(...)}``. ``prompt_ids(dataset,
    prompt)``: the prompt's token ids."""
    by_key = {(r["dataset"], r["prompt"], r["method"]): r for r in records}
    d = summary["dataset"]
    for name, a in summary.get("agreement", {}).items():
        a["divergences"] = [{"prompt": p, **(first_divergence(target, prompt_ids(d, p), by_key[(d, p, a["against"])][
            "output"], by_key[(d, p, name)]["output"]) or {})} for p in a["mismatched_prompts"]]


def near_tie(gap: float, top1: float, dtype: torch.dtype) -> bool:
    """Whether two logits ``gap`` apart near ``top1`` are tied at ``dtype``'s precision: within two rounding
    steps (a forward over a tree and one over a single token sum in different orders, and each rounds)."""
    return gap <= 2 * torch.finfo(dtype).eps * max(abs(top1), 1.0)


def run(methods: Sequence[Method], prompts: Sequence[tuple[str, int, list[int]]], max_new_tokens: int,
        results: Path, on_record: Callable[[dict[str, Any]], None] | None = None,
        context: int | None = None, settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run every method on every ``(dataset, index, token ids)`` prompt, interleaved per prompt;
    append a record per (prompt, method) to ``results`` and skip those already there. ``context``: the model's
    positions, which the warm-up call's tokens are kept within (never fewer than the runs'). ``settings``: what
    else decides the outputs and timings (a script's options); with ``max_new_tokens`` and each method's precision
    they are kept in every record, and a file of records made under other settings is refused (a re-run into it
    would have mixed them), records kept before settings were excepted. A method's records made in another of its
    own settings (HF assisted generation's, :attr:`Method.setting`: a file made before its fastest setting was
    searched, or whose search cache was removed) are run again and left out of what it returns."""
    results.parent.mkdir(parents=True, exist_ok=True)
    repair_tail(results)  # a torn last line from an interrupted run
    settings = {"max_new_tokens": max_new_tokens, **(settings or {})}
    own = {m.name: m.setting for m in methods}
    current = lambda r: r.get("assisted_setting") == own[r["method"]] if r["method"] in own else True  # noqa: E731
    kept = read_records(results)
    check_settings(kept, settings, {m.name: m.precision for m in methods}, results)
    done = {(r["dataset"], r["prompt"], r["method"]) for r in kept if current(r)}
    if prompts and len(done) < len(prompts) * len(methods):
        # the same warm-up call for every method (compiles and one-off setup, kept apart), on the longest prompt and
        # as many new tokens as the runs: the caches it makes hold every run's (a compiled step's runner of a larger
        # capacity serves shorter prompts), so no timed run compiles
        dataset, index, ids = max(prompts, key=lambda p: len(p[2]))
        warm = max(WARMUP_TOKENS, max_new_tokens)
        if context is not None:
            warm = max(max_new_tokens, min(warm, context - len(ids)))
        for m in methods:
            _, seconds, _ = m.run(ids, warm)
            append_record(warmup_file(results), {"dataset": dataset, "prompt": index, "method": m.name,
                                                 "seconds": seconds, "tokens": warm})
    for dataset, index, ids in prompts:
        for m in methods:
            if (dataset, index, m.name) in done:
                continue
            tokens, seconds, extra = m.run(ids, max_new_tokens)
            record = {"dataset": dataset, "prompt": index, "method": m.name, "precision": m.precision,
                      "baseline": m.baseline, "tokens": len(tokens), "seconds": seconds,
                      "tokens_per_second": len(tokens) / seconds, "output": tokens, **extra, "settings": settings}
            append_record(results, record)
            if on_record is not None:
                on_record(record)
    return [r for r in read_records(results) if current(r)]


def check_settings(records: Sequence[dict[str, Any]], settings: dict[str, Any], precisions: dict[str, str],
                   results: Path) -> None:
    """Refuse ``results``'s records made under other ``settings``, or by a method of this run in another precision
    (:func:`run`); records without settings (kept before they were) pass."""
    for r in records:
        made = r.get("settings")
        if made is not None and made != settings:
            other = sorted(k for k in {*made, *settings} if made.get(k) != settings.get(k))
            said = ", ".join(f"{k} {made.get(k)!r} there, {settings.get(k)!r} now" for k in other)
            raise ValueError(f"{results} holds records made under other settings ({said}); give another --out, "
                             "or the settings it was made with")
        if r["method"] in precisions and r.get("precision") not in (None, precisions[r["method"]]):
            raise ValueError(f"{results} holds {r['method']} records of a {r['precision']} target, and this run's is "
                             f"{precisions[r['method']]}; give another --out, or the precision it was made with")


def summarize(records: Sequence[dict[str, Any]], dataset: str,
              warmup: dict[str, float] | None = None) -> dict[str, Any]:
    """Per-method tok/s, treespec's speedups over each baseline (paired per prompt) and greedy agreement;
    ``warmup``: each method's warm-up seconds (:func:`warmup_seconds`), kept beside its tok/s."""
    rows = [r for r in records if r["dataset"] == dataset]
    warm = warmup or {}
    by_method: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_method.setdefault(r["method"], {})[r["prompt"]] = r
    complete = sorted(set.intersection(*(set(v) for v in by_method.values()))) if by_method else []
    out: dict[str, Any] = {"dataset": dataset, "prompts": complete, "methods": {}, "speedups": {}}
    for name, recs in by_method.items():
        sel = [recs[p] for p in complete]
        entry = {"baseline": sel[0]["baseline"] if sel else None, "precision": sel[0]["precision"] if sel else None,
                 "tokens_per_second": intervals.ratio_of_sums([r["tokens"] for r in sel],
                                                              [r["seconds"] for r in sel]).as_dict() if sel else None}
        if sel and "steps" in sel[0]:
            entry["tau"] = intervals.ratio_of_sums([r["tokens"] for r in sel], [r["steps"] for r in sel]).as_dict()
            full = [(sum(t for t, c in zip(r["step_tokens"], r["step_cut"]) if not c),
                     sum(1 for c in r["step_cut"] if not c)) for r in sel]
            if sum(n for _, n in full):
                entry["tau_uncut"] = intervals.ratio_of_sums([t for t, _ in full], [n for _, n in full]).as_dict()
            entry["seconds_split"] = {k: sum(r[k] for r in sel) for k in
                                      ("prefill_seconds", "drafting_seconds", "verifying_seconds", "engine_seconds")}
        if name in warm:
            entry["warmup_seconds"] = warm[name]
        out["methods"][name] = entry
    spec = [n for n, e in out["methods"].items() if not e["baseline"]]
    bases = [n for n, e in out["methods"].items() if e["baseline"]]
    for s in spec:
        for b in bases:
            sel_s = [by_method[s][p] for p in complete]
            sel_b = [by_method[b][p] for p in complete]
            out["speedups"][f"{s} vs {b}"] = intervals.ratio_of_sums([r["seconds"] for r in sel_b],
                                                                     [r["seconds"] for r in sel_s]).as_dict()
            if by_method[s][complete[0]]["precision"] == by_method[b][complete[0]]["precision"] and \
                    b.startswith("hf-") and not speculative(b):
                same = [r["output"] == q["output"] for r, q in zip(sel_s, sel_b)]
                # against the first such baseline (HF eager, listed first): compiled HF may differ from it too
                out.setdefault("agreement", {}).setdefault(s, {
                    "against": b, "identical": sum(same), "of": len(same),
                    "mismatched_prompts": [p for p, ok in zip(complete, same) if not ok]})
    if bases and spec:
        speed = lambda b: out["methods"][b]["tokens_per_second"]["estimate"]  # noqa: E731
        plain = [b for b in bases if not speculative(b)] or bases
        out["fastest_baseline"] = max(plain, key=speed)  # the target alone, of the configurations run
        out["fastest_any"] = max(bases, key=speed)  # HF's own speculative decoding included (where it ran)
        out["headline"] = {s: out["speedups"][f"{s} vs {out['fastest_baseline']}"] for s in spec}
        out["headline_any"] = {s: out["speedups"][f"{s} vs {out['fastest_any']}"] for s in spec}
    return out


def speculative(method: str) -> bool:
    """Whether a baseline decodes speculatively (HF assisted generation, llama.cpp's speculative decoding)."""
    return "assisted" in method or "speculative" in method


def fastest_labels(who: str = "HF") -> tuple[str, str]:
    """The labels of the fastest plain baseline and of the fastest of all baselines: of what ran, never a claim
    about ``who``'s configurations that did not run."""
    return f"fastest plain {who} decoding run here", f"fastest of the {who} methods run here"


FASTEST_PLAIN, FASTEST_ANY = fastest_labels()


def fmt(iv: dict[str, Any] | None, digits: int = 2) -> str:
    """An interval record as ``"2.31 [2.10, 2.52]"``."""
    if iv is None:
        return "-"
    return intervals.Interval(iv["estimate"], iv["low"], iv["high"], iv["confidence"], iv["n"]).fmt(digits)


def markdown(summary: dict[str, Any], who: str = "HF") -> str:
    """A table per dataset: tok/s and tau per method, speedups (the fastest baselines labelled as ``who``'s),
    agreement."""
    fastest_plain, fastest_any = fastest_labels(who)
    lines = [f"### {summary['dataset']} ({len(summary['prompts'])} prompts)", "",
             "| method | precision | tok/s [95% CI] | tau (all steps) | tau (uncut steps) | warm-up call s |",
             "|---|---|---|---|---|---|"]
    for name, e in summary["methods"].items():
        warm = f"{e['warmup_seconds']:.1f}" if "warmup_seconds" in e else "-"
        lines.append(f"| {name} | {e['precision']} | {fmt(e['tokens_per_second'])} | {fmt(e.get('tau'))} | "
                     f"{fmt(e.get('tau_uncut'))} | {warm} |")
    lines += ["", "| speedup (paired per prompt) | ratio [95% CI] |", "|---|---|"]
    for k, iv in summary["speedups"].items():
        star = (f" **({fastest_any})**" if k.endswith(f"vs {summary.get('fastest_any')}") else
                f" **({fastest_plain})**" if k.endswith(f"vs {summary.get('fastest_baseline')}") else "")
        lines.append(f"| {k}{star} | {fmt(iv)}x |")
    if any("warmup_seconds" in e for e in summary["methods"].values()):
        lines.append("\nEvery method made the same warm-up call first (the longest prompt, as many new tokens as the "
                     f"runs and at least {WARMUP_TOKENS}: its compiles and one-off setup); its seconds are shown apart "
                     "and counted in no tok/s.")
    for s, a in summary.get("agreement", {}).items():
        lines.append(f"\nGreedy output of {s} identical to {a['against']} (same precision) on "
                     f"{a['identical']}/{a['of']}"
                     f" prompts" + (f"; differing: {a['mismatched_prompts']}" if a["mismatched_prompts"] else "."))
    return "\n".join(lines)


def plot(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    """Bars of tok/s per method (95% interval over prompts), one panel per dataset; treespec's in blue."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(5 * len(summaries), 3.6), squeeze=False)
    for ax, s in zip(axes[0], summaries):
        names = list(s["methods"])
        est = [s["methods"][n]["tokens_per_second"]["estimate"] for n in names]
        err = [[e - s["methods"][n]["tokens_per_second"]["low"] for n, e in zip(names, est)],
               [s["methods"][n]["tokens_per_second"]["high"] - e for n, e in zip(names, est)]]
        ax.bar(range(len(names)), est, yerr=err, capsize=4,
               color=["#999" if s["methods"][n]["baseline"] else "#1f77b4" for n in names])
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("tokens / s (95% CI over prompts)")
        ax.set_title(f"{s['dataset']} ({len(s['prompts'])} prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
