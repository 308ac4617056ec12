"""How a step's tree was drafted, read off its proposals, and which constructions a rule is exact for.

``treespec.core.verifiers`` declares, for each verification rule, the constructions it is proven
exact for; ``classify`` reads the construction of a tree so that ``generate`` can refuse a rule
on a tree it is not exact for (``docs/verifiers.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .drafting import POINT_MASS
from .tree import Proposal, TokenTree


@dataclass(frozen=True)
class Construction:
    """How one step's tree was drafted, read off the proposals in the trie.

    ``draws``: ``point_mass`` (every proposal deterministic: top-k, n-gram, dynamic trees),
    ``without_replacement`` (at every node, draws from one ``q`` with the earlier siblings removed),
    ``iid`` (at every node, i.i.d. draws from one ``q``; duplicates merged in the trie), ``sampled``
    (every node has one sampled proposal, so both of the previous readings hold) or ``mixed``.
    """

    draws: str
    drafters: int  # drafters with proposals in the tree
    chain: bool  # every node has at most one proposal
    merged: bool  # some node's child has several proposals
    truncated: bool  # the budget dropped proposals

    def describe(self) -> str:
        draws = {"point_mass": "point-mass proposals", "without_replacement": "draws without replacement",
                 "iid": "i.i.d. draws", "sampled": "one sampled proposal per node",
                 "mixed": "a mix of proposal kinds or of draft distributions"}[self.draws]
        bits = [draws, f"{self.drafters} drafter{'s' * (self.drafters != 1)}"]
        bits += ["a chain"] if self.chain else []
        bits += ["merged duplicates"] if self.merged else []
        bits += ["cut by the budget"] if self.truncated else []
        return ", ".join(bits)


def of_static_shape(mode: str, chain: bool) -> Construction:
    """The construction of a static shape drafted whole by one model drafter in ``mode`` (``topk``: point masses;
    ``sample_without_replacement``: draws without replacement, one per node on a ``chain``), no duplicates merged,
    no budget cut: what the captured step drafts, known before any step."""
    draws = "point_mass" if mode == "topk" else "sampled" if chain else "without_replacement"
    return Construction(draws, 1, chain, merged=False, truncated=False)


def classify(tree: TokenTree, truncated: bool = False) -> Construction:
    """The :class:`Construction` of ``tree`` (``truncated``: the budget dropped proposals)."""
    kinds = {"point_mass", "without_replacement", "iid"}
    chain, merged, drafters = True, False, set()
    for props in tree.proposals:
        if not props:
            continue
        chain &= len(props) == 1
        merged |= len({p.child for p in props}) < len(props)
        drafters |= {p.drafter for p in props}
        if all(p.row == POINT_MASS for p in props):
            kinds &= {"point_mass"}
            continue
        if not all(_same_q(props[0], p) for p in props[1:]):
            kinds = set()
            continue
        tokens = [p.token for p in props]
        node_kinds = {"iid"} if all(not p.exclude for p in props) else set()
        if all(sorted(p.exclude) == sorted(tokens[:j]) for j, p in enumerate(props)):
            node_kinds.add("without_replacement")
        kinds &= node_kinds
    if kinds == {"without_replacement", "iid"}:
        draws = "sampled"
    elif len(kinds) == 1:
        draws = next(iter(kinds))
    else:  # empty (mixed), or all three (a tree without proposals: nothing to verify)
        draws = "mixed" if not kinds else "point_mass"
    return Construction(draws, len(drafters), chain, merged, truncated)


def _same_q(a: Proposal, b: Proposal, atol: float = 1e-6) -> bool:
    """Both sampled by one drafter from one distribution. A drafter computes the ``q`` of a context
    once per tree node, so siblings merged into one node carry equal rows computed at different
    batch positions; they count as one ``q`` when they agree to ``atol`` (float rounding)."""
    if a.row == POINT_MASS or b.row == POINT_MASS or a.drafter != b.drafter:
        return False
    if a.dists is b.dists and a.row == b.row:
        return True
    return bool((a.dists[a.row] - b.dists[b.row].to(a.dists.device)).abs().max() <= atol)


def every_construction(c: Construction) -> bool:
    """Exact for every tree: each proposal carries the ``q`` it was drawn from."""
    return True  # every proposal carries the q it was drawn from (docs/design.md, "Exactness rule")


def chain_only(c: Construction) -> bool:
    """Exact for chains (one proposal per node)."""
    return c.chain


def iid_uncut(c: Construction) -> bool:
    """One drafter's i.i.d. draws with every duplicate kept, not cut by the budget."""
    # K-SEQ needs, at every node, a fixed number of i.i.d. draws from one q; a budget cut that
    # depends on merged duplicates makes that number depend on the draws' values.
    return c.drafters <= 1 and c.draws in ("iid", "sampled") and not c.truncated
