"""NVIDIA GPUs through NVML (nvidia-ml-py), behind a seam tests feed with recorded readings.

`read_nvml()` returns one `NvmlReading`: the driver version and, per GPU, its index, name,
UUID, total/free/used memory and the processes holding memory on it (compute and graphics).
No NVIDIA driver, no NVML library or no GPU is a normal answer (a reading whose `status` says
so in words), never an error: most machines qmgui runs on plan for hardware they do not have.
`read_gpus()` is the short form the planner uses: the GPUs, or [] when there are none.

Every function takes `nvml`, the `pynvml` module or a stand-in with the same functions (tests
replay JSON readings recorded with `record()`; see `tests/fixtures/nvml/`).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STATUS_ERROR",
    "STATUS_NO_DRIVER",
    "STATUS_NO_GPU",
    "STATUS_NO_LIBRARY",
    "STATUS_OK",
    "GpuProcess",
    "GpuReading",
    "NvmlReading",
    "read_gpus",
    "read_nvml",
    "record",
]

STATUS_OK = "ok"
STATUS_NO_LIBRARY = "no-library"  # nvidia-ml-py itself is not installed
STATUS_NO_DRIVER = "no-driver"  # no NVIDIA driver (libnvidia-ml not found, or not loaded)
STATUS_NO_GPU = "no-gpu"  # a driver, but no GPU it can see
STATUS_ERROR = "error"  # a driver that does not answer: a version mismatch, a lost GPU…

# NVML errors (pynvml's exception class names) that mean "there is no usable NVIDIA driver
# here" rather than "the driver is broken"
_NO_DRIVER_ERRORS = {
    "NVMLError_LibraryNotFound": "the NVIDIA driver's NVML library was not found",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_FunctionNotFound": "the NVIDIA driver is too old for NVML",
}
# Broken drivers, with what fixes them
_ERROR_FIXES = {
    "NVMLError_LibRmVersionMismatch": "the NVIDIA driver was updated without a reboot; "
    "reboot so the loaded kernel module matches the library",
    "NVMLError_NoPermission": "this user may not query the GPUs; check the permissions of "
    "/dev/nvidia*",
    "NVMLError_GpuIsLost": "a GPU fell off the bus; check its power and seating, then reboot",
}


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU. ``used_bytes`` is None where NVML cannot say
    (Windows WDDM, containers without the host's PID namespace)."""

    pid: int
    used_bytes: int | None
    kind: str  # "compute", "graphics" or "compute+graphics"
    name: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "used_bytes": self.used_bytes,
            "kind": self.kind,
            "name": self.name,
        }


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    uuid: str | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def process_bytes(self) -> int:
        """Memory the listed processes hold (those NVML gave a number for)."""
        return sum(p.used_bytes or 0 for p in self.processes)

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "used_bytes": self.used_bytes,
            "processes": [p.to_json() for p in self.processes],
        }


@dataclass(frozen=True)
class NvmlReading:
    """One look at the NVIDIA side of this machine. ``message`` says in words what ``status``
    means here, and ``fix`` what to do when something is wrong (None when nothing is)."""

    status: str
    message: str
    gpus: tuple[GpuReading, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # "12.4": the newest CUDA the driver runs
    fix: str | None = None
    problems: tuple[str, ...] = field(default=())  # parts that could not be read
    # GPU index pairs (i < j) joined by NVLink, as NVML's P2P status says; None: not known
    nvlink: tuple[tuple[int, int], ...] | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def broken(self) -> bool:
        """A driver is there but does not work (as opposed to no driver at all)."""
        return self.status == STATUS_ERROR

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "message": self.message,
            "fix": self.fix,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": [g.to_json() for g in self.gpus],
            "problems": list(self.problems),
        }


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _binding_installed() -> bool:
    """Whether pynvml can be imported, without importing it."""
    import importlib.util  # noqa: PLC0415

    try:
        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it
        return False


def _driver_library_present() -> bool:
    """Whether NVML's shared library can be loaded, where pynvml loads it on Linux
    (`libnvidia-ml.so.1`: a dlopen, fractions of a millisecond either way). Elsewhere, and
    when in doubt, True: pynvml's own search decides."""
    if not sys.platform.startswith("linux"):
        return True
    import ctypes  # noqa: PLC0415 - only for this probe

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _load(nvml: Any) -> Any:
    if nvml is not None:
        return nvml
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _cuda_version(raw: Any) -> str | None:
    """NVML gives 12040 for CUDA 12.4."""
    try:
        n = int(raw)
    except (TypeError, ValueError):
        return None
    return f"{n // 1000}.{(n % 1000) // 10}"


