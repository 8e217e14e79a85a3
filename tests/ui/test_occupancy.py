"""Who holds a device's memory: engine shares (planned, measured) and other processes, from a
replayed NVML reading and host figures."""

from __future__ import annotations

from pathlib import Path

from qmgui.core.footprint import CPU, DeviceFootprint, Footprint, Gpu
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings, resolve
from qmgui.core.meta import ModelMeta, meta_from_gguf
from qmgui.core.units import GIB, MIB
from qmgui.hw.nvml import read_nvml
from qmgui.ui.occupancy import (
    EngineLoad,
    LiveReading,
    free_for_plan,
    gpu_index,
    others_on,
    shares_on,
)
from tests.hw.fake_nvml import FakeNvml
from tests.synth.factory import PRESETS, write_gguf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


_META: list[ModelMeta] = []


def _meta() -> ModelMeta:
    if not _META:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            p = write_gguf(Path(d) / "m.gguf", PRESETS["llama"])
            _META.append(meta_from_gguf(read_gguf_header(p), file_name=p.name))
    return _META[0]


def footprint(**per_device: int) -> Footprint:
    meta = _meta()
    return Footprint(
        resolve(meta, LaunchSettings()),
        0,
        (),
        tuple(DeviceFootprint(name, weights=n) for name, n in per_device.items()),
    )


def test_gpu_index_reads_this_machines_names() -> None:
    assert gpu_index("GPU0 (NVIDIA H200)") == 0
    assert gpu_index("GPU12 (x)") == 12
    assert gpu_index("RTX 4090") is None
    assert gpu_index(CPU) is None


def test_shares_prefer_measured_bytes() -> None:
    a = EngineLoad(1, "a", "ma", footprint(**{"GPU0 (x)": 2 * GIB, CPU: 100 * MIB}), {})
    b = EngineLoad(2, "b", "mb", footprint(**{"GPU0 (x)": GIB}), {"GPU0 (x)": GIB + 5 * MIB})
    shares = shares_on("GPU0 (x)", [a, b])
    assert [(s.name, s.planned, s.measured) for s in shares] == [
        ("a", 2 * GIB, None),
        ("b", GIB, GIB + 5 * MIB),
    ]
    assert b.bytes_on("GPU0 (x)") == GIB + 5 * MIB
    assert [s.name for s in shares_on(CPU, [a, b])] == ["a"]


def test_others_on_a_gpu_leave_out_the_engines_processes() -> None:
    reading = read_nvml(nvml=FakeNvml(str(FIXTURES / "two-gpus-with-processes.json")))
    assert reading.ok
    gpu0 = reading.gpus[0]
    live = LiveReading(reading, None, None)
    ours = gpu0.processes[0]
    name = f"GPU0 ({gpu0.name})"
    load = EngineLoad(1, "mine", "m", footprint(**{name: 1}), {}, frozenset({ours.pid}))
    assert ours.used_bytes is not None
    assert others_on(name, live, [load]) == gpu0.used_bytes - ours.used_bytes
    # without the engine, everything in use is someone else's
    assert others_on(name, live, []) == gpu0.used_bytes
    assert others_on("GPU7 (absent)", live, []) is None


def test_others_in_ram_and_unknowns() -> None:
    live = LiveReading(None, 32 * GIB, 10 * GIB)
    load = EngineLoad(1, "mine", "m", footprint(**{CPU: 3 * GIB}), {CPU: 4 * GIB})
    assert others_on(CPU, live, [load]) == 6 * GIB
    assert others_on(CPU, None, [load]) is None
    assert others_on("GPU0 (x)", live, [load]) is None  # no NVML reading


def test_free_for_plan_takes_nvmls_free_memory() -> None:
    reading = read_nvml(nvml=FakeNvml(str(FIXTURES / "h200-real.json")))
    g = Gpu("GPU0 (NVIDIA H200)", reading.gpus[0].total_bytes)
    (now,) = free_for_plan([g], LiveReading(reading, None, None))
    assert now.free_bytes == reading.gpus[0].free_bytes
    assert free_for_plan([g], None) == (g,)


