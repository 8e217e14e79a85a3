"""Role sets in the window and the tray (the real llama-server on the CPU): Run sets → Save role
set… prefilled from the selected models, a bad row said inline, Start planning on a worker
thread through `service.role_sets` (the code `qmgui place --role` runs) and starting each
instance on its own port with its role's flags, Stop ending every engine it started; the tray
lists the role set and starts and stops it; Delete with undo."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from PySide6.QtWidgets import QMenu, QWidget

from qmgui.core.discovery import entry_for_path
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import State
from qmgui.settings import RunSet
from qmgui.ui.engine_runner import Engine
from qmgui.ui.main_window import MainWindow
from qmgui.ui.role_set_dialog import Check, RoleSetDialog, check_lines, suggested_roles
from qmgui.ui.run_sets_menu import RunSetsMenu
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle
from tests.ui.test_fleet import fleet_with, sub_menu

LLAMA_SERVER = find_llama_server()
READY_MS = 60_000
STOP_MS = 30_000


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    if LLAMA_SERVER is None:
        pytest.skip("llama-server not found")
    d = tmp_path / "stack"
    write_gguf(d / "tiny-chat.gguf", PRESETS["llama"])
    write_gguf(d / "tiny-embed.gguf", PRESETS["qwen3-embed"])  # causal: pooling last
    return d


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def action(menu: QMenu, name: str):  # type: ignore[no-untyped-def]
    found = next((a for a in menu.actions() if a.objectName() == name), None)
    assert found is not None, (name, [a.objectName() for a in menu.actions()])
    return found


def pids_of(engines: list[Engine]) -> list[int]:
    pids: list[int] = []
    for e in engines:
        pid = e.supervisor.pid if e.supervisor is not None else None
        if pid is not None:
            pids += [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    return pids


def test_the_dialog_says_a_bad_row_inline_and_stays_open(qtbot) -> None:  # type: ignore[no-untyped-def]
    dialog = RoleSetDialog(None, name="Stack", roles=["chat=a.gguf", "talk=b.gguf"])
    qtbot.addWidget(dialog)
    dialog.accept()
    assert dialog.result() != dialog.DialogCode.Accepted
    assert not dialog.message.isHidden()
    assert (
        "'talk=b.gguf'" in dialog.message.text() and "unknown role 'talk'" in dialog.message.text()
    )
    dialog.roles_edit.setPlainText("chat=a.gguf:ctx=oops")
    dialog.accept()
    assert "ctx=oops: not a whole number" in dialog.message.text()
    dialog.roles_edit.setPlainText("chat=a.gguf:ctx=4096\n\nembed=b.gguf")
    dialog.accept()
    assert dialog.result() == dialog.DialogCode.Accepted and dialog.message.isHidden()
    assert dialog.roles == ["chat=a.gguf:ctx=4096", "embed=b.gguf"]
    assert check_lines(" ", ["chat=a.gguf"]) == "Give the role set a name."


def test_saving_checks_the_rows_and_delete_has_undo(qtbot) -> None:  # type: ignore[no-untyped-def]
    fleet, store = fleet_with(qtbot, {})
    with pytest.raises(ValueError, match="unknown role 'talk'"):
        fleet.save_role_set("Bad", ["talk=x.gguf"])
    with pytest.raises(ValueError, match="at least one role"):
        fleet.save_role_set("Empty", ["  "])
    assert store.settings.run_sets == []
    parent = QWidget()
    qtbot.addWidget(parent)
    asked: list[tuple[str, list[str]]] = []

    def ask(_p: QWidget, name: str, roles: list[str], check: Check) -> tuple[str, list[str]]:
        asked.append((name, roles))
        assert check(name, ["chat=m.gguf:ctx=x"]) is not None  # the dialog's inline check
        return "Stack", ["chat=m.gguf:ctx=4096", "embed=e.gguf", "chat=m.gguf:name=second"]

    menu = RunSetsMenu(fleet, parent, ask_roles=ask, selected=lambda: [])
    saved = menu.save_role_set()
    assert asked == [("Roles 1", ["chat="])]  # nothing selected: a row to fill in
    assert saved == RunSet(
        name="Stack",
        model_ids=["m.gguf", "e.gguf"],
        roles=["chat=m.gguf:ctx=4096", "embed=e.gguf", "chat=m.gguf:name=second"],
    )
    sub = sub_menu(menu, "run-set:Stack")
    assert "role set of 3 roles, 0 engine(s) running" in sub.title()
    assert action(sub, "start").isEnabled() and not action(sub, "stop").isEnabled()
    assert not any(a.objectName() == "serve-router" for a in sub.actions())
    action(sub, "delete").trigger()
    assert store.settings.run_sets == []
    action(menu, "undo-delete").trigger()
    assert store.settings.run_sets == [saved]


def test_engines_an_earlier_qmgui_started_for_a_role_set_count_as_its_own(qtbot) -> None:  # type: ignore[no-untyped-def]
    """Adopted at the window's start, an engine has no group, only its name `SET: INSTANCE`:
    the set shows it running and Stop stops it; a plain run set leaves it alone."""
    fleet, _ = fleet_with(qtbot, {1: "m.gguf", 2: "m.gguf"})
    fleet.runner.engines[1].name = "Stack: chat"
    stack = fleet.save_role_set("Stack", ["chat=m.gguf"])
    plain = fleet.save_run_set("Plain", ["m.gguf"])
    assert [e.id for e in fleet.role_set_engines("Stack")] == [1]
    assert fleet.is_running(stack) and fleet.is_running(plain)
    stopped: list[int] = []
    fleet.runner.stop = stopped.append  # type: ignore[method-assign]
    assert fleet.stop_run_set("Stack") == 1 and stopped == [1]


def test_a_role_set_saved_started_and_stopped_from_the_window_and_the_tray(  # type: ignore[no-untyped-def]
    qtbot, make_window, stack: Path
) -> None:
    w: MainWindow = make_window([str(stack)], tray=True)
    settle(qtbot, w)
    chat_id, embed_id = (entry_for_path(str(stack / f"{n}.gguf")).id for n in
                         ("tiny-chat", "tiny-embed"))  # fmt: skip
    assert w.table.select_id(chat_id) and w.table.select_ids([embed_id]) == 1
    assert suggested_roles(w.table.selected_entries()) == [f"chat={chat_id}", f"embed={embed_id}"]
    menu = w.run_sets_menu
    asked: list[list[str]] = []

    def ask(_p: QWidget, _name: str, roles: list[str], _check: Check) -> tuple[str, list[str]]:
        asked.append(roles)  # what the dialog opens with: the selected models' rows
        return "Stack", [f"chat={chat_id}:ctx=2048,slots=1", f"embed={embed_id}"]

    menu.ask_roles = ask
    menu.rebuild()
    action(menu, "save-role-set").trigger()
    assert asked == [[f"chat={chat_id}", f"embed={embed_id}"]]
    (saved,) = w.settings.run_sets
    assert saved.roles == [f"chat={chat_id}:ctx=2048,slots=1", f"embed={embed_id}"]

    runner = w.engine_runner
    tray = w.tray
    assert tray is not None

    def engines() -> list[Engine]:
        return w.fleet.role_set_engines("Stack")

    def all_ready() -> bool:  # the latest start's two engines ready, or one ended
        now = [e for e in runner.engines.values() if e.group == "Stack"][-2:]
        if any(e.state.final for e in now):
            raise AssertionError([(e.name, e.error, e.state) for e in now])
        return len(now) == 2 and all(e.state == State.READY for e in now)

    try:
        menu.rebuild()
        action(sub_menu(menu, "run-set:Stack"), "start").trigger()
        assert "Stack" in w.fleet.planning_role_sets  # planned on a worker, not here
        qtbot.waitUntil(all_ready, timeout=READY_MS)
        by_role = {e.name: e for e in engines()}
        assert set(by_role) == {"Stack: embed", "Stack: chat"}
        for e in by_role.values():
            assert e.state == State.READY, (e.name, e.error, e.supervisor and e.supervisor.outcome)
        embed, chat = by_role["Stack: embed"], by_role["Stack: chat"]
        e_argv, c_argv = embed.supervisor.argv, chat.supervisor.argv  # type: ignore[union-attr]
        assert e_argv is not None and c_argv is not None
        assert "--embedding" in e_argv and flag(e_argv, "--pooling") == "last"
        assert flag(e_argv, "-fa") == "off" and flag(e_argv, "-b") == flag(e_argv, "-c")
        assert "--embedding" not in c_argv and flag(c_argv, "-c") == "2048"
        ports = {int(flag(e_argv, "--port")), int(flag(c_argv, "--port"))}
        assert len(ports) == 2 and ports == {embed.supervisor.port, chat.supervisor.port}  # type: ignore[union-attr]
        assert (embed.model_id, chat.model_id) == (embed_id, chat_id)
        menu.rebuild()
        sub = sub_menu(menu, "run-set:Stack")
        assert "2 engine(s) running" in sub.title() and not action(sub, "start").isEnabled()

        # the tray lists the set as running: Stop from there ends both engines
        w._update_tray_lists()
        sets = sub_menu(tray.menu, "run-sets")
        pids = pids_of(engines())
        action(sets, "run-set-stop:Stack").trigger()
        qtbot.waitUntil(lambda: not engines(), timeout=STOP_MS)
        runner.wait()
        qtbot.waitUntil(lambda: not any(psutil.pid_exists(p) for p in pids), timeout=STOP_MS)

        # ... and starts it again
        w._update_tray_lists()
        sets = sub_menu(tray.menu, "run-sets")
        assert not any(a.objectName() == "run-set-stop:Stack" for a in sets.actions())
        action(sets, "run-set-start:Stack").trigger()
        qtbot.waitUntil(all_ready, timeout=READY_MS)
        assert all(e.state == State.READY for e in engines())
        pids = pids_of(engines())
        menu.rebuild()
        action(sub_menu(menu, "run-set:Stack"), "stop").trigger()
        qtbot.waitUntil(lambda: not engines(), timeout=STOP_MS)
        runner.wait()
        qtbot.waitUntil(lambda: not any(psutil.pid_exists(p) for p in pids), timeout=STOP_MS)
        assert not runner.running()
    finally:
        runner.stop_all()
        runner.wait()
