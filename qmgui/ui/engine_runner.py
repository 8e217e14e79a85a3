"""The window's bridge to the engine supervisor: start, stop and restart engines off the GUI
thread, and hand their state changes to the GUI thread through a queued signal.

An engine is started from a `PlanOutcome`: the argv is the preview's command exactly (its
port is the model's saved one, as `qmgui serve` uses; Restart keeps it), the health
path and kind come from the same resolver. `Supervisor.start()` and `stop()` may block (the
executable's resolution, a graceful stop's grace period), so both run on worker threads; state
callbacks arrive on the supervisor's threads and are re-emitted as `changed(id)` on the GUI
thread. When an engine becomes ready its log is compared with the plan (planned vs actual
total memory) on the supervisor's thread, never on the GUI's.

The first start makes the window's process a child subreaper (Linux): a wrapper script's
engine stays the window's own when the script dies (`qmgui.engines.runner`).

Every engine the window starts writes its output to its log file (followed by its supervisor),
so it can be left running: `set_keep(id, True)` ("Keep running after quit") detaches it (the
watchdog forgets it, the run registry marks it detached) and at quit it is let go of, not
stopped; `leave_all()` ("Leave them running") does that for every running engine. Engines not
kept die with the window, however it ends. `adopt_survivors()` (at the window's start) takes
in the engines an earlier qmgui left: detached ones (kept running past this window too) and
survivors of a qmgui that died (they end with this window unless kept), each shown with its
state, URL, uptime and log (its log file, followed from where it is), and Stop and Restart
(the same command, started again).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from qmgui import notify
from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import Command
from qmgui.core.errors import EngineError
from qmgui.core.footprint import Footprint
from qmgui.core.readback import parse_llama_log
from qmgui.core.webui import kind_of_argv, web_ui_url
from qmgui.engines.adopt import Adopted
from qmgui.engines.model_ports import port_for_start
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.residuals import readback
from qmgui.engines.router import RouterReading, is_router
from qmgui.engines.runner import become_subreaper
from qmgui.engines.supervisor import EngineSpec, State, Supervisor
from qmgui.service.exposure import expose_spec, key_path
from qmgui.service.launch import Request, Resolver, engine_spec
from qmgui.service.router import (
    plan_router,
    refresh_preset,
    router_id,
    router_spec,
    write_preset,
)
from qmgui.ui.planning import PlanOutcome

SOURCE = "engines"
STOP_GRACE_S = 5.0
LATE_MEMORY_S = 5.0  # how long the buffer lines may trail the health endpoint in the log file
JOIN_S = 30.0
REFRESH_DELAY_MS = 800  # a burst of profile edits is one preset write


def spec_for(outcome: PlanOutcome, resolver: Resolver, port: int | None = None) -> EngineSpec:
    """The supervisor's spec for the command the preview shows (ValueError when there is none).

    The same spec `qmgui serve` builds, on the model's saved port (chosen and saved at its
    first start); the context the user chose is kept (no downshift)."""
    command = outcome.command
    if not command.runnable:
        raise ValueError("; ".join(command.warnings) or "this model has no launch command")
    target = resolver.target(outcome.entry)
    if isinstance(target, str):
        raise ValueError(target)
    if port is None:
        loaded = resolver.loaded
        port = port_for_start(outcome.entry.id, loaded.settings, path=loaded.path)
    spec = engine_spec(command, target.kind, outcome.entry, port=port)
    # a `--host` beyond loopback in the model's arguments: an API key, as `qmgui serve` gives
    spec, exposed = expose_spec(spec)
    if exposed is not None and exposed.warning:
        notify.warning(exposed.warning, source=SOURCE)
    if exposed is not None and exposed.new_key:
        notify.warning(f"API key (shown once, kept in {key_path()}): {exposed.new_key}",
                       source=SOURCE)  # fmt: skip
    return spec


@dataclass(frozen=True)
class Memory:
    """Planned and actual total bytes once the engine is ready (None: unknown), and the
    actual bytes per planned device name (a GPU of the plan, or CPU for host memory)."""

    planned: int | None
    actual: int | None
    actual_by_device: Mapping[str, int] = field(default_factory=dict)
    overruns: tuple[str, ...] = ()  # buffers beyond the plan (print precision + 2%)


def memory_of(log_text: str, footprint: Footprint | None) -> Memory:
    """Planned and actual totals, compared kind by kind as `qmgui serve` does."""
    if footprint is None:
        report = parse_llama_log(log_text)
        by_dev = {d.device: d.total.bytes for d in report.devices}
        return Memory(None, sum(by_dev.values()) or None, by_dev)
    rb = readback(log_text, footprint)
    planned = [sum(r.planned.values()) for r in rb.rows if r.planned is not None]
    actual = [sum(r.actual.values()) for r in rb.rows if r.actual is not None]
    by_device = {r.name: sum(r.actual.values()) for r in rb.rows if r.actual is not None}
    return Memory(
        sum(planned) if planned else None,
        sum(actual) if actual else None,
        by_device,
        rb.overruns() if actual else (),
    )


@dataclass
class Engine:
    """One engine the window started (a restart keeps the id, with a new supervisor)."""

    id: int
    name: str
    spec: EngineSpec | None
    footprint: Footprint | None
    supervisor: Supervisor | None = None
    ready_at: float | None = None  # monotonic
    memory: Memory | None = None
    error: str = ""  # why it could not be started
    busy: bool = False  # a start, stop or restart is on its way
    model_id: str = ""
    started_at: float = field(default_factory=time.monotonic)
    adopted: Adopted | None = None  # one an earlier qmgui left running, until restarted
    keep: bool = False  # keep running after quit (detached)
    # a llama.cpp router: its latest reading (models, loaded ones and their memory), and how
    # to build its spec again (the preset regenerated from the profiles as they are then)
    router: RouterReading | None = None
    replan: Callable[[], EngineSpec] | None = None
    members: frozenset[str] = frozenset()  # a router's model ids (their profiles feed it)
    group: str = ""  # the role set it was started for ("" for none)
    refresh: Callable[[], str] | None = None  # a router: write its preset again, say what did

    @property
    def label(self) -> str:
        """Its name; for a router, with the models it has loaded now."""
        reading = self.router
        if reading is None or not reading.models:
            return self.name
        loaded = [m.name for m in reading.loaded]
        n = len(reading.models)
        return f"router of {n} model{'s' if n != 1 else ''}: loaded " + (
            ", ".join(loaded) if loaded else "none"
        )

    @property
    def is_router(self) -> bool:
        handle = self.handle
        argv = self.spec.argv if self.spec is not None else handle.argv if handle else None
        return is_router(argv or ())

    @property
    def handle(self) -> Supervisor | Adopted | None:
        """What runs it now: its supervisor, or the adopted engine's watcher."""
        return self.supervisor if self.supervisor is not None else self.adopted

    @property
    def state(self) -> State:
        handle = self.handle
        if handle is None:
            return State.FAILED if self.error else State.STARTING
        return handle.state

    @property
    def url(self) -> str | None:
        handle = self.handle
        return handle.url if handle is not None else None

    @property
    def kind(self) -> str | None:
        """llama, vllm, sd, whisper, custom; for an adopted engine, what its executable's
        name says (None: it says nothing)."""
        if self.supervisor is not None:
            return self.supervisor.spec.kind
        if self.adopted is not None:
            return kind_of_argv(self.adopted.argv)
        return None

    @property
    def chat_url(self) -> str | None:
        """The address of the engine's own chat page (llama-server's web UI at `/`), None
        for an engine without one."""
        handle = self.handle
        if handle is None:
            return None
        argv = self.supervisor.spec.argv if self.supervisor is not None else handle.argv or ()
        return web_ui_url(self.kind, argv, self.url)

    def uptime_s(self) -> float | None:
        if self.state != State.READY:
            return None
        if self.supervisor is None and self.adopted is not None:
            return self.adopted.uptime_s()  # since its process started
        if self.ready_at is None:
            return None
        return time.monotonic() - self.ready_at

    @property
    def last_used(self) -> float:
        """When it last did something (monotonic): the latest line it logged (llama-server
        logs every request), else when it became ready or was started."""
        latest = self.ready_at or self.started_at
        sup = self.handle
        if sup is not None and sup.log.last_line_at is not None:
            latest = max(latest, sup.log.last_line_at)
        return latest


