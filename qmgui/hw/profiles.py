"""What-if GPUs: plan for hardware that is not in this machine ("2x3090", "RTX 4090", "24GiB").

`PROFILES` is a table of common cards with their memory from the vendors' spec sheets.
`lookup("2x3090")` turns a user's words into `qmgui.core.footprint.Gpu` values the planner
takes; `find_profile` resolves one name; a size with a unit ("24GiB", "80GB") is a card of
that size. Unknown or ambiguous names raise ValueError with a sentence that says what would
match.

Memory sizes. Vendors print VRAM as "GB" and mean binary gigabytes: GDDR and HBM come in
power-of-two chip densities (a 24 GB RTX 4090 is twelve 16 Gbit GDDR6X chips, 24 GiB), so every
entry is ``<GB> * 2**30`` bytes. The H100 NVL's 94 GB and H200's 141 GB are the enabled part of
96 and 144 GiB of HBM and are read the same way. Drivers report up to about 1% less than this
(ECC and firmware reservations: nvidia-smi shows 81559 MiB on an 80 GB H100, 24564 MiB on an
RTX 4090); the planner's per-GPU reserve covers that difference.

Backends. Each profile says whose allocation rules the sizing core applies: NVIDIA → "cuda";
AMD cards run llama.cpp's CUDA backend compiled with HIP (ROCm), so they use the "cuda" rules
too; Intel Arc runs the SYCL or Vulkan backend, sized as "vulkan"; Apple → "metal".

Apple silicon has unified memory: the GPU may wire only part of it. Metal reports that part as
``recommendedMaxWorkingSetSize`` (llama.cpp's device memory): by macOS's default
``iogpu.wired_limit_mb``, about 75% of RAM on Macs with more than 36 GiB and about 67% on
smaller ones (observed defaults, not a spec; ``sudo sysctl iogpu.wired_limit_mb=…`` raises it).
A unified profile plans with that share and says so in its name.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from qmgui.core.footprint import Gpu
from qmgui.core.units import GIB, parse_size

__all__ = [
    "APPLE_LARGE_SHARE",
    "APPLE_SMALL_SHARE",
    "PROFILES",
    "GpuProfile",
    "custom_gpu",
    "find_profile",
    "lookup",
]

# Share of unified memory Metal lets the GPU use by default; see the module docstring.
APPLE_LARGE_SHARE = 0.75
APPLE_SMALL_SHARE = 2 / 3
APPLE_LARGE_FROM = 36 * GIB  # "more than 36 GiB" gets the larger share


@dataclass(frozen=True)
class GpuProfile:
    """One card to plan for: `memory_bytes` as the vendor sells it (for unified memory, the
    whole RAM), `backend` the sizing rules (cuda, vulkan, metal), `source` where the number
    comes from."""

    key: str
    name: str
    vendor: str  # nvidia, amd, intel, apple
    memory_bytes: int
    backend: str
    source: str
    unified: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def budget_bytes(self) -> int:
        """What a model may use on it: all of it, or Metal's working set on unified memory."""
        if not self.unified:
            return self.memory_bytes
        share = APPLE_LARGE_SHARE if self.memory_bytes > APPLE_LARGE_FROM else APPLE_SMALL_SHARE
        return int(self.memory_bytes * share)

    def to_gpu(self, name: str | None = None) -> Gpu:
        """This card as a planner GPU (all of its budget free)."""
        return Gpu(name=name or self.name, total_bytes=self.budget_bytes, backend=self.backend)

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "name": self.name,
            "vendor": self.vendor,
            "memory_bytes": self.memory_bytes,
            "budget_bytes": self.budget_bytes,
            "backend": self.backend,
            "unified": self.unified,
            "source": self.source,
        }


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _nv(name: str, gb: int, sheet: str) -> GpuProfile:
    return GpuProfile(
        _key(name), name, "nvidia", gb * GIB, "cuda", f"NVIDIA {sheet} specifications: {gb} GB"
    )


def _amd(name: str, gb: int, sheet: str) -> GpuProfile:
    # ROCm: ggml's CUDA backend built with HIP, so the CUDA allocation rules apply
    return GpuProfile(
        _key(name), name, "amd", gb * GIB, "cuda", f"AMD {sheet} specifications: {gb} GB"
    )


def _intel(name: str, gb: int, sheet: str) -> GpuProfile:
    return GpuProfile(
        _key(name), name, "intel", gb * GIB, "vulkan", f"Intel {sheet} specifications: {gb} GB"
    )


def _apple(chip: str, gb: int) -> GpuProfile:
    name = f"Apple {chip} {gb}GB"
    return GpuProfile(
        _key(name),
        name,
        "apple",
        gb * GIB,
        "metal",
        f"Apple {chip} tech specs: {gb} GB unified memory (a configuration offered)",
        unified=True,
    )


