"""NVIDIA GPUs through NVML (nvidia-ml-py), behind a seam tests feed with recorded readings.

No driver, no library or no GPU is a normal answer (an empty list), never an error: most
machines qmgui runs on plan for hardware they do not have.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int


def read_gpus(nvml: Any = None) -> list[GpuReading]:
    """Every NVIDIA GPU's name and memory now; [] without a driver. `nvml` is the pynvml
    module (injected by tests)."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA driver here
        return []
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            out.append(
                GpuReading(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    total_bytes=int(mem.total),
                    free_bytes=int(mem.free),
                    used_bytes=int(mem.used),
                )
            )
        return out
    except Exception:  # a GPU that fell off the bus mid-read: report what we have not
        return []
    finally:
        with contextlib.suppress(Exception):  # best effort, as the library may be half up
            nvml.nvmlShutdown()
