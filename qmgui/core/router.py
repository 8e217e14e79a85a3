"""How many models a llama.cpp router may hold loaded at once (`--models-max`).

The rule: each model is sized at the settings its own launch would get (its saved profile on
the same command line), on the same cards, with `fit.charged` per device (mapped weights on
the host are page cache, not charged). Models are taken largest first (by what they charge in
all), and `--models-max` is the largest k for which the k largest fit *together*: on every
device, the sum of what they charge is within the budget's limit (available memory less the
reserve on a GPU; host RAM when given). Any k models then fit, since no k of them are larger
than the k largest. It is at least 1 (the router must load something; a model that does not
fit alone fails its own load and says why) and at most the number of models. A model that
cannot be sized (no header) charges nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qmgui.core.fit import Budget, charged
from qmgui.core.footprint import Footprint
from qmgui.core.launch import LaunchSettings


@dataclass(frozen=True)
class Sized:
    """One model of a router, as its own launch would size it (None: it cannot be sized)."""

    name: str
    settings: LaunchSettings
    footprint: Footprint | None


def _charges(m: Sized) -> dict[str, int]:
    if m.footprint is None:
        return {}
    return {d.name: charged(d, m.settings) for d in m.footprint.devices}


def models_max(models: Sequence[Sized], budget: Budget) -> int:
    """The largest k such that the k largest models fit together in `budget` (module rule)."""
    if not models:
        return 1
    order = sorted((_charges(m) for m in models), key=lambda c: -sum(c.values()))
    used: dict[str, int] = {}
    best = 0
    for k, charge in enumerate(order, start=1):
        for device, n in charge.items():
            used[device] = used.get(device, 0) + n
        if any(
            (limit := budget.limit(device)) is not None and n > limit for device, n in used.items()
        ):
            break
        best = k
    return max(best, 1)
