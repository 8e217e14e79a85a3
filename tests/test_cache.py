"""The SQLite header cache: hits for unchanged files, misses for changed ones, and a corrupt
database set aside instead of breaking the scan."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qmgui.cache import SqliteHeaderCache
from qmgui.core.discovery import scan
from tests.synth.factory import PRESETS, write_gguf, write_mmproj, write_split


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cached")
    write_gguf(root / "a" / "llama.gguf", PRESETS["llama"])
    write_gguf(root / "b" / "qwen2.gguf", PRESETS["qwen2"])
    write_mmproj(root / "b" / "mmproj-qwen2.gguf")
    write_split(root / "c", PRESETS["llama"], n_shards=2)
    (root / "d").mkdir()
    (root / "d" / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 100)
    return root


class CountingCache(SqliteHeaderCache):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hits = 0
        self.misses = 0

    def get(self, path, size, mtime_ns):  # type: ignore[no-untyped-def]
        v = super().get(path, size, mtime_ns)
        if v is None:
            self.misses += 1
        else:
            self.hits += 1
        return v


def test_header_cache_serves_unchanged_files(tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "cache" / "headers.sqlite"
    with SqliteHeaderCache(db) as cache:
        first = scan([tree], cache=cache)
    again = CountingCache(db)
    second = scan([tree], cache=again)
    again.close()
    assert again.misses == 0
    assert again.hits > 0
    assert [m.to_json() for m in second.models] == [m.to_json() for m in first.models]
    assert [m.meta for m in second.models] == [m.meta for m in first.models]


def test_header_cache_rereads_changed_files(tmp_path: Path) -> None:
    p = write_gguf(tmp_path / "m" / "x.gguf", PRESETS["llama"])
    db = tmp_path / "c.sqlite"
    with SqliteHeaderCache(db) as cache:
        scan([tmp_path / "m"], cache=cache)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    counting = CountingCache(db)
    scan([tmp_path / "m"], cache=counting)
    counting.close()
    assert counting.misses == 1


def test_corrupt_cache_is_set_aside(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m" / "x.gguf", PRESETS["llama"])
    db = tmp_path / "c.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    with SqliteHeaderCache(db) as cache:
        (m,) = scan([tmp_path / "m"], cache=cache).models
        assert cache.disabled_reason is None
    assert m.error is None
    assert list(tmp_path.glob("c.sqlite.bad-*"))
