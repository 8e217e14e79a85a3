"""The disk rule on the command line: a model on a network filesystem is planned and launched
with `--no-mmap` when its weights fit in 85% of RAM, with the reason in the plan; beyond that
mmap stays, with a warning; a `--no-mmap` or a local disk changes nothing. The filesystem comes
through `qmgui.hw.mounts.filesystem_of` (no network mount can be made here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qmgui.hw import mounts
from qmgui.hw.mounts import Mount
from tests.synth.factory import PRESETS, write_gguf
from tests.test_cli import run


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", PRESETS["llama"])


def on(monkeypatch: pytest.MonkeyPatch, fstype: str) -> None:
    monkeypatch.setattr(mounts, "filesystem_of", lambda path: Mount("/mnt/nas", fstype, "nas:/m"))


def test_on_nfs_the_plan_and_the_command_read_the_weights_once(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "nfs4")
    code, out, _ = run("plan", str(model), "--json")
    assert code == 0
    notes = json.loads(out)["notes"]
    assert any("network filesystem (nfs4, nas:/m)" in n and "--no-mmap" in n for n in notes)
    code, out, _ = run("preview", str(model))
    assert code == 0 and "--no-mmap" in out


def test_too_large_for_ram_keeps_mmap_with_a_warning(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "cifs")
    code, out, _ = run("plan", str(model), "--host-memory", "1KiB")
    assert code == 1  # 1 KiB of RAM holds nothing; the disk note still says why mmap stays
    assert "mmap stays on" in out and "warning: pages dropped" in out


def test_a_local_disk_or_an_explicit_choice_changes_nothing(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "ext4")
    code, out, _ = run("preview", str(model))
    assert code == 0 and "--no-mmap" not in out
    on(monkeypatch, "nfs")
    code, out, _ = run("plan", str(model), "--no-mmap", "--json")
    assert not any("network filesystem" in n for n in json.loads(out)["notes"])
