"""The window applies the disk rule: a model on a network filesystem gets `--no-mmap` in its
command and the reason beside the verdict (the filesystem through the `filesystem_of` seam)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.hw import mounts
from qmgui.hw.mounts import Mount
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle


def test_a_model_on_nfs_is_read_once(  # type: ignore[no-untyped-def]
    qtbot, make_window, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_gguf(tmp_path / "tiny.gguf", PRESETS["llama"])
    monkeypatch.setattr(mounts, "filesystem_of", lambda p: Mount("/mnt/nas", "nfs4", "nas:/m"))
    w = make_window([str(tmp_path)])
    settle(qtbot, w)
    assert w.table.select_name("tiny")
    settle(qtbot, w)
    o = w.outcome
    assert o is not None and "--no-mmap" in o.command.argv
    assert "network filesystem (nfs4, nas:/m)" in o.disk_note
    assert "Note: the model is on a network filesystem" in w.memory.verdict.text()
