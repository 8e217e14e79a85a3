"""The model library as a table: a thin item model over a plain list of `ModelEntry`, a sort
and filter proxy, and the view with a filter box above it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import (
    QAbstractTableModel,
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLineEdit,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from qmgui.core.arch_names import architecture_tooltip, display_architecture
from qmgui.core.discovery import ModelEntry
from qmgui.core.units import format_bytes, natural_key
from qmgui.ui.planning import Badge, BadgeResult

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ENTRY_ROLE = Qt.ItemDataRole.UserRole + 2

_AnyIndex = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class Column:
    key: str  # stable: settings keep widths and the sort by key
    title: str
    width: int
    least: int = 0  # a narrow table shrinks the column down to this (text elided, tooltip)


COLUMNS: tuple[Column, ...] = (
    Column("name", "Name", 220),
    Column("class", "Class", 80, 44),
    Column("arch", "Arch", 84, 60),
    Column("quant", "Quant", 58, 50),
    Column("size", "Size", 70, 66),
    Column("context", "Context", 64, 60),
    Column("backend", "Backend", 96, 50),
    Column("fit", "Fit", 80, 62),
)
NAME_LEAST = 120  # the Name column (stretched) keeps at least this much of a narrow table
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
FIT_COLUMN = COLUMN_KEYS.index("fit")

# badge colours: readable on light and dark palettes alike
BADGE_COLOURS = {
    Badge.FITS: QColor(46, 160, 67),
    Badge.PARTIAL: QColor(210, 140, 20),
    Badge.NO_FIT: QColor(215, 58, 73),
}
BADGE_TEXT = {
    Badge.FITS: "● fits",
    Badge.PARTIAL: "◐ partial",
    Badge.NO_FIT: "✕ no fit",
    Badge.NOT_PLANNED: "—",
}


def _name(e: ModelEntry) -> str:
    name = e.name
    if len(e.shards) > 1 and "shards]" not in name:
        name += f" [{len(e.shards)} shards]"
    if e.mmproj and "mmproj]" not in name:
        name += " [+mmproj]"
    if e.source == "url":  # planned from its header over HTTP; not on disk
        name += " [remote]"
    return name


class ModelTableModel(QAbstractTableModel):
    """Rows are the entries of a plain list; the fit badges live beside it, keyed by id."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entries: list[ModelEntry] = []
        self._badges: dict[str, BadgeResult] = {}
        self._backends: dict[str, tuple[str, str]] = {}  # id -> (backend label, reason)
        self._sort_column = 0
        self._sort_order = Qt.SortOrder.AscendingOrder

    # --- the list -------------------------------------------------------------------------
    @property
    def entries(self) -> tuple[ModelEntry, ...]:
        return tuple(self._entries)

    def set_entries(self, entries: Sequence[ModelEntry]) -> None:
        self.beginResetModel()
        ids = {e.id for e in entries}
        self._entries = list(entries)
        self._badges = {k: v for k, v in self._badges.items() if k in ids}
        self._sort_entries()
        self.endResetModel()

    def set_badges(self, badges: dict[str, BadgeResult]) -> None:
        self._badges = dict(badges)
        if self._sort_column == FIT_COLUMN and self._entries:
            self._resort()
            return
        if self._entries:
            top = self.index(0, FIT_COLUMN)
            bottom = self.index(len(self._entries) - 1, FIT_COLUMN)
            self.dataChanged.emit(top, bottom)

    def set_backends(self, backends: dict[str, tuple[str, str]]) -> None:
        """Which backend would serve each model (label, and the reason as a tooltip)."""
        self._backends = dict(backends)
        if self._entries:
            column = COLUMN_KEYS.index("backend")
            self.dataChanged.emit(self.index(0, column), self.index(len(self._entries) - 1, column))

    def clear_badges(self) -> None:
        self.set_badges({})

    def badge(self, entry_id: str) -> BadgeResult | None:
        return self._badges.get(entry_id)

    def entry(self, row: int) -> ModelEntry:
        return self._entries[row]

    def row_of(self, entry_id: str) -> int | None:
        for i, e in enumerate(self._entries):
            if e.id == entry_id:
                return i
        return None

    # --- sorting: one Python sort of the list, not thousands of comparisons through Qt ------
    # (with a worker thread busy in Python, every call from Qt into Python waits for the GIL;
    # a proxy sorting 500 rows makes ~9,000 such calls and stalled the GUI for ~0.5 s)
    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self._sort_column, self._sort_order = column, order
        self._resort()

    def _resort(self) -> None:
        """Sort in place, keeping selections and other persistent indexes on their entries."""
        self.layoutAboutToBeChanged.emit()
        old = self.persistentIndexList()
        ids = [
            self._entries[i.row()].id if 0 <= i.row() < len(self._entries) else None for i in old
        ]
        self._sort_entries()
        rows = {e.id: r for r, e in enumerate(self._entries)}
        new = [
            self.index(rows[k], i.column()) if k in rows else QModelIndex()
            for k, i in zip(ids, old, strict=True)
        ]
        self.changePersistentIndexList(old, new)
        self.layoutChanged.emit()

    def _sort_entries(self) -> None:
        key = COLUMN_KEYS[self._sort_column]
        desc = self._sort_order == Qt.SortOrder.DescendingOrder
        self._entries.sort(
            key=lambda e: (self._sort_value(e, key), natural_key(e.name)), reverse=desc
        )

    # --- Qt's side ------------------------------------------------------------------------
    def rowCount(self, parent: _AnyIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._entries)

    def columnCount(self, parent: _AnyIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> object:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section].title
        return None

    def data(self, index: _AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        e = self._entries[index.row()]
        key = COLUMN_KEYS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(e, key)
        if role == SORT_ROLE:
            return self._sort_value(e, key)
        if role == ENTRY_ROLE:
            return e
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(e, key)
        if role == Qt.ItemDataRole.ForegroundRole:
            return self._foreground(e, key)
        if role == Qt.ItemDataRole.TextAlignmentRole and key in ("size", "context"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def _display(self, e: ModelEntry, key: str) -> str:
        m = e.meta
        if key == "name":
            return _name(e)
        if key == "class":
            return "broken" if e.error else (m.model_class.value if m else "")
        if key == "arch":
            return display_architecture(m) if m and not e.error else ""
        if key == "quant":
            return (m.quant or "") if m else ""
        if key == "size":
            return format_bytes(e.size_bytes)
        if key == "context":
            return f"{m.context_length:,}" if m and m.context_length else ""
        if key == "backend":
            choice = self._backends.get(e.id)
            return "" if e.error else ("…" if choice is None else choice[0])
        b = self._badges.get(e.id)
        return "…" if b is None else BADGE_TEXT[b.badge]

    def _sort_value(self, e: ModelEntry, key: str) -> object:
        if key == "size":
            return e.size_bytes
        if key == "context":
            return (e.meta.context_length or 0) if e.meta else 0
        if key == "fit":
            b = self._badges.get(e.id)
            order = [Badge.FITS, Badge.PARTIAL, Badge.NO_FIT, Badge.NOT_PLANNED]
            return order.index(b.badge) if b else len(order)
        return natural_key(self._display(e, key))

    def _tooltip(self, e: ModelEntry, key: str) -> str | None:
        if e.error:
            return f"{e.path}\n\n{e.error}"
        if key == "fit":
            b = self._badges.get(e.id)
            return b.detail if b else "sizing…"
        if key == "backend":
            choice = self._backends.get(e.id)
            return choice[1] if choice else None
        if key == "arch" and e.meta is not None:
            return architecture_tooltip(e.meta) or e.meta.architecture
        if key in ("class", "quant", "size", "context"):
            text = self._display(e, key)  # elided when the table is narrow: shown whole here
            return text or None
        parts = [e.path]
        if e.source == "url":
            parts.append("Not downloaded: planned from its header. Start downloads it.")
        if len(e.shards) > 1:
            parts.append(f"{len(e.shards)} shards")
        if e.mmproj:
            parts.append(f"projector: {e.mmproj}")
        if e.meta and e.meta.warnings:
            parts.extend(e.meta.warnings)
        return "\n".join(parts)

    def _foreground(self, e: ModelEntry, key: str) -> QBrush | None:
        if e.error:
            return QBrush(QPalette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
        if key == "fit":
            b = self._badges.get(e.id)
            colour = BADGE_COLOURS.get(b.badge) if b else None
            return QBrush(colour) if colour else None
        return None


class ModelFilterProxy(QSortFilterProxyModel):
    """Case-insensitive filter on every column. Sorting is handed to the source model, which
    sorts its list on the raw values (sizes as numbers) in one call."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.setFilterKeyColumn(-1)
        self.setSortRole(SORT_ROLE)
        self.setDynamicSortFilter(False)

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        source = self.sourceModel()
        if source is not None and column >= 0:
            source.sort(column, order)


class ModelTable(QWidget):
    """The filter box and the table. `selected(entry or None)` when the selection changes."""

    selected = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = ModelTableModel(self)
        self.proxy = ModelFilterProxy(self)
        self.proxy.setSourceModel(self.model)

        self.filter = QLineEdit(self)
        self.filter.setPlaceholderText("Filter models (Ctrl+F)")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self.proxy.setFilterFixedString)

        self.view = QTableView(self)
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        # several rows (Ctrl/Shift-click) for "Serve through one endpoint"; the current row
        # is the one the plan shows
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setAlternatingRowColors(True)
        self.view.setShowGrid(False)
        self.view.setWordWrap(False)
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.view.verticalHeader().hide()
        self.view.verticalHeader().setDefaultSectionSize(self.view.fontMetrics().height() + 10)
        header = self.view.horizontalHeader()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setHighlightSections(False)
        header.setTextElideMode(Qt.TextElideMode.ElideRight)  # "Cont…", never a cut-off word
        self._wanted = {i: c.width for i, c in enumerate(COLUMNS) if i != 0}  # before fitting
        self._fitting = False
        for i, c in enumerate(COLUMNS):
            self.view.setColumnWidth(i, c.width)
        header.sectionResized.connect(self._on_section_resized)
        self.view.viewport().installEventFilter(self)
        self.view.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.view.selectionModel().currentRowChanged.connect(self._on_current)
        self.proxy.modelReset.connect(lambda: self.selected.emit(self.current_entry()))

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(self.filter)
        layout.addWidget(self.view)
        self.setFocusProxy(self.view)

    def current_entry(self) -> ModelEntry | None:
        index = self.view.selectionModel().currentIndex()
        if not index.isValid():
            return None
        entry = index.data(ENTRY_ROLE)
        return entry if isinstance(entry, ModelEntry) else None

    def selected_entries(self) -> list[ModelEntry]:
        """The selected rows' models, in the table's order (the current one when none)."""
        rows = sorted(self.view.selectionModel().selectedRows(0), key=lambda i: i.row())
        found = [e for i in rows if isinstance(e := i.data(ENTRY_ROLE), ModelEntry)]
        current = self.current_entry()
        return found or ([current] if current is not None else [])

    def select_ids(self, entry_ids: list[str]) -> int:
        """Add the rows of `entry_ids` to the selection (as Ctrl-click does); how many."""
        n = 0
        sel = self.view.selectionModel()
        for entry_id in entry_ids:
            row = self.model.row_of(entry_id)
            index = self.proxy.mapFromSource(self.model.index(row, 0)) if row is not None else None
            if index is not None and index.isValid():
                sel.select(
                    index,
                    QItemSelectionModel.SelectionFlag.Select
                    | QItemSelectionModel.SelectionFlag.Rows,
                )
                n += 1
        return n

    def select_id(self, entry_id: str | None) -> bool:
        row = self.model.row_of(entry_id) if entry_id else None
        if row is None:
            return False
        index = self.proxy.mapFromSource(self.model.index(row, 0))
        if not index.isValid():
            return False
        self.view.selectRow(index.row())
        self.view.setCurrentIndex(index)
        self.view.scrollTo(index)
        return True

    def select_name(self, text: str) -> bool:
        """Select the first row whose name contains `text` (case-insensitive)."""
        needle = text.lower()
        for e in sorted(self.model.entries, key=lambda e: (needle != e.name.lower(), e.name)):
            if needle in e.name.lower():
                return self.select_id(e.id)
        return False

    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        entry = current.data(ENTRY_ROLE) if current.isValid() else None
        self.selected.emit(entry if isinstance(entry, ModelEntry) else None)

    # --- column widths: every column in view, down to a narrow window ----------------------
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.view.viewport() and event.type() == QEvent.Type.Resize:
            self.fit_columns()
        return super().eventFilter(watched, event)

    def _on_section_resized(self, index: int, _old: int, new: int) -> None:
        if index != 0 and not self._fitting:
            self._wanted[index] = new  # the user dragged it: the width to come back to

    def fit_columns(self) -> None:
        """Show the columns at their wanted widths where the table is wide enough; where it is
        not, shrink them (the widest slack first, down to each column's least width) so that
        Name keeps `NAME_LEAST` and the Fit column stays in view without scrolling."""
        room = self.view.viewport().width() - NAME_LEAST
        widths = dict(self._wanted)
        excess = sum(widths.values()) - room
        if excess > 0:
            slack = {i: max(w - COLUMNS[i].least, 0) for i, w in widths.items()}
            total = sum(slack.values())
            if total:
                take = min(excess, total)
                for i in widths:
                    widths[i] -= -(-slack[i] * take // total)  # round up: never short of room
        self._fitting = True
        try:
            for i, w in widths.items():
                if self.view.columnWidth(i) != w:
                    self.view.setColumnWidth(i, w)
        finally:
            self._fitting = False

    # --- remembered state, by column key -------------------------------------------------
    def column_widths(self) -> dict[str, int]:
        """The wanted widths (what the user set), not those a narrow window shrank."""
        return {COLUMNS[i].key: w for i, w in self._wanted.items()}

    def restore_column_widths(self, widths: dict[str, int]) -> None:
        for i, c in enumerate(COLUMNS):
            if i != 0 and widths.get(c.key, 0) > 20:
                self._wanted[i] = widths[c.key]
        self.fit_columns()

    def sort_state(self) -> tuple[str, str]:
        header = self.view.horizontalHeader()
        col = header.sortIndicatorSection()
        key = COLUMN_KEYS[col] if 0 <= col < len(COLUMNS) else "name"
        asc = header.sortIndicatorOrder() == Qt.SortOrder.AscendingOrder
        return key, "ascending" if asc else "descending"

    def restore_sort(self, key: str | None, order: str) -> None:
        col = COLUMN_KEYS.index(key) if key in COLUMN_KEYS else 0
        qt_order = (
            Qt.SortOrder.DescendingOrder if order == "descending" else (Qt.SortOrder.AscendingOrder)
        )
        self.view.sortByColumn(col, qt_order)
