"""Attach to an engine an earlier qmgui run started and left running (a run-registry survivor).

`Adopted(entry).start()` checks it still runs (the very process recorded: pid and
create_time, not a zombie; or, when a wrapper script that started it died, a member of its
process group carrying its token), then watches it on a thread: its health endpoint (READY on
2xx, LOADING otherwise; through loopback when it listens on a wildcard address) and its exit
(psutil; it is not our child, so there is no exit status). `stop()` ends its whole process tree
and group and forgets it in the registry. qmgui has no log of an adopted engine (its output
went to the run that started it): the outcome and `logs` say so.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.engines.health import Health, check_health
from qmgui.engines.ports import HOST, connect_host, url_host
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.runner import terminate_tree
from qmgui.engines.supervisor import Outcome, OutcomeKind, State

POLL_S = 0.5
STOP_GRACE_S = 10.0
NO_LOGS = "qmgui has no log of it: it was started by an earlier run"
_SOURCE = "engines"

AdoptedCallback = Callable[["Adopted", State], None]


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def _alive(entry: RunEntry) -> bool:
    """Still runs: the recorded process (not a zombie waiting for its parent), or a member of
    its group that carries its token."""
    return entry.is_alive()


class Adopted:
    """A survivor watched and stoppable like a supervised engine, without logs."""

    logs = False

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
        self.name = Path(entry.argv[0]).name if entry.argv else f"pid {entry.pid}"
        self.host = connect_host(_flag(entry.argv, "--host") or HOST)
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
        return Outcome(kind, f"{message} ({NO_LOGS}).")

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
