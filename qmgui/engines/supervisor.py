"""Run one engine and watch it: starting → loading → ready → stopping → stopped | crashed | failed.

`Supervisor(spec).start()` resolves the executable (a missing one is an outcome, not an
exception), uses the spec's port (a model's saved one: taken is a failure that names the
holder and the next free port, never a silent move) or, for a spec without one, a free port on
127.0.0.1 (retried when the engine says it is taken), starts
the engine through a `Runner`, copies its output into a `LogSink` (ring buffer + rotating file,
0600, secrets redacted, older logs pruned; a write that fails is counted in `log_errors` and
the outcome, said once, and never stops the engine) and polls its health endpoint every
`poll_s` until it answers 2xx, or the engine exits, or the load deadline (a base plus seconds
per GiB of model) passes. An out-of-memory load is retried at half the context (never below
4096) when `spec.downshift` allows it; once the engine is ready the reduction is forgotten: a
restart after a crash asks for the context it was started with again (memory may have been
freed since) and has the whole ladder again. At ready, a llama-server's log gets one line
naming the binary, its build, its backends and its devices, as the engine reported them
(`engine_line`). Every end is an `Outcome` with a sentence the user can
act on. `stop()` ends the whole process tree and the engine's process group (a wrapper
script's engine included), gracefully first; nothing qmgui did not start is touched. Each
attempt carries a fresh `QMGUI_ENGINE_TOKEN` in its environment and is recorded in the run
registry with its group, token and owner.

The engine listens where its argv's `--host` says (an extra `--host 0.0.0.0` is honoured,
with a warning that it is reachable from the network); the health checks and `url` go
through loopback for a wildcard address.

A crash after ready is restarted when `spec.max_restarts` allows it, after an exponential
backoff (`restart_base_s` doubling, capped at `restart_max_s`), each restart announced through
the notifier; the final outcome says how many restarts happened. With `spec.idle_ttl_s` the
engine is stopped once no activity was marked (`touch()`, e.g. by a proxy) for that long since
it became ready or was last touched.

An engine started with `output_file=True` can be left running (`qmgui.engines.runner`): it
writes to its log file itself and the supervisor follows that file (from where the previous
attempt stopped) into the ring, so the log view, the failure sentences and the readback work
as with a pipe. `set_detached(True)` leaves it (the watchdog forgets its group, the run
registry marks it detached: it outlives qmgui); `release()` then lets go of it without
stopping it: the supervisor ends STOPPED with a LEFT_RUNNING outcome and the registry keeps
its entry for a later qmgui to adopt. `detached=True` starts it left (`qmgui serve --detach`).

Thread-safe. State callbacks run on the supervisor's threads (or the caller of `stop`), after
its lock is released; a GUI marshals them to its own thread.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.core.readback import EngineReport, FailureKind, parse_llama_log
from qmgui.core.textsafe import printable, redact_argv, redact_env
from qmgui.engines import oom
from qmgui.engines.health import Health, check_health
from qmgui.engines.logs import (
    LogSink,
    follow_file,
    log_dir,
    log_name,
    prune_logs,
    secret_values,
)
from qmgui.engines.ports import (
    HOST,
    connect_host,
    free_port,
    port_is_free,
    reachable_from_network,
    taken_sentence,
    url_host,
)
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.runner import (
    ENV_TOKEN,
    Child,
    PopenRunner,
    Runner,
    group_of,
    process_identity,
    reap_adopted,
    resolve_executable,
    watchdog,
)
from qmgui.engines.runner import terminate_tree as _terminate_tree

# SIGKILL's number (Windows has no SIGKILL; a child killed there reports another code)
_SIGKILL = getattr(signal, "SIGKILL", 9)

GIB = 1 << 30
POLL_S = 0.05
STOP_GRACE_S = 10.0
LOAD_BASE_S = 30.0
LOAD_PER_GIB_S = 10.0
PORT_RETRIES = 3
TAIL_LINES = 12
READER_JOIN_S = 1.0
RESTART_BASE_S = 1.0
RESTART_MAX_S = 60.0
READY_POLL_S = 1.0
READ_CHUNK = 1 << 16  # the longest line kept whole; a longer one is split
_PORT_WORDS = ("address already in use", "couldn't bind", "exiting due to http server")
_SOURCE = "engines"


class State(str, enum.Enum):
    IDLE = "idle"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        return self in (State.STOPPED, State.CRASHED, State.FAILED)


class OutcomeKind(str, enum.Enum):
    STOPPED = "stopped"
    NOT_FOUND = "not_found"
    NOT_EXECUTABLE = "not_executable"
    START_FAILED = "start_failed"
    PORT_TAKEN = "port_taken"
    EXITED_DURING_LOAD = "exited_during_load"
    OUT_OF_MEMORY = "out_of_memory"
    NEVER_HEALTHY = "never_healthy"
    KILLED_BY_SIGNAL = "killed_by_signal"
    CRASHED = "crashed"
    IDLE = "idle"  # stopped by qmgui after its idle limit
    LEFT_RUNNING = "left_running"  # let go of, still running (detached)


@dataclass(frozen=True)
class Outcome:
    """How one engine run ended: a kind for code, a sentence for people."""

    kind: OutcomeKind
    message: str
    returncode: int | None = None
    log_tail: tuple[str, ...] = ()
    log_path: str | None = None
    restarts: int = 0  # crash restarts that happened before this end
    idle_s: float | None = None  # for IDLE: how long it had been idle
    log_errors: int = 0  # output lines that could not be written to the log file

    def was_successful(self) -> bool:
        return self.kind in (OutcomeKind.STOPPED, OutcomeKind.IDLE, OutcomeKind.LEFT_RUNNING)

    def __str__(self) -> str:
        return self.message


def engine_line(executable: str, report: EngineReport) -> str:
    """One line naming the engine that runs: its binary, its build, its backends and its
    devices, as the engine's own log reported them (`parse_llama_log`)."""
    build = report.build
    built = f"build {build.number} ({build.commit})" if build else "build not reported"
    devices = [d.device for d in report.devices]
    gpus = [d for d in devices if not d.upper().startswith("CPU")]
    backends = sorted({d.rstrip("0123456789") for d in gpus}) or ["CPU"]
    where = ", ".join(devices) if devices else "none reported"
    return f"engine: {executable}, {built}, backend {'+'.join(backends)}, devices {where}"


