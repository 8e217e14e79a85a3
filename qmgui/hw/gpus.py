"""This machine's GPUs, whatever their vendor: NVIDIA through NVML (`hw.nvml`), then AMD through
the amdgpu driver's sysfs files (`hw.amdgpu`; integrated ones left out, their memory is the
host's). Positions follow that order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qmgui.hw import amdgpu
from qmgui.hw.nvml import read_gpus


@dataclass(frozen=True)
class LocalGpu:
    index: int  # position among this machine's GPUs: NVIDIA (NVML order) first, then AMD
    name: str
    total_bytes: int
    free_bytes: int
    vendor: str  # "nvidia" or "amd"


def local_gpus(*, nvml: Any = None, drm_root: str | None = None) -> list[LocalGpu]:
    """Every GPU this machine has that qmgui can read, with its memory now (`nvml` and
    `drm_root`: recorded readings for tests)."""
    out = [
        LocalGpu(r.index, r.name, r.total_bytes, r.free_bytes, "nvidia") for r in read_gpus(nvml)
    ]
    for a in amdgpu.read_amd_gpus(drm_root or amdgpu.DRM):
        if a.integrated:  # its memory is the host's: planned as host memory
            continue
        out.append(LocalGpu(len(out), a.name, a.total_bytes, a.free_bytes, "amd"))
    return out
