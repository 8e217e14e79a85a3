"""AMD GPUs from a recorded amdgpu sysfs tree, and this machine's GPUs merged across vendors."""

from __future__ import annotations

from pathlib import Path

from qmgui.hw.amdgpu import AmdGpu, read_amd_gpus
from qmgui.hw.gpus import local_gpus
from tests.hw.fake_nvml import FakeNvml

TREE = str(Path(__file__).parent.parent / "fixtures" / "sysfs" / "amd-dgpu-igpu-intel" / "drm")


def test_amd_cards_with_vram_are_read_others_left_out() -> None:
    assert read_amd_gpus(TREE) == [
        AmdGpu(0, "AMD Radeon RX 7900 XTX", 25753026560, 1210056704, "1002:744c"),
        AmdGpu(1, "AMD GPU (1002:15bf)", 536870912, 94371840, "1002:15bf"),
    ]
    assert read_amd_gpus(TREE)[0].free_bytes == 25753026560 - 1210056704


def test_no_drm_folder_is_no_gpu(tmp_path: Path) -> None:
    assert read_amd_gpus(str(tmp_path / "missing")) == []


def test_a_crafted_product_name_is_printable(tmp_path: Path) -> None:
    device = tmp_path / "card0" / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x1002\n")
    (device / "mem_info_vram_total").write_text("1024\n")
    (device / "mem_info_vram_used").write_text("4096\n")  # more used than total: clamped
    (device / "product_name").write_text("Radeon\x1b[31m evil\n")
    (gpu,) = read_amd_gpus(str(tmp_path))
    assert "\x1b" not in gpu.name and gpu.used_bytes == 1024 and gpu.free_bytes == 0


def test_nvidia_first_then_amd() -> None:
    gpus = local_gpus(nvml=FakeNvml("two-gpus-with-processes.json"), drm_root=TREE)
    # the iGPU's 512 MiB carve-out is host memory, not a card
    assert [(g.index, g.vendor) for g in gpus] == [(0, "nvidia"), (1, "nvidia"), (2, "amd")]
    assert gpus[2].name == "AMD Radeon RX 7900 XTX"
    assert [a.integrated for a in read_amd_gpus(TREE)] == [False, True]


def test_plan_sees_the_amd_cards(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`qmgui plan` on this machine (no --gpu): the AMD cards are its GPUs."""
    import json

    from qmgui.hw import amdgpu
    from tests.synth.factory import PRESETS, write_gguf
    from tests.test_cli import run

    monkeypatch.setattr(amdgpu, "DRM", TREE)
    model = write_gguf(tmp_path / "tiny.gguf", PRESETS["llama"])
    code, out, _ = run("plan", str(model), "--json")
    assert code == 0
    plan = json.loads(out)
    names = [d["name"] for d in plan["devices"]]
    assert names == ["GPU0", "CPU"], names  # the RX 7900 XTX; the iGPU is host memory
    assert plan["fits"]


def test_nvlink_peers_come_from_the_reading() -> None:
    """The recorded 4090 + 3090 desktop has no NVLink: each GPU's peers are known and empty;
    AMD cards' are unknown."""
    from qmgui.hw.gpus import as_gpus

    gpus = local_gpus(nvml=FakeNvml("two-gpus-with-processes.json"), drm_root=TREE)
    assert [g.nvlink_peers for g in gpus] == [frozenset(), frozenset(), None]
    planned = as_gpus(gpus, lambda g: f"GPU{g.index}")
    assert [g.nvlink for g in planned] == [frozenset(), frozenset(), None]
    linked = FakeNvml("two-gpus-with-processes.json")
    linked.reading["nvlink"] = [[0, 1]]
    a, b = as_gpus(local_gpus(nvml=linked, drm_root="/nonexistent"), lambda g: f"GPU{g.index}")
    assert a.nvlink == frozenset({"GPU1"}) and b.nvlink == frozenset({"GPU0"})
