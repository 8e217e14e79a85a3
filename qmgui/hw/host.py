"""The host: RAM, CPU model, core counts and the CPU features the CPU backend uses.

Memory and core counts come from psutil; the CPU model and feature flags (avx2, avx512*, amx*,
NEON/SVE on ARM) from /proc/cpuinfo on Linux, best effort elsewhere. What cannot be read is
None (or empty) with a note in ``problems``, never an exception.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from qmgui.core.repack import CpuTarget, target_from_cpuinfo

__all__ = [
    "SIMD_FLAGS",
    "HostInfo",
    "cpu_target",
    "has_flags",
    "parse_cpuinfo",
    "read_cpu_flags",
    "read_host",
]

CPUINFO = "/proc/cpuinfo"

# The CPU features ggml's CPU backend picks kernels by, in the order people quote them
# (x86: ggml-cpu's feature checks; ARM: the Linux "Features" names).
SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "f16c",
    "fma",
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",  # NEON
    "asimddp",  # dot product
    "i8mm",
    "bf16",
    "sve",
    "sve2",
)

_MODEL_KEYS = ("model name", "Model", "Hardware", "cpu model", "Processor")
_FLAG_KEYS = ("flags", "Features")


@dataclass(frozen=True)
class HostInfo:
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    swap_total_bytes: int | None
    cpu_model: str | None
    physical_cores: int | None
    logical_cores: int | None
    cpu_flags: frozenset[str] = field(repr=False)  # every flag cpuinfo lists (Linux)
    system: str  # "Linux 6.1.0-18-amd64"
    machine: str  # "x86_64", "arm64", "AMD64"
    problems: tuple[str, ...] = ()

    @property
    def simd(self) -> tuple[str, ...]:
        """The features from `SIMD_FLAGS` this CPU has, in that order."""
        return tuple(f for f in SIMD_FLAGS if f in self.cpu_flags)

    def to_json(self) -> dict[str, object]:
        return {
            "ram_total_bytes": self.ram_total_bytes,
            "ram_available_bytes": self.ram_available_bytes,
            "swap_total_bytes": self.swap_total_bytes,
            "cpu_model": self.cpu_model,
            "physical_cores": self.physical_cores,
            "logical_cores": self.logical_cores,
            "simd": list(self.simd),
            "system": self.system,
            "machine": self.machine,
            "problems": list(self.problems),
        }


def parse_cpuinfo(text: str) -> tuple[str | None, frozenset[str]]:
    """The CPU model and feature flags of a /proc/cpuinfo text (x86 or ARM); the first
    processor's entry is enough, as Linux lists the same flags for every core."""
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if model is None and key in _MODEL_KEYS and value:
            model = " ".join(value.split())
        elif key in _FLAG_KEYS and not flags:
            flags = set(value.split())
    return model, frozenset(flags)


def _windows_cpu_model() -> str | None:
    with contextlib.suppress(Exception):
        winreg: Any = importlib.import_module("winreg")
        key = winreg.OpenKey(
            winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0"
        )
        with key:
            value, _ = winreg.QueryValueEx(key, "ProcessorNameString")
            return " ".join(str(value).split()) or None
    return None


def _cpu_model_and_flags(
    cpuinfo_path: str, problems: list[str]
) -> tuple[str | None, frozenset[str]]:
    system = platform.system()
    if system == "Linux":
        try:
            with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
                model, flags = parse_cpuinfo(f.read())
        except OSError as e:
            problems.append(f"{cpuinfo_path} could not be read ({e.strerror or e})")
            model, flags = None, frozenset()
        return model or platform.processor() or None, flags
    if system == "Windows":
        return _windows_cpu_model() or platform.processor() or None, frozenset()
    # macOS and the rest: the brand string needs sysctl; platform gives the architecture
    return platform.processor() or None, frozenset()


def _load_psutil(psutil_module: Any) -> Any:
    if psutil_module is not None:
        return psutil_module
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


MEMINFO = "/proc/meminfo"


def _meminfo(path: str = MEMINFO) -> tuple[int, int] | None:
    """Linux: MemTotal and MemAvailable in bytes, as psutil reads them (without importing
    psutil: `qmgui plan` checks host memory and starts faster without it); None elsewhere."""
    found: dict[str, int] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(found) != 2:
        return None
    return found["MemTotal"], found["MemAvailable"]


def read_ram(*, psutil_module: Any = None) -> tuple[int | None, int | None]:
    """RAM total and available now (None where psutil is missing or fails): the cheap part of
    `read_host`, for readings taken every few seconds."""
    if psutil_module is None and platform.system() == "Linux":
        meminfo = _meminfo()
        if meminfo is not None:
            return meminfo
    ps = _load_psutil(psutil_module)
    if ps is None:
        return None, None
    try:
        vm = ps.virtual_memory()
    except Exception:
        return None, None
    return int(vm.total), int(vm.available)


def read_host(*, psutil_module: Any = None, cpuinfo_path: str = CPUINFO) -> HostInfo:
    """RAM, swap, CPU model, core counts and CPU features of this machine; never raises.
    `psutil_module` stands in for psutil in tests."""
    problems: list[str] = []
    ps = _load_psutil(psutil_module)
    ram_total = ram_available = swap_total = physical = logical = None
    if ps is None:
        problems.append("psutil is not installed: RAM and core counts are unknown")
    else:
        ram_total, ram_available = read_ram(psutil_module=ps)
        if ram_total is None:
            problems.append("RAM could not be read (psutil.virtual_memory failed)")
        with contextlib.suppress(Exception):
            swap_total = int(ps.swap_memory().total)
        with contextlib.suppress(Exception):
            logical = _count(ps.cpu_count(logical=True))
        with contextlib.suppress(Exception):
            physical = _count(ps.cpu_count(logical=False))
    model, flags = _cpu_model_and_flags(cpuinfo_path, problems)
    return HostInfo(
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_available,
        swap_total_bytes=swap_total,
        cpu_model=model,
        physical_cores=physical,
        logical_cores=logical,
        cpu_flags=flags,
        system=f"{platform.system()} {platform.release()}".strip(),
        machine=platform.machine(),
        problems=tuple(problems),
    )


def _count(value: Any) -> int | None:
    """psutil says None where it cannot tell (physical cores in some VMs)."""
    return int(value) if isinstance(value, int) and value > 0 else None


def has_flags(host: HostInfo, flags: Iterable[str]) -> bool:
    """Whether the CPU has every one of `flags` (False when the flags are unknown)."""
    return all(f in host.cpu_flags for f in flags)


def read_cpu_flags(cpuinfo_path: str = CPUINFO) -> frozenset[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo); empty where they cannot be read."""
    problems: list[str] = []
    return _cpu_model_and_flags(cpuinfo_path, problems)[1]


@functools.cache
def _host_flags() -> frozenset[str]:
    return read_cpu_flags()  # read once: a plan is made per keystroke in the window


def cpu_target(
    build: int | None = None, *, flags: frozenset[str] | None = None
) -> CpuTarget | None:
    """The CPU features llama.cpp's CPU backend repacks weights by on this machine, for a
    build with repacking compiled in that runs its best variant for this CPU (what a
    GGML_BACKEND_DL build picks; a native build is compiled for it). None where the flags
    cannot be read (Windows, macOS: no /proc/cpuinfo): plans then charge only the bound
    (`repack_bound`). The engine's own `system_info` line, where a launch printed it, is the
    exact answer (qmgui.core.repack.parse_system_info)."""
    flags = _host_flags() if flags is None else flags
    if not flags:
        return None
    return target_from_cpuinfo(flags, build=build)
