"""The header cache: parsed GGUF headers kept in SQLite, keyed by (path, size, mtime).

A rescan of an unchanged tree reads one small database instead of every header. The cache is
disposable: a corrupt or foreign database is moved aside and a new one started, and any
database error makes the cache a no-op for the rest of the run (the scan still works, only
slower). All rows are loaded in one query on first use, because a scan asks for all of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import platformdirs

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import GGUFHeader, header_from_data, header_to_data

# Bump when the stored form or the reader's results change, so old rows are not trusted.
CACHE_FORMAT = 1


def cache_dir() -> Path:
    env = os.environ.get("QMGUI_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("qmgui", appauthor=False))


class SqliteHeaderCache:
    """`qmgui.core.discovery.HeaderCache` backed by one SQLite file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "headers.sqlite"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._rows: dict[str, tuple[int, int, str]] | None = None
        self._pending: list[tuple[str, int, int, str]] = []
        self.disabled_reason: str | None = None

    # -- HeaderCache --
    def get(self, path: str, size: int, mtime_ns: int) -> GGUFHeader | ModelReadError | None:
        with self._lock:
            rows = self._load()
            row = rows.get(path)
        if row is None or row[0] != size or row[1] != mtime_ns:
            return None
        try:
            data = json.loads(row[2])
            if "error" in data:
                return ModelReadError(path, data["error"], offset=data.get("offset"))
            return header_from_data(path, data)
        except (ValueError, KeyError, TypeError, AssertionError):
            return None  # a row we cannot read is a miss, the header is read again

    def put(self, path: str, size: int, mtime_ns: int, value: GGUFHeader | ModelReadError) -> None:
        if isinstance(value, ModelReadError):
            data: dict[str, object] = {"error": value.reason, "offset": value.offset}
        else:
            data = header_to_data(value)
        blob = json.dumps(data, separators=(",", ":"))
        with self._lock:
            self._load()[path] = (size, mtime_ns, blob)
            self._pending.append((path, size, mtime_ns, blob))

    # -- lifetime --
    def flush(self) -> None:
        """Write the rows added since the last flush (one transaction)."""
        with self._lock:
            pending, self._pending = self._pending, []
            conn = self._connect()
            if conn is None or not pending:
                return
            try:
                with conn:
                    conn.executemany(
                        "INSERT OR REPLACE INTO headers(path, size, mtime_ns, data) "
                        "VALUES (?, ?, ?, ?)",
                        pending,
                    )
            except sqlite3.Error as e:
                self._disable(f"could not write {self.path} ({e})")

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SqliteHeaderCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (hold the lock) --
    def _load(self) -> dict[str, tuple[int, int, str]]:
        if self._rows is None:
            self._rows = {}
            conn = self._connect()
            if conn is not None:
                try:
                    for path, size, mtime_ns, data in conn.execute(
                        "SELECT path, size, mtime_ns, data FROM headers"
                    ):
                        self._rows[path] = (size, mtime_ns, data)
                except sqlite3.Error as e:
                    self._disable(f"could not read {self.path} ({e})")
        return self._rows

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is not None or self.disabled_reason:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._open()
        except sqlite3.DatabaseError:
            self._set_aside()
            try:
                self._conn = self._open()
            except (sqlite3.Error, OSError) as e:
                self._disable(f"could not open {self.path} ({e})")
        except OSError as e:
            self._disable(f"could not open {self.path} ({e})")
        return self._conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=5)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, CACHE_FORMAT):
                conn.execute("DROP TABLE IF EXISTS headers")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS headers("
                "path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, data TEXT)"
            )
            conn.execute(f"PRAGMA user_version = {CACHE_FORMAT}")
            conn.commit()
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _set_aside(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(f"{self.path.name}.bad-{stamp}"))

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        if self._conn is not None:
            self._conn.close()
            self._conn = None
