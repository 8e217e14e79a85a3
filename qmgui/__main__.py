"""`python -m qmgui` and the `qmgui` command: the window when there is a display (or with
`--screenshot`), the command-line tools otherwise and whenever a command is named."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence

WINDOW_FLAGS = (
    "--screenshot", "--models", "--what-if", "--select", "--size", "--minimized", "--theme",
    "--start", "--show", "--ctx",
)  # fmt: skip


def display_available(env: dict[str, str] | None = None, platform: str | None = None) -> bool:
    """A window can be shown: an X11 or Wayland display, a Qt platform named, or Windows/macOS."""
    env = dict(os.environ) if env is None else env
    platform = platform or sys.platform
    if any(env.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")):
        return True
    return platform in ("win32", "darwin")


def wants_window(argv: Sequence[str], *, display: bool) -> bool:
    """No arguments with a display, or the window's own flags (`--screenshot` works anywhere)."""
    if not argv:
        return display
    return any(a.split("=", 1)[0] in WINDOW_FLAGS for a in argv) and argv[0].startswith("--")


def main(argv: Sequence[str] | None = None) -> int:
    # No cyclic garbage collection while the start-up imports build their long-lived objects
    # (pydantic's schemas, Qt's wrappers, the tables): collections then only walk objects that
    # live as long as the process. It measured a quarter of the window's start-up time and of
    # `qmgui plan`'s (bench/window_start.py, bench/startup.py). The window turns it back on
    # once its event loop runs, the command line before the command runs.
    gc.disable()
    try:
        return _main(argv)
    finally:
        gc.enable()


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:  # answered before any import: installers and scripts call it
        from qmgui import __version__  # noqa: PLC0415

        print(f"qmgui {__version__}")
        return 0
    if wants_window(args, display=display_available()):
        from qmgui.app import run  # noqa: PLC0415 - Qt loads only for the window

        return run(args)
    from qmgui.cli import main as cli_main  # noqa: PLC0415 - keeps `--help` fast

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
