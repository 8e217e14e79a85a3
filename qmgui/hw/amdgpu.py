"""AMD GPUs from the kernel's amdgpu driver (Linux sysfs): no library needed.

Each `/sys/class/drm/cardN` whose `device/vendor` is AMD's (0x1002) and which reports VRAM
(`device/mem_info_vram_total`, `device/mem_info_vram_used`, in bytes) is one GPU; its name is
`device/product_name` where the driver gives one, else the PCI id. Connectors
(`card0-DP-1`) and render nodes are not cards. Integrated GPUs report a small VRAM carve-out
here (under 2 GiB: `integrated`); the rest of their memory is the host's, so the planner does
not count them as cards. Nothing here raises: an unreadable card is left
out. The root is a parameter so tests replay recorded trees.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from qmgui.core.textsafe import printable

DRM = "/sys/class/drm"
AMD_VENDOR = "0x1002"
_CARD = re.compile(r"^card(\d+)$")
_MAX_READ = 4096
INTEGRATED_BELOW = 2 << 30  # an APU's VRAM carve-out; discrete cards have far more


@dataclass(frozen=True)
class AmdGpu:
    card: int  # N of /sys/class/drm/cardN
    name: str
    total_bytes: int
    used_bytes: int
    pci_id: str  # "1002:744c"

    @property
    def free_bytes(self) -> int:
        return max(self.total_bytes - self.used_bytes, 0)

    @property
    def integrated(self) -> bool:
        """An APU: a small carve-out of host memory, not a card to place models on."""
        return self.total_bytes < INTEGRATED_BELOW


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(_MAX_READ).strip()
    except OSError:
        return None


def _int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        value = int(text, 0)
    except ValueError:
        return None
    return value if value >= 0 else None


def read_amd_gpus(root: str = DRM) -> list[AmdGpu]:
    """The AMD GPUs under `root`, in card order."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    cards = sorted((int(m.group(1)), n) for n in names if (m := _CARD.match(n)))
    out = []
    for number, name in cards:
        device = os.path.join(root, name, "device")
        if (_read(os.path.join(device, "vendor")) or "").lower() != AMD_VENDOR:
            continue
        total = _int(os.path.join(device, "mem_info_vram_total"))
        used = _int(os.path.join(device, "mem_info_vram_used"))
        if not total:
            continue
        product = (_read(os.path.join(device, "product_name")) or "").strip()
        dev_id = (_read(os.path.join(device, "device")) or "").lower().removeprefix("0x")
        pci = f"1002:{dev_id}" if dev_id else "1002"
        label = printable(product)[:80] if product else f"AMD GPU ({pci})"
        out.append(AmdGpu(number, label, total, min(used or 0, total), pci))
    return out