def test_amd_cards_are_read_live_from_sysfs() -> None:
    """The window's GPU2 on the 4090 + 3090 + RX 7900 XTX machine is the AMD card: its free
    memory and what others hold come from the sysfs reading of the poll, not the start-up
    value."""
    from qmgui.hw.amdgpu import read_amd_gpus

    tree = str(FIXTURES.parent / "sysfs" / "amd-dgpu-igpu-intel" / "drm")
    reading = read_nvml(nvml=FakeNvml(str(FIXTURES / "two-gpus-with-processes.json")))
    cards = tuple(a for a in read_amd_gpus(tree) if not a.integrated)
    (xtx,) = cards
    live = LiveReading(reading, None, None, cards)
    stale = Gpu("GPU2 (AMD Radeon RX 7900 XTX)", xtx.total_bytes, xtx.total_bytes)
    nvidia = Gpu("GPU0 (NVIDIA GeForce RTX 4090)", reading.gpus[0].total_bytes, 1)
    now = free_for_plan([nvidia, stale], live)
    assert [g.free_bytes for g in now] == [reading.gpus[0].free_bytes, xtx.free_bytes]
    load = EngineLoad(1, "mine", "m", footprint(**{stale.name: GIB}), {})
    assert others_on(stale.name, live, [load]) == xtx.used_bytes - GIB
    assert others_on("GPU3 (absent)", live, []) is None
    # without an NVML reading the AMD card is GPU0
    alone = LiveReading(None, None, None, cards)
    (g,) = free_for_plan([replace_name(stale, "GPU0 (AMD Radeon RX 7900 XTX)")], alone)
    assert g.free_bytes == xtx.free_bytes


def replace_name(g: Gpu, name: str) -> Gpu:
    return Gpu(name, g.total_bytes, g.free_bytes, g.backend)


def test_a_card_that_comes_or_goes_changes_this_machine() -> None:
    """Seeds row 99: the window's live poll sees the set of GPUs change (a card added, a driver
    that came up late, one removed) and plans for the GPUs there now; a driver that is there but
    does not answer is not taken for the cards being gone."""
    from qmgui.hw.amdgpu import read_amd_gpus
    from qmgui.hw.nvml import STATUS_ERROR, STATUS_NO_DRIVER, NvmlReading
    from qmgui.ui.hardware import THIS_MACHINE, Hardware, seen_now

    two = read_nvml(nvml=FakeNvml(str(FIXTURES / "two-gpus-with-processes.json")))
    tree = str(FIXTURES.parent / "sysfs" / "amd-dgpu-igpu-intel" / "drm")
    amd = tuple(read_amd_gpus(tree))
    cpu_only = Hardware(THIS_MACHINE, (), 64 * GIB)
    now = seen_now(cpu_only, two, amd)  # the driver came up: NVIDIA first, then the AMD card
    assert now is not None and now.host_bytes == 64 * GIB and not now.what_if
    assert [g.name for g in now.gpus] == [
        f"GPU0 ({two.gpus[0].name})",
        f"GPU1 ({two.gpus[1].name})",
        "GPU2 (AMD Radeon RX 7900 XTX)",
    ]
    assert seen_now(now, two, amd) is None  # the same set: nothing to do
    no_driver = NvmlReading(STATUS_NO_DRIVER, "libnvidia-ml.so.1 not found")
    gone = seen_now(now, no_driver, amd)  # the NVIDIA cards went (the driver with them)
    assert gone is not None and [g.name for g in gone.gpus] == ["GPU0 (AMD Radeon RX 7900 XTX)"]
    broken = NvmlReading(STATUS_ERROR, "the driver does not answer")
    assert broken.broken
    assert seen_now(now, broken, amd) is None  # not known to be gone
    assert seen_now(now, None, amd) is None  # not read
