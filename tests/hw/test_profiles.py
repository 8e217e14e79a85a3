"""What-if GPU profiles: names and aliases, counts, custom sizes, Apple unified memory."""

from __future__ import annotations

import pytest

from qmgui.core.fit import Budget
from qmgui.core.footprint import Gpu
from qmgui.hw.profiles import (
    APPLE_LARGE_SHARE,
    APPLE_SMALL_SHARE,
    PROFILES,
    custom_gpu,
    find_profile,
    lookup,
)

GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "name", "gib"),
    [
        ("4090", "RTX 4090", 24),
        ("rtx 4090", "RTX 4090", 24),
        ("RTX4090", "RTX 4090", 24),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 24),
        ("3060", "RTX 3060", 12),
        ("3090", "RTX 3090", 24),
        ("5090", "RTX 5090", 32),
        ("a100 40gb", "A100 40GB", 40),
        ("A100-80GB", "A100 80GB", 80),
        ("a100 80", "A100 80GB", 80),
        ("h100", "H100 80GB", 80),
        ("H100 NVL", "H100 NVL 94GB", 94),
        ("h200", "H200 141GB", 141),
        ("l4", "L4", 24),
        ("rx 7900 xtx", "RX 7900 XTX", 24),
        ("7900xtx", "RX 7900 XTX", 24),
        ("AMD Radeon RX 7900 XTX", "RX 7900 XTX", 24),
        ("a6000", "RTX A6000", 48),
        ("arc a770", "Arc A770 16GB", 16),
        ("mi300x", "Instinct MI300X", 192),
    ],
)
def test_find_profile(text: str, name: str, gib: int) -> None:
    p = find_profile(text)
    assert p.name == name
    assert p.memory_bytes == gib * GIB


def test_two_gpus_from_a_count() -> None:
    gpus = lookup("2x3090")
    assert gpus == (
        Gpu("GPU0 (RTX 3090)", 24 * GIB, None, "cuda"),
        Gpu("GPU1 (RTX 3090)", 24 * GIB, None, "cuda"),
    )
    assert lookup("2× RTX 3090") == gpus
    assert lookup("2 * 3090") == gpus


def test_mixed_and_custom() -> None:
    gpus = lookup("4090+3060, 24GiB")
    assert [g.name for g in gpus] == ["GPU0 (RTX 4090)", "GPU1 (RTX 3060)", "GPU2 (24GiB GPU)"]
    assert [g.total_bytes for g in gpus] == [24 * GIB, 12 * GIB, 24 * GIB]
    assert len({g.name for g in gpus}) == len(gpus)  # the planner keys devices by name
    assert lookup("2x24GiB")[1].total_bytes == 24 * GIB
    assert lookup("80GB")[0].total_bytes == 80 * 10**9  # GB is decimal, as parse_size reads it


def test_custom_gpu() -> None:
    assert custom_gpu("12G") == Gpu("12G GPU", 12 * GIB)
    assert custom_gpu("16GiB", name="my card", backend="vulkan") == Gpu(
        "my card", 16 * GIB, None, "vulkan"
    )
    with pytest.raises(ValueError, match="not a size"):
        custom_gpu("lots")


def test_backends() -> None:
    assert find_profile("4090").backend == "cuda"
    assert find_profile("7900xtx").backend == "cuda"  # ROCm runs ggml's CUDA backend (HIP)
    assert find_profile("b580").backend == "vulkan"
    assert find_profile("m2 ultra 192gb").backend == "metal"


def test_apple_unified_memory() -> None:
    big = find_profile("Apple M3 Max 128GB")
    assert big.unified and big.memory_bytes == 128 * GIB
    assert big.budget_bytes == int(128 * GIB * APPLE_LARGE_SHARE)
    assert big.to_gpu() == Gpu("Apple M3 Max 128GB", int(128 * GIB * 0.75), None, "metal")
    # any configuration, listed or not
    small = find_profile("m2 max 32gb")
    assert small.name == "Apple M2 Max 32GB"
    assert small.budget_bytes == int(32 * GIB * APPLE_SMALL_SHARE)
    assert find_profile("M4 Pro 24G").memory_bytes == 24 * GIB


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a100", "'a100' could be A100 40GB or A100 80GB; say which (e.g. 'A100 80GB')"),
        ("3080", "'3080' could be RTX 3080 10GB or RTX 3080 12GB"),
        ("4095", "no GPU profile called '4095' (did you mean RTX 4090?); a size works too"),
        ("m3 max", "Apple silicon needs its memory size ('m3 max 64gb')"),
        ("rtx 9999", "no GPU profile called 'rtx 9999'"),
        ("", "no GPU given (examples: 4090, 2x3090, 24GiB)"),
        ("0x3090", "'0x3090': a GPU count must be between 1 and 64"),
        ("0GiB", "a size must be positive"),
    ],
)
def test_errors_say_what_would_match(text: str, message: str) -> None:
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")
    ):
        lookup(text)


def test_table_is_sound() -> None:
    keys = [p.key for p in PROFILES]
    assert len(keys) == len(set(keys))
    for p in PROFILES:
        assert p.memory_bytes % GIB == 0, p.name  # spec sheets give whole GB (GiB)
        assert p.source and p.vendor in {"nvidia", "amd", "intel", "apple"}
        assert p.backend in {"cuda", "vulkan", "metal"}
        assert p.unified == (p.vendor == "apple")
        assert find_profile(p.name) == p  # every name finds itself
        assert p.to_json()["budget_bytes"] == p.budget_bytes


def test_profiles_plan_like_real_gpus() -> None:
    budget = Budget(gpus=lookup("2x3090"))
    assert [g.total_bytes for g in budget.gpus] == [24 * GIB, 24 * GIB]
