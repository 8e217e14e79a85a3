"""The header cache: parsed GGUF headers kept in SQLite, keyed by (path, size, mtime).

A rescan of an unchanged tree reads one small database instead of every header. The cache is
disposable: a corrupt or foreign database is moved aside (``qmgui.keep_aside``, which keeps
the newest few copies) and a new one started, and any other database error makes the cache a
no-op for the rest of the run (the scan still works, only slower). All rows are loaded in one
query on first use, because a scan asks for all of them.

Several qmgui processes share the file (the window, a ``qmgui scan`` in a terminal). SQLite
locks it during another process's transaction; each statement then waits up to
``BUSY_TIMEOUT_S`` and, still locked, the cache is skipped for this run. A locked database is
never taken for a corrupt one: only SQLite's "not a database" and "malformed" errors set it
aside, since renaming a file another process is writing would fail that process's commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from pathlib import Path

import platformdirs

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import GGUFHeader, header_from_data, header_to_data
from qmgui.keep_aside import move_aside

# Bump when the stored form or the reader's results change, so old rows are not trusted.
CACHE_FORMAT = 1

BUSY_TIMEOUT_S = 2.0
"""How long a statement waits for another process's transaction before the cache is skipped."""

# SQLite's primary result codes (the low byte of an extended code)
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


def _is_locked(error: sqlite3.Error) -> bool:
    """Another connection holds a lock SQLite waited for in vain (busy or locked)."""
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(error).lower()
    return "locked" in text or "busy" in text


def _is_corrupt(error: sqlite3.Error) -> bool:
    """The file is not a (readable) SQLite database: the only case for setting it aside."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(error).lower()
    return "not a database" in text or "malformed" in text


def cache_dir() -> Path:
    env = os.environ.get("QMGUI_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("qmgui", appauthor=False))


class SqliteHeaderCache:
    """`qmgui.core.discovery.HeaderCache` backed by one SQLite file."""

    def __init__(self, path: Path | None = None, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = path or cache_dir() / "headers.sqlite"
        self.busy_timeout_s = busy_timeout_s
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
                self._disable(self._why(e, "write"))

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
                    self._disable(self._why(e, "read"))
        return self._rows

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is not None or self.disabled_reason:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._open()
        except sqlite3.Error as e:
            if not _is_corrupt(e):
                self._disable(self._why(e, "open"))
                return None
            self._set_aside()
            try:
                self._conn = self._open()
            except sqlite3.Error as again:
                self._disable(self._why(again, "open"))
        except OSError as e:
            self._disable(f"could not open {self.path} ({e})")
        return self._conn

    def _why(self, error: sqlite3.Error, doing: str) -> str:
        if _is_locked(error):
            return (
                f"{self.path} is in use by another process (still locked after"
                f" {self.busy_timeout_s:g} s), so the cache was skipped"
            )
        return f"could not {doing} {self.path} ({error})"

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=self.busy_timeout_s)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != CACHE_FORMAT:  # a new file (0) or another format: (re)create
                with conn:
                    conn.execute("DROP TABLE IF EXISTS headers")
                    conn.execute(
                        "CREATE TABLE headers("
                        "path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, data TEXT)"
                    )
                    conn.execute(f"PRAGMA user_version = {CACHE_FORMAT}")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _set_aside(self) -> None:
        # a failed rename leaves the file; opening it again then fails and disables the cache
        with contextlib.suppress(OSError):
            move_aside(self.path)

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        if self._conn is not None:
            self._conn.close()
            self._conn = None
