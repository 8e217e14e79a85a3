"""The main window: a composition root. It builds the small widgets, owns the workers and the
settings, and wires them together in `_connect_signals()`; each widget only shows what it is
given and says what the user did.

The window keeps its own copy of the settings, but the file is shared with the CLI, scripts
and other windows: a change made here is saved as what changed (`save_changes`: merged into
the file as it is now, under the settings lock), and a change another process made is read
back (`SettingsWatch`) and shown: roots rescanned, the registry's plans and badges redone,
favourites, pins and run sets refreshed."""

from __future__ import annotations

import base64
import contextlib
import gc
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from qmgui import notify
from qmgui.ui.first_paint import BuildAfterPaint, FirstPaint, window_modules_deferred
from qmgui.ui.icons import app_icon

if TYPE_CHECKING:  # imported by load_window_modules(): after the first paint, or before
    # a window is built where nothing is painted first (tests, screenshots, --minimized)
    from qmgui.core.backends import resolve_backend
    from qmgui.core.bench import measured_words
    from qmgui.core.build_rules import rules_for
    from qmgui.core.discovery import ModelEntry, ScanResult
    from qmgui.core.fit import FitResult
    from qmgui.core.launch import LaunchSettings
    from qmgui.core.units import MIB, format_bytes
    from qmgui.core.vllm import VllmPlan
    from qmgui.engines.model_ports import choose_port, stored_port, with_port
    from qmgui.roots import plan_add
    from qmgui.service.launch import Resolver, default_executable, kind_for
    from qmgui.settings import (
        LoadResult,
        ModelOverride,
        Settings,
        load_settings,
        save_changes,
        settings_path,
    )
    from qmgui.stores import common_model_folders, default_store_roots
    from qmgui.ui import hardware
    from qmgui.ui.drop import DropFilter
    from qmgui.ui.empty_state import EmptyState
    from qmgui.ui.engine_runner import EngineRunner
    from qmgui.ui.engines_panel import EnginesPanel
    from qmgui.ui.fleet import Fleet
    from qmgui.ui.model_table import ModelTable
    from qmgui.ui.plan_panel import PlanPanel
    from qmgui.ui.planning import (
        BadgeResult,
        PlanOutcome,
        fit_badge,
        fit_context,
        for_variant,
        plan_model,
    )
    from qmgui.ui.preview_pane import PreviewPane
    from qmgui.ui.profile_actions import WINDOW_FIELDS, Profiles, window_settings
    from qmgui.ui.remote_models import RemoteModels, is_remote
    from qmgui.ui.run_sets_menu import ModelActions, RunSetsMenu
    from qmgui.ui.settings_watch import SettingsWatch
    from qmgui.ui.tray import CloseDecision, QuitChoice, RunnerEngines, Tray
    from qmgui.ui.vram_bar import MemoryPanel, bars_for
    from qmgui.ui.workers import Breather, LatestWins, ScanRunner

# the window's modules beyond Qt, by module: the names this module uses from each
_WINDOW_MODULES: dict[str, tuple[str, ...]] = {
    "qmgui.core.backends": ("resolve_backend",),
    "qmgui.core.bench": ("measured_words",),
    "qmgui.core.build_rules": ("rules_for",),
    "qmgui.core.discovery": (
        "ModelEntry",
        "ScanResult",
    ),
    "qmgui.core.fit": ("FitResult",),
    "qmgui.core.launch": ("LaunchSettings",),
    "qmgui.core.units": (
        "MIB",
        "format_bytes",
    ),
    "qmgui.core.vllm": ("VllmPlan",),
    "qmgui.engines.model_ports": (
        "choose_port",
        "stored_port",
        "with_port",
    ),
    "qmgui.roots": ("plan_add",),
    "qmgui.service.launch": (
        "Resolver",
        "default_executable",
        "kind_for",
    ),
    "qmgui.settings": (
        "LoadResult",
        "ModelOverride",
        "Settings",
        "load_settings",
        "save_changes",
        "settings_path",
    ),
    "qmgui.stores": (
        "common_model_folders",
        "default_store_roots",
    ),
    "qmgui.ui.hardware": (),  # the module itself
    "qmgui.ui.drop": ("DropFilter",),
    "qmgui.ui.empty_state": ("EmptyState",),
    "qmgui.ui.engine_runner": ("EngineRunner",),
    "qmgui.ui.engines_panel": ("EnginesPanel",),
    "qmgui.ui.fleet": ("Fleet",),
    "qmgui.ui.model_table": ("ModelTable",),
    "qmgui.ui.plan_panel": ("PlanPanel",),
    "qmgui.ui.planning": (
        "BadgeResult",
        "PlanOutcome",
        "fit_badge",
        "fit_context",
        "for_variant",
        "plan_model",
    ),
    "qmgui.ui.preview_pane": ("PreviewPane",),
    "qmgui.ui.profile_actions": (
        "WINDOW_FIELDS",
        "Profiles",
        "window_settings",
    ),
    "qmgui.ui.remote_models": (
        "RemoteModels",
        "is_remote",
    ),
    "qmgui.ui.run_sets_menu": (
        "ModelActions",
        "RunSetsMenu",
    ),
    "qmgui.ui.settings_watch": ("SettingsWatch",),
    "qmgui.ui.tray": (
        "CloseDecision",
        "QuitChoice",
        "RunnerEngines",
        "Tray",
    ),
    "qmgui.ui.vram_bar": (
        "MemoryPanel",
        "bars_for",
    ),
    "qmgui.ui.workers": (
        "Breather",
        "LatestWins",
        "ScanRunner",
    ),
}


def load_window_modules() -> None:
    """Import what the window needs beyond Qt and make it this module's globals, as if imported
    at the top. Done when this module is imported, unless the window is to be painted first
    (`qmgui.ui.first_paint.defer_window_modules`): then by the window, right after its first
    paint. A name already set is kept (a test's monkeypatch)."""
    names = globals()
    for module_name, wanted in _WINDOW_MODULES.items():
        module = importlib.import_module(module_name)
        if not wanted:
            names.setdefault(module_name.rsplit(".", 1)[1], module)
        for name in wanted:
            names.setdefault(name, getattr(module, name))


if TYPE_CHECKING:  # dialogs are imported when opened (not on the start path)
    from qmgui.ui.get_models import GetModelsDialog
    from qmgui.ui.roots_dialog import RootsDialog

SOURCE = "window"
REPLAN_THROTTLE_MS = 100  # slider drags re-plan at most this often (qutebrowser's throttle)
MESSAGE_MS = 10_000
BADGE_DELAY_MS = 150  # after a scan: let the table paint its rows before the badges' search
REPLAN_FREE_DELTA = 64 * 1024 * 1024  # a card's free memory moved this much: plan again
PAGE_EMPTY, PAGE_MODELS = 0, 1
FIT_MESSAGE = "Looking for the longest context that fits…"


def freeze_heap() -> None:
    """Exempt everything alive now from the cyclic garbage collector's full passes.

    A full collection holds the GIL from whichever thread triggers it; when a scan or badge
    worker triggered one, the GUI thread waited for it: 100-220 ms of the stalls
    bench/gui_stall.py measured were gen-2 collections on worker threads, over objects that
    live as long as the window (the library, compiled graphs, Qt wrappers). Frozen objects are
    still freed by reference counting; only cycles among them would wait. Cheap: it moves a
    list, it does not traverse it."""
    gc.freeze()


def initial_settings(entry: ModelEntry, ov: ModelOverride | None) -> LaunchSettings:
    """Where a newly selected model starts: its saved profile, else 8192 tokens."""
    return window_settings(entry, ov)


ENGINES_DOCK_HEIGHT = 170  # px at first start; the user's size is kept after