def _processes(nvml: Any, handle: Any, problems: list[str], index: int) -> tuple[GpuProcess, ...]:
    found: dict[int, GpuProcess] = {}
    for kind, fn_name in (
        ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ):
        fn: Callable[[Any], Any] | None = getattr(nvml, fn_name, None)
        if fn is None:
            continue
        try:
            listed = fn(handle)
        except Exception as e:  # NotSupported on some GPUs and vGPUs: the rest still counts
            problems.append(f"GPU {index}: {kind} processes could not be read ({e})")
            continue
        for p in listed:
            pid = int(p.pid)
            used = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
            if pid in found:  # a process with both a CUDA and a graphics context
                # NVML reports the process's whole usage in both lists: not a sum
                old = found[pid].used_bytes
                both = None if old is None and used is None else max(old or 0, used or 0)
                found[pid] = GpuProcess(pid, both, "compute+graphics")
            else:
                found[pid] = GpuProcess(pid, used, kind)
    out = []
    for pid, proc in sorted(found.items()):
        name = None
        with contextlib.suppress(Exception):  # the pid may be in another PID namespace
            name = _text(nvml.nvmlSystemGetProcessName(pid)) or None
        out.append(GpuProcess(pid, proc.used_bytes, proc.kind, name))
    return tuple(out)


def _read_gpu(nvml: Any, index: int, problems: list[str]) -> GpuReading:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    uuid = None
    try:
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    except Exception as e:
        problems.append(f"GPU {index}: UUID could not be read ({e})")
    return GpuReading(
        index=index,
        name=name,
        total_bytes=int(mem.total),
        free_bytes=int(mem.free),
        used_bytes=int(mem.used),
        uuid=uuid,
        processes=_processes(nvml, handle, problems, index),
    )


def _nvlink_pairs(nvml: Any, n: int) -> tuple[tuple[int, int], ...] | None:
    """The GPU pairs NVLink joins (NVML's P2P status with the NVLink capability); None when
    NVML cannot say (an old driver or binding)."""
    if n < 2:
        return ()
    status = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
    nvlink = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    if status is None or nvlink is None:
        return None
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        return tuple(
            (i, j)
            for i in range(n)
            for j in range(i + 1, n)
            if status(handles[i], handles[j], nvlink) == ok
        )
    except Exception:  # NotSupported on some drivers and vGPUs: unknown, not "none"
        return None


def _init_failure(e: Exception) -> NvmlReading:
    return _failure(type(e).__name__, e)


def _failure(kind: str, e: object) -> NvmlReading:
    """The reading for a failure of `kind` (pynvml's exception class name)."""
    if kind in _NO_DRIVER_ERRORS:
        return NvmlReading(
            STATUS_NO_DRIVER,
            f"no NVIDIA driver: {_NO_DRIVER_ERRORS[kind]}",
            fix="if this machine has an NVIDIA GPU, install the NVIDIA driver; otherwise plan "
            "with what-if GPUs (qmgui plan --gpu 24GiB) or the engine's --list-devices",
        )
    return NvmlReading(
        STATUS_ERROR,
        f"the NVIDIA driver did not answer ({kind}: {e})",
        fix=_ERROR_FIXES.get(
            kind, "check `nvidia-smi`; reinstalling the driver or a reboot usually fixes this"
        ),
    )


