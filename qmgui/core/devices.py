"""This machine's devices as the engine sees them: its `--list-devices`, merged with live readings.

The registered llama-server build's `--list-devices` (`core.probe.parse_devices`) says which
devices exist, in the engine's own numbering (CUDA0, ROCm1, Vulkan2, SYCL0, MTL0…) and with
the memory the engine can use, for every vendor and API it was built with. What it cannot
say is what is free *now*, so the host's own readings (`HostGpu`: NVML for NVIDIA, the amdgpu
driver's sysfs files for AMD) replace the engine's free figure for the devices they match:

- a device is matched to a host GPU of its vendor by name first (``AMD Radeon RX 7900 XTX``
  against ``AMD Radeon RX 7900 XTX (RADV NAVI31)``: Mesa adds its driver in parentheses),
  then in order among that vendor's unmatched GPUs when the totals agree within a tenth;
- a unified-memory device (Metal on Apple Silicon, an integrated GPU on Vulkan, an AMD APU)
  has no memory of its own: it is not a card to plan for, its models go to host memory
  (free RAM less `os_floor`);
- a device no model should be placed on is refused with a reason: a software renderer
  (llvmpipe), a paravirtual adapter, a device with almost no memory, the same GPU listed a
  second time by another API of the same build. When the engine offered GPUs and every one
  was refused, the launch is pinned to the CPU (`--device none`): left unpinned, ggml would
  pick the first adapter it has, the very one refused.

`Machine.unseen` lists the host's discrete GPUs the engine did not list, and `unseen_warning`
says so naming the vendor's visibility variable, the usual reason (a variable set in this
environment that hides the card). Everything here is pure: the readings are arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from qmgui.core.footprint import Gpu

if TYPE_CHECKING:
    from qmgui.core.probe import EngineDevice

__all__ = [
    "AMD",
    "NVIDIA",
    "OS_RESERVE",
    "HostGpu",
    "Machine",
    "MachineDevice",
    "host_budget",
    "host_gpus_as_planned",
    "merge",
    "os_floor",
    "unseen_warning",
    "vendor_of",
]

OS_RESERVE = 2 << 30  # RAM kept for the system and desktop when models go to host memory
_FLOOR_SHARE = 4  # ...but never more than a quarter of the RAM: a small host keeps a budget
MIN_DEVICE_BYTES = 256 << 20  # a "GPU" with less is no place for a model
_TOTAL_TOLERANCE = 10  # totals within a tenth are the same card (drivers reserve differently)

NVIDIA = "nvidia"
AMD = "amd"
INTEL = "intel"
APPLE = "apple"

# what each vendor's runtime reads to hide GPUs, named when the engine did not list a GPU
VISIBILITY_VARS: Mapping[str, tuple[str, ...]] = {
    NVIDIA: ("CUDA_VISIBLE_DEVICES",),
    AMD: ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    INTEL: ("ONEAPI_DEVICE_SELECTOR",),
}
VULKAN_VISIBILITY = "GGML_VK_VISIBLE_DEVICES"
_VENDOR_WORDS = {NVIDIA: "NVIDIA", AMD: "AMD", INTEL: "Intel", APPLE: "Apple"}

# the backend of a device name decides its vendor where one API speaks for one vendor
_BACKEND_VENDOR = {"cuda": NVIDIA, "rocm": AMD, "metal": APPLE}
# software renderers and paravirtual adapters: they list as GPUs, but offloading to them is
# slower than the CPU or goes nowhere
_REFUSED = re.compile(
    r"llvmpipe|lavapipe|softpipe|swiftshader|basic render|virtio|virgl|venus|vmware svga|"
    r"svga3d|parallels|qxl|bochs|cirrus",
    re.IGNORECASE,
)
# integrated GPUs by their names, where no sysfs reading says so: Intel's UHD/Iris/HD and the
# Meteor Lake "Arc Graphics" without a model number, AMD's "Radeon Graphics" and "Radeon 780M"
_INTEGRATED = re.compile(
    r"\b(?:uhd|iris|hd graphics)\b|intel\S*\s+arc\S*\s+graphics|radeon\S*\s+(?:graphics|\d{3}m\b)|"
    r"\bapple\b",
    re.IGNORECASE,
)
_TRADEMARKS = re.compile(r"\((?:r|tm)\)", re.IGNORECASE)
_TRAILING_PAREN = re.compile(r"\s*\([^()]*\)\s*$")


@dataclass(frozen=True)
class HostGpu:
    """One GPU as the host's driver reports it now (NVML, amdgpu sysfs)."""

    vendor: str  # nvidia, amd
    name: str
    total_bytes: int
    free_bytes: int
    index: int  # NVML's index, or N of /sys/class/drm/cardN
    integrated: bool = False  # an APU's carve-out: its memory is the host's
    # the NVML indexes of the GPUs NVLink joins this one to; None: not known
    nvlink_peers: frozenset[int] | None = None

    @property
    def source(self) -> str:
        return "nvml" if self.vendor == NVIDIA else "sysfs"