@dataclass(frozen=True)
class EngineSpec:
    """What to run. The port goes in as `{port}` in any argv token, else as `port_flag N`
    (replacing one already there); the host likewise."""

    argv: tuple[str, ...]
    name: str = ""
    kind: str = "llama"
    health_path: str = "/health"
    host: str = ""  # "": the argv's own `host_flag` value, else 127.0.0.1
    port: int | None = None  # None: a free one, retried when taken; set: that one, never moved
    port_flag: str | None = "--port"
    host_flag: str | None = "--host"
    env: Mapping[str, str] | None = None
    model_bytes: int = 0
    load_base_s: float = LOAD_BASE_S
    load_per_gib_s: float = LOAD_PER_GIB_S
    downshift: bool = False  # retry an out-of-memory load at a smaller context
    default_ctx: int | None = None  # the context the engine uses when argv gives none
    max_restarts: int = 0  # crash restarts after ready; 0: off
    restart_base_s: float = RESTART_BASE_S  # the first backoff; doubles per restart
    restart_max_s: float = RESTART_MAX_S  # the backoff's cap
    idle_ttl_s: float | None = None  # stop after this long without activity; None: never

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        if not self.argv:
            raise EngineError("an engine needs a command to run")
        if self.max_restarts < 0 or self.restart_base_s < 0 or self.restart_max_s < 0:
            raise EngineError("restart limits cannot be negative")
        if self.idle_ttl_s is not None and self.idle_ttl_s <= 0:
            raise EngineError("an idle limit must be positive")
        if not self.name:
            object.__setattr__(self, "name", Path(self.argv[0]).name)
        if not self.host:
            given = flag_value(self.argv, self.host_flag) if self.host_flag else None
            object.__setattr__(self, "host", given or HOST)

    def restart_delay_s(self, n: int) -> float:
        """The wait before restart number `n` (1-based)."""
        return float(min(self.restart_max_s, self.restart_base_s * 2 ** max(0, n - 1)))

    @property
    def load_timeout_s(self) -> float:
        return self.load_base_s + self.load_per_gib_s * self.model_bytes / GIB


def flag_value(argv: tuple[str, ...], flag: str) -> str | None:
    """The value the last `flag` in `argv` gives (`flag V` or `flag=V`; the engine reads the
    last one), or None."""
    found = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif tok.startswith(flag + "="):
            found = tok.split("=", 1)[1]
    return found


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            argv[i + 1] = value
            return argv
        if tok.startswith(flag + "="):
            argv[i] = f"{flag}={value}"
            return argv
    return [*argv, flag, value]


def launch_argv(spec: EngineSpec, argv: tuple[str, ...], port: int) -> tuple[str, ...]:
    """`argv` with the host and port filled in."""
    if any("{port}" in t for t in argv):
        return tuple(t.replace("{port}", str(port)).replace("{host}", spec.host) for t in argv)
    out = list(argv)
    if spec.host_flag:
        out = _set_flag(out, spec.host_flag, spec.host)
    if spec.port_flag:
        out = _set_flag(out, spec.port_flag, str(port))
    return tuple(out)


