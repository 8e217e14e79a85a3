"""The run registry: which engines qmgui started, so a later run can adopt or stop them.

A JSON file (`engines.json` under `platformdirs.user_state_dir("qmgui")`, or `$QMGUI_STATE_DIR`)
with pid, create_time, argv and port per engine. An entry whose process is gone, or whose pid
now belongs to another process (different create_time), is stale and dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import platformdirs

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.engines.runner import StopResult, process_identity, terminate_tree

ENV_STATE_DIR = "QMGUI_STATE_DIR"
FILE_NAME = "engines.json"
VERSION = 1
SAME_PROCESS_S = 0.01  # create_time is a float of the boot clock; equal within this


def state_dir() -> Path:
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else Path(platformdirs.user_state_dir("qmgui"))


@dataclass(frozen=True)
class RunEntry:
    pid: int
    create_time: float
    argv: tuple[str, ...]
    port: int | None

    def is_alive(self) -> bool:
        """The very process that was recorded still runs (not a reused pid)."""
        now = process_identity(self.pid)
        return now is not None and abs(now - self.create_time) <= SAME_PROCESS_S


class RunRegistry:
    """Thread-safe; every change is written atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / FILE_NAME
        self._lock = threading.Lock()

    def _read(self) -> list[RunEntry]:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
            return [
                RunEntry(int(e["pid"]), float(e["create_time"]), tuple(e["argv"]), e.get("port"))
                for e in data.get("engines", [])
            ]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            # unreadable: keep it aside for a look (it may name engines still running), say
            # so, and start a new one; nothing is overwritten silently
            aside = self.path.with_name(
                f"{self.path.name}.bad-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
            )
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            notify.warning(
                f"the run registry {self.path} could not be read ({type(e).__name__}); it was "
                f"moved to {aside}: engines it listed are not offered for adoption",
                source="engines",
            )
            return []

    def _write(self, entries: Sequence[RunEntry]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": VERSION, "engines": [asdict(e) for e in entries]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".engines-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise EngineError(f"could not write the run registry {self.path}: {e}") from e

    def record(self, entry: RunEntry) -> None:
        with self._lock:
            entries = [e for e in self._read() if e.pid != entry.pid]
            self._write([*entries, entry])

    def remove(self, pid: int) -> None:
        with self._lock:
            entries = self._read()
            kept = [e for e in entries if e.pid != pid]
            if len(kept) != len(entries):
                self._write(kept)

    def survivors(self) -> list[RunEntry]:
        """Engines of an earlier run that still run, to adopt or stop; stale entries are
        dropped from the file."""
        with self._lock:
            entries = self._read()
            alive = [e for e in entries if e.is_alive()]
            if len(alive) != len(entries):
                self._write(alive)
            return alive

    def stop(self, entry: RunEntry, *, grace_s: float = 5.0) -> StopResult:
        """Stop a survivor (only when it is still the recorded process) and forget it."""
        result = terminate_tree(entry.pid, create_time=entry.create_time, grace_s=grace_s)
        self.remove(entry.pid)
        return result
