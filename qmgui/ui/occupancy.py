"""Who holds each device's memory now: the engines this window runs, and everything else.

The bars show, next to the plan of the selected model, each running engine's share of every
device (planned, and measured from its log once it is ready) and what other processes hold
(NVML on an NVIDIA GPU, the amdgpu driver's sysfs files on an AMD one, the operating
system's figures for RAM). A planned start is charged on top of
those. Plain values and functions; the window reads the live figures on a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from qmgui.core.footprint import CPU, Footprint, Gpu
from qmgui.hw import amdgpu
from qmgui.hw.host import read_ram
from qmgui.hw.nvml import NvmlReading, read_nvml


@dataclass(frozen=True)
class EngineLoad:
    """One running engine as the bars and the budget see it."""

    key: int  # the engine runner's id
    name: str
    model_id: str
    footprint: Footprint | None
    measured: Mapping[str, int]  # actual bytes per planned device name, once ready
    pids: frozenset[int] = frozenset()
    last_used: float = 0.0

    def planned_on(self, device: str) -> int:
        if self.footprint is None:
            return 0
        return next((d.total for d in self.footprint.devices if d.name == device), 0)

    def bytes_on(self, device: str) -> int:
        """Measured where the engine told us, else planned."""
        got = self.measured.get(device)
        return got if got is not None else self.planned_on(device)


@dataclass(frozen=True)
class EngineShare:
    name: str
    planned: int
    measured: int | None

    @property
    def bytes(self) -> int:
        """What the bar draws: measured once the engine said, else planned."""
        return self.measured if self.measured is not None else self.planned


@dataclass(frozen=True)
class LiveReading:
    """This machine now: NVML (None: not read), host RAM in use (None: unknown) and the AMD
    cards' sysfs readings (integrated ones left out, as `hw.gpus.local_gpus` numbers them)."""

    nvml: NvmlReading | None
    host_total: int | None
    host_used: int | None
    amd: tuple[amdgpu.AmdGpu, ...] = ()


def read_live() -> LiveReading:
    """Blocking (NVML, sysfs and /proc): call it on a worker thread."""
    total, available = read_ram()
    used = total - available if total is not None and available is not None else None
    cards = tuple(a for a in amdgpu.read_amd_gpus(amdgpu.DRM) if not a.integrated)
    return LiveReading(read_nvml(), total, used, cards)


def _amd_at(index: int | None, live: LiveReading) -> amdgpu.AmdGpu | None:
    """The AMD card the window calls GPU`index`: `local_gpus` numbers NVIDIA's first."""
    if index is None:
        return None
    nvidia = len(live.nvml.gpus) if live.nvml is not None and live.nvml.ok else 0
    at = index - nvidia
    return live.amd[at] if 0 <= at < len(live.amd) else None


def shares_on(device: str, loads: Iterable[EngineLoad]) -> tuple[EngineShare, ...]:
    out = []
    for load in loads:
        planned = load.planned_on(device)
        measured = load.measured.get(device)
        if planned or measured:
            out.append(EngineShare(load.name, planned, measured))
    return tuple(out)


def gpu_index(name: str) -> int | None:
    """The NVML index of a GPU named the way `hardware.this_machine` names them ("GPU1 (…)")."""
    if not name.startswith("GPU"):
        return None
    digits = name[3:].split(" ", 1)[0]
    return int(digits) if digits.isdigit() else None


def others_on(device: str, live: LiveReading | None, loads: Sequence[EngineLoad]) -> int | None:
    """Bytes other processes (and the driver) hold on `device`: what is in use there less what
    qmgui's engines hold. NVML's per-process figures identify the engines' share on a GPU
    where it reports them; otherwise their measured (else planned) bytes stand in."""
    if live is None:
        return None
    if device == CPU:
        if live.host_used is None:
            return None
        return max(0, live.host_used - sum(load.bytes_on(CPU) for load in loads))
    index = gpu_index(device)
    nvml = live.nvml
    amd = _amd_at(index, live)
    if amd is not None:
        # sysfs says how much is in use, not by whom: the engines' bytes stand in for theirs
        return max(0, amd.used_bytes - sum(load.bytes_on(device) for load in loads))
    if index is None or nvml is None or not nvml.ok:
        return None
    gpu = next((g for g in nvml.gpus if g.index == index), None)
    if gpu is None or gpu.used_bytes is None:
        return None
    pids = frozenset().union(*(load.pids for load in loads))
    ours_nvml = [p.used_bytes for p in gpu.processes if p.pid in pids and p.used_bytes]
    ours = sum(ours_nvml) if ours_nvml else sum(load.bytes_on(device) for load in loads)
    return max(0, gpu.used_bytes - ours)


def free_for_plan(gpus: Sequence[Gpu], live: LiveReading | None) -> tuple[Gpu, ...]:
    """The cards with what NVML (NVIDIA) or sysfs (AMD) says is free now (the reading at
    hand, else as given)."""
    if live is None:
        return tuple(gpus)
    nvml = live.nvml.gpus if live.nvml is not None and live.nvml.ok else ()
    out = []
    for g in gpus:
        index = gpu_index(g.name)
        r = next((x for x in nvml if x.index == index), None)
        amd = _amd_at(index, live) if r is None else None
        free = g.free_bytes
        if r is not None and r.free_bytes is not None:
            free = r.free_bytes
        elif amd is not None:
            free = amd.free_bytes
        out.append(replace(g, free_bytes=free))
    return tuple(out)
