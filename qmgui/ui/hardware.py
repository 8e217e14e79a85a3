"""What-if hardware: the GPUs and host memory a plan is made for.

"This machine" reads NVML (none: CPU only) and psutil; the profiles plan for cards that need not
exist (`qmgui.hw.profiles.lookup`). No Qt here: the window only shows the choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.footprint import Gpu
from qmgui.hw import amdgpu
from qmgui.hw.gpus import LocalGpu, as_gpus, gpus_from, local_gpus
from qmgui.hw.host import read_host
from qmgui.hw.nvml import NvmlReading
from qmgui.hw.profiles import lookup

THIS_MACHINE = "This machine"
# (label shown in the toolbar, text `profiles.lookup` understands)
PROFILE_CHOICES: tuple[tuple[str, str], ...] = (
    ("RTX 3060 12 GB", "rtx 3060"),
    ("RTX 4090", "rtx 4090"),
    ("2× RTX 3090", "2x rtx 3090"),
    ("RTX 5090", "rtx 5090"),
    ("2× RTX 4090", "2x rtx 4090"),
    ("A100 80 GB", "a100 80gb"),
    ("H100 80 GB", "h100 80gb"),
)


@dataclass(frozen=True)
class Hardware:
    """One hardware choice: its label, the GPUs to plan for and the host RAM (None: unknown)."""

    label: str
    gpus: tuple[Gpu, ...]
    host_bytes: int | None
    what_if: bool = False

    @property
    def summary(self) -> str:
        if not self.gpus:
            return "CPU only"
        return ", ".join(g.name for g in self.gpus)


def choice_labels() -> tuple[str, ...]:
    return (THIS_MACHINE, *(label for label, _ in PROFILE_CHOICES))


def _named(g: LocalGpu) -> str:
    return f"GPU{g.index} ({g.name})"


def this_machine() -> Hardware:
    """The GPUs present (NVIDIA, then AMD; none is normal: CPU only) and this machine's RAM."""
    host = read_host()
    return Hardware(THIS_MACHINE, as_gpus(local_gpus(), _named), host.ram_total_bytes)


def seen_now(
    machine: Hardware, nvml: NvmlReading | None, amd: tuple[amdgpu.AmdGpu, ...]
) -> Hardware | None:
    """This machine as the window's live readings (taken on a worker) show it, when its set of
    GPUs is no longer `machine`'s: a card was added, removed or changed (a driver that came up
    after qmgui started). None when the set is the same, or when NVML could not be read (a
    driver that is there but does not answer: the NVIDIA cards are not known to be gone)."""
    if nvml is None or nvml.broken:
        return None
    if not nvml.ok:
        nvml = NvmlReading(nvml.status, nvml.message)  # no driver at all: no NVIDIA cards
    gpus = as_gpus(gpus_from(nvml, amd), _named)
    same = [(g.name, g.total_bytes) for g in gpus] == [
        (g.name, g.total_bytes) for g in machine.gpus
    ]
    return None if same else Hardware(THIS_MACHINE, gpus, machine.host_bytes)


def resolve(label_or_text: str, *, host_bytes: int | None = None) -> Hardware:
    """A toolbar label ("2× RTX 3090"), "This machine", or any text `lookup` reads ("2x3090",
    "24GiB"); ValueError with a sentence when it reads none of them. What-if profiles keep this
    machine's RAM (`host_bytes`) for the host side of the plan."""
    text = label_or_text.strip()
    if text.lower() == THIS_MACHINE.lower():
        return this_machine()
    for label, query in PROFILE_CHOICES:
        if text.lower() == label.lower():
            return Hardware(label, lookup(query), host_bytes, what_if=True)
    return Hardware(text, lookup(text), host_bytes, what_if=True)
