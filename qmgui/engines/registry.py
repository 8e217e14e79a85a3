"""The run registry: which engines qmgui started, so another qmgui (or a later run) can list,
adopt or stop them.

A JSON file (`engines.json` under `platformdirs.user_state_dir("qmgui")`, or `$QMGUI_STATE_DIR`)
with, per engine: pid, create_time, argv (its secrets redacted), port, its process group
(`pgid`), the token every process of the engine carries in its environment
(`QMGUI_ENGINE_TOKEN`), and the qmgui process that runs it (`owner`, `owner_create_time`);
for an engine that can be left running also its log file (`log_path`: it writes there
itself), the model (`model`, `model_id`), its extra environment (`env`, secrets redacted) and
whether it was left running (`detached`: no qmgui watches it, it outlives them all).

Every change is a read-modify-write under an advisory lock (`engines.json.lock`, the `filelock`
package) with the file re-read inside the lock, and the write is atomic (a temporary file
renamed over it), so qmgui processes started together never lose each other's entries.

An engine runs while its first process does (same pid *and* create_time, not a zombie) or,
when that one is gone (a wrapper script that died), while a live member of its group carries
its token. Entries of engines that no longer run are stale: `running()` drops them from the
file. `survivors()` are the running engines whose qmgui is gone (left by an earlier run);
`adoptable()` adds the detached ones (a window left them, it may still run): what a qmgui
that starts offers to adopt.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import platformdirs
import psutil

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.core.textsafe import redact_argv, redact_env
from qmgui.engines.runner import (
    SAME_PROCESS_S,
    StopResult,
    group_members,
    is_running,
    process_identity,
    terminate_tree,
)

ENV_STATE_DIR = "QMGUI_STATE_DIR"
FILE_NAME = "engines.json"
VERSION = 1
LOCK_TIMEOUT_S = 10.0
KEEP_ASIDE = 3  # unreadable copies kept beside it

T = TypeVar("T")


def state_dir() -> Path:
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else Path(platformdirs.user_state_dir("qmgui"))


@dataclass(frozen=True)
class RunEntry:
    pid: int
    create_time: float
    argv: tuple[str, ...]
    port: int | None
    pgid: int | None = None  # its own process group (POSIX)
    token: str | None = None  # in the environment of every process of the engine
    owner: int | None = None  # the qmgui process that runs it
    owner_create_time: float | None = None
    detached: bool = False  # left running: no qmgui's watchdog ends it
    log_path: str | None = None  # the file it writes its output to (it can be left running)
    model: str | None = None  # the model's name, as the window and `engines list` show it
    model_id: str | None = None
    env: dict[str, str] | None = None  # what it got on top of qmgui's environment (redacted)

    @property
    def name(self) -> str:
        """The model's name, else its executable's."""
        return self.model or (Path(self.argv[0]).name if self.argv else f"pid {self.pid}")

    def root_alive(self) -> bool:
        """The very process that was recorded still runs (not a reused pid, not a zombie)."""
        return is_running(self.pid, self.create_time)

    def members(self) -> list[psutil.Process]:
        """What of it still runs: the recorded process, or else the live members of its
        group that carry its token (a wrapper's engine after the wrapper died)."""
        if self.root_alive():
            with contextlib.suppress(psutil.Error):
                return [psutil.Process(self.pid)]
        if self.pgid is None or self.token is None:
            return []
        return [
            p
            for p in group_members(self.pgid, self.token)
            if _created(p) >= self.create_time - SAME_PROCESS_S
        ]

    def is_alive(self) -> bool:
        return bool(self.members())

    def owner_alive(self) -> bool:
        """Its qmgui still runs (an entry without an owner counts as left behind)."""
        return self.owner is not None and is_running(self.owner, self.owner_create_time)


def _created(p: psutil.Process) -> float:
    try:
        created: float = p.create_time()
        return created
    except psutil.Error:
        return 0.0


def _entry(e: Any) -> RunEntry:
    def opt(key: str, kind: Callable[[Any], T]) -> T | None:
        value = e.get(key)
        return None if value is None else kind(value)

    port = e.get("port")
    return RunEntry(
        int(e["pid"]),
        float(e["create_time"]),
        tuple(str(a) for a in e["argv"]),
        None if port is None else int(port),
        opt("pgid", int),
        opt("token", str),
        opt("owner", int),
        opt("owner_create_time", float),
        bool(e.get("detached", False)),
        opt("log_path", str),
        opt("model", str),
        opt("model_id", str),
        opt("env", lambda v: {str(k): str(x) for k, x in dict(v).items()}),
    )


class RunRegistry:
    """Thread- and process-safe; every change is locked, re-read, merged and written
    atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / FILE_NAME
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import filelock  # noqa: PLC0415 - at the first registry access, not at start

        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                lock = filelock.FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)
                lock.acquire()
            except filelock.Timeout as e:
                raise EngineError(
                    f"the run registry {self.path} stayed locked by another qmgui for "
                    f"{LOCK_TIMEOUT_S:g} s; try again"
                ) from e
            except OSError as e:
                raise EngineError(f"could not lock the run registry {self.path}: {e}") from e
            try:
                yield
            finally:
                lock.release()

    def _read(self) -> list[RunEntry]:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
            return [_entry(e) for e in data.get("engines", [])]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            # unreadable: keep it aside for a look (it may name engines still running), say
            # so, and start a new one; nothing is overwritten silently
            self._keep_aside(e)
            return []

    def _keep_aside(self, e: BaseException) -> None:
        from qmgui.keep_aside import move_aside  # noqa: PLC0415

        try:
            aside: Path | str = move_aside(self.path, keep=KEEP_ASIDE)
        except OSError as err:
            aside = f"nowhere ({err.strerror or err})"
        notify.warning(
            f"the run registry {self.path} could not be read ({type(e).__name__}); it was "
            f"moved to {aside}: engines it listed are not offered for adoption",
            source="engines",
        )

    def _write(self, entries: Sequence[RunEntry]) -> None:
        data = {"version": VERSION, "engines": [asdict(e) for e in entries]}
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".engines-", suffix=".json")
        except OSError as e:
            raise EngineError(f"could not write the run registry {self.path}: {e}") from e
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
        """Add (or replace, by pid) one engine; its argv is written with secrets redacted."""
        env = None if entry.env is None else redact_env(entry.env)
        entry = RunEntry(**{**asdict(entry), "argv": redact_argv(entry.argv), "env": env})
        with self._locked():
            entries = [e for e in self._read() if e.pid != entry.pid]
            self._write([*entries, entry])

    def remove(self, pid: int) -> None:
        with self._locked():
            entries = self._read()
            kept = [e for e in entries if e.pid != pid]
            if len(kept) != len(entries):
                self._write(kept)

    def mark_detached(self, pid: int, detached: bool) -> RunEntry | None:
        """Record that engine `pid` is left running (or taken back, owned by this process);
        the entry as it is now, None when it is not recorded."""
        with self._locked():
            entries = self._read()
            found = next((e for e in entries if e.pid == pid), None)
            if found is None:
                return None
            me = os.getpid()
            changed = replace(
                found,
                detached=detached,
                owner=found.owner if detached else me,
                owner_create_time=found.owner_create_time if detached else process_identity(me),
            )
            self._write([changed if e.pid == pid else e for e in entries])
            return changed

    def entries(self) -> list[RunEntry]:
        """Everything recorded, stale entries included."""
        with self._locked():
            return self._read()

    def running(self) -> list[RunEntry]:
        """The engines that still run, whichever qmgui runs them; stale entries (the process
        and its group are gone, or the pid now belongs to another process) are dropped from
        the file."""
        with self._locked():
            entries = self._read()
            alive = [e for e in entries if e.is_alive()]
            if len(alive) != len(entries):
                self._write(alive)
            return alive

    def survivors(self) -> list[RunEntry]:
        """Running engines whose qmgui is gone: left by an earlier run, to adopt or stop."""
        return [e for e in self.running() if not e.owner_alive()]

    def adoptable(self) -> list[RunEntry]:
        """What a qmgui that starts offers to adopt: the survivors and the detached engines."""
        return [e for e in self.running() if e.detached or not e.owner_alive()]

    def stop(self, entry: RunEntry, *, grace_s: float = 5.0) -> StopResult:
        """Stop an engine (its first process when it is still the recorded one, and every
        member of its group that carries its token) and forget it."""
        result = terminate_tree(
            entry.pid,
            create_time=entry.create_time,
            grace_s=grace_s,
            pgid=entry.pgid,
            token=entry.token,
        )
        self.remove(entry.pid)
        return result
