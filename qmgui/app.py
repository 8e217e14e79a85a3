"""The desktop application: builds the QApplication and the main window, and the
`--screenshot` mode that saves a PNG of the window once its scan and plan are shown."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QProxyStyle,
    QStyle,
    QStyleFactory,
    QStyleOption,
    QWidget,
)

from qmgui import __version__, notify
from qmgui.ui.first_paint import defer_window_modules, read_first_paint
from qmgui.ui.icons import app_icon
from qmgui.ui.startup_probe import report_built, report_when_shown

if TYPE_CHECKING:
    from qmgui.ui.main_window import MainWindow

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SCREENSHOT_TIMEOUT_S = 120.0
POLL_MS = 50
SETTLED_POLLS = 4  # the window must stay settled this many polls in a row before the shot
SETTLED_POLLS_ENGINE = 30  # with --start: the engines panel shows its log once a second


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qmgui",
        description="Start the qmgui window (with no arguments), or save a screenshot of it. "
        "The command-line tools are `qmgui scan|plan|preview|export|…` (qmgui --help).",
    )
    p.add_argument("--screenshot", metavar="FILE", help="save a PNG of the window and exit")
    p.add_argument("--models", metavar="DIR", help="use DIR as the only model root (no settings "
                   "are written)")  # fmt: skip
    p.add_argument("--what-if", dest="what_if", metavar="PROFILE",
                   help='plan for this hardware, e.g. "2× RTX 3090", 4090, 2x24GiB')  # fmt: skip
    p.add_argument("--select", metavar="NAME", help="select the first model whose name has NAME")
    p.add_argument("--size", default="1280x800", metavar="WxH", help="window size (1280x800)")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="with --select: plan the selected model at N tokens")  # fmt: skip
    p.add_argument("--theme", choices=("system", "light", "dark"), default=None,
                   help="colours: follow the system (default, or the saved choice), or force "
                   "light or dark")  # fmt: skip
    p.add_argument("--start", action="store_true",
                   help="with --screenshot: start the selected model's engine and shoot once "
                   "it is ready (the Engines panel and the bars' engine share)")  # fmt: skip
    p.add_argument("--show", choices=("backends",), default=None,
                   help="with --screenshot: save this dialog instead of the window")  # fmt: skip
    p.add_argument("--minimized", action="store_true",
                   help="start in the system tray (minimized where there is none); the "
                   "installers' start-with-the-session option uses it")  # fmt: skip
    return p


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise ValueError(f"--size {text}: give WIDTHxHEIGHT, e.g. 1280x800") from None
    if w < 320 or h < 240:
        raise ValueError(f"--size {text}: at least 320x240")
    return w, h


GUI_SWITCH_INTERVAL_S = 0.001


def dark_palette() -> QPalette:
    """A dark palette for the Fusion style (where the platform cannot switch its own)."""
    p = QPalette()
    role = QPalette.ColorRole
    window, base, text = QColor(45, 45, 48), QColor(30, 30, 32), QColor(230, 230, 230)
    for r, c in (
        (role.Window, window), (role.WindowText, text), (role.Base, base),
        (role.AlternateBase, QColor(40, 40, 43)), (role.ToolTipBase, QColor(60, 60, 64)),
        (role.ToolTipText, text), (role.PlaceholderText, QColor(140, 140, 140)),
        (role.Text, text), (role.Button, QColor(55, 55, 58)), (role.ButtonText, text),
        (role.BrightText, QColor(255, 90, 90)), (role.Light, QColor(75, 75, 80)),
        (role.Midlight, QColor(62, 62, 66)), (role.Mid, QColor(90, 90, 96)),
        (role.Dark, QColor(25, 25, 27)), (role.Shadow, QColor(0, 0, 0)),
        (role.Highlight, QColor(42, 130, 218)), (role.HighlightedText, QColor(255, 255, 255)),
        (role.Link, QColor(100, 170, 255)),
    ):  # fmt: skip
        p.setColor(r, c)
    disabled = QColor(120, 120, 120)
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, r, disabled)
    return p


DARK_OUTLINE_WINDOW = QColor(150, 150, 156)  # Fusion's outline is Window.darker(140): ~#6b6b6f


class DarkFusion(QProxyStyle):
    """Fusion for the dark palette. Fusion draws the ring of a radio button, the box of a check
    box and the frame of a line edit in the Window colour made darker, which on a dark Window
    is all but invisible: these few are drawn as if the Window colour were a mid grey."""

    OUTLINED = frozenset(
        {
            QStyle.PrimitiveElement.PE_IndicatorRadioButton,
            QStyle.PrimitiveElement.PE_IndicatorCheckBox,
            QStyle.PrimitiveElement.PE_IndicatorItemViewItemCheck,
            QStyle.PrimitiveElement.PE_FrameLineEdit,
        }
    )

    def __init__(self) -> None:
        super().__init__(QStyleFactory.create("Fusion"))
        self.setObjectName("fusion")

    def drawPrimitive(
        self,
        element: QStyle.PrimitiveElement,
        option: QStyleOption,
        painter: QPainter,
        widget: QWidget | None = None,
    ) -> None:
        if element in self.OUTLINED:
            option = type(option)(option)  # a copy: the caller's option stays as it was
            palette = QPalette(option.palette)
            palette.setColor(QPalette.ColorRole.Window, DARK_OUTLINE_WINDOW)
            option.palette = palette
        super().drawPrimitive(element, option, painter, widget)


def apply_theme(app: QApplication, theme: str) -> None:
    """ "system" follows the platform's light/dark setting; "light"/"dark" force it with the
    Fusion style (which draws every widget from the palette on every platform). The platform
    is asked too (Qt 6.8+), where it can switch its own colours."""
    if theme == "system":
        return
    dark = theme == "dark"
    app.setStyle(DarkFusion() if dark else QStyleFactory.create("Fusion"))
    app.styleHints().setColorScheme(Qt.ColorScheme.Dark if dark else Qt.ColorScheme.Light)
    app.setPalette(dark_palette() if dark else app.style().standardPalette())


def make_application(argv: Sequence[str] = ()) -> QApplication:
    """The QApplication: high-DPI scaling that follows the screen exactly, the system palette."""
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    # Workers (scan, sizing) run Python for long stretches; every call Qt makes into Python on
    # the GUI thread then waits for the GIL, up to one switch interval each (5 ms by default).
    # 1 ms keeps painting and input responsive (measured by bench/gui_stall.py).
    sys.setswitchinterval(GUI_SWITCH_INTERVAL_S)
    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(
        Qt.HighDpiScaleFactorRoundingPolicy.PassThrough
    )
    app = QApplication(["qmgui", *argv])
    app.setApplicationName("qmgui")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("qmgui")
    app.setWindowIcon(app_icon())  # dialogs too; the packaged PNGs (qmgui/resources/icons)
    return app


def run(argv: Sequence[str]) -> int:
    """`qmgui` with no arguments (the window) or with `--screenshot FILE …`."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
        size = parse_size(args.size)
        if args.what_if:
            from qmgui.ui import hardware  # noqa: PLC0415 - only to check the profile here

            hardware.resolve(args.what_if)  # a bad profile is a usage error, not a window
    except SystemExit as e:
        return int(e.code or 0)
    except ValueError as e:
        print(f"qmgui: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.screenshot:
        if not _display_available():
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
        gc.enable()  # a screenshot's scan may be long: collect as usual
        return screenshot(
            args.screenshot, models=args.models, what_if=args.what_if, select=args.select,
            size=size, ctx=args.ctx, theme=args.theme or "system", start=args.start,
            show=args.show,
        )  # fmt: skip
    app = make_application()
    if args.minimized:  # nothing is painted at first: build the whole window now
        from qmgui.settings import load_settings  # noqa: PLC0415
        from qmgui.ui.main_window import MainWindow  # noqa: PLC0415

        loaded = load_settings()
        apply_theme(app, args.theme or loaded.settings.ui.theme)
        window = MainWindow(loaded, hardware_choice=args.what_if)
        _when_built(app, window, args.models, theme=None)
        if window.tray is None or not window.tray.install():
            window.showMinimized()  # only the tray icon where there is one (start with the session)
        return app.exec()
    # the window first, built after its first paint: Qt alone is imported before it shows
    first = read_first_paint()
    apply_theme(app, args.theme or first.theme)
    defer_window_modules()
    from qmgui.ui.main_window import MainWindow  # noqa: PLC0415

    window = MainWindow(hardware_choice=args.what_if, deferred=first)
    window.show()
    report_when_shown(window)
    guessed = None if args.theme else first.theme  # --theme holds; a guess is checked once loaded
    window.when_built(lambda: _when_built(app, window, args.models, theme=guessed))
    return app.exec()


def _when_built(
    app: QApplication, window: MainWindow, models: str | None, *, theme: str | None
) -> None:
    """The rest of the start, once the window is whole: the theme the validated settings name
    (when `theme`, the first paint's guess, differs), the folder given on the command line,
    the tray, then adopt the engines an earlier qmgui left and scan."""
    if theme is not None and window.settings.ui.theme != theme:
        apply_theme(app, window.settings.ui.theme)
    if models:
        window.add_roots([models])
    if window.tray is not None and window.isVisible():
        window.tray.install()  # nothing where the platform has no tray
    if report_built(app):
        return  # QMGUI_REPORT_SHOWN: timed, and quitting
    window.start()
    _stop_on_signals(app, window)
    QTimer.singleShot(0, _collect_again)


def _collect_again() -> None:
    """Start-up is over (qmgui.__main__ turned collection off for it): what exists now lives as
    long as the window, so it is frozen out of every later collection, then collection resumes."""
    gc.freeze()
    gc.enable()


def _stop_on_signals(app: QApplication, window: MainWindow) -> None:
    """SIGINT (Ctrl-C in the terminal that started qmgui), SIGTERM (a logout, `kill`) and
    SIGHUP (the terminal closed) end the window the way Quit does: layout saved, workers
    joined, the engines it started stopped gracefully. Python runs signal handlers between
    bytecodes only, so a timer wakes the interpreter while Qt's loop waits."""
    ending = {"done": False}

    def end(signum: int, _frame: object) -> None:
        if ending["done"]:
            return
        ending["done"] = True
        words = f"got {signal.Signals(signum).name}: stopping the engines this window started"
        print(f"qmgui: {words}", file=sys.stderr)
        notify.info(words, source="app")
        window.save_state()
        window.shutdown()
        app.quit()

    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), end)
    timer = QTimer(window)
    timer.setInterval(200)
    timer.timeout.connect(lambda: None)
    timer.start()