@dataclass(frozen=True)
class MachineDevice:
    """One device the engine listed, with the host's live reading where one matched."""

    listed: EngineDevice
    vendor: str | None  # nvidia, amd, intel, apple; None: cannot tell
    total_bytes: int
    free_bytes: int
    free_from: str  # engine, nvml or sysfs: who said how much is free
    host: HostGpu | None = None
    unified: bool = False  # its memory is the host's: placed in host memory
    refused: str | None = None  # why no model is placed on it; None: it is used

    @property
    def name(self) -> str:
        """The engine's own name (CUDA0, Vulkan1…): what `--device` takes."""
        return self.listed.name

    @property
    def planned(self) -> bool:
        """A card models are placed on (not unified memory, not refused, not remote)."""
        return not self.unified and self.refused is None and self.listed.backend != "rpc"

    def to_json(self) -> dict[str, object]:
        return {
            **self.listed.to_json(),
            "vendor": self.vendor,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "free_from": self.free_from,
            "host_index": None if self.host is None else self.host.index,
            "unified": self.unified,
            "refused": self.refused,
        }


@dataclass(frozen=True)
class Machine:
    """This machine's devices and where they came from.

    ``source`` is "engine" when the devices are the engine's listing (``engine`` names it),
    "host" when the engine could not be asked and the host's readings stand in (NVIDIA, then
    AMD: positions, not the engine's numbering)."""

    source: str  # engine, host
    devices: tuple[MachineDevice, ...] = ()
    host: tuple[HostGpu, ...] = ()
    engine: str | None = None
    notes: tuple[str, ...] = field(default=())  # sentences for the user (warnings)

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """The planner's cards: the devices models are placed on, by the engine's names."""
        if self.source == "host":
            return host_gpus_as_planned(self.host)
        planned = [d for d in self.devices if d.planned]
        names = {d.host.index: d.name for d in planned if d.host is not None}
        out = []
        for d in planned:
            peers = d.host.nvlink_peers if d.host is not None else None
            base = d.listed.to_gpu()
            out.append(
                replace(
                    base,
                    total_bytes=d.total_bytes,
                    free_bytes=d.free_bytes,
                    nvlink=None
                    if peers is None
                    else frozenset(names[i] for i in peers if i in names),
                )
            )
        return tuple(out)

    @property
    def refused_all(self) -> bool:
        """The engine offered GPUs and every one was refused: pin it to the CPU."""
        local = [d for d in self.devices if d.listed.backend != "rpc"]
        return bool(local) and all(d.refused is not None for d in local)

    @property
    def unified(self) -> bool:
        """No card of its own: every model goes to host memory (a laptop, an Apple Mac)."""
        return not self.gpus

    @property
    def unseen(self) -> tuple[HostGpu, ...]:
        """The host's discrete GPUs no listed device matched (only with the engine's list)."""
        if self.source != "engine":
            return ()
        matched = {(d.host.vendor, d.host.index) for d in self.devices if d.host is not None}
        return tuple(
            g for g in self.host if not g.integrated and (g.vendor, g.index) not in matched
        )

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "engine": self.engine,
            "devices": [d.to_json() for d in self.devices],
            "gpus": [g.name for g in self.gpus],
            "refused_all": self.refused_all,
            "unseen": [g.name for g in self.unseen],
            "notes": list(self.notes),
        }


def host_gpus_as_planned(host: Sequence[HostGpu]) -> tuple[Gpu, ...]:
    """The host's discrete GPUs as the planner's cards when no engine listed them: GPU0,
    GPU1… in the host's order (NVIDIA, then AMD), NVLink peers by name."""
    cards = [g for g in host if not g.integrated]
    names = {(g.vendor, g.index): f"GPU{i}" for i, g in enumerate(cards)}
    out = []
    for g in cards:
        peers = g.nvlink_peers
        out.append(
            Gpu(
                name=names[(g.vendor, g.index)],
                total_bytes=g.total_bytes,
                free_bytes=g.free_bytes,
                nvlink=None
                if peers is None
                else frozenset(names[(g.vendor, i)] for i in peers if (g.vendor, i) in names),
            )
        )
    return tuple(out)


