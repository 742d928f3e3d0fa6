"""Whether a rollout's log-probabilities are those of the versions it claims: one claimed version, or a span of them.

    m = match([scores under v_start, ..., scores under v_end], their_logprobs, tolerance)
    m.ok, m.worst, m.at, m.version                 # passed?, its worst |difference|, where, under which claimed version

A rollout stamped v_start..v_end says its engine's adapter was replaced while it was generated: its first tokens were
sampled under v_start, later ones under later versions, never an earlier one again. So each token must match one
claimed version within the tolerance, and the versions matched must not go back (v_start, v_start, v_start + 1, ...).
Greedily taking, token by token, the oldest version not older than the last one taken that matches finds such an
assignment whenever one exists (any valid assignment takes, at each token, a version at least as new as the greedy
one). One claimed version is the plain per-token check. The sampling test then uses each token's assigned version.
"""
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Match:
    """ok: every token matches a claimed version, in order. worst: passed, the largest per-token difference under the
    assignment; failed, the worst token's smallest difference over the claimed versions (inf: the lengths differ).
    at: that token; version: the index (into the claimed versions) that comes closest there. lp, mean, var: passed,
    each token's log-probability and sampling moments under its assigned version; diffs: its differences."""

    ok: bool
    worst: float
    at: int = 0
    version: int = 0
    diffs: torch.Tensor | None = None
    lp: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    var: torch.Tensor | None = None


def match(scored, theirs: torch.Tensor, tolerance: float) -> Match:
    """Match `theirs` (a site's per-token log-probabilities) against `scored`, one (lp, mean, var) per claimed version,
    oldest first (replica/forward.py completion_scores)."""
    if any(lp.shape != theirs.shape for lp, _, _ in scored):
        return Match(False, math.inf)
    if not theirs.numel():
        return Match(True, 0.0, diffs=theirs, lp=theirs, mean=theirs, var=theirs)
    diff = torch.stack([(lp - theirs).abs() for lp, _, _ in scored])    # [versions, tokens]
    fits = (diff <= tolerance).tolist()
    pick, cur = [], 0
    for t in range(diff.shape[1]):
        while cur < len(scored) and not fits[cur][t]:
            cur += 1
        if cur == len(scored):
            return _failed(diff, t, pick[-1] if pick else 0, tolerance)
        pick.append(cur)
    cols = torch.arange(diff.shape[1])
    rows = torch.tensor(pick)
    chosen = diff[rows, cols]
    lp, mean, var = (torch.stack([s[k] for s in scored])[rows, cols] for k in range(3))
    at = int(chosen.argmax())
    return Match(True, float(chosen[at]), at, pick[at], chosen, lp, mean, var)


def _failed(diff: torch.Tensor, t: int, lo: int, tolerance: float) -> Match:
    """A failed match's evidence: its worst token over the best claimed version per token; if every token has a version
    within the tolerance (they fit only out of order), the token `t` where the order broke, from version `lo` on."""
    best, which = diff.min(0)
    at = int(best.argmax())
    if not float(best[at]) <= tolerance:
        return Match(False, float(best[at]), at, int(which[at]))
    j = lo + int(diff[lo:, t].argmin())
    return Match(False, float(diff[j, t]), t, j)
