"""Attach to an engine an earlier qmgui run started and left running (a run-registry survivor).

`Adopted(entry).start()` checks it still runs (the very process recorded: pid and
create_time, not a zombie; or, when a wrapper script that started it died, a member of its
process group carrying its token), then watches it on a thread: its health endpoint (READY on
2xx, LOADING otherwise; through loopback when it listens on a wildcard address) and its exit
(psutil; it is not our child, so there is no exit status). `stop()` ends its whole process tree
and group and forgets it in the registry.

An engine that was started so it could be left running (`RunEntry.log_path`: a detached one)
writes its output to its log file itself: `log` shows the file's last lines at adoption and
then follows it from there (as `Supervisor.log` does), and outcomes carry its tail. An engine
whose output went to the qmgui that started it (a pipe) has no log here: the outcome and
`logs` say so. `uptime_s()` counts from the process's start; `set_detached` leaves it running
past this qmgui (the default for a detached one) or makes it end with it (the watchdog learns
its group); `spec()` is how to start it again (Restart: the same argv, detached again).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.core.textsafe import REDACTED
from qmgui.engines.health import Health, check_health
from qmgui.engines.logs import LogSink, follow_file, tail_offset
from qmgui.engines.ports import HOST, connect_host, url_host
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.runner import terminate_tree, watchdog
from qmgui.engines.supervisor import (
    TAIL_LINES,
    EngineSpec,
    Outcome,
    OutcomeKind,
    State,
    flag_value,
)

POLL_S = 0.5
STOP_GRACE_S = 10.0
NO_LOGS = "qmgui has no log of it: it was started by an earlier run"
TAIL_BYTES = 64 << 10  # what is shown of its log file at adoption
RING_LINES = 2000
_SOURCE = "engines"

AdoptedCallback = Callable[["Adopted", State], None]


def _alive(entry: RunEntry) -> bool:
    """Still runs: the recorded process (not a zombie waiting for its parent), or a member of
    its group that carries its token."""
    return entry.is_alive()


class Adopted:
    """A survivor watched and stoppable like a supervised engine; with its log file's lines
    when it writes one."""

    def __init__(
        self,
        entry: RunEntry,
        *,
        registry: RunRegistry | None = None,
        health_path: str = "/health",
        poll_s: float = POLL_S,
        stop_grace_s: float = STOP_GRACE_S,
        on_state: AdoptedCallback | None = None,
    ) -> None:
        self.entry = entry
        self.name = entry.name
        self.logs = entry.log_path is not None
        self.log = LogSink(None, ring_lines=RING_LINES)
        self.detached = entry.detached
        self._follower: threading.Thread | None = None
        self.host = connect_host(flag_value(entry.argv, "--host") or HOST)
        self._registry = registry
        self._health_path = health_path
        self._poll_s = poll_s
        self._stop_grace_s = stop_grace_s
        self._on_state = on_state
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._final = threading.Event()
        self._state = State.IDLE
        self._outcome: Outcome | None = None
        self._closing = False
        self._released = False
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.entry.pid

    @property
    def port(self) -> int | None:
        return self.entry.port

    @property
    def url(self) -> str | None:
        return None if self.port is None else f"http://{url_host(self.host)}:{self.port}"

    @property
    def argv(self) -> tuple[str, ...]:
        return self.entry.argv

    def uptime_s(self) -> float:
        """Seconds since its process started."""
        return max(0.0, time.time() - self.entry.create_time)

    def spec(self) -> EngineSpec:
        """How to start it again: its argv and environment, its port; EngineError when the
        registry only has them with a secret redacted (it cannot be started from that)."""
        env = self.entry.env or {}
        if any(REDACTED in a for a in self.entry.argv) or REDACTED in env.values():
            raise EngineError(
                f"{self.name} cannot be restarted from here: its command holds a secret qmgui "
                "does not keep; stop it and start the model again"
            )
        return EngineSpec(
            argv=self.entry.argv,
            name=self.name,
            health_path=self._health_path,
            port=self.port,
            env=env or None,
        )

    def set_detached(self, detached: bool) -> None:
        """Leave it running past this qmgui (True) or end it with this qmgui (False: the
        watchdog learns its group, the registry names this process its owner)."""
        if not detached and self.entry.pgid is not None:
            watchdog.watch(self.entry.pgid)
        elif self.entry.pgid is not None:
            watchdog.unwatch(self.entry.pgid)
        self.detached = detached
        if self._registry is not None:
            with contextlib.suppress(EngineError):
                changed = self._registry.mark_detached(self.entry.pid, detached)
                if changed is not None:
                    self.entry = changed

    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    @property
    def outcome(self) -> Outcome | None:
        with self._lock:
            return self._outcome

    def _set_state(self, state: State, outcome: Outcome | None = None) -> None:
        with self._lock:
            if self._state.final or self._state == state:
                return
            self._state = state
            if outcome is not None:
                self._outcome = outcome
        if state.final:
            if not self._released:
                if self.entry.pgid is not None:
                    watchdog.unwatch(self.entry.pgid)
                if self._registry is not None:
                    with contextlib.suppress(EngineError):
                        self._registry.remove(self.entry.pid)
            self._final.set()
        if self._on_state is not None:
            try:
                self._on_state(self, state)
            except Exception:
                notify.notifier.error(
                    f"an engine state listener failed on {state.value}", source=_SOURCE
                )

    def _end(self, kind: OutcomeKind, message: str) -> Outcome:
        if not self.logs:
            return Outcome(kind, f"{message} ({NO_LOGS}).")
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(2)  # what it wrote last, in the tail
        return Outcome(
            kind,
            f"{message}.",
            log_tail=tuple(self.log.tail(TAIL_LINES)),
            log_path=self.entry.log_path,
        )

    def _follow(self, offset: int) -> None:
        assert self.entry.log_path is not None
        follow_file(
            Path(self.entry.log_path),
            self.log,
            offset=offset,
            done=lambda: self._closing,
            halt=self._halt,
            poll_s=min(self._poll_s, 0.1),
        )

    def start(self) -> None:
        """Start watching; an entry that no longer runs ends FAILED at once."""
        with self._lock:
            if self._state != State.IDLE:
                raise EngineError(f"{self.name} (pid {self.pid}) was already adopted")
        if not _alive(self.entry):
            self._set_state(
                State.FAILED,
                self._end(
                    OutcomeKind.START_FAILED,
                    f"{self.name} (pid {self.pid}) is no longer running; nothing to adopt",
                ),
            )
            return
        if self.entry.log_path is None:
            self.log.remember(f"# qmgui: adopted pid {self.pid}; {NO_LOGS}")
        else:
            path = Path(self.entry.log_path)
            self.log.remember(f"# qmgui: adopted pid {self.pid}; its log file is {path}")
            self._follower = threading.Thread(
                target=self._follow,
                args=(tail_offset(path, TAIL_BYTES),),
                name=f"qmgui-adopted-log-{self.pid}",
                daemon=True,
            )
            self._follower.start()
        self._set_state(State.LOADING)
        self._thread = threading.Thread(
            target=self._watch, name=f"qmgui-adopted-{self.pid}", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        while True:
            if not _alive(self.entry):
                with self._lock:
                    if self._closing:
                        return
                    self._closing = True
                self._set_state(
                    State.CRASHED,
                    self._end(
                        OutcomeKind.CRASHED,
                        f"{self.name} (adopted, pid {self.pid}) exited; its exit status is unknown",
                    ),
                )
                return
            if self.port is not None:
                health = check_health(self.host, self.port, self._health_path)
                self._set_state(State.READY if health == Health.READY else State.LOADING)
            if self._halt.wait(self._poll_s):
                return

    def wait_ready(self, timeout: float | None = None) -> bool:
        step = self._poll_s / 4
        waited = 0.0
        while timeout is None or waited < timeout:
            st = self.state
            if st == State.READY:
                return True
            if st.final:
                return False
            self._final.wait(step)
            waited += step
        return self.state == State.READY

    def wait(self, timeout: float | None = None) -> Outcome | None:
        self._final.wait(timeout)
        return self.outcome

    def release(self) -> Outcome:
        """Stop watching it and leave it running, detached (the registry keeps it)."""
        if not self.detached:
            self.set_detached(True)
        with self._lock:
            claimed = not self._closing
            self._closing = True
            if claimed:
                self._released = True
        if not claimed:
            self._final.wait(self._poll_s + 2)
            return self.outcome or Outcome(OutcomeKind.STOPPED, f"{self.name} ended.")
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._poll_s + 2)
        where = f" at {self.url}" if self.url else ""
        self._set_state(
            State.STOPPED,
            Outcome(
                OutcomeKind.LEFT_RUNNING,
                f"{self.name} (adopted, pid {self.pid}) was left running{where}.",
                log_path=self.entry.log_path,
            ),
        )
        outcome = self.outcome
        assert outcome is not None
        return outcome

    def stop(self, grace_s: float | None = None) -> Outcome:
        """End its whole process tree and group (only what is still ours: the recorded
        process, members carrying its token)."""
        with self._lock:
            claimed = not self._closing
            self._closing = True
        if not claimed:
            self._final.wait(2 * (grace_s or self._stop_grace_s) + 10)
            if self.outcome is None:
                raise EngineError(f"{self.name} did not finish stopping")
            return self.outcome
        self._halt.set()
        self._set_state(State.STOPPING)
        result = terminate_tree(
            self.entry.pid,
            create_time=self.entry.create_time,
            grace_s=self._stop_grace_s if grace_s is None else grace_s,
            pgid=self.entry.pgid,
            token=self.entry.token,
        )
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._poll_s + 2)
        killed = " (it ignored the stop signal and was killed)" if result.killed else ""
        self._set_state(
            State.STOPPED,
            self._end(
                OutcomeKind.STOPPED, f"{self.name} (adopted, pid {self.pid}) was stopped{killed}"
            ),
        )
        outcome = self.outcome
        assert outcome is not None
        return outcome


__all__ = ["NO_LOGS", "Adopted"]
