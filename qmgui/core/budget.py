"""The VRAM budget: which running models to stop so that a new one fits.

The policy, as a pure function over values:
- a pinned model is never stopped;
- stop as few models as possible, because every stopped engine costs its users a reload;
- among equally few, stop the least recently used (compared oldest first), because that is
  the engine least likely to be asked for next;
- "fits" means what `placement.place` says with the models that keep running charged against
  their cards, so starting a model and planning a layout can never disagree;
- when it does not fit even with every unpinned model stopped, say so with the placement's
  reason, and stop nothing.

Up to `EXHAUSTIVE_LIMIT` unpinned residents every candidate set is tried, smallest first; with
more, the search takes the least recently used in turn until the model fits and then keeps
running any of those whose stop turned out not to be needed (newest first), which leaves no
stop wasted but may stop more than the fewest in contrived mixes of sizes and cards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from qmgui.core import footprint as _footprint
from qmgui.core.fit import DEFAULT_GPU_RESERVE
from qmgui.core.footprint import Footprint, Gpu
from qmgui.core.placement import Estimator, Placement, Request, memoized, place

# 2**10 candidate sets at most; an engine panel rarely shows more than a handful of engines
EXHAUSTIVE_LIMIT = 10


@dataclass(frozen=True)
class Resident:
    """A model that is running: what it holds per device, when it last served, and whether
    the user pinned it (never stopped to make room)."""

    name: str
    footprint: Footprint
    last_used: float  # any clock; only the order matters
    pinned: bool = False


@dataclass(frozen=True)
class StartPlan:
    """What starting a model takes: `stop` these first (oldest first), then launch it as
    `placement` says."""

    fits: bool
    stop: tuple[str, ...]
    placement: Placement  # the new model, against the residents that keep running
    reason: str | None = None  # why it cannot fit, even with every unpinned model stopped
    notes: tuple[str, ...] = field(default=())


def _occupied(residents: Sequence[Resident]) -> dict[str, int]:
    used: dict[str, int] = {}
    for r in residents:
        for d in r.footprint.devices:
            used[d.name] = used.get(d.name, 0) + d.total
    return used


def plan_start(
    request: Request,
    residents: Sequence[Resident],
    gpus: Sequence[Gpu],
    *,
    reserve: int = DEFAULT_GPU_RESERVE,
    host_bytes: int | None = None,
    estimate: Estimator = _footprint.estimate,
) -> StartPlan:
    """Which residents to stop so `request` fits (policy in the module docstring).

    `gpus` give what the cards offer qmgui's engines with the residents' memory counted as
    free (a live reading's free memory plus what the residents hold, or a what-if card): the
    residents are charged on top. A resident with the request's name is its earlier launch,
    which the start replaces: its memory counts as free and it is not listed in `stop`."""
    notes: list[str] = []
    others = [r for r in residents if r.name != request.name]
    if len(others) != len(residents):
        notes.append(f"replaces the running {request.name}")
    sizing = memoized(estimate)

    def attempt(stopped: frozenset[str], *, grow: bool = False) -> Placement:
        kept = [r for r in others if r.name not in stopped]
        return place(
            [request],
            gpus,
            reserve=reserve,
            host_bytes=host_bytes,
            occupied=_occupied(kept),
            grow_context=grow,
            estimate=sizing,
        )

    def done(stopped: Sequence[Resident]) -> StartPlan:
        final = attempt(frozenset(r.name for r in stopped), grow=True)
        return StartPlan(True, tuple(r.name for r in stopped), final, notes=tuple(notes))

    if attempt(frozenset()).fits:
        return done(())
    candidates = sorted((r for r in others if not r.pinned), key=lambda r: (r.last_used, r.name))
    everyone = attempt(frozenset(r.name for r in candidates))
    if not everyone.fits:
        pinned = len(others) - len(candidates)
        reason = everyone.unplaced[0].reason
        if candidates:
            kept = f", {pinned} pinned kept running" if pinned else ""
            reason += f" (even with {len(candidates)} running models stopped{kept})"
        elif pinned:
            reason += f" (the {pinned} running models are pinned)"
        return StartPlan(False, (), everyone, reason=reason, notes=tuple(notes))

    def fits(stopped: Sequence[Resident]) -> bool:
        return attempt(frozenset(r.name for r in stopped)).fits

    found = _fewest(candidates, fits) if len(candidates) <= EXHAUSTIVE_LIMIT else None
    return done(found if found is not None else _greedy(candidates, fits))


def _fewest(
    candidates: Sequence[Resident], fits: Callable[[Sequence[Resident]], bool]
) -> tuple[Resident, ...] | None:
    """The smallest set that fits; among as small, the oldest first (`combinations` of the
    oldest-first list come in that order)."""
    for k in range(1, len(candidates) + 1):
        for combo in combinations(candidates, k):
            if fits(combo):
                return combo
    return None


def _greedy(
    candidates: Sequence[Resident], fits: Callable[[Sequence[Resident]], bool]
) -> list[Resident]:
    """The oldest in turn until it fits, then give back every stop not needed, newest first."""
    stopped: list[Resident] = []
    for r in candidates:
        stopped.append(r)
        if fits(stopped):
            break
    for r in reversed(tuple(stopped)):
        without = [x for x in stopped if x is not r]
        if fits(without):
            stopped = without
    return stopped