PROFILES: tuple[GpuProfile, ...] = (
    # NVIDIA GeForce (nvidia.com product specification pages)
    _nv("RTX 3060", 12, "GeForce RTX 3060 (12 GB model)"),
    _nv("RTX 3060 Ti", 8, "GeForce RTX 3060 Ti"),
    _nv("RTX 3070", 8, "GeForce RTX 3070"),
    _nv("RTX 3080 10GB", 10, "GeForce RTX 3080"),
    _nv("RTX 3080 12GB", 12, "GeForce RTX 3080 (12 GB model)"),
    _nv("RTX 3080 Ti", 12, "GeForce RTX 3080 Ti"),
    _nv("RTX 3090", 24, "GeForce RTX 3090"),
    _nv("RTX 3090 Ti", 24, "GeForce RTX 3090 Ti"),
    _nv("RTX 4060", 8, "GeForce RTX 4060"),
    _nv("RTX 4060 Ti 8GB", 8, "GeForce RTX 4060 Ti"),
    _nv("RTX 4060 Ti 16GB", 16, "GeForce RTX 4060 Ti (16 GB model)"),
    _nv("RTX 4070", 12, "GeForce RTX 4070"),
    _nv("RTX 4070 Super", 12, "GeForce RTX 4070 SUPER"),
    _nv("RTX 4070 Ti", 12, "GeForce RTX 4070 Ti"),
    _nv("RTX 4070 Ti Super", 16, "GeForce RTX 4070 Ti SUPER"),
    _nv("RTX 4080", 16, "GeForce RTX 4080"),
    _nv("RTX 4080 Super", 16, "GeForce RTX 4080 SUPER"),
    _nv("RTX 4090", 24, "GeForce RTX 4090"),
    _nv("RTX 5060 Ti 8GB", 8, "GeForce RTX 5060 Ti"),
    _nv("RTX 5060 Ti 16GB", 16, "GeForce RTX 5060 Ti (16 GB model)"),
    _nv("RTX 5070", 12, "GeForce RTX 5070"),
    _nv("RTX 5070 Ti", 16, "GeForce RTX 5070 Ti"),
    _nv("RTX 5080", 16, "GeForce RTX 5080"),
    _nv("RTX 5090", 32, "GeForce RTX 5090"),
    # NVIDIA workstation
    _nv("RTX A4000", 16, "RTX A4000 datasheet"),
    _nv("RTX A5000", 24, "RTX A5000 datasheet"),
    _nv("RTX A6000", 48, "RTX A6000 datasheet"),
    _nv("RTX 4000 Ada", 20, "RTX 4000 Ada Generation datasheet"),
    _nv("RTX 6000 Ada", 48, "RTX 6000 Ada Generation datasheet"),
    _nv("RTX PRO 6000 Blackwell", 96, "RTX PRO 6000 Blackwell datasheet"),
    # NVIDIA data centre (product datasheets)
    _nv("Tesla T4", 16, "T4 datasheet"),
    _nv("V100 16GB", 16, "V100 datasheet"),
    _nv("V100 32GB", 32, "V100 datasheet"),
    _nv("A10", 24, "A10 datasheet"),
    _nv("A40", 48, "A40 datasheet"),
    _nv("L4", 24, "L4 datasheet"),
    _nv("L40S", 48, "L40S datasheet"),
    _nv("A100 40GB", 40, "A100 datasheet"),
    _nv("A100 80GB", 80, "A100 datasheet"),
    _nv("H100 80GB", 80, "H100 datasheet (SXM5 and PCIe)"),
    _nv("H100 NVL 94GB", 94, "H100 NVL datasheet"),
    _nv("H200 141GB", 141, "H200 datasheet (SXM and NVL)"),
    # AMD (amd.com product specifications)
    _amd("RX 6800 XT", 16, "Radeon RX 6800 XT"),
    _amd("RX 6900 XT", 16, "Radeon RX 6900 XT"),
    _amd("RX 7800 XT", 16, "Radeon RX 7800 XT"),
    _amd("RX 7900 XT", 20, "Radeon RX 7900 XT"),
    _amd("RX 7900 XTX", 24, "Radeon RX 7900 XTX"),
    _amd("RX 9070 XT", 16, "Radeon RX 9070 XT"),
    _amd("Radeon PRO W7900", 48, "Radeon PRO W7900"),
    _amd("Instinct MI210", 64, "Instinct MI210"),
    _amd("Instinct MI300X", 192, "Instinct MI300X"),
    # Intel (intel.com product specifications)
    _intel("Arc A770 16GB", 16, "Arc A770 Graphics (16 GB model)"),
    _intel("Arc B580", 12, "Arc B580 Graphics"),
    # Apple silicon: common configurations; any other is "m3 max 64gb" (see lookup)
    _apple("M1", 16),
    _apple("M1 Max", 64),
    _apple("M1 Ultra", 128),
    _apple("M2 Max", 96),
    _apple("M2 Ultra", 192),
    _apple("M3 Max", 128),
    _apple("M3 Ultra", 512),
    _apple("M4 Pro", 64),
    _apple("M4 Max", 128),
)