def idle_words(seconds: float) -> str:
    """Idle times in minutes: "5 minutes", "1 minute", "0.5 minutes"."""
    minutes = seconds / 60
    if minutes >= 1:
        n = round(minutes)
        return f"{n} minute" if n == 1 else f"{n} minutes"
    return f"{minutes:.2g} minutes"


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


StateCallback = Callable[["Supervisor", State], None]
_ids = itertools.count(1)


@dataclass
class _Attempt:
    child: Child
    pid: int
    create_time: float | None
    port: int
    argv: tuple[str, ...]
    token: str
    pgid: int | None  # its own process group, when it leads one
    exited: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None
    reader: threading.Thread | None = None


class Supervisor:
    """One engine from start to its end."""

    def __init__(
        self,
        spec: EngineSpec,
        *,
        runner: Runner | None = None,
        registry: RunRegistry | None = None,
        notifier: notify.Notifier | None = None,
        logs: Path | None = None,
        poll_s: float = POLL_S,
        stop_grace_s: float = STOP_GRACE_S,
        stop_signal: int = signal.SIGTERM,
        ring_lines: int = 2000,
        on_state: StateCallback | None = None,
        output_file: bool = False,
        detached: bool = False,
        model_id: str = "",
    ) -> None:
        self.spec = spec
        self._registry = registry
        self.model_id = model_id
        self.detached = detached
        self._released = False
        self._unfollow = threading.Event()
        self._follow_at = 0
        self._notifier = notifier
        self._poll_s = poll_s
        self._stop_grace_s = stop_grace_s
        self._stop_signal = stop_signal
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._wake = threading.Event()
        self._final = threading.Event()
        self._ready = threading.Event()
        self._state = State.IDLE
        self._outcome: Outcome | None = None
        self._attempt: _Attempt | None = None
        self._closing = False  # someone is ending the process: the monitor or stop()
        self._monitor: threading.Thread | None = None
        self._callbacks: dict[int, StateCallback] = {}
        self._tokens = itertools.count()
        self.downshifts: list[tuple[int, int]] = []  # (from, to) contexts
        self._unshifted: tuple[str, ...] | None = None  # the argv before this load's halvings
        self.restarts = 0  # crash restarts so far
        self._ever_ready = False
        self._stop_requested = threading.Event()
        self._last_activity = time.monotonic()
        self._warned_network = False
        if on_state is not None:
            self.subscribe(on_state)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        folder = log_dir() if logs is None else logs
        path = folder / f"{log_name(spec.name)}-{stamp}-{next(_ids)}.log"
        secrets = secret_values(spec.argv, spec.env)
        try:
            self.log = LogSink(
                path,
                ring_lines=ring_lines,
                secrets=secrets,
                on_error=self._log_failed,
                from_file=output_file or detached,
            )
        except OSError as e:  # a log file is not worth failing: memory only, said once
            self.log = LogSink(None, ring_lines=ring_lines, secrets=secrets)
            self._log_failed(e, path)
        else:
            prune_logs(folder, protect=self._live_logs())
        # an engine that writes its own log file can be left running; without a file, not
        # (nor, on Windows, one that joined qmgui's kill-on-close job: only one started left)
        self.can_detach = self.log.from_file and (sys.platform != "win32" or detached)
        if runner is None and self.log.from_file:
            runner = PopenRunner(output=self.log.path, detached=detached)
        self._runner: Runner = runner or PopenRunner()

    def _live_logs(self) -> list[Path]:
        """The log files of engines in the registry (a detached one still writes its own)."""
        if self._registry is None:
            return []
        try:
            return [Path(e.log_path) for e in self._registry.entries() if e.log_path]
        except EngineError:
            return []

    def _log_failed(self, e: OSError, path: Path | None = None) -> None:
        where = path or self.log.path
        (self._notifier or notify.notifier).warning(
            f"the log of {self.spec.name} could not be written to {where} "
            f"({e.strerror or e}); its output is kept in memory only, and the engine runs on",
            source=_SOURCE,
        )

    # -- observation ---------------------------------------------------------------------

    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    @property
    def outcome(self) -> Outcome | None:
        with self._lock:
            return self._outcome

    @property
    def port(self) -> int | None:
        with self._lock:
            return self._attempt.port if self._attempt else None

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._attempt.pid if self._attempt else None

    @property
    def argv(self) -> tuple[str, ...] | None:
        """The argv running now (with its port and any downshifted context)."""
        with self._lock:
            return self._attempt.argv if self._attempt else None

    @property
    def url(self) -> str | None:
        """Where to reach it from this machine (loopback for a wildcard host)."""
        port = self.port
        return None if port is None else f"http://{url_host(connect_host(self.spec.host))}:{port}"

    @property
    def log_errors(self) -> int:
        """Output lines that could not be written to its log file (a full disk)."""
        return self.log.errors

    def touch(self) -> None:
        """Mark request activity now (a proxy calls it per request): resets the idle timer."""
        with self._lock:
            self._last_activity = time.monotonic()

    @property
    def idle_s(self) -> float:
        """Seconds since it became ready or was last touched."""
        with self._lock:
            return time.monotonic() - self._last_activity

    def subscribe(self, callback: StateCallback) -> Callable[[], None]:
        with self._lock:
            token = next(self._tokens)
            self._callbacks[token] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks.pop(token, None)

        return unsubscribe

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once ready; False when it ended first or `timeout` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ready.is_set():
                return self.state == State.READY
            if self._final.is_set():
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._wake_any(left)

    def _wake_any(self, left: float | None) -> None:
        step = 0.02 if left is None else min(0.02, left)
        self._ready.wait(step)

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """The outcome once the engine ended, or None when `timeout` passed."""
        self._final.wait(timeout)
        return self.outcome

    # -- state ---------------------------------------------------------------------------

    def _set_state(self, state: State, outcome: Outcome | None = None) -> None:
        with self._lock:
            if self._state.final or self._state == state:
                return
            self._state = state
            if outcome is not None:
                self._outcome = outcome
            callbacks = list(self._callbacks.values())
            attempt = self._attempt
        if state == State.READY:
            with self._lock:
                self._ever_ready = True
                self._last_activity = time.monotonic()
            self._ready.set()
        if state.final:
            self.log.close()
            if self._registry is not None and attempt is not None and not self._released:
                try:
                    self._registry.remove(attempt.pid)
                except EngineError as e:
                    notify.notifier.warning(str(e), source=_SOURCE)
            self._final.set()
            self._ready.set()
        for cb in callbacks:
            try:
                cb(self, state)
            except Exception:
                notify.notifier.error(
                    f"an engine state listener failed on {state.value}", source=_SOURCE
                )

    def _fail(self, kind: OutcomeKind, message: str, rc: int | None = None) -> None:
        tail = tuple(self.log.tail(TAIL_LINES))
        with self._lock:
            restarts, ever_ready = self.restarts, self._ever_ready
        if restarts:
            times = "once" if restarts == 1 else f"{restarts} times"
            message += f" It had been restarted {times} after crashing; qmgui gave up."
        outcome = self._ending(kind, self._with_log_words(message), rc, tail=tail)
        final = State.CRASHED if ever_ready else State.FAILED
        self._set_state(final, outcome)

    def _ending(
        self,
        kind: OutcomeKind,
        message: str,
        rc: int | None,
        *,
        tail: tuple[str, ...] | None = None,
        idle_s: float | None = None,
    ) -> Outcome:
        """How it ended, with its last log lines, its log file, restarts and log errors."""
        return Outcome(
            kind,
            message,
            rc,
            tuple(self.log.tail(TAIL_LINES)) if tail is None else tail,
            str(self.log.path) if self.log.path else None,
            self.restarts,
            idle_s,
            log_errors=self.log.errors,
        )

    def _with_log_words(self, message: str) -> str:
        words = self.log.error_words()
        return f"{message} {words}." if words else message

    def _say(self, text: str) -> None:
        (self._notifier or notify.notifier).info(text, source=_SOURCE)

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine and return at once; follow `state`, `wait_ready` or callbacks.
        A missing executable or a taken port ends in FAILED with its outcome."""
        with self._lock:
            if self._state != State.IDLE:
                raise EngineError(f"{self.spec.name} was already started")
        self._set_state(State.STARTING)
        exe, why = resolve_executable(self.spec.argv[0], self.spec.env)
        if exe is None:
            kind = (
                OutcomeKind.NOT_FOUND
                if "not found" in why or "does not exist" in why
                else (OutcomeKind.NOT_EXECUTABLE)
            )
            self._fail(kind, f"{self.spec.name} cannot start: {why}.")
            return
        if self.spec.port is not None and not port_is_free(self.spec.port, self.spec.host):
            self._fail(
                OutcomeKind.PORT_TAKEN,
                taken_sentence(self.spec.name, self.spec.port, self.spec.host),
            )
            return
        self._monitor = threading.Thread(
            target=self._run, args=((exe, *self.spec.argv[1:]),), name=f"qmgui-{self.spec.name}"
        )
        self._monitor.daemon = True
        self._monitor.start()

    def _spawn(self, argv: tuple[str, ...]) -> _Attempt | None:
        try:
            port = self.spec.port if self.spec.port is not None else free_port(self.spec.host)
        except OSError as e:
            self._fail(
                OutcomeKind.START_FAILED,
                f"{self.spec.name} cannot listen on {self.spec.host}: {e.strerror or e}.",
            )
            return None
        full = launch_argv(self.spec, argv, port)
        self.log.write_line(f"# qmgui: {printable(' '.join(redact_argv(full)))}")
        if self.spec.env:
            pairs = " ".join(f"{k}={v}" for k, v in redact_env(self.spec.env).items())
            self.log.write_line(f"# qmgui: environment: {printable(pairs)}")
        self._warn_network(port)
        token = uuid.uuid4().hex
        env = {**(self.spec.env or {}), ENV_TOKEN: token}
        with self._spawn_lock:  # stop() reads the attempt under it: no spawn slips past
            with self._lock:
                if self._closing:
                    return None
            try:
                child = self._runner.spawn(full, env)
            except OSError as e:
                self._fail(
                    OutcomeKind.START_FAILED,
                    f"{self.spec.name} could not start: {e.strerror or e}.",
                )
                return None
            pgid = group_of(child.pid)
            attempt = _Attempt(
                child,
                child.pid,
                process_identity(child.pid),
                port,
                full,
                token,
                pgid if pgid == child.pid else None,
            )
            with self._lock:
                self._attempt = attempt
        if self._registry is not None and attempt.create_time is not None:
            try:
                self._registry.record(
                    RunEntry(
                        attempt.pid,
                        attempt.create_time,
                        full,
                        port,
                        attempt.pgid,
                        token,
                        os.getpid(),
                        process_identity(os.getpid()),
                        detached=self.detached,
                        log_path=str(self.log.path) if self.log.from_file else None,
                        model=self.spec.name,
                        model_id=self.model_id or None,
                        env=dict(self.spec.env) if self.spec.env else None,
                    )
                )
            except EngineError as e:
                notify.notifier.warning(str(e), source=_SOURCE)
        if child.stdout is None and self.log.from_file:
            attempt.reader = threading.Thread(target=self._follow, args=(attempt,), daemon=True)
        else:
            attempt.reader = threading.Thread(target=self._read, args=(child,), daemon=True)
        attempt.reader.start()
        threading.Thread(target=self._reap, args=(attempt,), daemon=True).start()
        return attempt

    def _warn_network(self, port: int) -> None:
        """Once: an engine that listens beyond loopback can be used by anyone who reaches
        this machine."""
        host = self.spec.host
        if self._warned_network or not reachable_from_network(host):
            return
        self._warned_network = True
        if any(t.split("=", 1)[0] in ("--api-key", "--api-key-file") for t in self.spec.argv):
            return  # a key: whoever gave it (qmgui.service.exposure) said where it listens
        where = "every address of this computer" if connect_host(host) != host else host
        (self._notifier or notify.notifier).warning(
            f"{self.spec.name} listens on {printable(host)} port {port} ({where}): it is "
            "reachable from the network, not only from this computer; anyone who can reach "
            "it can use it (--api-key sets a key).",
            source=_SOURCE,
        )

    def _read(self, child: Child) -> None:
        """Copy the engine's output into the log until its pipe closes. Nothing the log does
        stops it: the pipe is drained to the end, so the engine never blocks on it."""
        stream = child.stdout
        if stream is None:
            return
        try:
            while True:
                try:
                    raw = stream.readline(READ_CHUNK)
                except (OSError, ValueError):
                    return
                if not raw:
                    return
                try:
                    self.log.write_line(raw.decode("utf-8", errors="replace"))
                except Exception:  # a line lost, never the reader
                    continue
        finally:
            with contextlib.suppress(OSError, ValueError):
                stream.close()

    def _follow(self, attempt: _Attempt) -> None:
        """Copy what the engine writes to its log file into the ring, from where the last
        attempt's follower stopped, until it exited (and all it wrote is read) or it is let go."""
        assert self.log.path is not None
        self._follow_at = follow_file(
            self.log.path,
            self.log,
            offset=self._follow_at,
            done=attempt.exited.is_set,
            halt=self._unfollow,
            poll_s=self._poll_s,
            rotate=True,
        )

    def _reap(self, attempt: _Attempt) -> None:
        attempt.returncode = attempt.child.wait()
        attempt.exited.set()
        self._wake.set()

    # -- the monitor thread --------------------------------------------------------------

    def _run(self, argv: tuple[str, ...]) -> None:
        port_tries = 0
        while True:
            attempt = self._spawn(argv)
            if attempt is None:
                return
            self._set_state(State.LOADING)
            verdict = self._watch_load(attempt)
            if verdict == "ready":
                if self.spec.kind == "llama":
                    line = engine_line(attempt.argv[0], parse_llama_log(self.log.text()))
                    self.log.write_line(f"# qmgui: {printable(line)}")
                restart = self._forget_downshift(attempt)
                self._set_state(State.READY)
                if not self._watch_ready(attempt):
                    return
                argv = restart
                port_tries = 0
                continue
            if verdict in ("stopping", "ended"):
                return
            retry = self._after_load_exit(attempt, port_tries)
            if retry is None:
                return
            argv, port_tries = retry
            with self._lock:
                if self._closing:
                    return
                self._state = State.STARTING  # a restart; LOADING follows the spawn

    def _watch_load(self, attempt: _Attempt) -> str:
        deadline = time.monotonic() + self.spec.load_timeout_s
        while True:
            self._wake.wait(self._poll_s)
            self._wake.clear()
            with self._lock:
                if self._closing:
                    return "stopping"
            if attempt.exited.is_set():
                return "exited"
            host = connect_host(self.spec.host)
            if check_health(host, attempt.port, self.spec.health_path) == Health.READY:
                return "ready"
            if time.monotonic() >= deadline:
                if not self._claim():
                    return "stopping"
                self._kill(attempt, grace_s=0.5)
                self._fail(
                    OutcomeKind.NEVER_HEALTHY,
                    f"{self.spec.name} did not become ready within "
                    f"{self.spec.load_timeout_s:.0f} s (its {self.spec.health_path} never "
                    "answered OK); it was stopped. Check its log, or allow more time for a "
                    "large model.",
                )
                return "ended"

    def _claim(self) -> bool:
        with self._lock:
            if self._closing:
                return False
            self._closing = True
            return True

    def _terminate(self, attempt: _Attempt, grace_s: float) -> None:
        """End the attempt's process, tree and group (EngineError when something survives
        SIGKILL); once its group is empty the watchdog forgets it."""
        _terminate_tree(
            attempt.pid,
            create_time=attempt.create_time,
            grace_s=grace_s,
            sig=self._stop_signal,
            wait_root=attempt.exited.wait,
            pgid=attempt.pgid,
            token=attempt.token,
        )
        watchdog.unwatch(attempt.pid)  # the runner gave it its pid's group (if any)

    def _kill(self, attempt: _Attempt, *, grace_s: float) -> None:
        """`_terminate` from the monitor thread: never raises (a survivor is said)."""
        try:
            self._terminate(attempt, grace_s)
        except EngineError as e:
            notify.notifier.error(f"{self.spec.name}: {e}", source=_SOURCE)
        if attempt.reader is not None:
            attempt.reader.join(READER_JOIN_S)

    def _watch_ready(self, attempt: _Attempt) -> bool:
        """Watch a ready engine until it ends; True when it crashed and is to be restarted
        (the backoff waited, the state back at STARTING)."""
        ttl = self.spec.idle_ttl_s
        while True:
            step = READY_POLL_S
            if ttl is not None:
                step = min(step, max(0.01, ttl - self.idle_s))
            if attempt.exited.wait(step):
                break
            with self._lock:
                if self._closing:
                    return False
            reap_adopted(attempt.pgid, exclude=attempt.pid)  # orphans of a wrapper that ended
            if ttl is not None and self.idle_s >= ttl:
                self._stop_idle(attempt)
                return False
        if attempt.reader is not None:
            attempt.reader.join(READER_JOIN_S)
        rc = attempt.returncode
        if self._restart_after_crash(attempt):
            return True
        if not self._claim():
            return False
        self._kill(attempt, grace_s=0)  # whatever it left behind in its group
        if rc is not None and rc < 0:
            self._fail(
                OutcomeKind.KILLED_BY_SIGNAL,
                f"{self.spec.name} was killed by {_signal_name(-rc)} after it was ready.",
                rc,
            )
        else:
            self._fail(
                OutcomeKind.CRASHED,
                f"{self.spec.name} exited with status {rc} after it was ready; see its log.",
                rc,
            )
        return False

    def _crash_words(self, rc: int | None) -> str:
        if rc is not None and rc < 0:
            return f"was killed by {_signal_name(-rc)}"
        return f"exited with status {rc}"

    def _restart_after_crash(self, attempt: _Attempt) -> bool:
        with self._lock:
            if self._closing or self.restarts >= self.spec.max_restarts:
                return False
            self.restarts += 1
            n = self.restarts
        self._kill(attempt, grace_s=0)  # leftovers in its group
        if self._registry is not None:
            with contextlib.suppress(EngineError):
                self._registry.remove(attempt.pid)
        delay = self.spec.restart_delay_s(n)
        self.log.write_line(f"# qmgui: crashed ({attempt.returncode}); restart {n} in {delay:g} s")
        self._say(
            f"{self.spec.name} {self._crash_words(attempt.returncode)} after it was ready; "
            f"restarting it in {delay:g} s (restart {n} of {self.spec.max_restarts})."
        )
        self._ready.clear()
        self._set_state(State.STARTING)
        if self._stop_requested.wait(delay):
            return False  # stop() ends it
        with self._lock:
            return not self._closing

    def _stop_idle(self, attempt: _Attempt) -> None:
        if not self._claim():
            return
        idle = self.idle_s
        self._set_state(State.STOPPING)
        self._kill(attempt, grace_s=self._stop_grace_s)
        outcome = self._ending(
            OutcomeKind.IDLE,
            self._with_log_words(
                f"{self.spec.name} was stopped after {idle_words(idle)} idle (no requests); "
                "start it again when you need it."
            ),
            attempt.returncode,
            idle_s=idle,
        )
        self._set_state(State.STOPPED, outcome)

    def _after_load_exit(
        self, attempt: _Attempt, port_tries: int
    ) -> tuple[tuple[str, ...], int] | None:
        """An exit while loading: a new argv to retry with, or None (the outcome is set)."""
        if attempt.reader is not None:
            attempt.reader.join(READER_JOIN_S)
        with self._lock:
            if self._closing:
                return None
        self._kill(attempt, grace_s=0)  # whatever it left behind in its group
        text = self.log.text()
        report = parse_llama_log(text)
        kinds = report.failure_kinds()
        rc = attempt.returncode
        base = self._base_argv(attempt)
        lowered = text.lower()
        port_taken = FailureKind.PORT in kinds or any(w in lowered for w in _PORT_WORDS)
        if port_taken:
            if self.spec.port is None and port_tries + 1 < PORT_RETRIES:
                self.log.write_line(f"# qmgui: port {attempt.port} was taken; another one")
                return base, port_tries + 1
            self._fail(
                OutcomeKind.PORT_TAKEN,
                taken_sentence(self.spec.name, attempt.port, self.spec.host),
                rc,
            )
            return None
        oom_kill = rc == -_SIGKILL
        if FailureKind.OUT_OF_MEMORY in kinds or oom_kill:
            return self._downshift(
                base, rc, killed=oom_kill and FailureKind.OUT_OF_MEMORY not in kinds
            )
        if rc is not None and rc < 0:
            self._fail(
                OutcomeKind.KILLED_BY_SIGNAL,
                f"{self.spec.name} was killed by {_signal_name(-rc)} while loading the model.",
                rc,
            )
            return None
        why = next((f.message for f in report.failures), None)
        last = why or next((ln for ln in reversed(self.log.tail()) if ln.strip()), "")
        self._fail(
            OutcomeKind.EXITED_DURING_LOAD,
            f"{self.spec.name} exited with status {rc} while loading the model"
            + (f": {last}" if last else ".")
            + " See its log for more.",
            rc,
        )
        return None

    def _base_argv(self, attempt: _Attempt) -> tuple[str, ...]:
        return attempt.argv

    def _forget_downshift(self, attempt: _Attempt) -> tuple[str, ...]:
        """The argv a restart after a crash runs: the one this load started from, without
        its halvings (the ready engine proved the reduced load, not that it is still needed)."""
        argv, self._unshifted = self._unshifted, None
        if argv is None:
            return self._base_argv(attempt)
        self.log.write_line(
            f"# qmgui: ready at context {oom.ctx_of(attempt.argv)}; the reduction is "
            f"forgotten: a restart asks for context {oom.ctx_of(argv) or 'the default'} again"
        )
        return argv

    def _downshift(
        self, argv: tuple[str, ...], rc: int | None, *, killed: bool
    ) -> tuple[tuple[str, ...], int] | None:
        ctx = oom.ctx_of(argv) or self.spec.default_ctx
        smaller = oom.next_ctx(ctx) if self.spec.downshift else None
        cause = (
            "was killed by SIGKILL while loading, most likely by the system's out-of-memory killer"
            if killed
            else "ran out of memory while loading the model"
        )
        if smaller is None or ctx is None:
            hint = (
                "the context is pinned; lower it, or offload fewer layers (-ngl)"
                if not self.spec.downshift
                else f"the context is already at the floor ({oom.MIN_CTX})"
                if ctx is not None
                else "offload fewer layers (-ngl) or pick a smaller quantisation"
            )
            self._fail(OutcomeKind.OUT_OF_MEMORY, f"{self.spec.name} {cause}; {hint}.", rc)
            return None
        if self._unshifted is None:
            self._unshifted = argv
        self.downshifts.append((ctx, smaller))
        self._say(f"{self.spec.name} {cause} at context {ctx}; restarting it at context {smaller}.")
        return oom.with_ctx(argv, smaller), 0

    # -- leave running -------------------------------------------------------------------

    def set_detached(self, detached: bool) -> None:
        """Leave the engine running when qmgui ends (True), or take it back to end with it
        (False): the watchdog forgets (learns) its group and the run registry says so.
        EngineError when it cannot be left (its output goes to a pipe: no log file)."""
        if detached and not self.can_detach:
            raise EngineError(
                f"{self.spec.name} cannot be left running: its output goes to qmgui, not to a "
                "log file"
            )
        with self._spawn_lock, self._lock:
            self.detached = detached
            attempt = self._attempt
            if isinstance(self._runner, PopenRunner) and self._runner.output is not None:
                self._runner.detached = detached  # a restart after a crash: the same
        if attempt is None or attempt.pgid is None:
            return  # the next attempt is recorded and watched as `detached` says
        if detached:
            watchdog.unwatch(attempt.pgid)
        else:
            watchdog.watch(attempt.pgid)
        if self._registry is not None:
            self._registry.mark_detached(attempt.pid, detached)

    def release(self) -> Outcome:
        """Let go of a detached engine without stopping it: the supervisor ends (STOPPED,
        LEFT_RUNNING) and the run registry keeps it for a later qmgui to adopt."""
        with self._lock:
            attempt = self._attempt
        if attempt is None or attempt.exited.is_set():
            return self.stop()  # nothing runs to be left
        if not self.detached:
            self.set_detached(True)
        if not self._claim():
            self._final.wait(READER_JOIN_S + 1)
            return self.outcome or Outcome(OutcomeKind.STOPPED, f"{self.spec.name} ended.")
        with self._lock:
            self._released = True
            attempt = self._attempt
        self._unfollow.set()
        self._stop_requested.set()
        self._wake.set()
        if attempt is not None and attempt.reader is not None:
            attempt.reader.join(READER_JOIN_S)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(READER_JOIN_S + 1)
        where = f" at {self.url}" if self.url else ""
        pid = f" (pid {attempt.pid})" if attempt is not None else ""
        outcome = self._ending(
            OutcomeKind.LEFT_RUNNING,
            f"{self.spec.name}{pid} was left running{where}; "
            "`qmgui engines stop` or a later qmgui stops it.",
            None,
        )
        self._set_state(State.STOPPED, outcome)
        return self.outcome or outcome

    @property
    def released(self) -> bool:
        with self._lock:
            return self._released

    # -- stop ----------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> Outcome:
        """End the engine and its whole process tree: the stop signal, then SIGKILL after
        `grace_s`; bounded. Returns the outcome (the earlier one when it had already ended)."""
        if not self._claim():
            self._final.wait(2 * (grace_s or self._stop_grace_s) + 10)
            outcome = self.outcome
            if outcome is None:
                raise EngineError(f"{self.spec.name} did not finish stopping")
            return outcome
        self._set_state(State.STOPPING)
        self._stop_requested.set()
        self._wake.set()
        with self._spawn_lock, self._lock:
            attempt = self._attempt
        killed = False
        survived = ""
        if attempt is not None:
            try:
                self._terminate(attempt, self._stop_grace_s if grace_s is None else grace_s)
            except EngineError as e:
                survived = f" Some of its processes did not die: {e}."
                notify.notifier.error(f"{self.spec.name}: {e}", source=_SOURCE)
            killed = attempt.returncode == -_SIGKILL
            if attempt.reader is not None:
                attempt.reader.join(READER_JOIN_S)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(READER_JOIN_S + 1)
        message = f"{self.spec.name} was stopped" + (
            " (it ignored the stop signal and was killed)." if killed else "."
        )
        outcome = self._ending(
            OutcomeKind.STOPPED,
            self._with_log_words(message) + survived,
            attempt.returncode if attempt else None,
        )
        self._set_state(State.STOPPED, outcome)
        return self.outcome or outcome


__all__ = [
    "EngineSpec",
    "Outcome",
    "OutcomeKind",
    "State",
    "Supervisor",
    "idle_words",
    "launch_argv",
]
