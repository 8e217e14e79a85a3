"""A stand-in for the `pynvml` module that replays a reading recorded with
`qmgui.hw.nvml.record()` (tests/fixtures/nvml/*.json).

A recorded ``{"error": "NVMLError_…"}`` is raised as pynvml's own exception class of that
name, so the code under test sees exactly what a live driver would throw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvml"


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


def _raise_if_error(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"error"}:
        cls = getattr(pynvml, value["error"], None)
        raise cls() if cls is not None else RuntimeError(value["error"])
    return value


class FakeNvml:
    """Replays one recorded reading; counts init/shutdown calls so tests can check pairing."""

    def __init__(self, reading: dict[str, Any] | str) -> None:
        if isinstance(reading, str):
            reading = json.loads((FIXTURES / reading).read_text(encoding="utf-8"))
        self.reading = {k: v for k, v in reading.items() if not k.startswith("_")}
        self.inits = 0
        self.shutdowns = 0
        self.fail: dict[tuple[str, int], str] = {}  # (function, device index) -> error name

    def _device(self, handle: int) -> dict[str, Any]:
        return self.reading["devices"][handle]

    def _maybe_fail(self, fn: str, index: int) -> None:
        name = self.fail.get((fn, index))
        if name:
            raise getattr(pynvml, name)()

    def nvmlInit(self) -> None:
        self.inits += 1
        _raise_if_error(self.reading.get("init"))

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return _raise_if_error(self.reading["driver_version"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return _raise_if_error(self.reading["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.reading["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.reading["devices"]):
            raise pynvml.NVMLError_InvalidArgument()
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._maybe_fail("name", handle)
        return _raise_if_error(self._device(handle)["name"])

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return _raise_if_error(self._device(handle)["uuid"])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        self._maybe_fail("memory", handle)
        return _Memory(**_raise_if_error(self._device(handle)["memory"]))

    def _procs(self, handle: int, key: str) -> list[_Process]:
        listed = _raise_if_error(self._device(handle)[key])
        return [_Process(p["pid"], p["usedGpuMemory"]) for p in listed]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:
        return self._procs(handle, "compute_processes")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[_Process]:
        return self._procs(handle, "graphics_processes")

    NVML_P2P_CAPS_INDEX_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        """NVLink pairs as recorded (`"nvlink": [[0, 1]]`); a reading without them raises
        NotSupported, as an old driver does."""
        pairs = self.reading.get("nvlink")
        if pairs is None or index != pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            raise pynvml.NVMLError_NotSupported()
        linked = [min(a, b), max(a, b)] in [sorted(p) for p in pairs]
        return pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        name = self.reading.get("process_names", {}).get(str(pid))
        if name is None:
            raise pynvml.NVMLError_NotFound()
        return name