# words users add or drop: "NVIDIA GeForce RTX 4090", "AMD Radeon RX 7900 XTX"
_NOISE = re.compile(
    r"\b(nvidia|geforce|amd|radeon(?!\s*pro)|intel|apple|graphics|tesla)\b|\(r\)|\(tm\)"
)
_PREFIXES = ("rtx", "rx", "arc", "instinct", "radeonpro")
# "2x3090", "2 × RTX 3090", "4*24GiB"; at most two digits, so "7900xtx" is a card
_COUNT = re.compile(r"^\s*(\d{1,2})\s*(?:x|×|\*)\s*(.+)$", re.IGNORECASE)
_SIZE = re.compile(r"^\d+(?:\.\d+)?\s*(?:[kmgt]i?b?|b)$", re.IGNORECASE)  # parse_size's units
_APPLE = re.compile(r"^m(\d)(pro|max|ultra)?(\d+)(?:gb|gib|g)?$")
MAX_COUNT = 64  # more GPUs than any one box holds is a typo


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _NOISE.sub(" ", text.lower()))


def _aliases(p: GpuProfile) -> set[str]:
    full = _norm(p.name)
    gb = p.memory_bytes // GIB
    base = full.removesuffix(f"{gb}gb")  # "a10080gb" -> "a100"
    forms = {full, f"{base}{gb}gb", f"{base}{gb}", f"{base}{gb}gib"}
    if not p.unified:  # "m3 max" alone says nothing about the memory: not an alias
        forms.add(base)
    forms |= {_norm(a) for a in p.aliases}
    for f in list(forms):
        for prefix in _PREFIXES:
            if f.startswith(prefix) and len(f) > len(prefix):
                forms.add(f[len(prefix) :])
    return forms


def _index() -> dict[str, list[GpuProfile]]:
    index: dict[str, list[GpuProfile]] = {}
    for p in PROFILES:
        for alias in _aliases(p):
            index.setdefault(alias, []).append(p)
    return index


_INDEX = _index()


def _apple_custom(key: str) -> GpuProfile | None:
    """ "m3max64gb" -> an Apple M3 Max with 64 GB, whether or not the table lists it."""
    m = _APPLE.match(key)
    if m is None:
        return None
    chip = f"M{m[1]}" + (f" {m[2].capitalize()}" if m[2] else "")
    return _apple(chip, int(m[3]))


def find_profile(name: str) -> GpuProfile:
    """The profile `name` means: "4090", "rtx 4090", "NVIDIA GeForce RTX 4090", "a100 80gb",
    "7900xtx", "m3 max 64gb". Raises ValueError naming the candidates when `name` is unknown
    or matches several cards."""
    key = _norm(name)
    found = _INDEX.get(key, [])
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        names = " or ".join(p.name for p in found)
        raise ValueError(f"{name!r} could be {names}; say which (e.g. {found[-1].name!r})")
    apple = _apple_custom(key)
    if apple is not None:
        return apple
    close = difflib.get_close_matches(key, list(_INDEX), n=3, cutoff=0.6)
    hint = ", ".join(dict.fromkeys(_INDEX[c][0].name for c in close))
    parts = [f"no GPU profile called {name!r}" + (f" (did you mean {hint}?)" if hint else "")]
    if _APPLE.match(key + "0"):  # "m3max": a chip without its memory size
        parts.append("Apple silicon needs its memory size ('m3 max 64gb')")
    parts.append("a size works too: 24GiB, 80GB")
    raise ValueError("; ".join(parts) + ".")


def custom_gpu(size: str, *, name: str | None = None, backend: str = "cuda") -> Gpu:
    """A card of `size` ("24GiB", "12G", "80GB": `qmgui.core.units.parse_size`)."""
    total = parse_size(size)
    return Gpu(name=name or f"{size.strip()} GPU", total_bytes=total, backend=backend)


def _one(part: str) -> tuple[int, Gpu]:
    count, what = 1, part.strip()
    if m := _COUNT.match(what):
        count, what = int(m[1]), m[2].strip()
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"{part.strip()!r}: a GPU count must be between 1 and {MAX_COUNT}")
    if _SIZE.match(what) and not _APPLE.match(_norm(what)):
        return count, custom_gpu(what)
    return count, find_profile(what).to_gpu()


def lookup(text: str) -> tuple[Gpu, ...]:
    """The GPUs `text` describes: "4090", "2x3090", "2× RTX 3090", "4090+3090", "24GiB",
    "2x24GiB", "a100 80gb, 3090". Each GPU is named "GPU<i> (<card>)", unique as the planner
    needs. Raises ValueError with a sentence for anything it cannot read."""
    parts = [p for p in re.split(r"[+,;]", text) if p.strip()]
    if not parts:
        raise ValueError("no GPU given (examples: 4090, 2x3090, 24GiB)")
    gpus: list[Gpu] = []
    for part in parts:
        count, gpu = _one(part)
        for _ in range(count):
            i = len(gpus)
            gpus.append(
                Gpu(name=f"GPU{i} ({gpu.name})", total_bytes=gpu.total_bytes, backend=gpu.backend)
            )
    return tuple(gpus)