def os_floor(total_ram: int | None, reserve: int = OS_RESERVE) -> int:
    """RAM left to the system when models are placed in host memory: the configured reserve,
    capped at a quarter of the RAM (a 4 GiB laptop keeps 1 GiB, not all of it)."""
    if total_ram is None or total_ram <= 0:
        return reserve
    return min(reserve, total_ram // _FLOOR_SHARE)


def host_budget(available: int | None, total: int | None, reserve: int = OS_RESERVE) -> int | None:
    """Host memory for models on a machine without a card of its own: the RAM available now
    less the OS floor; None when it cannot be read (not checked)."""
    if available is None:
        return None
    return max(available - os_floor(total, reserve), 0)


def _norm(name: str) -> str:
    """A device name to compare across APIs: no (R)/(TM), no driver suffix, one case."""
    text = _TRADEMARKS.sub("", name)
    while True:
        shorter = _TRAILING_PAREN.sub("", text)
        if shorter == text or not shorter.strip():
            break
        text = shorter
    return " ".join(text.lower().split())


def vendor_of(device: EngineDevice) -> str | None:
    """The vendor of a listed device: its API where that decides it, else its name."""
    by_backend = _BACKEND_VENDOR.get(device.backend)
    if by_backend is not None:
        return by_backend
    desc = device.description.lower()
    if "nvidia" in desc or "geforce" in desc or "quadro" in desc or "tesla" in desc:
        return NVIDIA
    if "amd" in desc or "radeon" in desc or "instinct" in desc:
        return AMD
    if "intel" in desc:
        return INTEL
    if "apple" in desc:
        return APPLE
    return None


def _same_card(device: EngineDevice, gpu: HostGpu) -> bool:
    a, b = _norm(device.description), _norm(gpu.name)
    return bool(a) and bool(b) and (a == b or a in b or b in a)


def _close(a: int, b: int) -> bool:
    return abs(a - b) * _TOTAL_TOLERANCE <= max(a, b)


def _match(
    device: EngineDevice, vendor: str | None, host: Sequence[HostGpu], taken: set[int]
) -> int | None:
    """The position in `host` of the GPU `device` is, or None."""
    mine = [i for i, g in enumerate(host) if g.vendor == vendor and i not in taken]
    named = next((i for i in mine if _same_card(device, host[i])), None)
    if named is not None:
        return named
    # no name in common (a marketing name against a PCI id): the next one of its vendor,
    # where the memory says it is the same card
    return next((i for i in mine if _close(host[i].total_bytes, device.total_bytes)), None)


def _refusal(device: EngineDevice) -> str | None:
    if _REFUSED.search(device.description):
        return f"{device.description} is a software or virtual adapter, not a GPU to offload to"
    if device.total_bytes < MIN_DEVICE_BYTES:
        return f"{device.description} reports only {device.total_mib} MiB"
    return None


def merge(listed: Sequence[EngineDevice], host: Sequence[HostGpu]) -> tuple[MachineDevice, ...]:
    """The engine's devices in its order, each with the host's live reading where one matches
    (see the module docstring)."""
    taken: set[int] = set()
    seen_by: dict[int, str] = {}  # host position -> the device name that matched it first
    out: list[MachineDevice] = []
    for d in listed:
        if d.backend == "rpc":  # a remote device: its host is elsewhere
            out.append(MachineDevice(d, None, d.total_bytes, d.free_bytes, "engine"))
            continue
        vendor = vendor_of(d)
        refused = _refusal(d)
        at = None if refused else _match(d, vendor, host, taken)
        if at is None and refused is None:
            # the same GPU through a second API of one build (CUDA0 and Vulkan0)
            again = next(
                (i for i in seen_by if host[i].vendor == vendor and _same_card(d, host[i])), None
            )
            if again is not None:
                refused = f"the same GPU as {seen_by[again]}"
        if at is None:
            unified = d.backend == "metal" or bool(_INTEGRATED.search(d.description))
            out.append(
                MachineDevice(
                    d, vendor, d.total_bytes, d.free_bytes, "engine", None, unified, refused
                )
            )
            continue
        taken.add(at)
        seen_by[at] = d.name
        g = host[at]
        free = min(g.free_bytes, d.total_bytes)
        out.append(
            MachineDevice(
                d,
                vendor,
                d.total_bytes,
                free,
                g.source,
                g,
                unified=g.integrated or d.backend == "metal",
            )
        )
    return tuple(out)


def unseen_warning(machine: Machine, env: Mapping[str, str], *, vulkan: bool = False) -> str | None:
    """A sentence when the host has a GPU the engine did not list, naming the vendor's
    visibility variable (its value when this environment sets it); `vulkan`: the build is a
    Vulkan one (its own variable is named too). None when every GPU was listed."""
    missing = machine.unseen
    if not missing:
        return None
    vendors = sorted({g.vendor for g in missing})
    names = ", ".join(g.name for g in missing)
    variables = [v for vendor in vendors for v in VISIBILITY_VARS.get(vendor, ())]
    if vulkan or any(d.listed.backend == "vulkan" for d in machine.devices):
        variables.append(VULKAN_VISIBILITY)
    set_here = [f"{v}={env[v]!r}" for v in variables if v in env]
    what = " and ".join(_VENDOR_WORDS.get(v, v) for v in vendors)
    listed = "listed no devices" if not machine.devices else "did not list it"
    sentence = (
        f"this host has {what} GPU{'s' if len(missing) > 1 else ''} ({names}) but "
        f"{machine.engine or 'the engine'} --list-devices {listed}: check the driver, "
        f"{' / '.join(variables)}, and that this build supports that GPU"
    )
    if set_here:
        sentence += f" ({', '.join(set_here)} is set here)"
    return sentence
