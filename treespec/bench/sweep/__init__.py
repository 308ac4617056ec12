"""Tree-budget sweeps and comparisons: the research harness behind ``treespec sweep``.

Modules: ``config`` (TOML -> validated dict), ``points`` (the grid, point keys, a point's recipe),
``models`` (the pair's models, loaded once), ``runner`` (timed calls, the resumable loop),
``distributed`` (the same loop's points on Ray workers, one device each), ``records``
(``results.jsonl``), ``lock`` (one writer per directory, the config fingerprint), ``paths`` (the names of
what a sweep writes), ``figures`` (intervals and checks over records), ``report`` (the plots: ``report.report``),
``markdown`` (the README summary), ``cli`` (``treespec sweep``).

A sweep runs a grid of *points* described by a TOML config (``experiments/configs/*.toml``) and
appends one JSON record per finished point to ``<out>/results.jsonl``. A point is either

* a **treespec** point: ``treespec.run`` of the point's recipe over every evaluation prompt with one drafter set
  (``model``, ``ngram`` or ``both``), one tree builder and one budget, depth limit, temperature,
  top-p and seed; or
* a **baseline** point: HuggingFace ``generate`` on the same prompts: the target alone
  (``target``), assisted generation with the same draft (``assisted``, ``assistant_model=``; one point per setting
  of ``baselines.assisted``, by default HF's own and a constant 1, 2, 3, 4 or 6 drafted tokens, and speedups over
  the fastest of them on the same prompts) or prompt lookup (``prompt_lookup``, ``prompt_lookup_num_tokens=``; one
  point per length of ``baselines.prompt_lookup_num_tokens``, by default 2, 4 and 10, compared by the fastest).

Fair comparisons. Every method generates exactly ``max_new_tokens`` tokens per prompt: treespec
runs with ``eos_token_id=None`` and HF with ``min_new_tokens=max_new_tokens`` and an empty
``eos_token_id`` list (HF would otherwise merge in the model's eos and *suppress* it, which changes
greedy outputs). Each model's own ``generation_config`` is replaced by a neutral one, so no
repetition penalty, top-k or other default of a checkpoint leaks into a baseline. The counts are
checked; a speedup is recorded only when every prompt of both methods has the full count.
Each point starts with an untimed warm-up (``run.warmup_tokens`` tokens after the last 32 tokens of
the first evaluation prompt); every timed call is wrapped in ``torch.cuda.synchronize()`` on CUDA.
Speedup over a baseline is its total wall time divided by the point's, for the same prompts, token
counts, temperature, top-p and seed, measured on the same machine. Records name their machine
(CPU model with family/model/stepping numbers, or the GPU) and keep its load average: a sweep
resumed on another host (a cloud VM can come back on a CPU generation 1.7x faster) or run beside
other processes skews every timing, so a point is never paired with another machine's baseline.
Greedy points also record how many prompts produced exactly the target baseline's tokens (an
exactness check; in bf16/fp16 near-ties can legitimately differ).

How a treespec point becomes drafters: its builder, budget ``B``, depth limit ``D`` (``"none"`` =
no limit), temperature, top-p, verifier, compile mode, ``grid.model_mode`` (``"auto"`` = the rule) and n-gram
options form a ``treespec.recipes.Recipe``, run by ``treespec.run`` as ``treespec generate`` and
``treespec demo`` run theirs (see that module for the rules: drafting mode, trees from
``tree_builders.for_budget``, how the n-gram drafter shares ``B`` with the model's tree). At T=0 a point runs
under one verifier (``rrs`` where ``grid.verifiers`` has it, else the first): greedy acceptance is the target's
argmax whatever the verifier, so the others would repeat it token for token. Options of the
builders come from the ``shapes`` table (``kary_width``, ``chains``, ``dynamic_depth``, ``dynamic_topk``). In
``both`` the n-gram drafter reserves part of ``B`` and the model's tree is sized for the rest; the step never
verifies more than ``B`` tokens. For ``drafters = "ngram"`` the builder axis does not apply
(builder ``"ngram"``).

Acceptance vectors (``treespec.calibrate.acceptance.measure``) are measured once per (pair, dataset, mode,
temperature, top-p) on the calibration prompts, cached as ``acceptance-<hash>.json`` in the output
directory, and always read back from that file. Static-shape points record the tau the vector
predicts (``TreeShape.expected_tokens``) beside the measured tau, and ``replayed_tau``: the point's
tree run over the calibration walk's ranks (``MeasuredAcceptance.replayed_tau``).

Datasets (``treespec.bench.datasets``): ``humaneval`` (164 code prompts) and ``lee-news`` (leads of the
Lee news articles shipped in the PyPI package ``gensim``).
Calibration and evaluation ranges (``"start:stop"``) must be disjoint: overlapping ranges or a
shared prompt text raise. Prompts are fed raw, without a chat template (both models are treated as
text continuers, which is what HumanEval prompts are written for); ``data.max_prompt_tokens`` keeps
the last tokens of longer prompts.

Resuming: a point's key is a hash of all its parameters (device and dtype included; timings and
warm-up excluded). Re-running a config skips points already in ``results.jsonl`` (a greedy record under
another verifier stands for the greedy point the grid keeps: ``points.finished``, which the loop, ``--dry-run``,
the output lock and the report all read); records are
written with flush + fsync as each point finishes, so Ctrl-C or a crash loses only the point in
progress. A point that raises is written with ``"status": "error"`` and retried on the next run; one whose
verifier is not exact for its tree (``NotExactError``) or, under ``run.compile``, runs on the host only
(``points.Refused``) is marked ``"refused"`` too, since a re-run fails the same way (``points.verifier_refusal``
and ``points.compile_refusal`` tell it before any model loads where the config alone decides it, and
``--dry-run`` names it), and is recorded once (a later run refusing it for the same reason says so and writes
nothing). The report lists the errors of points taken out of the grid since apart, as not run again.

Model names: anything ``treespec.models.load`` accepts, or an in-process tiny random model for tests
(``treespec.models.tiny.tiny_from_spec``): ``"tiny:llama:seed=0"`` /
``"tiny:qwen2:seed=0:vocab=64:hidden=32:layers=2:scale=4"``, and a draft correlated with it
``"tiny:llama:seed=0:noise=0.3"`` (the same model plus Gaussian weight noise, ``noise_seed`` 1 by
default). Tiny models read text as UTF-8 bytes modulo their vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...common import lazy

#: the public names, each imported from its module when first read (``treespec sweep --help`` imports no torch);
#: the report is ``report.report`` (a name of the package's own would be its module once that is imported)
_HOMES = {
    **dict.fromkeys(["BASELINES", "BUILDERS", "DEFAULTS", "DRAFTER_SETS", "calib_eval_prompts", "load_config", "pairs",
                     "split_ranges"], ".config"),
    **dict.fromkeys(["Point", "acceptance_params", "enumerate_points", "point_key", "point_recipe"], ".points"),
    **dict.fromkeys(["TIMING_FIELDS", "append_record", "comparable", "read_records"], ".records"),
    "RESULTS": ".paths", "main": ".cli", "load_model": ".models", "sweep": ".loop", "Sweep": ".runner",
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy.exports(__name__, _HOMES)

if TYPE_CHECKING:  # what a type checker and an IDE see: the same names, imported eagerly (``X as X``: re-exported)
    from .cli import main as main
    from .config import (BASELINES as BASELINES, BUILDERS as BUILDERS, DEFAULTS as DEFAULTS,
                         DRAFTER_SETS as DRAFTER_SETS, calib_eval_prompts as calib_eval_prompts,
                         load_config as load_config, pairs as pairs, split_ranges as split_ranges)
    from .loop import sweep as sweep
    from .models import load_model as load_model
    from .paths import RESULTS as RESULTS
    from .points import (Point as Point, acceptance_params as acceptance_params, enumerate_points as enumerate_points,
                         point_key as point_key, point_recipe as point_recipe)
    from .records import (TIMING_FIELDS as TIMING_FIELDS, append_record as append_record, comparable as comparable,
                          read_records as read_records)
    from .runner import Sweep as Sweep
