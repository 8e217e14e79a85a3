"""Starting one more engine within the memory of this machine: whom to stop first, and why.

`start_decision` asks `core.budget.plan_start` with the engines this window runs as residents
(their planned footprints; the least recently used is the one whose log went quiet first;
models the user pinned are never chosen). The cards offer what NVML says is free now plus what
qmgui's engines hold, because those are charged again as residents. No Qt here: the window
calls it on a worker thread and acts on the answer on the GUI thread.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from qmgui.core.budget import Resident, plan_start
from qmgui.core.errors import SizingError
from qmgui.core.footprint import CPU, Gpu, estimate
from qmgui.core.placement import Request
from qmgui.core.units import MIB, format_bytes
from qmgui.service.role_sets import with_projectors
from qmgui.ui.hardware import Hardware
from qmgui.ui.occupancy import EngineLoad, LiveReading, free_for_plan
from qmgui.ui.planning import PlanOutcome


@dataclass(frozen=True)
class StartDecision:
    """Stop `stop` (engine ids) first, then start. `message` says what and why (None when
    nothing is stopped and nothing is in doubt); `fits` False: not even with every unpinned
    engine stopped (nothing is stopped then; the start goes ahead and may fail)."""

    stop: tuple[int, ...]
    fits: bool
    message: str | None = None


def _resident_name(load: EngineLoad) -> str:
    return f"{load.name} (engine {load.key})"


def _offered(hw: Hardware, live: LiveReading | None, loads: Sequence[EngineLoad]) -> list[Gpu]:
    """Each card's free memory now, plus what qmgui's engines hold there (charged again)."""
    out = []
    for g in free_for_plan(hw.gpus, live):
        held = sum(load.bytes_on(g.name) for load in loads)
        free = None if g.free_bytes is None else min(g.total_bytes, g.free_bytes + held)
        out.append(Gpu(g.name, g.total_bytes, free, g.backend))
    return out


def _host_offered(
    live: LiveReading | None, hw: Hardware, loads: Sequence[EngineLoad]
) -> int | None:
    if live is None or live.host_total is None or live.host_used is None:
        return hw.host_bytes
    held = sum(load.bytes_on(CPU) for load in loads)
    return max(0, live.host_total - live.host_used + held)


def start_decision(
    outcome: PlanOutcome,
    loads: Sequence[EngineLoad],
    *,
    pinned: Collection[str],
    live: LiveReading | None,
    reserve_mib: int,
) -> StartDecision:
    """Whom to stop so that `outcome`'s launch fits next to the running engines."""
    entry = outcome.entry
    if not loads or outcome.fit is None or entry.meta is None or outcome.hardware.what_if:
        return StartDecision((), True)
    by_name = {_resident_name(load): load for load in loads}
    residents = [
        Resident(
            name,
            load.footprint,
            load.last_used,
            pinned=load.model_id in pinned,
        )
        for name, load in by_name.items()
        if load.footprint is not None
    ]
    request = Request(f"{entry.name} (new)", entry.meta, settings=outcome.settings)
    hw = outcome.hardware
    # the new model with the projector its plan charged (read on the planner's worker)
    projectors = {id(entry.meta): outcome.mmproj} if outcome.mmproj is not None else {}
    try:
        plan = plan_start(
            request,
            residents,
            _offered(hw, live, loads),
            reserve=reserve_mib * MIB,
            host_bytes=_host_offered(live, hw, loads),
            estimate=with_projectors(estimate, projectors),
        )
    except SizingError as e:
        return StartDecision((), False, f"{entry.name}: could not check the memory budget ({e})")
    if not plan.fits:
        return StartDecision(
            (),
            False,
            f"{entry.name} may not fit next to the running engines: {plan.reason}. "
            "Nothing was stopped; stop an engine or unpin one to make room.",
        )
    if not plan.stop:
        return StartDecision((), True)
    stopped = [by_name[n] for n in plan.stop]
    need = outcome.fit.footprint
    where = (
        ", ".join(
            f"{format_bytes(d.total)} on {d.name}"
            for d in need.devices
            if d.total and d.name != CPU
        )
        or f"{format_bytes(need.host.total)} of RAM"
    )
    names = ", ".join(s.name for s in stopped)
    return StartDecision(
        tuple(s.key for s in stopped),
        True,
        f"Stopping {names} (least recently used, not pinned) to make room for "
        f"{entry.name}, which needs {where}.",
    )
