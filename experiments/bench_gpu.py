"""GPU protocol: costs, tok/s and the predicted speedup of the real Qwen2.5-Coder pair, in phases.

The real weights cannot travel to a GPU node, so the models are built with random weights from the
real pair's configs (1.5B target, 0.5B draft). GPU time is scarce, so the protocol runs in phases,
each one command well under 10 minutes, each writing ``results.json`` and ``README.md`` the moment it
ends (a crash later loses nothing; a phase run again replaces only its own entry):

* ``first``: a tiny model, ``compile=True`` on the device with the real backend (inductor, and CUDA
  graphs on CUDA), greedy, against eager treespec and HF greedy, in float32. A compiled-step bug
  of the CUDA-graph class shows here in seconds, before minutes of compiles.
* ``costs``: the target's tree forward t(n), eager for n = 1..128 and compiled for a few sizes, and
  the draft's cost per tree level, eager and compiled.
* ``hf``: HF ``generate``, eager and with a static cache + ``torch.compile``.
* ``treespec``: treespec eager and compiled with a weak draft (the target's first layers and head:
  partial agreement, low acceptance) and a random draft (chance acceptance); the share of a step
  spent outside model forwards.
* ``validate``: draft = target in float32 (bf16 random logits have near-ties): the share of steps
  accepting the whole chain, eager and compiled, and compiled == eager greedy output.
* ``predict``: the real pair's speedup predicted from the measured costs and the shipped
  acceptance vectors (``treespec/data/acceptance-*.json``) through ``treespec.calibrate.costs``;
  needs ``costs`` and ``hf``. Predicted, NOT measured: the README says which is which.

    python experiments/bench_gpu.py --out experiments/results/gpu-h100 --phase first      # seconds
    python experiments/bench_gpu.py --out experiments/results/gpu-h100 --phase costs      # then hf, ...
    python experiments/bench_gpu.py --smoke --out /tmp/bench-smoke --phase all            # tiny, CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing treespec

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers.generation import CompileConfig  # noqa: E402

import treespec  # noqa: E402
from treespec.calibrate.acceptance import MeasuredAcceptance  # noqa: E402
from treespec.calibrate.costs import choose_tree, draft_level_cost, measure_latency  # noqa: E402
from treespec.common.device import sync  # noqa: E402
from treespec.common.machine import device_name  # noqa: E402
from treespec.common.files import write_json  # noqa: E402
from treespec.core import compiled, compiling  # noqa: E402

# Qwen2.5-Coder-{1.5B,0.5B}-Instruct (HF config.json; the GGUF-dequantised copies agree except that
# they untie the LM head, which does not change the cost of a forward).
REAL = {
    "target": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                   intermediate_size=8960),
    "draft": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, use_sliding_window=False)
TINY = {
    "target": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128),
    "draft": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64),
}
# untied: a tiny random model with a tied head repeats its last token, and every draft then agrees
TINY_COMMON = dict(COMMON, vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False)
CHAIN = [(0,) * k for k in range(1, 5)]  # a rank-0 chain of depth 4 ...
CHECK_SHAPE = CHAIN + [(1,)]  # ... and a branch: draft = target accepts the whole chain every step
PHASES = ("first", "costs", "hf", "treespec", "validate", "predict")


def build(kind: str, tiny: bool, dtype: torch.dtype, device: torch.device, seed: int,
          layers: int | None = None) -> torch.nn.Module:
    """A Qwen2 model of the real (or tiny) ``kind`` config with random weights; ``layers`` overrides depth."""
    sizes = dict((TINY if tiny else REAL)[kind])
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    cfg = Qwen2Config(**sizes, **(TINY_COMMON if tiny else COMMON), attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype).eval()


def weak_draft(target: torch.nn.Module, layers: int, noise: float = 2.0, seed: int = 2) -> torch.nn.Module:
    """The target's first ``layers`` layers with its embeddings, final norm and head, every weight
    perturbed by Gaussian noise of ``noise`` times its tensor's std: a draft that agrees with the
    target sometimes, not always (random weights give no real draft; a truncated copy alone agrees
    almost always on tiny random models)."""
    settings = {**target.config.to_dict(), "num_hidden_layers": layers}
    settings.pop("layer_types", None)  # derived from the number of layers
    cfg = Qwen2Config(**settings)
    p = next(target.parameters())
    with torch.device(p.device):
        draft = Qwen2ForCausalLM(cfg).to(p.dtype).eval()
    draft.load_state_dict(target.state_dict(), strict=False)  # the missing layers are simply not copied
    g = torch.Generator(p.device).manual_seed(seed)
    with torch.no_grad():
        for w in draft.parameters():
            if w.numel() > 1:
                w.add_(noise * w.float().std().to(w.dtype) * torch.randn(w.shape, generator=g, device=w.device,
                                                                         dtype=w.dtype))
    return draft


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Bench:
    """The run's settings and models; builds each model once, when a phase first needs it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.tiny, self.device = args, args.smoke, torch.device(args.device)
        self.dtype = torch.float32 if self.tiny else torch.bfloat16
        self.backend, self.mode = ("aot_eager", None) if self.tiny else compiling.compile_options(True, self.device)
        self.compile = self.backend if self.tiny else True
        self._models: dict[str, torch.nn.Module] = {}
        g = torch.Generator().manual_seed(0)
        vocab = (TINY_COMMON if self.tiny else COMMON)["vocab_size"]
        self.prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]

    def model(self, name: str) -> torch.nn.Module:
        if name not in self._models:
            if name == "target":
                self._models[name] = build("target", self.tiny, self.dtype, self.device, 0)
            elif name == "draft":
                self._models[name] = build("draft", self.tiny, self.dtype, self.device, 1)
            elif name == "weak":
                target = self.model("target")
                self._models[name] = weak_draft(target, max(1, target.config.num_hidden_layers // 4))
            elif name == "target32":
                self._models[name] = build("target", self.tiny, torch.float32, self.device, 0)
        return self._models[name]

    def setup(self) -> dict[str, Any]:
        a = self.args
        return {"device": device_name(self.device), "torch": torch.__version__, "dtype": str(self.dtype),
                "smoke": self.tiny, "backend": self.backend, "mode": self.mode, "prompts": a.prompts,
                "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "budget": a.budget,
                "weights": "random (tiny configs)" if self.tiny else "random (real configs)"}


# -- phases ---------------------------------------------------------------------------------------


def phase_first(b: Bench) -> dict[str, Any]:
    """A tiny float32 model through the real compiled step on the device: equal to eager and to HF."""
    model = build("target", True, torch.float32, b.device, 0)
    weak = weak_draft(model, 1)  # partial agreement: steps of several lengths
    drafter = lambda: [treespec.ModelDrafter(weak, CHECK_SHAPE)]  # noqa: E731
    out: dict[str, Any] = {"cases": []}
    for prompt in ([1, 2, 3, 4, 5], list(range(20, 60))):
        t = time.perf_counter()
        comp = treespec.generate(model, prompt, drafter(), max_new_tokens=24, budget=8, compile=b.compile)
        seconds = time.perf_counter() - t
        eager = treespec.generate(model, prompt, drafter(), max_new_tokens=24, budget=8)
        with torch.inference_mode():
            hf = model.generate(torch.tensor([prompt], device=b.device), do_sample=False, max_new_tokens=24,
                                min_new_tokens=24, pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
        out["cases"].append({"prompt_len": len(prompt), "compiled_equals_eager": comp.new_tokens == eager.new_tokens,
                             "compiled_equals_hf": comp.new_tokens == hf, "seconds_with_compile": seconds,
                             "tau": comp.stats.tau})
    out["ok"] = all(c["compiled_equals_eager"] and c["compiled_equals_hf"] for c in out["cases"])
    return out


@torch.inference_mode()
def compiled_latency(b: Bench, model: torch.nn.Module, sizes: list[int], repeats: int) -> dict[int, float]:
    """t(n) of the compiled static-shape tree forward after ``prompt_len`` cached tokens."""
    context, out = b.args.prompt_len, {}
    for n in sizes:
        runner = compiled._Runner(model, compiled.round_up(context + n + 1, compiled.CAPACITY_BUCKET), n, b.backend,
                                  b.mode)
        runner.prefill(list(range(1, context + 2)))
        ids = torch.randint(0, model.config.vocab_size, (n,), device=b.device)
        depth = torch.arange(n, device=b.device)
        anc = torch.ones(n, n, dtype=torch.bool, device=b.device).tril()
        out[n] = timed(lambda: runner.forward(ids, depth, anc).clone(), b.device, repeats, warmup=3)
    return out


def phase_costs(b: Bench) -> dict[str, Any]:
    a, target, draft = b.args, b.model("target"), b.model("draft")
    eager_sizes = [1, 2, 4, 8] if b.tiny else list(range(1, 129))
    return {"t_eager": measure_latency(target, eager_sizes, context=a.prompt_len, repeats=a.repeats),
            "t_compiled": compiled_latency(b, target, a.compiled_sizes, a.repeats),
            "draft_level_eager": draft_level_cost(draft, tokens=4, context=a.prompt_len, repeats=a.repeats),
            "draft_level_compiled": compiled_latency(b, draft, [4], a.repeats)[4]}


def hf_generate(b: Bench, model: torch.nn.Module, compile: bool) -> dict[str, Any]:
    """HF ``generate`` greedy; eager (dynamic cache) or static cache + ``torch.compile``."""
    n = b.args.new_tokens
    kw: dict[str, Any] = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    if compile:
        cc = CompileConfig(fullgraph=True, backend=b.backend, mode=b.mode)
        cc._compile_all_devices = True  # HF compiles on CUDA only unless told
        kw.update(cache_implementation="static", compile_config=cc)
    model.generation_config.eos_token_id = None
    with torch.inference_mode():
        model.generate(torch.tensor([b.prompts[0]], device=b.device), **kw)  # warm-up (compiles)
        sync(b.device)
        t = time.perf_counter()
        for p in b.prompts:
            model.generate(torch.tensor([p], device=b.device), **kw)
        sync(b.device)
    seconds = time.perf_counter() - t
    return {"tokens": n * len(b.prompts), "seconds": seconds, "tok_s": n * len(b.prompts) / seconds}


def phase_hf(b: Bench) -> dict[str, Any]:
    return {"hf_generate_eager": hf_generate(b, b.model("target"), False),
            "hf_generate_static_compiled": hf_generate(b, b.model("target"), True)}


def treespec_run(b: Bench, target: torch.nn.Module, draft: torch.nn.Module, shape, compile) -> dict[str, Any]:
    """treespec on every prompt (one warm-up call first): tok/s, tau, sections, whole-chain steps."""
    n, budget = b.args.new_tokens, b.args.budget

    def one(p):
        return treespec.generate(target, p, [treespec.ModelDrafter(draft, shape)], max_new_tokens=n, budget=budget,
                                 compile=compile)

    one(b.prompts[0])
    sync(b.device)
    t = time.perf_counter()
    outs = [one(p) for p in b.prompts]
    sync(b.device)
    seconds = time.perf_counter() - t
    s = treespec.Stats.combined([o.stats for o in outs])
    depth = max(len(path) for path in shape)
    kept = [k for k, cut in zip(s.step_tokens, s.step_cut) if not cut]
    models = s.drafting_seconds + s.verifying_seconds
    return {"tokens": s.new_tokens, "steps": s.steps, "tau": s.tau, "seconds": seconds, "tok_s": s.new_tokens / seconds,
            "sections_seconds": {k: getattr(s, f"{k}_seconds") for k in ("prefill", "drafting", "verifying", "overhead")},
            "accepted_hist": s.accepted_hist, "uncut_steps": len(kept),
            "uncut_steps_committing_whole_chain": sum(k == depth + 1 for k in kept),
            # drafting includes the draft model's host loop: the engine's own share is overhead / step time
            "engine_share_of_step": s.overhead_seconds / max(models + s.overhead_seconds, 1e-12)}


def phase_treespec(b: Bench) -> dict[str, Any]:
    shape = CHAIN + [(1,), (0, 1)]
    runs = {}
    for name in ("weak", "draft"):
        for mode, comp in (("eager", False), ("compiled", b.compile)):
            runs[f"treespec_{mode}_{'weak' if name == 'weak' else 'random'}_draft"] = treespec_run(
                b, b.model("target"), b.model(name), shape, comp)
    return runs


def phase_validate(b: Bench) -> dict[str, Any]:
    """draft = target, float32: every uncut step accepts the whole chain; compiled output == eager."""
    target = b.model("target32")
    out: dict[str, Any] = {}
    for mode, comp in (("eager", False), ("compiled", b.compile)):
        r = treespec_run(b, target, target, CHECK_SHAPE, comp)
        share = r["uncut_steps_committing_whole_chain"] / max(r["uncut_steps"], 1)
        out[mode] = {"tau": r["tau"], "expected_tau": 5.0, "steps_accepting_whole_chain": share, "ok": share == 1.0}
    same = [treespec.generate(target, b.prompts[0], [treespec.ModelDrafter(target, CHECK_SHAPE)],
                              max_new_tokens=b.args.new_tokens, budget=b.args.budget, compile=c).new_tokens
            for c in (False, b.compile)]
    out["compiled_equals_eager_greedy"] = same[0] == same[1]
    return out


def phase_predict(b: Bench, done: dict[str, Any]) -> dict[str, Any]:
    """choose_tree on each shipped acceptance vector with each cost model (predicted, NOT measured)."""
    if "costs" not in done or "hf" not in done:
        raise SystemExit("phase predict needs the results of phases costs and hf: run them first")
    c = done["costs"]
    lat_e = {int(k): v for k, v in c["t_eager"].items()}
    lat_c = {int(k): v for k, v in c["t_compiled"].items()}
    budgets = [b.args.budget] if b.tiny else list(range(1, 129))
    out = {}
    for path in sorted((ROOT / "treespec" / "data").glob("acceptance-*.json")):
        acc, rows = MeasuredAcceptance.load(path), {}
        for name, lat, level in (("eager", lat_e, c["draft_level_eager"]),
                                 ("compiled target, eager draft levels", lat_c, c["draft_level_eager"]),
                                 ("compiled target and draft levels", lat_c, c["draft_level_compiled"])):
            ch = choose_tree(acc, lat, level, budgets=[x for x in budgets if x <= max(lat)], max_depth=10)
            rows[name] = {"budget": ch.budget, "depth": ch.depth, "tau": ch.tau, "speedup_vs_own_decode": ch.speedup,
                          "tok_s": ch.speedup / lat[1], "c": ch.c}
        out[path.stem] = rows
    return out


# -- results: written after every phase -----------------------------------------------------------


def save(out: Path, results: dict[str, Any]) -> None:
    """``results.json`` (atomically) and ``README.md`` from whatever phases have finished."""
    write_json(out / "results.json", results, default=float)
    (out / "README.md").write_text(report(results))


def report(r: dict[str, Any]) -> str:
    s, ph = r["setup"], r["phases"]
    lines = [f"# GPU protocol: {s['device']}, {s['dtype']}, torch {s['torch']}"
             + (" (SMOKE: tiny models)" if s["smoke"] else ""), "",
             f"Models: {s['weights']}; {s['prompts']} random prompts of {s['prompt_len']} tokens, {s['new_tokens']} "
             f"new tokens each; treespec budget {s['budget']}; compile backend {s['backend']} mode {s['mode']}. "
             f"Phases done: {', '.join(p for p in PHASES if p in ph) or 'none'}.", ""]
    if "first" in ph:
        lines += [f"First compiled run (tiny float32 model, real backend): ok = {ph['first']['ok']} "
                  f"({json.dumps(ph['first']['cases'])})", ""]
    if "costs" in ph:
        c = ph["costs"]
        lines += ["## Measured costs", "", "| t(n) | eager ms | compiled ms |", "|---|---|---|"]
        lines += [f"| {k} | {c['t_eager'].get(k, float('nan')) * 1e3:.2f} | {v * 1e3:.2f} |"
                  for k, v in c["t_compiled"].items()]
        lines += ["", f"Draft level (4 nodes): eager {c['draft_level_eager'] * 1e3:.2f} ms, compiled "
                  f"{c['draft_level_compiled'] * 1e3:.2f} ms.", ""]
    runs = {**ph.get("hf", {}), **ph.get("treespec", {})}
    if runs:
        lines += ["## Measured tok/s", "", "| run | tok/s | tau | engine share of a step |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['tok_s']:.1f} | {v.get('tau', 1.0):.2f} | {v.get('engine_share_of_step', float('nan')):.3f} |"
                  for k, v in runs.items()]
        lines += ["", "Random weights: the random draft is accepted at about chance and the weak draft (the target's "
                  "first layers) partly; these rows measure cost, not the real pair's speed-up.", ""]
    if "validate" in ph:
        lines += [f"Validation (draft = target, float32): {json.dumps(ph['validate'])}", ""]
    if "predict" in ph and "hf" in ph:
        hf_e, hf_c = ph["hf"]["hf_generate_eager"]["tok_s"], ph["hf"]["hf_generate_static_compiled"]["tok_s"]
        lines += ["## Predicted for the real pair (shipped acceptance vectors, measured costs; NOT measured)", "",
                  "| acceptance | cost model | budget | depth | tau | speedup vs own decode | tok/s | vs HF eager | "
                  "vs HF static+compile |", "|---|---|---|---|---|---|---|---|---|"]
        for acc, rows in ph["predict"].items():
            for cm, p in rows.items():
                lines.append(f"| {acc} | {cm} | {p['budget']} | {p['depth']} | {p['tau']:.2f} | "
                             f"{p['speedup_vs_own_decode']:.2f} | {p['tok_s']:.1f} | {p['tok_s'] / hf_e:.2f}x | "
                             f"{p['tok_s'] / hf_c:.2f}x |")
        lines += ["", "Predicted tok/s = G(n, d) / (t(n) + draft levels), from this machine's measured costs; the "
                  "engine's own time is not in the prediction (see the measured engine share).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for results.json and README.md (resumed)")
    ap.add_argument("--phase", choices=(*PHASES, "all"), default="all", help="which phase to run (default: all)")
    ap.add_argument("--smoke", action="store_true", help="tiny models (CPU by default, aot_eager): checks the script")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=32, help="tree budget of the treespec tok/s runs")
    ap.add_argument("--compiled-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        args.prompts, args.prompt_len, args.new_tokens, args.budget, args.repeats = 2, 16, 12, 8, 2
        args.compiled_sizes = [1, 4, 8]
    b, out = Bench(args), Path(args.out)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    results = {"setup": b.setup(), "phases": results.get("phases", {})}
    phases = {"first": phase_first, "costs": phase_costs, "hf": phase_hf, "treespec": phase_treespec,
              "validate": phase_validate, "predict": lambda bench: phase_predict(bench, results["phases"])}
    for name in PHASES if args.phase == "all" else (args.phase,):
        t = time.perf_counter()
        print(f"phase {name} ...", flush=True)
        results["phases"][name] = phases[name](b)
        results["phases"][name + "_seconds"] = time.perf_counter() - t
        save(out, results)
        print(f"phase {name} done in {time.perf_counter() - t:.0f} s; written to {out}", flush=True)
    return results


if __name__ == "__main__":
    main()