class MainWindow(QMainWindow):
    """The model library, the plan of the selected model, its memory and its command.

    `roots` replaces the configured roots and the stores (the screenshot mode); `persist=False`
    writes no settings and does not follow the file. `probe=False` skips running the engine's
    `--help` (tests)."""

    _message = Signal(object)  # a notify.Message, posted from any thread
    settled = Signal()  # scan, badges and plan all done
    tray: Tray | None

    def __init__(
        self,
        loaded: LoadResult | None = None,
        *,
        roots: Sequence[str] | None = None,
        persist: bool = True,
        probe: bool = True,
        hardware_choice: str | None = None,
        tray: bool = True,
        live: bool = True,
        deferred: FirstPaint | None = None,
    ) -> None:
        """`deferred`: show first, build after. The window gets its title, icon, theme and saved
        geometry and a "Starting…" page now, from what `first_paint.read_first_paint` read;
        the settings are loaded and everything else is built right after its first paint
        (`when_built` runs what waits for that). Without it, the window is whole on return."""
        super().__init__()
        self.setWindowTitle("qmgui")
        self.setWindowIcon(app_icon())
        self._built = False
        self._when_built: list[Callable[[], None]] = []
        build = partial(
            self._build, loaded, roots=roots, persist=persist, probe=probe,
            hardware_choice=hardware_choice, tray=tray, live=live,
        )  # fmt: skip
        if deferred is None:
            load_window_modules()  # a no-op unless the import deferred them
            build()
            return
        self._starting_page(deferred)

        def build_now() -> None:
            load_window_modules()
            build()

        self._build_later = BuildAfterPaint(self, build_now)

    def _first_dock_height(self) -> None:
        self.resizeDocks([self.engines_dock], [ENGINES_DOCK_HEIGHT], Qt.Orientation.Vertical)

    def _starting_page(self, first: FirstPaint) -> None:
        """What shows for the moment the window is being built: the saved size and place, and
        a line that says what is happening."""
        self.tray = None
        restored = False
        if first.geometry:
            with contextlib.suppress(ValueError):
                restored = self.restoreGeometry(QByteArray(base64.b64decode(first.geometry)))
        if not restored:
            self.resize(1280, 800)
        page = QLabel("Starting qmgui…", self)
        page.setAlignment(Qt.AlignmentFlag.AlignCenter)
        page.setEnabled(False)  # the palette's placeholder colour: a state, not content
        self.setCentralWidget(page)

    def when_built(self, then: Callable[[], None]) -> None:
        """Run `then` once the window is whole: now if it is, else right after it is built."""
        if self._built:
            then()
        else:
            self._when_built.append(then)

    @property
    def built(self) -> bool:
        return self._built

    def _build(
        self,
        loaded: LoadResult | None,
        *,
        roots: Sequence[str] | None,
        persist: bool,
        probe: bool,
        hardware_choice: str | None,
        tray: bool,
        live: bool,
    ) -> None:
        self._live_readings = live  # NVML and RAM readings every few seconds for the bars
        self._loaded = loaded or load_settings()
        self._roots_override = list(roots) if roots is not None else None
        self._persist = persist
        self._settings_path = self._loaded.path or settings_path()
        self.settings_watch: SettingsWatch | None = None  # made once the window is built
        self._resolver = Resolver(self._loaded, probe=probe)
        self._host = hardware.this_machine()
        self._hardware = self._host
        self._outcome: PlanOutcome | None = None
        self._scanned = False
        self._pending_select: str | None = None
        self._last_free: tuple[int, ...] | None = None
        self._scan_message = ""  # the status message of the scan under way ("" if none)
        self._start_when_planned: str | None = None  # model id: start once this machine planned
        self._get_models: GetModelsDialog | None = None  # made when first opened
        self.what_if_box: QMessageBox | None = None  # "Start under a what-if profile?" while open

        self._build_widgets()
        # the tray keeps engines running when the window closes (None: the window is the app)
        self.tray = (
            Tray(
                self,
                RunnerEngines(self.engine_runner, self),
                load=lambda: self.settings,
                save=self._store,
            )
            if tray
            else None
        )
        self._build_toolbar()
        self._build_status_bar()
        self._connect_signals()
        self._restore_state()
        self.set_hardware(hardware_choice or hardware.THIS_MACHINE)
        # follow the file: the CLI or a script may change it while the window is open
        if persist:
            self.settings_watch = SettingsWatch(self._settings_path, self)
            self.settings_watch.changed.connect(self._on_settings_file_changed)
        if self.isVisible():  # built into a shown window: the dock's first height again once
            # the new layout is active (a dock added to a visible window takes what is left)
            QTimer.singleShot(0, self, self._first_dock_height)
        self._built = True
        waiting, self._when_built = self._when_built, []
        for then in waiting:
            then()

    # --- building ---------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        self.table = ModelTable(self)
        self.plan_panel = PlanPanel(self)
        self.memory = MemoryPanel(self)
        self.preview = PreviewPane(self)
        self.empty = EmptyState(self)

        detail = QWidget(self)
        detail_layout = QVBoxLayout(detail)
        detail_layout.setContentsMargins(12, 4, 4, 4)
        detail_layout.setSpacing(12)
        detail_layout.addWidget(self.plan_panel)
        self.profiles = Profiles(self)  # saves what is set here as the model's profile
        detail_layout.addWidget(self.profiles.vllm_box)  # a Hugging Face model's vLLM fields
        detail_layout.addWidget(self.profiles.bar)
        line = QFrame(detail)
        line.setFrameShape(QFrame.Shape.HLine)
        line.setFrameShadow(QFrame.Shadow.Sunken)
        detail_layout.addWidget(line)
        detail_layout.addWidget(self.memory)
        detail_layout.addStretch(1)

        self._detail = detail
        self.detail_scroll = self._scrolled(detail)
        self.detail_split = QSplitter(Qt.Orientation.Vertical, self)
        self.detail_split.addWidget(self.detail_scroll)
        preview_box = QWidget(self)
        preview_layout = QVBoxLayout(preview_box)
        preview_layout.setContentsMargins(12, 4, 4, 4)
        preview_layout.addWidget(self._command_box())
        self.detail_split.addWidget(preview_box)
        self._preview_box = preview_box
        self.detail_split.setStretchFactor(0, 3)
        self.detail_split.setStretchFactor(1, 1)
        self.detail_split.setChildrenCollapsible(False)

        self.main_split = QSplitter(Qt.Orientation.Horizontal, self)
        self.main_split.addWidget(self.table)
        self.main_split.addWidget(self.detail_split)
        self.main_split.setStretchFactor(0, 5)
        self.main_split.setStretchFactor(1, 6)
        self.main_split.setChildrenCollapsible(False)

        self.pages = QStackedWidget(self)
        self.pages.addWidget(self.empty)
        self.pages.addWidget(self.main_split)
        container = QWidget(self)
        layout = QVBoxLayout(container)
        layout.setContentsMargins(8, 8, 8, 4)
        layout.addWidget(self.pages)
        self.setCentralWidget(container)
        self._build_workers()

    def _scrolled(self, detail: QWidget) -> QScrollArea:
        """A short or narrow window scrolls the plan rather than squeezing its rows (clipped
        text: "4.096" for 4,096, "q8 0" for q8_0)."""
        scroll = QScrollArea(self)
        scroll.setWidget(detail)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        return scroll

    def _build_workers(self) -> None:
        """Everything slow runs on these, never on the GUI thread."""
        self.scanner = ScanRunner(self)
        self.planner = LatestWins("plan", self)
        self.badger = LatestWins("badges", self)
        self.fitter = LatestWins("fit", self)
        self.checker = LatestWins("engine-check", self)  # the engine's own projection
        self.offerer = LatestWins("offer", self)  # first run: folders to offer (disk: a worker)
        self.remote = RemoteModels(self, show_work=self.show_work, end_work=self.end_work)
        self.badge_timer = QTimer(self)
        self.badge_timer.setSingleShot(True)
        self.badge_timer.setInterval(BADGE_DELAY_MS)
        self.badge_timer.timeout.connect(lambda: self._refresh_badges(clear=False))
        self.split_timer = QTimer(self)  # the detail split follows the plan's height
        self.split_timer.setSingleShot(True)
        self.split_timer.setInterval(0)
        self.split_timer.timeout.connect(self._fit_detail_split)
        self.split_timer.timeout.connect(self._check_settled)
        self.replan_timer = QTimer(self)
        self.replan_timer.setSingleShot(True)
        self.replan_timer.setInterval(REPLAN_THROTTLE_MS)
        self.drops = DropFilter(self)
        for w in (self, self.table.view.viewport(), self.empty):
            self.drops.watch(w)
        self.fleet = Fleet(
            self.engine_runner,
            resolver=lambda: self._resolver,
            load=lambda: self.settings,
            save=self._store,
            entries=lambda: self.table.model.entries,
            hardware=lambda: self._hardware,
            reserve_mib=lambda: self.reserve_mib,
            initial_settings=initial_settings,
            parent=self,
            live=self._live_readings,
        )

    def _command_box(self) -> QWidget:
        """The launch command with its Start button; the Engines dock (bottom) beside them."""
        self.engine_runner = EngineRunner(self)
        self.engine_runner.port_for = self._port_for
        self.engine_runner.port_for_id = self._port_for_id
        self.engines_panel = EnginesPanel(self.engine_runner, self)
        self.engines_dock = QDockWidget("Engines", self)
        self.engines_dock.setObjectName("engines-dock")
        self.engines_dock.setWidget(self.engines_panel)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.engines_dock)
        # a modest strip until an engine runs: the models and the plan are the main view
        self.resizeDocks([self.engines_dock], [ENGINES_DOCK_HEIGHT], Qt.Orientation.Vertical)
        box = QWidget(self)
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.preview, 1)
        start_row = QHBoxLayout()
        start_row.addStretch(1)
        self.start_button = QPushButton("Start", box)
        self.start_button.setToolTip("Run this command now and watch it in the Engines panel")
        self.start_button.setEnabled(False)
        start_row.addWidget(self.start_button)
        layout.addLayout(start_row)
        return box

    def _build_toolbar(self) -> None:
        bar = QToolBar("Main", self)
        bar.setObjectName("main-toolbar")
        bar.setMovable(False)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.add_action = QAction("Add folder…", self)
        self.add_action.setShortcut(QKeySequence.StandardKey.Open)
        self.add_action.setToolTip("Add a folder of models (Ctrl+O)")
        self.roots_action = QAction("Model folders…", self)
        self.roots_action.setShortcut(QKeySequence("Ctrl+Shift+O"))
        self.roots_action.setToolTip("The folders scanned for models: add, remove (Ctrl+Shift+O)")
        self.rescan_action = QAction("Rescan", self)
        self.rescan_action.setShortcut(QKeySequence(Qt.Key.Key_F5))
        self.rescan_action.setToolTip("Look for models again (F5)")
        self.backends_action = QAction("Backends…", self)
        self.backends_action.setShortcut(QKeySequence("Ctrl+B"))
        self.backends_action.setToolTip(
            "The engines qmgui can run, and the ★ default per model class (Ctrl+B)"
        )
        self.quit_action = QAction("Quit", self)
        self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.addAction(self.quit_action)
        bar.addAction(self.add_action)
        bar.addAction(self.roots_action)
        bar.addAction(self.rescan_action)
        self._build_get_actions(bar)
        bar.addAction(self.backends_action)
        bar.addAction(self.profiles.paste_action)
        self._build_fleet_actions(bar)
        spacer = QWidget(bar)
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        bar.addWidget(spacer)
        label = QLabel("Plan for: ", bar)
        bar.addWidget(label)
        self.hardware_box = QComboBox(bar)
        self.hardware_box.addItems(hardware.choice_labels())
        self.hardware_box.setToolTip(
            "Plan for this machine's GPUs, or for hardware you do not have (what-if)"
        )
        self.hardware_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        label.setBuddy(self.hardware_box)
        bar.addWidget(self.hardware_box)
        self.hardware_label = QLabel("", bar)
        self.hardware_label.setContentsMargins(8, 0, 4, 0)
        bar.addWidget(self.hardware_label)
        self.addToolBar(bar)
        self.filter_shortcut = QShortcut(QKeySequence.StandardKey.Find, self)

    def _build_get_actions(self, bar: QToolBar) -> None:
        """Get models… and, in its drop-down, Open URL… (both plan before downloading)."""
        self.get_models_action = QAction("Get models…", self)
        self.get_models_action.setShortcut(QKeySequence("Ctrl+Shift+G"))
        self.get_models_action.setToolTip(
            "Search Hugging Face, see what fits before downloading, download (Ctrl+Shift+G)"
        )
        self.open_url_action = QAction("Open URL…", self)
        self.open_url_action.setShortcut(QKeySequence("Ctrl+L"))
        self.open_url_action.setToolTip(
            "Plan a model from its URL before downloading it: only its header is read (Ctrl+L)"
        )
        self.addAction(self.open_url_action)
        bar.addAction(self.get_models_action)
        self._attach_menu(bar, self.get_models_action, [self.open_url_action])

    @staticmethod
    def _attach_menu(bar: QToolBar, action: QAction, more: Sequence[QAction]) -> None:
        """`more` in a drop-down beside `action`'s button (the toolbar keeps its width)."""
        button = bar.widgetForAction(action)
        if not isinstance(button, QToolButton):
            return
        menu = QMenu(button)
        menu.addActions(list(more))
        button.setMenu(menu)
        button.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)

    def _build_fleet_actions(self, bar: QToolBar) -> None:
        """Run sets (toolbar menu), and Start / favourite / pin for the selected model (table
        context menu and shortcuts)."""
        self.run_sets_menu = RunSetsMenu(self.fleet, self)
        self.addAction(self.run_sets_menu.save_action)
        run_sets = QToolButton(bar)
        run_sets.setText("Run sets")
        run_sets.setObjectName("run-sets-button")
        run_sets.setToolTip("Start, stop and save groups of models that run together")
        run_sets.setMenu(self.run_sets_menu)
        run_sets.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bar.addWidget(run_sets)
        self.model_actions = ModelActions(self.fleet, self.table.current_entry, self)
        self.start_action = QAction("Start", self)
        self.start_action.setShortcut(QKeySequence("Ctrl+Return"))
        self.start_action.setToolTip("Start the selected model with the plan shown (Ctrl+Enter)")
        self.serve_router_action = QAction("Serve through one endpoint", self)
        self.serve_router_action.setObjectName("serve-router")
        self.serve_router_action.setToolTip(
            "Serve the selected models (Ctrl-click for several) behind one address: "
            "llama.cpp's router loads each on its first request, with its own settings"
        )
        self.serve_router_action.triggered.connect(self.serve_selected_through_router)
        view = self.table.view
        view.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        for action in (
            self.start_action,
            self.serve_router_action,
            self.model_actions.favourite,
            self.model_actions.pin,
        ):
            view.addAction(action)
            self.addAction(action)

    def _build_status_bar(self) -> None:
        status = self.statusBar()
        self.progress = QProgressBar(self)
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setToolTip("Stop the scan")
        self.cancel_button.hide()
        self.count_label = QLabel("", self)
        status.addPermanentWidget(self.count_label)
        status.addPermanentWidget(self.progress)
        status.addPermanentWidget(self.cancel_button)

    def _connect_signals(self) -> None:
        self._unsubscribe = notify.notifier.subscribe(self._message.emit)
        self._message.connect(self._show_message, Qt.ConnectionType.QueuedConnection)

        self.add_action.triggered.connect(self.choose_folder)
        self.roots_action.triggered.connect(self.open_roots)
        self.empty.addFolderRequested.connect(self.choose_folder)
        self.empty.useFoldersRequested.connect(self.add_roots)
        self.offerer.finished.connect(self.empty.set_offer)
        self.rescan_action.triggered.connect(self.rescan)
        self.quit_action.triggered.connect(self._quit)
        self.backends_action.triggered.connect(self.open_backends)
        self.get_models_action.triggered.connect(self.open_get_models)
        self.open_url_action.triggered.connect(self.remote.ask)
        self.remote.added.connect(self._on_remote_added)
        self.remote.busyChanged.connect(self._check_settled)
        self.filter_shortcut.activated.connect(self.focus_filter)
        self.hardware_box.currentTextChanged.connect(self.set_hardware)
        self.drops.dropped.connect(self._on_drop)

        self.scanner.progress.connect(self._on_scan_progress)
        self.scanner.finished.connect(self._on_scan_finished)
        self.scanner.failed.connect(partial(self._on_failed, "scan"))
        self.scanner.busyChanged.connect(self._on_scan_busy)
        self.cancel_button.clicked.connect(self.scanner.cancel)

        self.table.selected.connect(self._on_selected)
        self.plan_panel.changed.connect(self._schedule_plan)
        self.plan_panel.fitRequested.connect(self._fit_context)
        self.replan_timer.timeout.connect(self._plan_now)
        self.planner.finished.connect(self._on_plan)
        self.planner.failed.connect(partial(self._on_failed, "plan"))
        self.badger.finished.connect(self._on_badges)
        self.badger.failed.connect(partial(self._on_failed, "fit badges"))
        self.fitter.finished.connect(self._on_fit_context)
        self.fitter.failed.connect(partial(self._on_failed, "fit context"))
        self.memory.nearestRequested.connect(self._apply_nearest)
        self.memory.checkRequested.connect(self.check_with_engine)
        self.checker.finished.connect(self._on_checked)
        self.checker.failed.connect(partial(self._on_failed, "engine check"))
        self.preview.copied.connect(
            lambda _text: self.statusBar().showMessage("Command copied to the clipboard", 4000)
        )
        for worker in (self.scanner, self.planner, self.badger, self.fitter, self.offerer):
            worker.busyChanged.connect(self._check_settled)
        self.start_button.clicked.connect(self.start_engine)
        self.start_action.triggered.connect(self.start_engine)
        self.engine_runner.added.connect(lambda _id: self.engines_dock.show())
        self.engine_runner.changed.connect(self._on_engines_changed)
        self.fleet.liveChanged.connect(self._on_live)
        self.fleet.changed.connect(self._update_tray_lists)
        if self.tray is not None:
            self.tray.favouriteRequested.connect(
                lambda mid: self.fleet.start_models([mid], why="favourite")
            )
            self.tray.runSetRequested.connect(self._on_tray_run_set)
            self._update_tray_lists()
        self.engines_panel.copied.connect(
            lambda url: self.statusBar().showMessage(f"Copied {url}", 4000)
        )

    # --- state ------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self._loaded.settings

    @property
    def hardware(self) -> hardware.Hardware:
        return self._hardware

    @property
    def outcome(self) -> PlanOutcome | None:
        """The plan on show (None before the first one)."""
        return self._outcome

    @property
    def reserve_mib(self) -> int:
        return self.settings.ui.gpu_reserve_mib

    def roots(self) -> list[str]:
        if self._roots_override is not None:
            return list(self._roots_override)
        roots = list(self.settings.model_roots)
        roots += [str(p) for p in default_store_roots() if str(p) not in roots]
        return roots

    def is_settled(self) -> bool:
        """Scanned at least once, and no scan, plan or badge work waiting or running."""
        return self._scanned and not (
            self.scanner.busy or self.planner.busy or self.badger.busy or self.fitter.busy
            or self.offerer.busy or self.remote.busy or self.replan_timer.isActive()
            or self.badge_timer.isActive() or self.split_timer.isActive()
        )  # fmt: skip

    def _check_settled(self) -> None:
        if self.is_settled():
            self.settled.emit()

    def _restore_state(self) -> None:
        ui = self.settings.ui
        if ui.window_geometry:
            with contextlib.suppress(ValueError):
                self.restoreGeometry(QByteArray(base64.b64decode(ui.window_geometry)))
        else:
            self.resize(1280, 800)
        for name, split in (("main", self.main_split), ("detail", self.detail_split)):
            sizes = ui.splitter_sizes.get(name)
            if sizes and len(sizes) == split.count():
                split.setSizes(sizes)
        self._splits_restored = {k for k in ("main", "detail") if k in ui.splitter_sizes}
        # the user's own height for the plan: kept from then on
        self.detail_split.splitterMoved.connect(lambda *_: self._splits_restored.add("detail"))
        self.table.restore_column_widths(ui.column_widths)
        self.table.restore_sort(ui.sort_column, ui.sort_order)
        self._pending_select = ui.last_model_id

    def _default_splits(self) -> None:
        """First show without remembered sizes: the table ~55 % wide (the plan's height
        follows the plans: `_fit_detail_split`)."""
        width = max(self.pages.width(), 800)
        if "main" not in self._splits_restored:
            self._splits_restored.add("main")
            self.main_split.setSizes([int(width * 0.55), int(width * 0.45)])

    def _fit_detail_split(self) -> None:
        """Until the user moves it (or a size was remembered): the plan, its bars and verdict
        as tall as they need where the height allows (the plan scrolls where it does not),
        the command below with at least its minimum height. Redone after each plan: a model
        with more rows (CPU experts, a GPU per card) takes more."""
        if "detail" in self._splits_restored:
            return
        height = sum(self.detail_split.sizes())
        if height <= 0:
            return
        below = max(self._preview_box.minimumSizeHint().height(), 120)
        top = max(min(self._detail.sizeHint().height() + 8, height - below), height // 2)
        if top != self.detail_split.sizes()[0]:
            self.detail_split.setSizes([top, height - top])

    def save_state(self) -> None:
        """Window geometry, splitters, columns, sort and the selection into settings.json."""
        if not self._built:
            return
        key, order = self.table.sort_state()
        current = self.table.current_entry()
        ui = self.settings.ui.model_copy(
            update={
                "window_geometry": base64.b64encode(bytes(self.saveGeometry().data())).decode(),
                "splitter_sizes": {
                    "main": self.main_split.sizes(),
                    "detail": self.detail_split.sizes(),
                },
                "column_widths": self.table.column_widths(),
                "sort_column": key,
                "sort_order": "descending" if order == "descending" else "ascending",
                "last_model_id": current.id if current else self.settings.ui.last_model_id,
            }
        )
        self._store(self.settings.model_copy(update={"ui": ui}))

    def _port_for(self, entry: ModelEntry) -> int:
        """The model's port: its saved one, else chosen now (`choose_port`) and saved with the
        window's settings, so every later start, restart and preview uses it."""
        return self._port_for_id(entry.id)

    def _port_for_id(self, model_id: str) -> int:
        """`_port_for` by id (a router's id names its port likewise)."""
        port = choose_port(self.settings, model_id)
        if stored_port(self.settings, model_id) is None:
            self._store(with_port(self.settings, model_id, port))
        return port

    def _store(self, settings: Settings) -> None:
        """Take `settings` (the window's copy with one change) and save what changed: merged
        into the file as it is now, so a change another process made meanwhile is kept, and
        then shown here."""
        base = self.settings
        self._set_settings(settings)
        if not self._persist or self._loaded.read_only:
            return
        try:
            saved = save_changes(base, settings, self._settings_path)
        except Exception as e:  # a settings file that cannot be written is a message
            notify.error(f"settings not saved: {e}", source=SOURCE)
            return
        if self.settings_watch is not None:
            self.settings_watch.wrote()
        for message in saved.messages:  # the file was unusable: moved aside, ours written
            notify.warning(message, source="settings")
        self._adopt(saved.settings)

    # --- what the profiles (qmgui.ui.profile_actions) use ------------------------------------
    def set_settings_in_memory(self, settings: Settings) -> None:
        """The window's settings now; the caller writes the file (the profile saver)."""
        self._set_settings(settings)

    @property
    def persisting(self) -> bool:
        return self._persist and not self._loaded.read_only

    @property
    def settings_file(self) -> Path:
        return self._settings_path

    def wrote_settings(self) -> None:
        """A worker wrote the file (the profile saver): not another process's change."""
        if self.settings_watch is not None:
            self.settings_watch.wrote()

    def saved_elsewhere(self, settings: Settings) -> None:
        """A worker wrote the file (the profile saver): take what it holds now."""
        self.wrote_settings()
        self._adopt(settings)

    def _set_settings(self, settings: Settings) -> None:
        before = self._loaded.settings.model_overrides
        self._loaded = replace(self._loaded, settings=settings)
        self._resolver.loaded = self._loaded
        after = settings.model_overrides
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        if changed:  # a running router serving one of them writes its preset again
            self.engine_runner.profiles_changed(changed)

    def _on_settings_file_changed(self, settings: object) -> None:
        """Another process changed the file: take its settings (the file loads cleanly now,
        so a window that could not save before can again)."""
        assert isinstance(settings, Settings)
        if settings == self.settings and not self._loaded.read_only:
            return  # our own save, or a change that changed nothing
        self._loaded = replace(self._loaded, read_only=False)
        self._adopt(settings)

    def _adopt(self, settings: Settings) -> None:
        """Make `settings` the window's and redo what depends on the parts that differ from
        what the window had: the roots (rescan), the registry, pins and GPU reserve (plan and
        badges), favourites, pins and run sets (tray and actions). Window layout is the
        window's own and is not applied."""
        settings = self.profiles.overlay(settings)  # profile changes not saved yet
        before, roots_before = self.settings, self.roots()
        self._set_settings(settings)
        if before == settings:
            return
        current = self.plan_panel.entry
        if current is not None and before.model_overrides.get(
            current.id
        ) != settings.model_overrides.get(current.id):
            self.profiles.reapply(current)  # another qmgui changed its profile: show it
        if self.roots() != roots_before and self._scanned:
            self.rescan()
        planning = ("backends", "model_overrides")
        if any(getattr(before, k) != getattr(settings, k) for k in planning) or (
            before.ui.gpu_reserve_mib != settings.ui.gpu_reserve_mib
        ):
            self._schedule_plan()
            self._refresh_badges(clear=False)
        if any(
            getattr(before, k) != getattr(settings, k) for k in ("favourites", "pinned", "run_sets")
        ):
            self._update_tray_lists()
            self.model_actions.sync()

    # --- scanning and roots -----------------------------------------------------------------
    def start(self) -> None:
        """Post the settings' messages, adopt the engines an earlier qmgui left, and scan."""
        for message in self._loaded.messages:
            notify.warning(message, source="settings")
        freeze_heap()  # Qt's wrappers, the modules and the window: alive until the end
        self.engine_runner.adopt_survivors()
        self.rescan()

    def rescan(self) -> None:
        roots = self.roots()
        if not roots:
            self._scanned = True
            self._on_scan_finished(ScanResult(()))
            return
        self.scanner.start(roots)

    def add_roots(self, paths: Sequence[str]) -> None:
        """Add folders or .gguf files as model roots (saved), then rescan."""
        if not paths:
            return
        # a folder inside a root is scanned already: not added twice; a parent replaces roots
        current = self._roots_override
        addition = plan_add(self.settings.model_roots if current is None else current, paths)
        for message in addition.messages():
            notify.info(message, source=SOURCE)
        paths = addition.added
        if not paths:
            return
        if self._roots_override is not None:
            self._roots_override = addition.roots
        else:
            roots = addition.roots
            self._store(self.settings.model_copy(update={"model_roots": roots}))
            # the settings validator normalises, so read it back through a round trip
            self._loaded = replace(
                self._loaded, settings=Settings.model_validate(self.settings.model_dump())
            )
        names = ", ".join(os.path.basename(p.rstrip(os.sep)) or p for p in paths)
        self._scan_message = self.show_work(f"Added {names}; scanning…")
        self.rescan()

    def set_model_roots(self, roots: Sequence[str]) -> None:
        """Replace the configured model roots (the Model folders dialog): saved, rescanned."""
        before = self.roots()
        normalised = Settings(model_roots=list(roots)).model_roots
        self._store(self.settings.model_copy(update={"model_roots": normalised}))
        if self.roots() != before:
            self.rescan()

    def open_roots(self) -> RootsDialog:
        """The Model folders dialog: the roots with Add, Remove and Undo."""
        from qmgui.ui.roots_dialog import RootsDialog  # noqa: PLC0415 - not on the start path

        dialog = RootsDialog(
            self,
            roots=lambda: list(self.settings.model_roots),
            add=self.add_roots,
            save=self.set_model_roots,
        )
        if self.settings_watch is not None:  # another qmgui changed them: show it
            self.settings_watch.changed.connect(dialog.refresh)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def open_get_models(self) -> GetModelsDialog:
        """The Get models dialog (one, kept while the window lives: a download goes on when
        it is closed); what it downloads lands in a model folder, added and rescanned."""
        from qmgui.ui.get_models import GetModelsDialog  # noqa: PLC0415 - not on the start path

        if self._get_models is None:
            roots = self._roots_override or list(self.settings.model_roots)
            folder = next((r for r in roots if os.path.isdir(r)), "")
            self._get_models = GetModelsDialog(
                self,
                folder=folder or str(Path.home() / "models"),
                downloaded=self._on_downloaded,
                # "fits" as the window plans: this machine or the what-if profile on show
                hardware=lambda: (self._hardware.label, self._hardware.gpus),
            )
        self._get_models.show()
        self._get_models.raise_()
        return self._get_models

    def _on_downloaded(self, paths: Sequence[str]) -> None:
        for entry, local in self.remote.downloaded(paths):  # on disk now: the file's row
            self._carry_profile(entry.id, local)
            self._pending_select = local
        folders = sorted({os.path.dirname(os.path.abspath(p)) for p in paths})
        before = list(self.roots())
        self.add_roots(folders)  # a new folder is added and scanned; one inside a root is not
        if list(self.roots()) == before:
            self.rescan()

    def _carry_profile(self, url: str, local: str) -> None:
        """The settings saved for a model's URL become the downloaded file's (unless it has
        its own already)."""
        overrides = self.settings.model_overrides
        if url in overrides and local not in overrides:
            self._store(
                self.settings.model_copy(
                    update={"model_overrides": {**overrides, local: overrides[url]}}
                )
            )

    def download_remote(self, entry: ModelEntry) -> None:
        """Start on a model planned from its URL: download it (the Get models dialog, with
        progress and Cancel) into the first model folder; the file then replaces the row."""
        dialog = self.open_get_models()
        if dialog.download_url(entry.path, entry.name):
            self.statusBar().showMessage(
                f"Downloading {entry.name} into {dialog.folder.text()}…", MESSAGE_MS
            )

    def _on_remote_added(self, entry: object) -> None:
        assert isinstance(entry, ModelEntry)
        local = [e for e in self.table.model.entries if not is_remote(e)]
        self._show_entries([*local, *self.remote.entries])
        self.table.select_id(entry.id)
        self.badge_timer.start()

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            self.add_roots([folder])

    def _on_drop(self, accepted: list[str], refused: list[str]) -> None:
        if refused:
            names = ", ".join(os.path.basename(p) or p for p in refused)
            notify.warning(f"cannot add {names}: drop a folder or a .gguf file", source=SOURCE)
        self.add_roots(accepted)

    def _on_scan_busy(self, busy: bool) -> None:
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.rescan_action.setEnabled(not busy)
        if busy:
            self.progress.setRange(0, 0)
            self.empty.set_status("Looking for models…")

    def _on_scan_progress(self, done: int, total: int, path: str) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.progress.setFormat(f"{done}/{total}")
        if path:
            self.progress.setToolTip(path)

    def _on_scan_finished(self, result: object) -> None:
        assert isinstance(result, ScanResult)
        self._scanned = True
        self.end_work(self._scan_message)  # "Added …; scanning…" ends with the scan
        self._scan_message = ""
        if result.cancelled:
            notify.info("scan cancelled; the list shows the last complete scan", source="scan")
            return
        for problem in result.problems:
            notify.warning(f"{problem.path}: {problem.reason}", source="scan")
        keep = self.table.current_entry()
        n = self._show_entries([*result.models, *self.remote.entries])
        roots = self.roots()
        self.empty.set_status(
            "Looked in: " + ", ".join(roots) if roots else "No folders configured yet."
        )
        if not n and self._roots_override is None:
            self.offerer.submit(
                lambda: [str(p) for p in common_model_folders() if str(p) not in roots]
            )
        freeze_heap()
        # the badges (a fit search per model, seconds of Python for hundreds of models) start
        # once the new rows are painted: the paint calls into Python for every cell and must
        # not wait for the GIL behind a worker (bench/gui_stall.py)
        self.badge_timer.start()
        wanted = self._pending_select or (keep.id if keep else None)
        self._pending_select = None
        if not (wanted and self.table.select_id(wanted)) and n:
            self.table.view.selectRow(0)
            self.table.view.setCurrentIndex(self.table.proxy.index(0, 0))
        self._check_settled()

    def _show_entries(self, entries: Sequence[ModelEntry]) -> int:
        """Put `entries` (scanned, and the remote ones) in the table; their count."""
        self.table.model.set_entries(entries)
        n = len(entries)
        broken = sum(1 for m in entries if m.error)
        remote = sum(1 for m in entries if is_remote(m))
        self.count_label.setText(
            f"{n} model{'s' if n != 1 else ''}"
            + (f", {broken} broken" if broken else "")
            + (f", {remote} remote" if remote else "")
        )
        self.pages.setCurrentIndex(PAGE_MODELS if n else PAGE_EMPTY)
        if n:
            self._default_splits()
        return n

    # --- hardware ---------------------------------------------------------------------------
    def set_hardware(self, choice: str) -> None:
        """Plan for "This machine" or a what-if profile (a toolbar label or `lookup` text)."""
        if choice.strip().lower() == hardware.THIS_MACHINE.lower():
            hw = self._host  # read once (and again when the live poll sees a card come or go)
        else:
            try:
                hw = hardware.resolve(choice, host_bytes=self._host.host_bytes)
            except ValueError as e:
                notify.error(str(e), source=SOURCE)
                return
        self._hardware = hw
        self.plan_panel.set_gpus([g.name for g in hw.gpus])
        if self.hardware_box.currentText() != hw.label:
            if self.hardware_box.findText(hw.label) < 0:
                self.hardware_box.addItem(hw.label)
            self.hardware_box.blockSignals(True)
            self.hardware_box.setCurrentText(hw.label)
            self.hardware_box.blockSignals(False)
        total = sum(g.total_bytes for g in hw.gpus)
        self.hardware_label.setText(
            f"{len(hw.gpus)} GPU{'s' if len(hw.gpus) != 1 else ''}, {total / MIB / 1024:.0f} GiB"
            if hw.gpus else "no GPU: CPU only"
        )  # fmt: skip
        self._refresh_badges()
        self._schedule_plan()
        self._sync_start_button()

    def _refresh_badges(self, *, clear: bool = True) -> None:
        """Size every model for the fit badges on a worker. `clear=False` (after a rescan, same
        hardware) keeps the badges on show until the new ones arrive: clearing repaints the
        column while the worker runs, and each cell painted then waits for the GIL."""
        entries = self.table.model.entries
        if not entries:
            return
        if clear:
            self.table.model.clear_badges()
        hw, reserve = self._hardware, self.reserve_mib

        registry = [b.to_core() for b in self.settings.backends]
        pins = {k: o.backend_id for k, o in self.settings.model_overrides.items() if o.backend_id}

        def task() -> tuple[dict[str, BadgeResult], dict[str, tuple[str, str]]]:
            breathe = Breather()  # leave the GUI thread room to paint between models
            badges, backends = {}, {}
            for e in entries:
                if not registry:
                    # what the command uses then: the kind's usual executable
                    badges[e.id] = fit_badge(e, hw, reserve)
                    exe = os.path.basename(default_executable(kind_for(e))) or "?"
                    backends[e.id] = (exe, f"no backends registered: {exe} (Backends… to add one)")
                    breathe()
                    continue
                choice = resolve_backend(e, registry, pin=pins.get(e.id))
                variant = choice.backend.variant if choice.backend else None
                rules, _ = rules_for(choice.backend.build if choice.backend else None)
                badges[e.id] = fit_badge(e, for_variant(hw, variant), reserve, rules=rules)
                label = (
                    choice.backend.id
                    if choice.backend
                    else ("skipped" if choice.skipped else "none")
                )
                backends[e.id] = (label, choice.reason)
                breathe()
            return badges, backends

        self.badger.submit(task)

    def _on_badges(self, result: object) -> None:
        assert isinstance(result, tuple)
        badges, backends = result
        self.table.model.set_backends(backends)
        self.table.model.set_badges(badges)
        freeze_heap()

    # --- planning ---------------------------------------------------------------------------
    def _on_selected(self, entry: object) -> None:
        self.model_actions.sync()
        if entry is None:
            self.plan_panel.set_entry(None)
            self.profiles.show_entry(None)
            self._outcome = None
            self.memory.set_bars([])
            self.memory.set_verdict("", ok=True, nearest=False)
            self.memory.set_measured("")
            self.preview.clear()
            self.start_button.setEnabled(False)
            return
        assert isinstance(entry, ModelEntry)
        if self.plan_panel.entry is not None and self.plan_panel.entry.id == entry.id:
            self.plan_panel.set_entry(entry, self.plan_panel.full_settings())
        else:
            self.profiles.before_set_entry(entry)
            self.plan_panel.set_entry(entry, self.profiles.show_entry(entry))
            self.profiles.after_set_entry(entry)
        self._schedule_plan()

    def _schedule_plan(self) -> None:
        """Throttle: the first change plans after a short pause, later ones join it."""
        if not self.replan_timer.isActive():
            self.replan_timer.start()

    def _plan_now(self) -> None:
        entry = self.plan_panel.entry
        if entry is None:
            self._check_settled()
            return
        settings = self.plan_panel.full_settings()
        hw, reserve, resolver = (
            self.fleet.plan_hardware(self._hardware),
            self.reserve_mib,
            self._resolver,
        )
        extra = self.plan_panel.extra_args()  # read on the GUI thread, like the settings
        subset = self.plan_panel.selected_gpus()
        # the panel shows the model's profile: nothing for the profile to fill in
        plan = partial(plan_model, extra_args=extra, gpu_subset=subset, given=WINDOW_FIELDS)
        self.planner.submit(lambda: plan(entry, settings, hw, reserve, resolver))

    def _on_plan(self, outcome: object) -> None:
        assert isinstance(outcome, PlanOutcome)
        current = self.plan_panel.entry
        if current is None or current.id != outcome.entry.id:
            return  # the selection moved on; its own plan is on the way
        self._outcome = outcome
        self._refresh_bars()
        fit = outcome.fit
        if fit is None and outcome.vllm is not None and outcome.error is None:
            self.memory.set_verdict(self._vllm_verdict(outcome.vllm), ok=outcome.vllm.fits,
                                    nearest=False)  # fmt: skip
        elif fit is None:
            self.memory.set_verdict(outcome.error or "", ok=False, nearest=False)
        elif fit.fits:
            r = fit.footprint.settings
            self.memory.set_verdict(
                f"{fit.verdict.capitalize()} {self._hw_words()}: {r.n_ctx:,} tokens in {r.n_seq} "
                f"slot{'s' if r.n_seq != 1 else ''}, KV {r.cache_type_k}/{r.cache_type_v}, "
                f"flash attention {'on' if r.flash_attn else 'off'}, "
                f"{fit.footprint.n_gpu_layers} layers on GPU."
                + (f" Note: {outcome.disk_note}." if outcome.disk_note else "")
                + "".join(f" Warning: {w}." for w in fit.warnings),
                ok=True,
                nearest=False,
            )
        else:
            self.memory.set_verdict(
                f"Does not fit: {fit.reason}.", ok=False, nearest=fit.nearest is not None
            )
        self._show_measured(outcome)
        checkable = (
            outcome.fit is not None and outcome.command.runnable and outcome.missing is None
            and "(llama)" in outcome.engine and not self._hardware.what_if
        )  # fmt: skip
        self.memory.set_checked("", available=checkable)
        self.preview.set_command(
            outcome.bash, outcome.powershell, outcome.command.warnings, outcome.engine,
            shown=(outcome.shown_bash, outcome.shown_powershell),
        )  # fmt: skip
        self._sync_start_button()
        self.split_timer.start()  # the plan's height, once its new rows are laid out
        self._start_if_asked(outcome)

    def _show_measured(self, outcome: PlanOutcome) -> None:
        """The latest `qmgui bench` figures of the model (read with the plan, off this
        thread), under the verdict."""
        if outcome.measured is None:
            self.memory.set_measured("")
            return
        result, same = outcome.measured
        devices = ", ".join(result.devices) or "unknown devices"
        tip = (
            f"qmgui bench: {result.prompt_tokens} prompt tokens, {result.gen_tokens} generated, "
            f"on {result.machine} ({devices}), build {result.build or 'unknown'}\n"
            f"settings: {result.settings}"
        )
        self.memory.set_measured(measured_words(result, same_settings=same), tip)

    def check_with_engine(self) -> None:
        """Run the engine's own projection of the launch on show (a worker: it starts
        llama-server and stops it before it loads) and show it beside the plan."""
        o = self._outcome
        if o is None or o.fit is None or not o.command.runnable:
            return
        argv, fit = tuple(o.command.argv), o.fit
        self.memory.set_checked("Asking the engine for its projection…", available=False)

        def task() -> tuple[str, list[dict[str, object]], str | None]:
            from qmgui.engines.fit_check import check_launch  # noqa: PLC0415 - on demand

            # beside the plan, and recorded with the memory residuals (qmgui doctor lists them)
            checked = check_launch(argv, fit.footprint, meta=o.entry.meta)
            return o.entry.id, [row.to_json() for row in checked.rows], checked.error

        self.checker.submit(task)

    def _on_checked(self, result: object) -> None:
        assert isinstance(result, tuple)
        entry_id, rows, error = result
        current = self.plan_panel.entry
        if current is None or current.id != entry_id:
            return
        if error:
            self.memory.set_checked(f"Engine check: no projection ({error}).", available=True)
            return
        parts = []
        for row in rows:
            ours = "/".join(f"{x:.1f}" for x in row["planned_mib"])
            theirs = "/".join(str(x) for x in row["engine_mib"])
            word = "agrees" if row["agrees"] else "differs"
            parts.append(f"{row['device']}: plan {ours}, engine {theirs} MiB ({word})")
        self.memory.set_checked(
            "Engine check (weights/context/compute, llama-server -fit on): " + "; ".join(parts),
            available=True,
        )

    def _vllm_verdict(self, plan: VllmPlan) -> str:
        """A vLLM launch in words: the plan's own numbers, or why it does not fit."""
        if not plan.fits:
            return f"Does not fit (vLLM): {plan.reason}."
        kv = plan.breakdown.kv_pool.nbytes if plan.breakdown else 0
        gpus = f" on {plan.tensor_parallel} GPUs" if plan.tensor_parallel > 1 else ""
        return (
            f"Fits {self._hw_words()} (vLLM){gpus}: max model length "
            f"{plan.max_model_len:,} tokens, GPU memory share "
            f"{plan.gpu_memory_utilization:.2f}, KV pool {format_bytes(kv)}."
        )

    def _refresh_bars(self) -> None:
        o = self._outcome
        if o is None:
            return
        self.memory.set_bars(
            bars_for(o, self.reserve_mib * MIB, self.fleet.loads(), self.fleet.live)
        )

    def _on_engines_changed(self) -> None:
        self._refresh_bars()
        self._sync_start_button()
        self._update_tray_lists()
        if not self._hardware.what_if and self._hardware.gpus:
            self.fleet.read_now()  # the cards' free memory moved: read it, then re-plan

    def _on_live(self) -> None:
        """New NVML/RAM readings: redraw the bars; re-plan when a card's free memory moved
        (an engine loaded or stopped, another program took memory), and plan for this
        machine's GPUs again when a card came or went."""
        self._refresh_bars()
        live = self.fleet.live
        now = hardware.seen_now(self._host, live.nvml, live.amd) if live is not None else None
        if now is not None:  # a card came or went (seeds row 99): plan for the GPUs there now
            self._host = now
            if not self._hardware.what_if:
                self.set_hardware(hardware.THIS_MACHINE)
            return
        hw = self._hardware
        if hw.what_if or not hw.gpus:
            return
        free = tuple(g.available for g in self.fleet.plan_hardware(hw).gpus)
        last = self._last_free
        self._last_free = free
        if last is None or len(last) != len(free):
            return
        if any(abs(a - b) > REPLAN_FREE_DELTA for a, b in zip(free, last, strict=True)):
            self._schedule_plan()

    def _on_tray_run_set(self, name: str, start: bool) -> None:
        if start:
            self.fleet.start_run_set(name)
        else:
            self.fleet.stop_run_set(name)

    def _update_tray_lists(self) -> None:
        if self.tray is None:
            return
        self.tray.set_offers(
            self.fleet.favourites(),
            [(r.name, self.fleet.is_running(r)) for r in self.fleet.run_sets()],  # role sets too
        )

    def _hw_words(self) -> str:
        hw = self._hardware
        if hw.what_if:
            return hw.label
        return "this machine" + ("" if hw.gpus else " (CPU only)")

    def _apply_nearest(self) -> None:
        o = self._outcome
        if o is not None and o.fit is not None and o.fit.nearest is not None:
            self.plan_panel.apply(o.fit.nearest, notify=True)

    def _fit_context(self) -> None:
        entry = self.plan_panel.entry
        if entry is None:
            return
        settings = self.plan_panel.full_settings()
        o = self._outcome
        # the plan's hardware: the cards' free memory now and the engine build's rules
        hw = o.hardware if o is not None and o.entry.id == entry.id else self._hardware
        subset, reserve = self.plan_panel.selected_gpus(), self.reserve_mib
        self.show_work(FIT_MESSAGE)
        self.fitter.submit(
            lambda: (entry.id, fit_context(entry, settings, hw, reserve, gpu_subset=subset))
        )

    def _on_fit_context(self, value: object) -> None:
        assert isinstance(value, tuple)
        entry_id, result = value
        self.end_work(FIT_MESSAGE)
        current = self.plan_panel.entry
        if current is None or current.id != entry_id:
            return
        if result is None:
            notify.info(f"{current.name}: qmgui does not size this model", source=SOURCE)
        elif not isinstance(result, FitResult):
            return
        elif result.fits:
            self.plan_panel.apply(result.settings, notify=True)
            notify.info(
                f"{current.name}: {result.footprint.settings.n_ctx:,} tokens fit", source=SOURCE
            )
        else:
            notify.warning(f"{current.name}: {result.reason}", source=SOURCE)

    def start_engine(self) -> int | None:
        """Start the command on show (the preview's, exactly) under the supervisor, off the GUI
        thread; the Engines panel follows it. Returns the engine's id.

        A model that runs already is not started twice: its engine is shown and selected (its
        id returned). Under a what-if profile the plan's numbers are not this machine's: the
        window asks first (`what_if_box`), and "Plan for this machine" switches the plan and
        starts once this machine's plan is in."""
        o = self._outcome
        current = self.plan_panel.entry
        running = self.running_engine_of(current.id) if current is not None else None
        if current is not None and running is not None:
            self.focus_engine(running)
            self.statusBar().showMessage(
                f"{current.name} is running already: its engine is selected below", MESSAGE_MS
            )
            return running
        if is_remote(current):
            assert current is not None
            self.download_remote(current)
            return None
        if o is None or current is None or o.entry.id != current.id or not o.command.runnable:
            return None
        if o.missing is not None:  # nothing to start: say what to install
            self.statusBar().showMessage(f"Cannot start {current.name}: {o.missing}", MESSAGE_MS)
            return None
        if self._hardware.what_if:
            self.ask_start_on_this_machine(current)
            return None
        if self.replan_timer.isActive() or self.planner.busy:
            self.statusBar().showMessage("The command is being updated; press Start again", 4000)
            return None
        self.statusBar().showMessage(f"Starting {o.entry.name}…", 4000)
        return self.fleet.start(o)

    def _sync_start_button(self) -> None:
        """Start, or "Show engine" for a model that runs already; its tooltip says what a
        press does (under a what-if profile: asks first)."""
        current, o, b = self.plan_panel.entry, self._outcome, self.start_button
        running = self.running_engine_of(current.id) if current is not None else None
        if current is not None and running is not None:
            b.setText("Show engine")
            b.setToolTip(f"{current.name} runs already: show its engine in the Engines panel")
            b.setEnabled(True)
            return
        if is_remote(current):
            assert current is not None
            b.setText("Download…")
            b.setToolTip(
                f"{current.name} is not on this machine: download it into a model folder "
                "(progress and Cancel in Get models); it then starts like any other"
            )
            b.setEnabled(True)
            return
        b.setText("Start")
        b.setEnabled(
            o is not None and current is not None and o.entry.id == current.id
            and o.command.runnable
        )  # fmt: skip
        if o is not None and o.missing is not None:
            b.setToolTip(f"The engine is not installed: {o.missing}")
            return
        b.setToolTip(
            f"The plan is for {self._hardware.label}, not this machine: Start asks to plan for"
            " this machine first"
            if self._hardware.what_if
            else "Run this command now and watch it in the Engines panel"
        )

    def serve_selected_through_router(self) -> int | None:
        """Serve through one endpoint: the selected models behind one llama.cpp router
        (planned and started off the GUI thread); the router's engine id."""
        entries = self.table.selected_entries()
        if not entries:
            notify.info(
                "Select the models to serve first (Ctrl-click for several)", source="engines"
            )
            return None
        eid = self.fleet.serve_router([e.id for e in entries])
        if eid is not None:
            self.focus_engine(eid)
        return eid

    def running_engine_of(self, model_id: str) -> int | None:
        """The id of an engine of `model_id` that is starting or running, else None."""
        for e in self.engine_runner.engines.values():
            if e.model_id == model_id and not e.state.final:
                return e.id
        return None

    def focus_engine(self, eid: int) -> None:
        """Show the Engines dock with engine `eid` selected (its log beside it)."""
        self.engines_dock.show()
        self.engines_dock.raise_()
        self.engines_panel.select(eid)
        self.engines_panel.table.setFocus(Qt.FocusReason.OtherFocusReason)

    def ask_start_on_this_machine(self, entry: ModelEntry) -> QMessageBox:
        """Start under a what-if profile: the engine would run here with numbers planned for
        other cards. Offer to plan for this machine and start then, or to cancel."""
        if self.what_if_box is not None:
            self.what_if_box.raise_()
            return self.what_if_box
        box = QMessageBox(QMessageBox.Icon.Question, "Start on this machine?", "", parent=self)
        box.setText(
            f"The plan on show is for {self._hardware.label}, not for this machine. "
            f"{entry.name} would run here with that plan's context and GPU layers."
        )
        box.setInformativeText(
            f"Plan {entry.name} for this machine ("
            + (", ".join(g.name for g in self._host.gpus) or "no GPU: CPU only")
            + ") and start it then?"
        )
        switch = box.addButton("Plan for this machine and start", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(switch)
        box.finished.connect(lambda _r: self._what_if_answered(box, switch, entry.id))
        self.what_if_box = box
        box.open()
        return box

    def _what_if_answered(self, box: QMessageBox, switch: object, entry_id: str) -> None:
        if self.what_if_box is box:
            self.what_if_box = None
        box.deleteLater()
        if box.clickedButton() is not switch:
            return
        self._start_when_planned = entry_id
        self.set_hardware(hardware.THIS_MACHINE)
        self.statusBar().showMessage("Planning for this machine, then starting…", MESSAGE_MS)

    def _start_if_asked(self, outcome: PlanOutcome) -> None:
        """After "Plan for this machine and start": start once this machine's plan is in."""
        wanted = self._start_when_planned
        if wanted is None or self._hardware.what_if:
            return
        if self.plan_panel.entry is None or self.plan_panel.entry.id != wanted:
            self._start_when_planned = None  # the selection moved on: forget it
            return
        if outcome.entry.id != wanted or self.replan_timer.isActive() or self.planner.busy:
            return  # a newer plan is on its way
        self._start_when_planned = None
        if outcome.command.runnable:
            self.start_engine()
        else:
            notify.warning(f"{outcome.entry.name}: no command to run here", source=SOURCE)

    def _on_failed(self, what: str, error: str) -> None:
        self.end_work(FIT_MESSAGE if what == "fit context" else self._scan_message)
        notify.error(f"{what} failed: {error}", source=SOURCE)

    def show_work(self, text: str) -> str:
        """A status message for work under way: it stays until `end_work(text)`."""
        self.statusBar().showMessage(text)
        return text

    def end_work(self, text: str) -> None:
        """The work `text` described is done: the message goes (unless another replaced it)."""
        if text and self.statusBar().currentMessage() == text:
            self.statusBar().clearMessage()

    # --- messages, keys, closing ------------------------------------------------------------
    def _show_message(self, message: object) -> None:
        assert isinstance(message, notify.Message)
        prefix = {notify.Level.ERROR: "Error: ", notify.Level.WARNING: "⚠ "}.get(message.level, "")
        self.statusBar().showMessage(prefix + message.text, MESSAGE_MS)

    def focus_filter(self) -> None:
        self.table.filter.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.table.filter.selectAll()

    def _quit(self) -> None:
        if self.tray is not None:
            self.tray.request_quit()  # asks about running engines, then closes and quits
        else:
            self.close()

    def open_backends(self) -> None:
        """The backend registry dialog; a save replaces the window's settings (so a later
        save of the UI state does not write the old registry back)."""
        from qmgui.ui.backends_dialog import BackendsDialog  # noqa: PLC0415 - not on the start path

        dialog = BackendsDialog(
            self, settings_loader=lambda: self._loaded, models=self.table.model.entries
        )
        dialog.saved.connect(self._on_backends_saved)
        dialog.open()

    def _on_backends_saved(self, loaded: LoadResult) -> None:
        if self.settings_watch is not None:
            self.settings_watch.wrote()
        self._loaded = replace(self._loaded, read_only=loaded.read_only)
        self._adopt(loaded.settings)
        self._schedule_plan()
        self._refresh_badges()  # the Backend column follows the registry

    def shutdown(self) -> None:
        """Stop and join every worker; forget the notifier (safe to call twice)."""
        if not self._built:  # still "Starting…": no worker yet, and none will start
            self._build_later.cancel()
            return
        self.profiles.flush()  # the last edits reach the file
        self.replan_timer.stop()
        self._unsubscribe()
        if self.settings_watch is not None:
            self.settings_watch.stop()
        self.scanner.wait()
        for worker in (self.planner, self.badger, self.fitter, self.offerer, self.checker):
            worker.cancel()
            worker.wait()
        self.remote.wait()
        self.engines_panel.timer.stop()
        if self._get_models is not None:
            self._get_models.wait()  # a download stops at its next chunk (resumable)
        self.fleet.wait()
        if self.tray is not None and self.tray.quit_choice is QuitChoice.LEAVE:
            self.engine_runner.leave_all()  # "Leave them running": detached, adopted later
        else:
            self.engine_runner.stop_all()  # the quit path: all but those kept running

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._built:  # closed while "Starting…": nothing to save or stop yet
            self._build_later.cancel()
            super().closeEvent(event)
            return
        if self.tray is not None and self.tray.close_policy(event) is not CloseDecision.QUIT:
            self.save_state()  # hidden to the tray with engines running, or cancelled
            return
        self.save_state()
        self.shutdown()
        super().closeEvent(event)


if not window_modules_deferred():
    load_window_modules()
