"""Special files: only regular files (after following symlinks) are opened. A FIFO, socket or
device where a model file, config.json, a safetensors header, a weight index, an Ollama blob
or an HF-cache ref is expected is that row's error (or the root's problem), never opened: an
open of a FIFO blocks until a writer appears, so on main `scan`, `plan` and `preview` hung.

Every call that could block runs in a thread with a deadline; a call still blocked then has
its FIFOs opened for writing (which releases the open) and the test fails."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from qmgui.core.discovery import ScanResult, entry_for_path, scan
from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.hf import read_config, read_safetensors_header
from qmgui.core.safeio import open_regular
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")

T = TypeVar("T")
DEADLINE_S = 10.0


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for f in made:  # release anything still blocked on one (a failed test)
        _release(f)


def _release(fifo: Path) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # nobody is blocked reading it
    os.close(fd)


def mkfifo(path: Path, made: list[Path]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    made.append(path)
    return path


def finishes(fn: Callable[[], T], made: list[Path]) -> T:
    """fn() run with a deadline: a call blocked on a FIFO fails the test instead of hanging."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    if t.is_alive():
        for f in made:
            _release(f)
        t.join(DEADLINE_S)
        pytest.fail(f"still blocked after {DEADLINE_S:.0f} s: a FIFO was opened")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def test_readers_refuse_a_fifo_without_opening_it(tmp_path: Path, fifos: list[Path]) -> None:
    for name, reader in (
        ("m.gguf", read_gguf_header),
        ("model.safetensors", read_safetensors_header),
        ("config.json", read_config),
        ("any", open_regular),
    ):
        fifo = mkfifo(tmp_path / name, fifos)
        with pytest.raises(ModelReadError, match="named pipe"):
            finishes(lambda r=reader, f=fifo: r(f), fifos)  # type: ignore[misc]


def test_a_symlink_is_judged_by_its_target(tmp_path: Path, fifos: list[Path]) -> None:
    fifo = mkfifo(tmp_path / "pipe", fifos)
    (tmp_path / "m.gguf").symlink_to(fifo)
    with pytest.raises(ModelReadError, match="named pipe"):
        finishes(lambda: read_gguf_header(tmp_path / "m.gguf"), fifos)
    if os.path.exists("/dev/zero"):
        (tmp_path / "zero.gguf").symlink_to("/dev/zero")
        with pytest.raises(ModelReadError, match="a device"):
            finishes(lambda: read_gguf_header(tmp_path / "zero.gguf"), fifos)


def test_scan_lists_good_models_beside_fifos(tmp_path: Path, fifos: list[Path]) -> None:
    root = tmp_path / "models"
    write_gguf(root / "good.gguf", PRESETS["llama"])
    mkfifo(root / "pipe.gguf", fifos)
    mkfifo(root / "pipe-00001-of-00002.gguf", fifos)
    write_hf_folder(root / "GoodHF")
    mkfifo(write_hf_folder(root / "ConfigPipe") / "config.json", fifos)
    shards = sorted((write_hf_folder(root / "WeightsPipe", n_shards=2)).glob("*.safetensors"))
    mkfifo(shards[1], fifos)
    mkfifo(write_hf_folder(root / "OnlyPipe") / "model.safetensors", fifos)
    mkfifo(write_hf_folder(root / "IndexPipe") / "model.safetensors.index.json", fifos)
    result: ScanResult = finishes(lambda: scan([root]), fifos)
    rows = {m.name: m for m in result.models}
    assert rows["good"].error is None and rows["GoodHF"].error is None
    for name in ("pipe", "ConfigPipe", "WeightsPipe", "IndexPipe"):
        assert "named pipe" in (rows[name].error or ""), name
    assert (rows["ConfigPipe"].error or "").startswith("config.json:")
    # weights that are only a FIFO: no weights file, so not a model folder (and not opened)
    assert "OnlyPipe" not in rows


def test_a_path_to_a_fifo_is_an_entry_error(tmp_path: Path, fifos: list[Path]) -> None:
    """What `plan` and `preview` read: entry_for_path."""
    write_gguf(tmp_path / "good.gguf", PRESETS["llama"])
    fifo = mkfifo(tmp_path / "pipe.gguf", fifos)
    entry = finishes(lambda: entry_for_path(fifo), fifos)
    assert entry.meta is None and "named pipe" in (entry.error or "")
    hf = write_hf_folder(tmp_path / "hf")
    mkfifo(hf / "config.json", fifos)
    entry = finishes(lambda: entry_for_path(hf), fifos)
    assert entry.meta is None and "named pipe" in (entry.error or "")


def test_a_root_that_is_not_a_folder_says_so(tmp_path: Path, fifos: list[Path]) -> None:
    fifo = mkfifo(tmp_path / "pipe", fifos)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(sock_path))
        roots = [fifo, sock_path] + ([Path("/dev/null")] if os.path.exists("/dev/null") else [])
        result: ScanResult = finishes(lambda: scan(roots), fifos)
    finally:
        sock.close()
    reasons = {p.path: p.reason for p in result.problems}
    assert "is a named pipe (FIFO), not a folder or a .gguf file" in reasons[str(fifo)]
    assert "is a socket" in reasons[str(sock_path)]
    if "/dev/null" in reasons:
        assert "is a device" in reasons["/dev/null"]
    assert result.models == ()


def test_store_files_that_are_fifos(tmp_path: Path, fifos: list[Path]) -> None:
    """The Hugging Face cache's refs/main and an Ollama blob: never opened."""
    repo = tmp_path / "hub" / "models--org--Tiny"
    snap = repo / "snapshots" / "abc123"
    write_hf_folder(snap)
    mkfifo(repo / "refs" / "main", fifos)
    store = tmp_path / "ollama"
    blob = mkfifo(store / "blobs" / "sha256-abc", fifos)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        '{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:abc"}]}'
    )
    result: ScanResult = finishes(lambda: scan([tmp_path / "hub", store]), fifos)
    rows = {m.name: m for m in result.models}
    assert rows["org/Tiny"].error is None  # the newest snapshot, found without the ref
    assert "named pipe" in (rows["tiny:latest"].error or "")
    assert str(blob) == rows["tiny:latest"].path
