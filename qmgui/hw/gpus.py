"""This machine's GPUs, whatever their vendor: NVIDIA through NVML (`hw.nvml`), then AMD through
the amdgpu driver's sysfs files (`hw.amdgpu`; integrated ones left out, their memory is the
host's). Positions follow that order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qmgui.core.devices import AMD, NVIDIA, HostGpu
from qmgui.core.footprint import Gpu
from qmgui.hw import amdgpu
from qmgui.hw.nvml import NvmlReading, read_nvml


@dataclass(frozen=True)
class LocalGpu:
    index: int  # position among this machine's GPUs: NVIDIA (NVML order) first, then AMD
    name: str
    total_bytes: int
    free_bytes: int
    vendor: str  # "nvidia" or "amd"
    # indexes of the GPUs NVLink joins this one to; None: not known (AMD, an old driver)
    nvlink_peers: frozenset[int] | None = None


def local_gpus(*, nvml: Any = None, drm_root: str | None = None) -> list[LocalGpu]:
    """Every GPU this machine has that qmgui can read, with its memory now (`nvml` and
    `drm_root`: recorded readings for tests)."""
    return gpus_from(read_nvml(nvml), amdgpu.read_amd_gpus(drm_root or amdgpu.DRM))


def _nvlink_peers(reading: NvmlReading) -> Callable[[int], frozenset[int] | None]:
    """GPU index -> the indexes NVLink joins it to, as NVML's P2P status says (None: not
    known)."""
    pairs = reading.nvlink

    def peers(i: int) -> frozenset[int] | None:
        if pairs is None:
            return None
        return frozenset(b if a == i else a for a, b in pairs if i in (a, b))

    return peers


def gpus_from(reading: NvmlReading, amd: Sequence[amdgpu.AmdGpu]) -> list[LocalGpu]:
    """`local_gpus` from readings already taken (the window's live poll): NVIDIA first, in
    NVML's order, then the AMD cards (integrated ones are host memory)."""
    peers = _nvlink_peers(reading)
    out = [
        LocalGpu(r.index, r.name, r.total_bytes, r.free_bytes, "nvidia", peers(r.index))
        for r in reading.gpus
    ]
    for a in amd:
        if a.integrated:  # its memory is the host's: planned as host memory
            continue
        out.append(LocalGpu(len(out), a.name, a.total_bytes, a.free_bytes, "amd"))
    return out


def host_gpus(
    *, nvml: Any = None, drm_root: str | None = None, reading: NvmlReading | None = None
) -> tuple[HostGpu, ...]:
    """Every GPU the host's drivers report now, integrated AMD ones too (flagged): NVIDIA
    through NVML (`reading`, when one was taken already), AMD through amdgpu sysfs. The
    engine's `--list-devices` says which of them it can use (`core.devices.merge`)."""
    reading = reading if reading is not None else read_nvml(nvml)
    peers = _nvlink_peers(reading)

    out = [
        HostGpu(NVIDIA, r.name, r.total_bytes, r.free_bytes, r.index, nvlink_peers=peers(r.index))
        for r in reading.gpus
    ]
    out += [
        HostGpu(AMD, a.name, a.total_bytes, a.free_bytes, a.card, integrated=a.integrated)
        for a in amdgpu.read_amd_gpus(drm_root or amdgpu.DRM)
    ]
    return tuple(out)


def as_gpus(local: Sequence[LocalGpu], name: Callable[[LocalGpu], str]) -> tuple[Gpu, ...]:
    """The planner's GPUs for this machine's, named by `name`, their NVLink peers by name."""
    names = {g.index: name(g) for g in local}
    return tuple(
        Gpu(
            name=names[g.index],
            total_bytes=g.total_bytes,
            free_bytes=g.free_bytes,
            nvlink=None
            if g.nvlink_peers is None
            else frozenset(names[i] for i in g.nvlink_peers if i in names),
        )
        for g in local
    )
