"""The window's "Run sets" menu: save the running models as a named set, save a role set (a
name and `ROLE=MODEL[:KEY=VALUE,...]` rows, `ui.role_set_dialog`, prefilled from the selected
models), start or stop a set, delete one (with undo), and the per-model actions that feed the
budget and the tray (pin, favourite)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QInputDialog, QMenu, QWidget

from qmgui import notify
from qmgui.core.discovery import ModelEntry
from qmgui.settings import RunSet
from qmgui.ui.fleet import Fleet
from qmgui.ui.role_set_dialog import AskRoles, ask_roles, check_lines, suggested_roles

SOURCE = "engines"
AskName = Callable[[QWidget, str], str | None]
Selected = Callable[[], Sequence[ModelEntry]]


def ask_name(parent: QWidget, suggestion: str) -> str | None:
    text, ok = QInputDialog.getText(
        parent, "Save run set", "Name of the run set (the running models, started together):",
        text=suggestion,
    )  # fmt: skip
    return text.strip() if ok and text.strip() else None


class RunSetsMenu(QMenu):
    """Rebuilt from the fleet each time it opens, so it always shows the saved sets."""

    def __init__(
        self,
        fleet: Fleet,
        parent: QWidget,
        *,
        ask: AskName = ask_name,
        ask_roles: AskRoles = ask_roles,
        selected: Selected | None = None,
    ) -> None:
        super().__init__("Run sets", parent)
        self.setObjectName("run-sets-menu")
        self.fleet = fleet
        self._ask = ask
        self.ask_roles = ask_roles
        # the models selected in the window (its table's, when it has one): a role set's rows
        self._selected = selected or _table_selection(parent)
        self._parent = parent
        self._undo: RunSet | None = None
        # owned by the window, not the menu: clear() deletes the actions a menu owns
        self.save_action = QAction("Save running models as a run set…", parent)
        self.save_action.setShortcut(QKeySequence("Ctrl+Shift+S"))
        self.save_action.triggered.connect(self.save_running)
        self.save_roles_action = QAction("Save role set…", parent)
        self.save_roles_action.setObjectName("save-role-set")
        self.save_roles_action.setToolTip(
            "Chat, embed, rerank and vision engines planned together (qmgui place --role)"
        )
        self.save_roles_action.triggered.connect(lambda _=False: self.save_role_set())
        self.aboutToShow.connect(self.rebuild)
        self.rebuild()

    def rebuild(self) -> None:
        for action in self.actions():
            sub = action.menu()
            if isinstance(sub, QMenu):
                sub.deleteLater()
        self.clear()
        self.addAction(self.save_action)
        self.addAction(self.save_roles_action)
        self.save_action.setEnabled(bool(self.fleet.running_model_ids()))
        if self._undo is not None:
            undo = self.addAction(f"Undo deleting {self._undo.name}")
            undo.setObjectName("undo-delete")
            undo.triggered.connect(self.undo_delete)
        sets = self.fleet.run_sets()
        if sets:
            self.addSeparator()
        running = set(self.fleet.running_model_ids())
        for rs in sets:
            if rs.roles:
                self.addMenu(self._role_set_menu(rs))
                continue
            n_running = sum(m in running for m in rs.model_ids)
            sub = QMenu(f"{rs.name} ({n_running}/{len(rs.model_ids)} running)", self)
            sub.setObjectName(f"run-set:{rs.name}")
            start = sub.addAction("Start")
            start.setObjectName("start")
            start.setEnabled(n_running < len(rs.model_ids))
            start.triggered.connect(lambda _=False, n=rs.name: self.fleet.start_run_set(n))
            stop = sub.addAction("Stop")
            stop.setObjectName("stop")
            stop.setEnabled(n_running > 0)
            stop.triggered.connect(lambda _=False, n=rs.name: self.fleet.stop_run_set(n))
            serve = sub.addAction("Serve through one endpoint")
            serve.setObjectName("serve-router")
            serve.setToolTip("One address for the set: llama.cpp's router loads each on demand")
            serve.triggered.connect(lambda _=False, n=rs.name: self.fleet.serve_run_set(n))
            sub.addSeparator()
            delete = sub.addAction("Delete")
            delete.setObjectName("delete")
            delete.triggered.connect(lambda _=False, n=rs.name: self.delete(n))
            self.addMenu(sub)

    def _role_set_menu(self, rs: RunSet) -> QMenu:
        engines = self.fleet.role_set_engines(rs.name)
        planning = rs.name in self.fleet.planning_role_sets
        n = len(rs.roles)
        state = "starting" if planning else f"{len(engines)} engine(s) running"
        sub = QMenu(f"{rs.name} (role set of {n} role{'s' if n != 1 else ''}, {state})", self)
        sub.setObjectName(f"run-set:{rs.name}")
        sub.setToolTipsVisible(True)
        start = sub.addAction("Start")
        start.setObjectName("start")
        start.setToolTip("Plan the roles together on this machine, then start each engine")
        start.setEnabled(not engines and not planning)
        start.triggered.connect(lambda _=False, n=rs.name: self.fleet.start_run_set(n))
        stop = sub.addAction("Stop")
        stop.setObjectName("stop")
        stop.setEnabled(bool(engines))
        stop.triggered.connect(lambda _=False, n=rs.name: self.fleet.stop_run_set(n))
        edit = sub.addAction("Edit…")
        edit.setObjectName("edit")
        edit.triggered.connect(lambda _=False, r=rs: self.save_role_set(r.name, list(r.roles)))
        sub.addSeparator()
        for line in rs.roles:
            shown = sub.addAction(line)
            shown.setEnabled(False)
        sub.addSeparator()
        delete = sub.addAction("Delete")
        delete.setObjectName("delete")
        delete.triggered.connect(lambda _=False, n=rs.name: self.delete(n))
        return sub

    def save_role_set(self, name: str = "", roles: list[str] | None = None) -> RunSet | None:
        """Ask for a name and role rows (prefilled from the selected models), then save."""
        if roles is None:
            roles = suggested_roles(self._selected()) or ["chat="]
        name = name or f"Roles {len(self.fleet.run_sets()) + 1}"
        answer = self.ask_roles(self._parent, name, roles, check_lines)
        if answer is None:
            return None
        try:
            rs = self.fleet.save_role_set(*answer)
        except ValueError as e:
            notify.error(f"role set not saved: {e}", source=SOURCE)
            return None
        notify.info(f"Saved role set {rs.name}: {len(rs.roles)} role(s)", source=SOURCE)
        self.rebuild()
        return rs

    def save_running(self) -> RunSet | None:
        ids = self.fleet.running_model_ids()
        if not ids:
            notify.info("Start the models of the set first, then save them", source=SOURCE)
            return None
        name = self._ask(self._parent, f"Set {len(self.fleet.run_sets()) + 1}")
        if name is None:
            return None
        rs = self.fleet.save_run_set(name, ids)
        notify.info(f"Saved run set {rs.name}: {len(rs.model_ids)} model(s)", source=SOURCE)
        self.rebuild()
        return rs

    def delete(self, name: str) -> None:
        gone = self.fleet.delete_run_set(name)
        if gone is not None:
            self._undo = gone
            notify.info(f"Deleted run set {name} (Run sets → Undo brings it back)", source=SOURCE)
        self.rebuild()

    def undo_delete(self) -> None:
        if self._undo is not None:
            self.fleet.restore_run_set(self._undo)
            notify.info(f"Run set {self._undo.name} is back", source=SOURCE)
            self._undo = None
        self.rebuild()


def _table_selection(parent: QWidget) -> Selected:
    """The selected models of `parent`'s model table (none when it has no table)."""

    def selected() -> Sequence[ModelEntry]:
        table = getattr(parent, "table", None)
        pick = getattr(table, "selected_entries", None)
        found = pick() if callable(pick) else []
        return [e for e in found if isinstance(e, ModelEntry)]

    return selected


