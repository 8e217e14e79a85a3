"""Several engines at once, for the window and the tray: the memory budget on every start,
live readings for the bars, favourites, pins and run sets.

`Fleet` is the one place that starts engines from a plan: the Start button, a favourite in the
tray and a run set all come here. Every start first asks `budgeting.start_decision` on a worker
thread (planning and the budget search never run on the GUI thread), then stops what it must
and starts, in the order asked. Favourites, pins and run sets live in the settings
(`Settings.favourites`, `.pinned`, `.run_sets`).

A role set (a run set with `roles`) is planned as a whole on a worker thread by
`service.role_sets.plan_role_set`, the code `qmgui place --role` runs, on the free memory of
the latest reading, each instance on a port of its own from the settings' range; then each
instance starts with its own argv (`EngineRunner.start_command`), its engine marked with the
set's name, and Stop stops those engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, QTimer, Signal

from qmgui import notify
from qmgui.core.discovery import ModelEntry
from qmgui.core.launch import LaunchSettings
from qmgui.core.roles import RoleError
from qmgui.core.units import MIB
from qmgui.engines.ports import port_is_free
from qmgui.service.launch import DEFAULT_PORT, Request, Resolver
from qmgui.service.role_sets import RoleSetOptions, RoleSetPlan, check_roles, plan_role_set
from qmgui.settings import ModelOverride, RunSet, Settings
from qmgui.ui.budgeting import StartDecision, start_decision
from qmgui.ui.engine_runner import Engine, EngineRunner
from qmgui.ui.hardware import Hardware
from qmgui.ui.occupancy import EngineLoad, LiveReading, free_for_plan, read_live
from qmgui.ui.planning import PlanOutcome, plan_model
from qmgui.ui.tray import Favourite
from qmgui.ui.workers import InOrder, LatestWins

SOURCE = "engines"
LIVE_INTERVAL_MS = 2000  # NVML and RAM figures for the bars: often enough to follow a load


@dataclass(frozen=True)
class _Start:
    outcome: PlanOutcome
    decision: StartDecision


@dataclass(frozen=True)
class _RoleStart:
    """A role set planned on the worker thread (or why it could not be)."""

    name: str
    plan: RoleSetPlan | None
    error: str = ""


def free_ports(settings: Settings, held: set[int], n: int) -> list[int]:
    """`n` ports of the settings' range that no model keeps as its own, no engine of this
    window holds and nothing listens on now (blocking: a worker thread's job); ValueError
    when the range has fewer free."""
    kept = {o.port for o in settings.model_overrides.values() if o.port is not None}
    out: list[int] = []
    for port in range(settings.ports.first, settings.ports.last + 1):
        if len(out) == n:
            break
        if port not in kept and port not in held and port_is_free(port):
            out.append(port)
    if len(out) < n:
        first, last = settings.ports.first, settings.ports.last
        raise ValueError(f"{n} engines need {n} free ports; {first}-{last} has {len(out)}")
    return out


class Fleet(QObject):
    """Starts, stops and groups engines; `liveChanged` when new readings arrive, `changed`
    when favourites, pins or run sets change."""

    liveChanged = Signal()
    changed = Signal()

    def __init__(
        self,
        runner: EngineRunner,
        *,
        resolver: Callable[[], Resolver],
        load: Callable[[], Settings],
        save: Callable[[Settings], None],
        entries: Callable[[], Sequence[ModelEntry]],
        hardware: Callable[[], Hardware],
        reserve_mib: Callable[[], int],
        initial_settings: Callable[[ModelEntry, ModelOverride | None], LaunchSettings],
        parent: QObject | None = None,
        live: bool = True,
    ) -> None:
        super().__init__(parent)
        self.runner = runner
        self._resolver, self._load, self._save = resolver, load, save
        self._entries, self._hardware, self._reserve = entries, hardware, reserve_mib
        self._initial = initial_settings
        self.live: LiveReading | None = None
        self.starter = InOrder("start", self)
        self.starter.finished.connect(self._on_start)
        self.starter.failed.connect(lambda e: notify.error(f"start failed: {e}", source=SOURCE))
        self.role_planner = InOrder("role-set", self)
        self.role_planner.finished.connect(self._on_role_plan)
        self.role_planner.failed.connect(
            lambda e: notify.error(f"role set not started: {e}", source=SOURCE)
        )
        self._planning_roles: set[str] = set()  # role sets on their way to a start
        self.reader = LatestWins("live", self)
        self.reader.finished.connect(self._on_live)
        self.timer = QTimer(self)
        self.timer.setInterval(LIVE_INTERVAL_MS)
        self.timer.timeout.connect(self.read_now)
        if live:
            self.timer.start()
            self.read_now()

    # --- live readings --------------------------------------------------------------------------
    def read_now(self) -> None:
        if not self.reader.busy:
            self.reader.submit(read_live)

    def _on_live(self, reading: object) -> None:
        if isinstance(reading, LiveReading):
            self.live = reading
            self.liveChanged.emit()

    def plan_hardware(self, hw: Hardware) -> Hardware:
        """This machine with the free memory of the latest reading; what-if as it is."""
        if hw.what_if:
            return hw
        return replace(hw, gpus=free_for_plan(hw.gpus, self.live))

    def loads(self) -> list[EngineLoad]:
        out = []
        for e in self.runner.running():
            handle = e.handle  # an adopted engine holds memory as much as a started one
            pid = handle.pid if handle is not None else None
            out.append(
                EngineLoad(
                    e.id,
                    e.name,
                    e.model_id,
                    e.footprint,
                    dict(e.memory.actual_by_device) if e.memory else {},
                    frozenset({pid}) if pid else frozenset(),
                    e.last_used,
                )
            )
        return out

    # --- starting -------------------------------------------------------------------------------
    def start(self, outcome: PlanOutcome) -> int | None:
        """Start `outcome`'s command, stopping least recently used engines first if the budget
        says so (decided on a worker thread). With no other engine running it starts at once
        and returns the engine's id; otherwise None (the id comes with `runner.added`)."""
        loads = self.loads()
        if not loads and not self.starter.busy:
            return self.runner.start(outcome, self._resolver())
        pinned = frozenset(self._load().pinned)
        live, reserve = self.live, self._reserve()
        self.starter.submit(
            lambda: _Start(
                outcome,
                start_decision(outcome, loads, pinned=pinned, live=live, reserve_mib=reserve),
            )
        )
        return None

    def start_models(self, model_ids: Sequence[str], *, why: str = "") -> None:
        """Plan each model with its stored settings, then start them in order (a favourite,
        a run set). Models not in the library are named in a message."""
        by_id = {e.id: e for e in self._entries()}
        missing = [m for m in model_ids if m not in by_id]
        if missing:
            notify.warning(
                f"{why or 'start'}: not in the library now: {', '.join(missing)}", source=SOURCE
            )
        wanted = [by_id[m] for m in model_ids if m in by_id]
        settings = self._load()
        hw, reserve, resolver = (
            self.plan_hardware(self._hardware()),
            self._reserve(),
            self._resolver(),
        )
        pinned = frozenset(settings.pinned) | {e.id for e in wanted}
        live = self.live
        running = self.loads()
        for entry in wanted:
            ls = self._initial(entry, settings.model_overrides.get(entry.id))

            def task(entry: ModelEntry = entry, ls: LaunchSettings = ls) -> _Start:
                outcome = plan_model(entry, ls, hw, reserve, resolver)
                decision = start_decision(
                    outcome, running, pinned=pinned, live=live, reserve_mib=reserve
                )
                fp = outcome.fit.footprint if outcome.fit is not None else None
                # the next model of the group is charged for this one (never stopped for it)
                running.append(EngineLoad(-len(running) - 1, entry.name, entry.id, fp, {}))
                return _Start(outcome, decision)

            self.starter.submit(task)

    def serve_router(self, model_ids: Sequence[str], *, why: str = "") -> int | None:
        """Serve the models through one endpoint (llama.cpp's router), each with the settings
        of its own launch (its saved profile); the router's engine id, None when none of
        them is in the library."""
        by_id = {e.id: e for e in self._entries()}
        missing = [m for m in model_ids if m not in by_id]
        if missing:
            notify.warning(
                f"{why or 'serve'}: not in the library now: {', '.join(missing)}", source=SOURCE
            )
        wanted = [by_id[m] for m in dict.fromkeys(model_ids) if m in by_id]
        if not wanted:
            return None
        hw = self.plan_hardware(self._hardware())
        req = Request(
            settings=LaunchSettings(),
            gpus=hw.gpus,
            reserve=self._reserve() * MIB,
            port=DEFAULT_PORT,
            extra=(),
        )
        notify.info(
            f"Serving {len(wanted)} model(s) through one endpoint: "
            + ", ".join(e.name for e in wanted),
            source=SOURCE,
        )
        return self.runner.start_router(wanted, self._resolver, req, host_bytes=hw.host_bytes)

    def serve_run_set(self, name: str) -> int | None:
        rs = next((r for r in self._load().run_sets if r.name == name), None)
        if rs is None:
            notify.warning(f"no run set called {name!r}", source=SOURCE)
            return None
        return self.serve_router(rs.model_ids, why=f"run set {name}")

    def _on_start(self, result: object) -> None:
        assert isinstance(result, _Start)
        o, d = result.outcome, result.decision
        if d.message:
            (notify.info if d.fits else notify.warning)(d.message, source=SOURCE)
        if not o.command.runnable:
            notify.error(
                f"{o.entry.name} cannot start: {'; '.join(o.command.warnings) or o.error}",
                source=SOURCE,
            )
            return
        self.runner.start(o, self._resolver(), stop_first=tuple(k for k in d.stop if k > 0))

    # --- favourites and pins ----------------------------------------------------------------------
    def favourites(self) -> list[Favourite]:
        names = {e.id: e.name for e in self._entries()}
        return [Favourite(m, names.get(m, m)) for m in self._load().favourites]

    def is_favourite(self, model_id: str) -> bool:
        return model_id in self._load().favourites

    def is_pinned(self, model_id: str) -> bool:
        return model_id in self._load().pinned

    def toggle_favourite(self, model_id: str) -> bool:
        """Add or remove a favourite; returns whether it is one now."""
        return self._toggle("favourites", model_id)

    def toggle_pinned(self, model_id: str) -> bool:
        return self._toggle("pinned", model_id)

    def _toggle(self, field: str, model_id: str) -> bool:
        s = self._load()
        ids: list[str] = list(getattr(s, field))
        now = model_id not in ids
        ids = [*ids, model_id] if now else [m for m in ids if m != model_id]
        self._save(s.model_copy(update={field: ids}))
        self.changed.emit()
        return now

    # --- run sets -------------------------------------------------------------------------------
    def run_sets(self) -> list[RunSet]:
        return list(self._load().run_sets)

    def running_model_ids(self) -> list[str]:
        seen: list[str] = []
        for e in self.runner.running():
            if e.model_id and e.model_id not in seen and not e.is_router:
                seen.append(e.model_id)
        return seen

    def save_run_set(
        self, name: str, model_ids: Sequence[str], roles: Sequence[str] = ()
    ) -> RunSet:
        """Save (or replace, by name) a run set; with `roles`, a role set (`save_role_set`)."""
        if roles:
            return self.save_role_set(name, roles)
        name = name.strip()
        if not name:
            raise ValueError("a run set needs a name")
        if not model_ids:
            raise ValueError("a run set needs at least one model")
        return self._put(RunSet(name=name, model_ids=list(dict.fromkeys(model_ids))))

    def save_role_set(self, name: str, roles: Sequence[str]) -> RunSet:
        """Save (or replace, by name) a role set: `ROLE=MODEL[:KEY=VALUE,...]` lines, checked
        here (ValueError naming the bad line and its bad part); blank lines are left out."""
        name = name.strip()
        if not name:
            raise ValueError("a role set needs a name")
        lines = [r.strip() for r in roles if r.strip()]
        try:
            specs = check_roles(lines)
        except RoleError as e:
            raise ValueError(str(e)) from None
        ids = list(dict.fromkeys(spec.model for spec in specs))
        return self._put(RunSet(name=name, model_ids=ids, roles=lines))

    def _put(self, new: RunSet) -> RunSet:
        name = new.name
        s = self._load()
        kept = [r for r in s.run_sets if r.name.casefold() != name.casefold()]
        self._save(s.model_copy(update={"run_sets": [*kept, new]}))
        self.changed.emit()
        return new

    def delete_run_set(self, name: str) -> RunSet | None:
        """Remove a run set; returns it, so that the caller can offer to undo."""
        s = self._load()
        gone = next((r for r in s.run_sets if r.name == name), None)
        if gone is None:
            return None
        self._save(s.model_copy(update={"run_sets": [r for r in s.run_sets if r.name != name]}))
        self.changed.emit()
        return gone

    def restore_run_set(self, run_set: RunSet) -> None:
        self._put(run_set)

    def start_run_set(self, name: str) -> None:
        rs = next((r for r in self._load().run_sets if r.name == name), None)
        if rs is None:
            notify.warning(f"no run set called {name!r}", source=SOURCE)
            return
        if rs.roles:
            self.start_role_set(rs)
            return
        already = set(self.running_model_ids())
        todo = [m for m in rs.model_ids if m not in already]
        if not todo:
            notify.info(f"run set {name}: every model is running already", source=SOURCE)
            return
        notify.info(f"Starting run set {name}: {len(todo)} model(s)", source=SOURCE)
        self.start_models(todo, why=f"run set {name}")

    def stop_run_set(self, name: str) -> int:
        """Stop every running engine of the set's models (a role set: the engines started
        for it); returns how many."""
        rs = next((r for r in self._load().run_sets if r.name == name), None)
        if rs is None:
            return 0
        ids = set(rs.model_ids)
        if rs.roles:
            engines = self.role_set_engines(name)
        else:
            engines = [e for e in self.runner.running() if e.model_id in ids and not e.group]
        for e in engines:
            self.runner.stop(e.id)
        notify.info(f"Stopping run set {name}: {len(engines)} engine(s)", source=SOURCE)
        return len(engines)

    # --- role sets ------------------------------------------------------------------------------
    @property
    def planning_role_sets(self) -> frozenset[str]:
        """The role sets being planned now (their engines not started yet)."""
        return frozenset(self._planning_roles)

    def role_set_engines(self, name: str) -> list[Engine]:
        """The running engines started for the role set `name`: marked with it, or named
        `NAME: INSTANCE` (one an earlier qmgui started, adopted at this window's start)."""
        prefix = f"{name}: "
        return [
            e
            for e in self.runner.running()
            if e.group == name or (not e.group and e.name.startswith(prefix))
        ]

    def is_running(self, rs: RunSet) -> bool:
        """Whether any engine of the set runs (a role set: any started for it)."""
        if rs.roles:
            return bool(self.role_set_engines(rs.name))
        running = set(self.running_model_ids())
        return any(m in running for m in rs.model_ids)

    def start_role_set(self, rs: RunSet) -> None:
        """Plan the role set on a worker thread (this machine's free memory, or the what-if
        cards chosen), then start each placed instance on its own port."""
        name = rs.name
        if name in self._planning_roles:
            notify.info(f"role set {name} is being started", source=SOURCE)
            return
        if self.role_set_engines(name):
            notify.info(f"role set {name} runs already (Stop it first)", source=SOURCE)
            return
        hw = self.plan_hardware(self._hardware())
        resolver = self._resolver()
        opts = RoleSetOptions(
            gpus=hw.gpus,
            reserve=self._reserve() * MIB,
            host_bytes=None if hw.gpus else hw.host_bytes,
            probe=resolver.probe,
            source=SOURCE,
        )
        loaded = resolver.loaded
        by_id = {e.id: e for e in self._entries()}
        settings = self._load()
        held = {p for e in self.runner.running() if (p := _port_of(e)) is not None}
        roles = list(rs.roles)

        def task() -> _RoleStart:
            try:
                chosen: list[int] = []

                def port(i: int) -> int:
                    while len(chosen) <= i:  # asked in order: one search for what is placed
                        chosen.extend(free_ports(settings, held | set(chosen), 1))
                    return chosen[i]

                plan = plan_role_set(roles, opts, port, find=by_id.get, loaded=loaded)
            except Exception as e:  # a plan that cannot be made is a message, not a crash
                return _RoleStart(name, None, str(e) or type(e).__name__)
            return _RoleStart(name, plan)

        self._planning_roles.add(name)
        notify.info(f"Planning role set {name}: {len(roles)} role(s)", source=SOURCE)
        self.role_planner.submit(task)

    def _on_role_plan(self, result: object) -> None:
        assert isinstance(result, _RoleStart)
        self._planning_roles.discard(result.name)
        plan = result.plan
        if plan is None:
            notify.error(f"role set {result.name} not started: {result.error}", source=SOURCE)
            return
        for warning in plan.warnings:
            notify.warning(f"role set {result.name}: {warning}", source=SOURCE)
        for u in plan.unplaced:
            notify.warning(f"role set {result.name}: {u.name} not placed: {u.reason}",
                           source=SOURCE)  # fmt: skip
        for inst in plan.instances:
            self.runner.start_command(
                f"{result.name}: {inst.name}",
                inst.entry,
                inst.command,
                port=inst.port,
                footprint=inst.footprint,
                group=result.name,
            )
        notify.info(
            f"Starting role set {result.name}: "
            + ", ".join(f"{i.name} on port {i.port}" for i in plan.instances),
            source=SOURCE,
        )
        self.changed.emit()

    def wait(self) -> None:
        self.timer.stop()
        self.role_planner.wait()
        self.starter.wait()
        self.reader.wait()


def _port_of(engine: Engine) -> int | None:
    handle = engine.handle
    port = getattr(handle, "port", None) if handle is not None else None
    if isinstance(port, int):
        return port
    return engine.spec.port if engine.spec is not None else None
