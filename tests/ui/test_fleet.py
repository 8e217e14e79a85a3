"""Several engines from the window: shares on the bars, the budget's stop-first start, run sets
(save, start, stop, delete with undo) from the window's menu and the tray, favourites and pins."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QMenu, QWidget

from qmgui.core.footprint import CPU
from qmgui.engines.supervisor import State
from qmgui.settings import Settings
from qmgui.ui.budgeting import StartDecision
from qmgui.ui.engine_runner import Engine, EngineRunner
from qmgui.ui.fleet import Fleet, _Start
from qmgui.ui.hardware import Hardware
from qmgui.ui.main_window import MainWindow, initial_settings
from qmgui.ui.run_sets_menu import RunSetsMenu
from qmgui.ui.tray import EngineRow, Tray
from tests.ui.conftest import settle
from tests.ui.test_engines_panel import READY_MS, llama_on_path, one_model, ready_window

__all__ = ["llama_on_path", "one_model"]  # fixtures used by name


class _Store:
    def __init__(self) -> None:
        self.settings = Settings()

    def load(self) -> Settings:
        return self.settings

    def save(self, s: Settings) -> None:
        self.settings = s


_KEEP: list[QWidget] = []  # parents outlive the test's fleet (Qt deletes children with them)


def fleet_with(qtbot, running: dict[int, str]) -> tuple[Fleet, _Store]:  # type: ignore[no-untyped-def]
    """A fleet over a runner whose engines are placeholders (starting, no process)."""
    holder = QWidget()
    _KEEP.append(holder)
    qtbot.addWidget(holder)
    runner = EngineRunner(holder, registry=False)
    for eid, model_id in running.items():
        runner.engines[eid] = Engine(eid, f"name-{model_id}", None, None, model_id=model_id)
    store = _Store()
    fleet = Fleet(
        runner,
        resolver=lambda: None,  # type: ignore[arg-type, return-value]
        load=store.load,
        save=store.save,
        entries=lambda: (),
        hardware=lambda: Hardware("test", (), None),
        reserve_mib=lambda: 512,
        initial_settings=initial_settings,
        parent=holder,
        live=False,
    )
    return fleet, store


def sub_menu(menu: QMenu, name: str) -> QMenu:
    for a in menu.actions():
        sub = a.menu()
        if isinstance(sub, QMenu) and sub.objectName() == name:
            return sub
    raise AssertionError(f"no sub-menu {name} in {[a.text() for a in menu.actions()]}")


def test_run_set_save_delete_and_undo(qtbot) -> None:  # type: ignore[no-untyped-def]
    fleet, store = fleet_with(qtbot, {1: "model-a", 2: "model-b", 3: "model-a"})
    parent = QWidget()
    qtbot.addWidget(parent)
    menu = RunSetsMenu(fleet, parent, ask=lambda _p, _s: "Chat and embed")
    assert menu.save_action.isEnabled()
    saved = menu.save_running()
    assert saved is not None
    assert [(r.name, r.model_ids) for r in store.settings.run_sets] == [
        ("Chat and embed", ["model-a", "model-b"])
    ]
    sub = sub_menu(menu, "run-set:Chat and embed")
    assert "(2/2 running)" in sub.title()
    stop = next(a for a in sub.actions() if a.objectName() == "stop")
    assert stop.isEnabled()
    # saving under the same name (any case) replaces the set
    fleet.save_run_set("chat AND embed", ["model-b"])
    assert [r.model_ids for r in store.settings.run_sets] == [["model-b"]]
    menu.delete("chat AND embed")
    assert store.settings.run_sets == []
    undo = next(a for a in menu.actions() if a.objectName() == "undo-delete")
    undo.trigger()
    assert [r.name for r in store.settings.run_sets] == ["chat AND embed"]
    assert not any(a.objectName() == "undo-delete" for a in menu.actions())


def test_saving_needs_running_models(qtbot) -> None:  # type: ignore[no-untyped-def]
    fleet, store = fleet_with(qtbot, {})
    parent = QWidget()
    qtbot.addWidget(parent)
    menu = RunSetsMenu(fleet, parent, ask=lambda _p, _s: "x")
    assert not menu.save_action.isEnabled()
    assert menu.save_running() is None
    assert store.settings.run_sets == []
    with pytest.raises(ValueError, match="name"):
        fleet.save_run_set("  ", ["m"])


def test_favourites_and_pins_are_settings(qtbot) -> None:  # type: ignore[no-untyped-def]
    fleet, store = fleet_with(qtbot, {})
    assert fleet.toggle_favourite("m1") is True
    assert fleet.toggle_pinned("m2") is True
    assert store.settings.favourites == ["m1"] and store.settings.pinned == ["m2"]
    assert [f.model_id for f in fleet.favourites()] == ["m1"]
    assert fleet.toggle_favourite("m1") is False
    assert store.settings.favourites == []


class _NoEngines(QWidget):
    from PySide6.QtCore import Signal

    enginesChanged = Signal()

    def engines(self) -> list[EngineRow]:
        return []

    def stop_engine(self, key: str) -> None: ...

    def start_engine(self, key: str) -> None: ...


def test_tray_offers_run_sets(qtbot) -> None:  # type: ignore[no-untyped-def]
    window = QWidget()
    qtbot.addWidget(window)
    source = _NoEngines()
    store = _Store()
    tray = Tray(window, source, load=store.load, save=store.save, tray_available=False)
    tray.set_run_sets([("Chat", True), ("Images", False)])
    sets = sub_menu(tray.menu, "run-sets")
    names = [a.objectName() for a in sets.actions()]
    assert names == ["run-set-start:Chat", "run-set-stop:Chat", "run-set-start:Images"]
    got: list[tuple[str, bool]] = []
    tray.runSetRequested.connect(lambda n, start: got.append((n, start)))
    next(a for a in sets.actions() if a.objectName() == "run-set-stop:Chat").trigger()
    next(a for a in sets.actions() if a.objectName() == "run-set-start:Images").trigger()
    assert got == [("Chat", False), ("Images", True)]


def test_engines_share_the_bars_and_a_start_stops_what_the_budget_says(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    """With the real llama-server: the RAM bar shows the running engine's share (measured from
    its log), a start with a stop-first decision stops that engine before the new one starts,
    and a run set saved from the running engine stops and starts again as a set."""
    w: MainWindow = ready_window(qtbot, make_window, one_model)
    runner = w.engine_runner
    try:
        first = w.start_engine()
        assert first is not None
        qtbot.waitUntil(lambda: runner.engines[first].state == State.READY, timeout=READY_MS)
        # measured once the log's follower has read the buffer lines: the health check can
        # answer first (the runner then measures again from a short thread)
        qtbot.waitUntil(lambda: _measured(runner.engines[first]), timeout=5_000)
        w._refresh_bars()
        ram = w.memory.bars[-1].spec
        assert ram is not None and ram.engines, "the RAM bar shows the running engine"
        share = ram.engines[0]
        assert share.planned > 0 and share.measured is not None
        assert share.measured == runner.engines[first].memory.actual_by_device[CPU]  # type: ignore[union-attr]

        assert w.outcome is not None
        w.fleet._on_start(_Start(w.outcome, StartDecision((first,), True, "Stopping it")))
        qtbot.waitUntil(lambda: runner.engines[first].state == State.STOPPED, timeout=30_000)
        second = max(runner.engines)
        qtbot.waitUntil(lambda: runner.engines[second].state == State.READY, timeout=READY_MS)

        w.fleet.save_run_set("Solo", w.fleet.running_model_ids())
        assert w.fleet.stop_run_set("Solo") == 1
        qtbot.waitUntil(lambda: not runner.running(), timeout=30_000)
        w.fleet.start_run_set("Solo")
        qtbot.waitUntil(lambda: len(runner.engines) == 3, timeout=10_000)
        third = max(runner.engines)
        qtbot.waitUntil(lambda: runner.engines[third].state == State.READY, timeout=READY_MS)
        assert runner.engines[third].model_id == runner.engines[first].model_id
        settle(qtbot, w)
    finally:
        runner.stop_all()
        runner.wait()


def test_model_actions_toggle_the_current_model(qtbot) -> None:  # type: ignore[no-untyped-def]
    from qmgui.core.discovery import ModelEntry
    from qmgui.ui.run_sets_menu import ModelActions

    fleet, store = fleet_with(qtbot, {})
    parent = QWidget()
    qtbot.addWidget(parent)
    current: list[ModelEntry | None] = [None]
    actions = ModelActions(fleet, lambda: current[0], parent)
    actions.sync()
    assert not actions.favourite.isEnabled()
    current[0] = ModelEntry("/m/a.gguf", "/m/a.gguf", "a", "gguf", "folder", 1)
    actions.sync()
    assert actions.favourite.isEnabled() and not actions.favourite.isChecked()
    actions.favourite.trigger()
    actions.pin.trigger()
    assert store.settings.favourites == ["/m/a.gguf"]
    assert store.settings.pinned == ["/m/a.gguf"]
    assert actions.favourite.isChecked() and actions.pin.isChecked()
    actions.pin.trigger()
    assert store.settings.pinned == []


def test_an_adopted_engine_counts_in_the_budget(qtbot) -> None:  # type: ignore[no-untyped-def]
    """An engine an earlier qmgui left running holds its memory like one started here: the
    budget sees its process (a stop-first start must know what it would stop)."""

    class _Log:
        last_line_at = None

    class _Survivor:  # what an Adopted watcher shows the fleet
        pid = 4242
        state = State.READY
        log = _Log()

    fleet, _ = fleet_with(qtbot, {1: "model-a"})
    fleet.runner.engines[1].adopted = _Survivor()  # type: ignore[assignment]
    (load,) = fleet.loads()
    assert load.model_id == "model-a"
    assert load.pids == frozenset({4242})


def _measured(engine: Engine) -> bool:
    """The engine's memory read from its log (not only the plan's figures)."""
    return engine.memory is not None and engine.memory.actual is not None
