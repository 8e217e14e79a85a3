"""Byte and count formatting shared by the CLI and the window."""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def format_bytes(n: int | None) -> str:
    """`1536 -> '1.5 KiB'`; binary units, because that is how VRAM is sold and reported."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: int | None) -> str:
    """Parameter counts the way model cards write them: 7.6B, 270M, 12K (three digits at most
    before the unit, one decimal below 100)."""
    if n is None:
        return "-"
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            value = n / div
            return f"{value:.0f}{suffix}" if value >= 100 else f"{value:.1f}{suffix}"
    return str(n)


_NATURAL_PART = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders embedded numbers by value: model-2 before model-10 before
    model-100; case-insensitive."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in _NATURAL_PART.split(text.lower())
        if part
    )


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kb": 1000,
    "kib": KIB,
    "m": MIB,
    "mb": 1000**2,
    "mib": MIB,
    "g": GIB,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_size(text: str, *, allow_zero: bool = False) -> int:
    """'24GiB', '24G' (binary), '80GB' (decimal), '512MiB', '1.5GiB', '1048576' -> bytes."""
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("kmgtib")
    unit = s[len(num) :]
    if unit not in _SIZE_UNITS or not num:
        raise ValueError(f"not a size: {text!r} (examples: 24GiB, 12G, 80GB, 512MiB)")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 24GiB, 12G, 80GB, 512MiB)") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"a size must be positive, not {text!r}")
    return int(value * _SIZE_UNITS[unit])