class ModelActions:
    """Pin and favourite for the selected model, as checkable actions (table context menu and
    shortcuts)."""

    def __init__(self, fleet: Fleet, current: Callable[[], ModelEntry | None], parent: QWidget):
        self.fleet = fleet
        self._current = current
        self.favourite = QAction("Favourite (start from the tray)", parent)
        self.favourite.setCheckable(True)
        self.favourite.setShortcut(QKeySequence("Ctrl+D"))
        self.favourite.triggered.connect(self._toggle_favourite)
        self.pin = QAction("Pin (never stopped to make room)", parent)
        self.pin.setCheckable(True)
        self.pin.setShortcut(QKeySequence("Ctrl+Shift+P"))
        self.pin.triggered.connect(self._toggle_pin)

    def sync(self) -> None:
        entry = self._current()
        for action in (self.favourite, self.pin):
            action.setEnabled(entry is not None)
        self.favourite.setChecked(entry is not None and self.fleet.is_favourite(entry.id))
        self.pin.setChecked(entry is not None and self.fleet.is_pinned(entry.id))

    def _toggle_favourite(self) -> None:
        self._toggle(
            self.fleet.toggle_favourite,
            "is a favourite now: the tray can start it",
            "is no longer a favourite",
        )

    def _toggle_pin(self) -> None:
        self._toggle(
            self.fleet.toggle_pinned,
            "is pinned: qmgui never stops it to make room",
            "is no longer pinned",
        )

    def _toggle(self, toggle: Callable[[str], bool], on: str, off: str) -> None:
        entry = self._current()
        if entry is None:
            return
        now = toggle(entry.id)
        notify.info(f"{entry.name} {on if now else off}", source=SOURCE)
        self.sync()