def read_nvml(nvml: Any = None) -> NvmlReading:
    """Every NVIDIA GPU's memory and processes now, and the driver version; never raises.

    `nvml` is the pynvml module (tests inject a stand-in). A GPU whose name or memory cannot
    be read makes the whole reading an error (a half list would misplace models); a missing
    UUID or process list is only noted in ``problems``.
    """
    if nvml is None and _binding_installed() and not _driver_library_present():
        # no driver library: no need to import pynvml (a 5,000-line binding) to hear it
        return _failure("NVMLError_LibraryNotFound", "libnvidia-ml.so.1 not found")
    nvml = _load(nvml)
    if nvml is None:
        return NvmlReading(
            STATUS_NO_LIBRARY,
            "nvidia-ml-py is not installed, so NVIDIA GPUs cannot be read",
            fix="pip install nvidia-ml-py (a dependency of qmgui: reinstall qmgui)",
        )
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound in ~0.2 ms without a driver
        return _init_failure(e)
    try:
        problems: list[str] = []
        driver = cuda = None
        with contextlib.suppress(Exception):
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(Exception):
            cuda = _cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
        try:
            gpus = tuple(_read_gpu(nvml, i, problems) for i in range(nvml.nvmlDeviceGetCount()))
        except Exception as e:  # a GPU that fell off the bus mid-read: report no half list
            failed = _init_failure(e)
            return NvmlReading(
                STATUS_ERROR,
                f"the NVIDIA driver {driver or ''} answered, but reading the GPUs failed "
                f"({type(e).__name__}: {e})".replace("  ", " "),
                driver_version=driver,
                cuda_driver_version=cuda,
                fix=failed.fix,
                problems=tuple(problems),
            )
        if not gpus:
            return NvmlReading(
                STATUS_NO_GPU,
                f"NVIDIA driver {driver} is installed but sees no GPU",
                driver_version=driver,
                cuda_driver_version=cuda,
                fix="check that the GPU is seated and powered (and, in a container, passed in "
                "with --gpus)",
                problems=tuple(problems),
            )
        names = ", ".join(g.name for g in gpus)
        return NvmlReading(
            STATUS_OK,
            f"NVIDIA driver {driver}, {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: {names}",
            gpus=gpus,
            driver_version=driver,
            cuda_driver_version=cuda,
            problems=tuple(problems),
            nvlink=_nvlink_pairs(nvml, len(gpus)),
        )
    finally:
        with contextlib.suppress(Exception):  # best effort, as the library may be half up
            nvml.nvmlShutdown()


def read_gpus(nvml: Any = None) -> list[GpuReading]:
    """Every NVIDIA GPU's name and memory now; [] without a driver (or when reading fails).
    `nvml` is the pynvml module (injected by tests)."""
    return list(read_nvml(nvml).gpus)


# --- recording -------------------------------------------------------------------------------


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as recorded: the value, or ``{"error": <NVML error class>}`` if it raised."""
    try:
        return fn(*args)
    except Exception as e:
        return {"error": type(e).__name__}


def _procs_json(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    return [{"pid": int(p.pid), "usedGpuMemory": p.usedGpuMemory} for p in value]


def _record_device(nvml: Any, handle: Any) -> dict[str, Any]:
    mem = _call(nvml.nvmlDeviceGetMemoryInfo, handle)
    name = _call(nvml.nvmlDeviceGetName, handle)
    uuid = _call(nvml.nvmlDeviceGetUUID, handle)
    return {
        "name": name if isinstance(name, dict) else _text(name),
        "uuid": uuid if isinstance(uuid, dict) else _text(uuid),
        "memory": mem
        if isinstance(mem, dict)
        else {"total": int(mem.total), "free": int(mem.free), "used": int(mem.used)},
        "compute_processes": _procs_json(_call(nvml.nvmlDeviceGetComputeRunningProcesses, handle)),
        "graphics_processes": _procs_json(
            _call(nvml.nvmlDeviceGetGraphicsRunningProcesses, handle)
        ),
    }


def record(nvml: Any = None) -> dict[str, Any]:
    """What NVML answers here, as the JSON the test fake replays (`tests/fixtures/nvml/`).

    Each call's result is stored as returned, or as ``{"error": "NVMLError_…"}``.
    """
    nvml = _load(nvml)
    if nvml is None:
        return {"init": {"error": "ImportError"}}
    try:
        nvml.nvmlInit()
    except Exception as e:
        return {"init": {"error": type(e).__name__}}
    try:
        driver = _call(nvml.nvmlSystemGetDriverVersion)
        out: dict[str, Any] = {
            "init": None,
            "driver_version": driver if isinstance(driver, dict) else _text(driver),
            "cuda_driver_version": _call(nvml.nvmlSystemGetCudaDriverVersion),
            "devices": [],
            "process_names": {},
        }
        count = _call(nvml.nvmlDeviceGetCount)
        pairs = _nvlink_pairs(nvml, count) if isinstance(count, int) else None
        out["nvlink"] = None if pairs is None else [list(p) for p in pairs]
        for i in range(count if isinstance(count, int) else 0):
            device = _record_device(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
            out["devices"].append(device)
            for key in ("compute_processes", "graphics_processes"):
                for p in device[key] if isinstance(device[key], list) else []:
                    name = _call(nvml.nvmlSystemGetProcessName, p["pid"])
                    if not isinstance(name, dict):
                        out["process_names"][str(p["pid"])] = _text(name)
        return out
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