def _display_available() -> bool:
    return bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        or os.environ.get("QT_QPA_PLATFORM") or sys.platform in ("win32", "darwin")
    )  # fmt: skip


class _Shooter(QObject):
    """Waits until the window has scanned, selected and planned, then saves it."""

    def __init__(
        self,
        window: MainWindow,
        path: str,
        select: str | None,
        ctx: int | None = None,
        *,
        start: bool = False,
        show: str | None = None,
    ) -> None:
        super().__init__(window)
        self.window = window
        self.start = start
        self.show = show
        self.dialog: QWidget | None = None
        self.engine: int | None = None
        self.path = path
        self.select = select
        self.ctx = ctx
        self.selected = select is None
        self.calm = 0
        self.waited_ms = 0
        self.status = EXIT_FAILED
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self._poll)

    def _poll(self) -> None:
        self.waited_ms += POLL_MS
        if self.waited_ms > SCREENSHOT_TIMEOUT_S * 1000:
            print(f"qmgui: the window did not settle in {SCREENSHOT_TIMEOUT_S:.0f} s",
                  file=sys.stderr)  # fmt: skip
            self._finish(EXIT_FAILED)
            return
        if not self.window.is_settled():
            self.calm = 0
            return
        if not self.selected:
            self.selected = True
            assert self.select is not None
            if not self.window.table.select_name(self.select):
                notify.warning(f"--select {self.select}: no model has that name", source="app")
            self.calm = 0
            return
        if self.ctx is not None:
            ctx, self.ctx = self.ctx, None
            self.window.plan_panel.ctx_spin.setValue(ctx)  # re-plans like a user's edit
            self.calm = 0
            return
        if self.start and not self._engine_ready():
            self.calm = 0
            return
        if self.show == "backends" and self.dialog is None:
            self.window.open_backends()
            self.dialog = next(
                (w for w in self.window.findChildren(QDialog) if w.isVisible()), None
            )
            self.calm = 0
            return
        self.calm += 1
        if self.calm < (SETTLED_POLLS_ENGINE if self.engine is not None else SETTLED_POLLS):
            return
        image = (self.dialog or self.window).grab()
        ok = image.save(self.path, "PNG")
        if not ok:
            print(f"qmgui: could not write {self.path}", file=sys.stderr)
        self._finish(EXIT_OK if ok else EXIT_FAILED)

    def _engine_ready(self) -> bool:
        """Start the engine once; True when it is ready (with its memory read) or has ended."""
        runner = self.window.engine_runner
        if self.engine is None:
            self.engine = self.window.start_engine()
            if self.engine is None:
                print("qmgui: --start: the selected model has no command to run", file=sys.stderr)
                self.start = False
            return False
        e = runner.engines.get(self.engine)
        if e is None or e.state.final:
            self.start = False  # shoot what there is (the panel shows why it ended)
            return True
        return e.memory is not None

    def _finish(self, status: int) -> None:
        self.status = status
        self.timer.stop()
        self.window.close()
        QApplication.quit()


def screenshot(
    path: str,
    *,
    models: str | None = None,
    what_if: str | None = None,
    select: str | None = None,
    ctx: int | None = None,
    size: tuple[int, int] = (1280, 800),
    theme: str = "system",
    start: bool = False,
    show: str | None = None,
) -> int:
    """Start the window, wait for its scan and plan, save a PNG of it to `path`."""
    from qmgui.settings import load_settings  # noqa: PLC0415
    from qmgui.ui.main_window import MainWindow  # noqa: PLC0415

    app = make_application()
    apply_theme(app, theme)
    if models is not None:
        # DIR is the only root; the settings (backends) are read, nothing is written
        window = MainWindow(
            load_settings(), roots=[models], persist=False, hardware_choice=what_if, tray=False
        )
    else:
        window = MainWindow(load_settings(), persist=False, hardware_choice=what_if, tray=False)
    window.resize(*size)
    shooter = _Shooter(window, path, select, ctx, start=start, show=show)
    window.show()
    window.start()
    shooter.timer.start()
    app.exec()
    window.shutdown()
    if shooter.status == EXIT_OK:
        print(path)
    return shooter.status
