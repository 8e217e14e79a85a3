"""A small keyed JSON file in the state folder that the window and the command line may both
write at once: entries under one key of a versioned object, each change a read-modify-write
under a file lock (and a thread lock), written atomically (a temporary file, fsync, rename).
A file that cannot be read is moved aside, with a warning through the notifier, and a new one
is started: nothing the user had is overwritten."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from qmgui import notify
from qmgui.atomic import replace_file
from qmgui.keep_aside import move_aside

LOCK_TIMEOUT_S = 10.0


class JsonStore:
    """`entries` (a dict) under `key` of the object in `path`, with the `version` written."""

    def __init__(
        self,
        path: Path,
        *,
        key: str,
        version: int,
        what: str,
        source: str,
        notifier: notify.Notifier | None = None,
    ) -> None:
        self.path = path
        self._key = key
        self._version = version
        self._what = what  # "the benchmark results": how a warning names the file
        self._source = source
        self._notifier = notifier
        self._lock = threading.Lock()

    def read(self) -> dict[str, Any]:
        """The entries as the file holds them now ({} when there is none)."""
        with self._lock:
            return self._read()

    @contextlib.contextmanager
    def changing(self) -> Iterator[dict[str, Any]]:
        """The entries, under both locks, to change in place; written when the block ends
        without an exception (OSError when it cannot be)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock  # noqa: PLC0415 - at the first write, not at start

        with self._lock, FileLock(f"{self.path}.lock", timeout=LOCK_TIMEOUT_S):
            entries = self._read()
            yield entries
            self._write(entries)

    def update(self, change: Callable[[dict[str, Any]], None]) -> None:
        with self.changing() as entries:
            change(entries)

    def _read(self) -> dict[str, Any]:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data[self._key]
            if not isinstance(entries, dict):
                raise TypeError(f"{self._key} is not an object")
            return entries
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            try:
                aside: Path | str = move_aside(self.path)
            except OSError:
                aside = "(it could not be moved aside)"
            (self._notifier or notify.notifier).warning(
                f"{self._what} {self.path} could not be read ({type(e).__name__}); "
                f"it was moved to {aside} and a new one is started",
                source=self._source,
            )
            return {}

    def _write(self, entries: Mapping[str, Any]) -> None:
        data = {"version": self._version, self._key: entries}
        text = json.dumps(data, indent=1, sort_keys=True).encode("utf-8")
        replace_file(self.path, text, prefix=f".{self.path.stem}-", suffix=".json")
