"""The SQLite header cache: hits for unchanged files, misses for changed ones, a corrupt
database set aside instead of breaking the scan (its old copies pruned), and a database another
process holds locked skipped, never set aside."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
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


def test_set_aside_copies_are_pruned(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m" / "x.gguf", PRESETS["llama"])
    db = tmp_path / "c.sqlite"
    old = [tmp_path / f"c.sqlite.bad-2020010{i}T000000" for i in range(1, 8)]
    for p in old:
        p.write_bytes(b"old copy")
    db.write_bytes(b"this is not a database" * 100)
    with SqliteHeaderCache(db) as cache:
        scan([tmp_path / "m"], cache=cache)
        assert cache.disabled_reason is None
    kept = sorted(p.name for p in tmp_path.glob("c.sqlite.bad-*"))
    assert len(kept) == 5  # the new copy and the four newest old ones
    assert [tmp_path / n for n in kept[:4]] == old[3:]
    assert not kept[4].startswith("c.sqlite.bad-2020")


# Holds the cache in an exclusive transaction (a row written, not committed) until told to
# commit on stdin: another process in the middle of a flush.
HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
conn.execute("INSERT OR REPLACE INTO headers VALUES ('/held', 1, 1, '{}')")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
print("committed", flush=True)
"""


def test_a_locked_cache_is_skipped_not_set_aside(tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "cache" / "headers.sqlite"
    with SqliteHeaderCache(db) as cache:
        first = scan([tree], cache=cache)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        cache = SqliteHeaderCache(db, busy_timeout_s=0.3)
        started = time.monotonic()
        second = scan([tree], cache=cache)
        cache.close()
        took = time.monotonic() - started
        # the scan finished, uncached, with the same answers
        assert [m.to_json() for m in second.models] == [m.to_json() for m in first.models]
        assert cache.disabled_reason is not None
        assert "in use by another process" in cache.disabled_reason
        assert took < 5
        # the database was left where it is, and the other process's commit goes through
        assert db.exists()
        assert not list(db.parent.glob("headers.sqlite.bad-*"))
        out, _ = holder.communicate("commit\n", timeout=10)
        assert holder.returncode == 0
        assert "committed" in out
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT size FROM headers WHERE path = '/held'").fetchone() == (1,)
        assert conn.execute("SELECT COUNT(*) FROM headers").fetchone()[0] > 1
    finally:
        conn.close()
    # and the next scan uses the cache again
    again = CountingCache(db)
    scan([tree], cache=again)
    again.close()
    assert again.misses == 0