class EngineRunner(QObject):
    """The engines this window started. `changed(id)` (GUI thread) after any change to one;
    `added(id)` when a new one appears."""

    changed = Signal(int)
    added = Signal(int)
    _state = Signal(int, object)  # id, State: posted from the supervisor's threads
    _found = Signal(object)  # list[RunEntry] to adopt: posted from a worker thread

    def __init__(self, parent: QObject | None = None, *, registry: bool = True) -> None:
        super().__init__(parent)
        self.engines: dict[int, Engine] = {}
        self._next = 1
        self._threads: list[threading.Thread] = []
        self._registry = RunRegistry() if registry else None
        # the model's port, chosen and saved on the GUI thread (the window saves it through
        # its own settings path); None: chosen and saved on the worker (`port_for_start`)
        self.port_for: Callable[[ModelEntry], int] | None = None
        self.port_for_id: Callable[[str], int] | None = None  # the same, by id (a router)
        self._changed_ids: set[str] = set()
        self._refresh_timer = QTimer(self)
        self._refresh_timer.setSingleShot(True)
        self._refresh_timer.setInterval(REFRESH_DELAY_MS)
        self._refresh_timer.timeout.connect(self._refresh_routers)
        self._state.connect(self._on_state, Qt.ConnectionType.QueuedConnection)
        self._found.connect(self._adopt, Qt.ConnectionType.QueuedConnection)

    # --- commands (GUI thread) ----------------------------------------------------------------
    def start(
        self, outcome: PlanOutcome, resolver: Resolver, *, stop_first: Sequence[int] = ()
    ) -> int:
        """Start the command of `outcome` on a worker thread; returns the engine's id.

        `stop_first`: engines to stop (and wait for) before it starts, to make room."""
        eid = self._next
        self._next += 1
        fp = outcome.fit.footprint if outcome.fit is not None else None
        engine = Engine(eid, outcome.entry.name, None, fp, busy=True, model_id=outcome.entry.id)
        self.engines[eid] = engine
        self.added.emit(eid)
        victims = [v for v in map(self._claim_for_stop, stop_first) if v is not None]
        port = self.port_for(outcome.entry) if self.port_for is not None else None

        def run() -> None:
            for victim, sup in victims:
                self._stop(victim, sup)
            self._start(engine, outcome, resolver, port)

        self._spawn(f"start-{eid}", run)
        return eid

    def start_command(
        self,
        name: str,
        entry: ModelEntry,
        command: Command,
        *,
        port: int,
        footprint: Footprint | None = None,
        group: str = "",
    ) -> int:
        """Start a command planned elsewhere (an instance of a role set: its own argv and
        port) on a worker thread; returns the engine's id. Restart runs the same command."""
        eid = self._next
        self._next += 1
        engine = Engine(eid, name, None, footprint, busy=True, model_id=entry.id, group=group)
        self.engines[eid] = engine
        self.added.emit(eid)

        def run() -> None:
            try:
                if not command.runnable:
                    raise ValueError("; ".join(command.warnings) or "no launch command")
                engine.spec = replace(engine_spec(command, "llama", entry, port=port), name=name)
                self._launch(engine, engine.spec)
            except Exception as e:  # a start that cannot happen is a message, not a crash
                engine.error = str(e) or type(e).__name__
                notify.error(f"{name} could not start: {engine.error}", source=SOURCE)
            finally:
                engine.busy = False
                self._post(engine.id, engine.state)

        self._spawn(f"start-{eid}", run)
        return eid

    def start_router(
        self,
        entries: Sequence[ModelEntry],
        resolver: Callable[[], Resolver],
        req: Request,
        *,
        host_bytes: int | None = None,
    ) -> int:
        """Serve `entries` through one endpoint (llama.cpp's router) on a worker thread; the
        preset is planned there, and again at each restart (profiles as they are then)."""
        eid = self._next
        self._next += 1
        rid = router_id(entries)
        engine = Engine(eid, "router", None, None, busy=True, model_id=rid)
        engine.members = frozenset(e.id for e in entries)
        self.engines[eid] = engine
        self.added.emit(eid)
        port: list[int] = [self.port_for_id(rid)] if self.port_for_id is not None else []

        def replan() -> EngineSpec:
            r = resolver()
            plan = plan_router(entries, r, req, host_bytes=host_bytes)
            for warning in plan.warnings:
                notify.warning(warning, source=SOURCE)
            preset = write_preset(plan)
            if not port:
                port.append(port_for_start(rid, r.loaded.settings, path=r.loaded.path))
            engine.name = plan.name
            return router_spec(plan, preset, port=port[0])

        engine.replan = replan

        def refresh() -> str:
            """The preset from the profiles as they are now, brought to the running router
            when it changed; what happened, in words ("" if nothing)."""
            plan = plan_router(entries, resolver(), req, host_bytes=host_bytes)
            argv = engine.spec.argv if engine.spec is not None else ()
            return refresh_preset(plan, engine.url, argv)

        engine.refresh = refresh

        def run() -> None:
            try:
                engine.spec = replan()
                self._launch(engine, engine.spec)
            except Exception as e:  # a start that cannot happen is a message, not a crash
                engine.error = str(e) or type(e).__name__
                notify.error(f"the router could not start: {engine.error}", source=SOURCE)
            finally:
                engine.busy = False
                self._post(engine.id, engine.state)

        self._spawn(f"router-{eid}", run)
        return eid

    def profiles_changed(self, model_ids: Iterable[str]) -> None:
        """Profiles of these models changed: each running router serving one of them gets
        its preset written again (after a short pause, so a burst of edits is one write)."""
        self._changed_ids |= set(model_ids)
        self._refresh_timer.start()

    def _refresh_routers(self) -> None:
        ids, self._changed_ids = self._changed_ids, set()
        for engine in self.engines.values():
            refresh = engine.refresh
            if refresh is None or engine.busy or engine.state != State.READY:
                continue
            if not engine.members & ids:
                continue

            def run(refresh: Callable[[], str] = refresh, name: str = engine.name) -> None:
                try:
                    said = refresh()
                except Exception as e:  # a preset that cannot be planned is a message
                    notify.warning(f"{name}: preset not updated: {e}", source=SOURCE)
                    return
                if said:
                    notify.info(said, source=SOURCE)

            self._spawn(f"refresh-{engine.id}", run)

    def stop(self, eid: int) -> None:
        claimed = self._claim_for_stop(eid)
        if claimed is not None:
            engine, sup = claimed
            self._spawn(f"stop-{eid}", lambda: self._stop(engine, sup))

    def _claim_for_stop(self, eid: int) -> tuple[Engine, Supervisor | Adopted] | None:
        """Mark a running engine busy for a stop; None when there is nothing to stop now."""
        engine = self.engines.get(eid)
        handle = engine.handle if engine is not None else None
        if engine is None or handle is None or engine.busy:
            return None
        engine.busy = True
        self.changed.emit(eid)
        return engine, handle

    def restart(self, eid: int) -> None:
        engine = self.engines.get(eid)
        if engine is None or engine.spec is None or engine.busy:
            return
        engine.busy = True
        self.changed.emit(eid)
        old = engine.handle
        self._spawn(f"restart-{eid}", lambda: self._restart(engine, old))

    def set_keep(self, eid: int, keep: bool) -> None:
        """Keep engine `eid` running after quit (detached), or make it end with qmgui again."""
        engine = self.engines.get(eid)
        if engine is None or engine.keep == keep:
            return
        engine.keep = keep
        self.changed.emit(eid)
        handle = engine.handle
        if handle is not None and not handle.state.final:
            self._spawn(f"keep-{eid}", lambda: self._set_detached(engine, handle, keep))

    def _set_detached(self, engine: Engine, handle: Supervisor | Adopted, keep: bool) -> None:
        try:
            handle.set_detached(keep)
            if keep:
                notify.info(
                    f"{engine.name} will keep running after qmgui quits (qmgui adopts it when "
                    "it starts again; `qmgui engines stop` stops it)",
                    source=SOURCE,
                )
        except EngineError as e:
            engine.keep = not keep
            notify.error(str(e), source=SOURCE)
        finally:
            self._post(engine.id, engine.state)

    def remove(self, eid: int) -> None:
        """Forget an engine that has ended."""
        engine = self.engines.get(eid)
        if engine is not None and engine.state.final and not engine.busy:
            del self.engines[eid]
            self.changed.emit(eid)

    def running(self) -> list[Engine]:
        return [e for e in self.engines.values() if not e.state.final]

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """The quit path: stop every engine, but let go of those kept running (detached);
        waits for it."""
        self.wait()
        threads = []
        for e in self.engines.values():
            handle = e.handle
            if handle is None or handle.state.final:
                continue
            if e.keep:
                threads.append(threading.Thread(target=self._leave, args=(e, handle), daemon=True))
            else:
                threads.append(threading.Thread(target=handle.stop, args=(grace_s,), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * grace_s + 10)

    def leave_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """At quit, "Leave them running": every running engine is kept, then let go of."""
        for e in self.engines.values():
            e.keep = True
        self.stop_all(grace_s)

    def _leave(self, engine: Engine, handle: Supervisor | Adopted) -> None:
        try:
            notify.info(str(handle.release()), source=SOURCE)
        except EngineError as e:  # it cannot be left (no log file): it ends with qmgui
            notify.error(f"{e}; it is stopped", source=SOURCE)
            handle.stop(STOP_GRACE_S)

    def adopt_survivors(self) -> None:
        """Take in, off the GUI thread, the engines an earlier qmgui left running."""
        if self._registry is None:
            return
        registry = self._registry
        mine = {h.pid for e in self.engines.values() if (h := e.handle) is not None and h.pid}

        def find() -> None:
            try:
                found = [e for e in registry.adoptable() if e.pid not in mine]
            except EngineError as e:
                notify.warning(f"engines left running could not be listed: {e}", source=SOURCE)
                return
            if found:
                with contextlib.suppress(RuntimeError):  # the window is gone
                    self._found.emit(found)

        self._spawn("adopt", find)

    def _adopt(self, entries: object) -> None:
        """GUI thread: one row per engine found, watched by an `Adopted`."""
        assert isinstance(entries, list)
        known = {h.pid for e in self.engines.values() if (h := e.handle) is not None}
        for entry in entries:
            assert isinstance(entry, RunEntry)
            if entry.pid in known:
                continue
            eid = self._next
            self._next += 1
            engine = Engine(
                eid, entry.name, None, None, model_id=entry.model_id or "", keep=entry.detached
            )

            def on_state(a: Adopted, state: State, engine: Engine = engine) -> None:
                if a is engine.adopted and engine.supervisor is None:
                    self._post(engine.id, state)

            adopted = Adopted(entry, registry=self._registry, on_state=on_state)
            try:
                engine.spec = adopted.spec()
            except EngineError as e:
                engine.error = str(e)  # shown as the state's tip; Restart is off
            engine.adopted = adopted
            self.engines[eid] = engine
            adopted.start()
            if not entry.detached:  # a survivor of a qmgui that died: it ends with this one
                self._spawn(f"own-{eid}", lambda a=adopted: a.set_detached(False))
            self.added.emit(eid)
            notify.info(
                f"adopted {entry.name} (pid {entry.pid}) left running by an earlier qmgui"
                + (f" at {adopted.url}" if adopted.url else ""),
                source=SOURCE,
            )

    def wait(self, timeout: float = JOIN_S) -> None:
        """Join the start/stop/restart threads running now."""
        for t in list(self._threads):
            t.join(timeout)
        self._threads = [t for t in self._threads if t.is_alive()]

    # --- worker threads -----------------------------------------------------------------------
    def _spawn(self, name: str, target: object) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        t = threading.Thread(target=target, name=f"qmgui-engine-{name}", daemon=True)  # type: ignore[arg-type]
        self._threads.append(t)
        t.start()

    def _post(self, eid: int, state: State) -> None:
        with contextlib.suppress(RuntimeError):  # the window is gone
            self._state.emit(eid, state)

    def _launch(self, engine: Engine, spec: EngineSpec) -> None:
        become_subreaper()
        sup = Supervisor(
            spec,
            registry=self._registry,
            output_file=True,  # so that it can be left running
            detached=engine.keep,
            model_id=engine.model_id,
        )

        def on_state(s: Supervisor, state: State) -> None:
            if s is not engine.supervisor:
                return
            if state == State.READY:
                engine.ready_at = time.monotonic()
                if not self._measure(engine, s):
                    # health answered before the log file's follower read the buffer lines:
                    # read them once it has (a short thread; the monitor must not wait)
                    threading.Thread(
                        target=self._measure_late, args=(engine, s), daemon=True,
                        name=f"qmgui-memory-{engine.id}",
                    ).start()  # fmt: skip
            if state in (State.CRASHED, State.FAILED):
                outcome = s.outcome
                notify.error(str(outcome or f"{engine.name} {state.value}"), source=SOURCE)
            self._post(engine.id, state)

        engine.ready_at = None
        engine.memory = None
        engine.supervisor = sup
        engine.adopted = None  # a restarted adopted engine is this window's own now
        sup.subscribe(on_state)
        sup.start()

    @staticmethod
    def _measure(engine: Engine, sup: Supervisor) -> bool:
        """Planned against actual memory from the engine's log; False while its buffer lines
        are not in the log yet."""
        try:
            engine.memory = memory_of(sup.log.text(), engine.footprint)
        except Exception:  # a comparison is a nicety, never a failure
            engine.memory = Memory(None, None)
            return True
        for overrun in engine.memory.overruns:  # the plan was short: said once per start
            notify.warning(f"{engine.name}: {overrun}", source=SOURCE)
        return engine.memory.actual is not None

    def _measure_late(self, engine: Engine, sup: Supervisor) -> None:
        deadline = time.monotonic() + LATE_MEMORY_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if sup is not engine.supervisor or sup.state != State.READY:
                return
            if self._measure(engine, sup):
                self._post(engine.id, State.READY)
                return

    def _start(
        self, engine: Engine, outcome: PlanOutcome, resolver: Resolver, port: int | None = None
    ) -> None:
        try:
            engine.spec = spec_for(outcome, resolver, port)
            self._launch(engine, engine.spec)
        except Exception as e:  # a start that cannot happen is a message, not a crash
            engine.error = str(e) or type(e).__name__
            notify.error(f"{engine.name} could not start: {engine.error}", source=SOURCE)
        finally:
            engine.busy = False
            self._post(engine.id, engine.state)

    def _stop(self, engine: Engine, sup: Supervisor | Adopted) -> None:
        try:
            outcome = sup.stop(STOP_GRACE_S)
            notify.info(str(outcome), source=SOURCE)
        except Exception as e:
            notify.error(f"{engine.name} did not stop: {e}", source=SOURCE)
        finally:
            engine.busy = False
            self._post(engine.id, engine.state)

    def _restart(self, engine: Engine, old: Supervisor | Adopted | None) -> None:
        try:
            if old is not None and not old.state.final:
                old.stop(STOP_GRACE_S)
            if engine.replan is not None:
                engine.spec = engine.replan()
            assert engine.spec is not None
            engine.error = ""
            self._launch(engine, engine.spec)
        except Exception as e:
            engine.error = str(e) or type(e).__name__
            notify.error(f"{engine.name} could not restart: {engine.error}", source=SOURCE)
        finally:
            engine.busy = False
            self._post(engine.id, engine.state)

    # --- GUI thread ---------------------------------------------------------------------------
    def _on_state(self, eid: int, state: object) -> None:
        if eid in self.engines:
            self.changed.emit(eid)
