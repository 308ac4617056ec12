"""The trees the protocol runs: phase first's check shapes, phase treespec's Sequoia trees, phase sweep's
families and their envelope."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tree_builders.budgeted import for_budget
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.core.buffers import Envelope

if TYPE_CHECKING:
    from .bench import Bench

CHAIN = [(0,) * k for k in range(1, 5)]  # a rank-0 chain of depth 4 ...
CHECK_SHAPE = CHAIN + [(1,)]  # ... and a branch: draft = target accepts the whole chain every step
SECOND_SHAPE = [(0,), (1,), (2,), (0, 0), (1, 0)]  # phase first's second tree, in the same envelope
FIRST_ENVELOPE = Envelope.for_shapes([CHECK_SHAPE, SECOND_SHAPE])

SWEEP_FAMILIES = {  # name -> (builder, for_budget keyword arguments)
    "sequoia-d8": ("sequoia", dict(max_depth=8)),  # the CPU's kind of tree (deep)
    "sequoia-d4": ("sequoia", dict(max_depth=4)),
    "chain": ("chain", dict(max_depth=8)),
    "kary-2": ("kary", dict(kary_width=2, max_depth=8)),
    "kary-4": ("kary", dict(kary_width=4, max_depth=8)),
    "sequoia-w2": ("sequoia", dict(max_depth=6, max_width=2)),
}


def step_shapes(b: Bench, acc: MeasuredAcceptance) -> dict[int, Any]:
    """The product's kind of tree for each ``--step-budgets`` budget: Sequoia's DP on ``acc``'s per-depth rows."""
    return {n: for_budget("sequoia", n, acc.matrix, max_depth=b.args.max_depth) for n in b.args.step_budgets}


def sweep_shapes(b: Bench, acc: MeasuredAcceptance) -> tuple[dict[str, Any], Envelope]:
    """Phase sweep's tree shapes (``SWEEP_FAMILIES`` x ``--sweep-budgets``) and their envelope, widened so that a
    device-sized tree fits it too (phase levels times its levers in this envelope, so that the sweep under the
    lever the levels phase ran last replays that lever's graphs)."""
    a = b.args
    shapes = {f"{name}-B{budget}": for_budget(builder, budget, acc.matrix, **kw)
              for budget in a.sweep_budgets for name, (builder, kw) in SWEEP_FAMILIES.items()
              if not a.sweep_families or name in a.sweep_families}
    env = Envelope.for_shapes(shapes.values())
    room = (max(a.sweep_budgets), 4, 4) if b.tiny else (64, 16, 8)  # nodes, rows, children a device tree may take
    env = Envelope(max(env.nodes, room[0]), (max(max(env.rows), room[1]),) * env.depth, max(env.children, room[2]))
    return shapes, env
