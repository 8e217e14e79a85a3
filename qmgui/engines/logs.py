"""An engine's output: the last lines in memory and every line in a rotating file.

Files go under `platformdirs.user_log_dir("qmgui")`, or `$QMGUI_LOG_DIR` when set.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from pathlib import Path

import platformdirs

ENV_LOG_DIR = "QMGUI_LOG_DIR"
RING_LINES = 2000
MAX_BYTES = 8 << 20  # per file before it rotates
BACKUPS = 2


def log_dir() -> Path:
    """Where engine logs go (created on demand by `LogSink`)."""
    env = os.environ.get(ENV_LOG_DIR)
    return Path(env) if env else Path(platformdirs.user_log_dir("qmgui"))


class LogSink:
    """Thread-safe: `write_line` from the reader thread, `tail`/`text` from anywhere."""

    def __init__(
        self,
        path: Path | None,
        *,
        ring_lines: int = RING_LINES,
        max_bytes: int = MAX_BYTES,
        backups: int = BACKUPS,
    ) -> None:
        self.path = path
        self._ring: deque[str] = deque(maxlen=ring_lines)
        self._lock = threading.Lock()
        self._max_bytes = max_bytes
        self._backups = backups
        self._size = 0
        self._file = None
        self.last_line_at: float | None = None  # time.monotonic() of the latest line
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._size = self._file.tell()

    def write_line(self, line: str) -> None:
        line = line.rstrip("\r\n")
        with self._lock:
            self._ring.append(line)
            self.last_line_at = time.monotonic()
            if self._file is None:
                return
            self._file.write(line + "\n")
            self._file.flush()
            self._size += len(line) + 1
            if self._size > self._max_bytes:
                self._rotate()

    def _rotate(self) -> None:
        assert self.path is not None
        assert self._file is not None
        self._file.close()
        for i in range(self._backups, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._size = 0

    def tail(self, n: int | None = None) -> list[str]:
        """The last `n` lines kept in memory (all kept ones by default)."""
        with self._lock:
            lines = list(self._ring)
        return lines if n is None else lines[-n:] if n > 0 else []

    def text(self) -> str:
        """The lines kept in memory, joined."""
        return "\n".join(self.tail())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
