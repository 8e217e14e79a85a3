"""Start with the session on Linux: an XDG autostart entry that opens qmgui in the tray.

`enable()` writes `$XDG_CONFIG_HOME/autostart/qmgui.desktop` (default `~/.config/autostart`),
whose Exec line runs this very qmgui (the bundle's executable, or this Python with
`-m qmgui`) with `--minimized`; `disable()` removes it; `is_enabled()` says whether it is
there and not hidden. The Windows installer's "Start with Windows" does the same through the
registry.

The Exec line is built by the Desktop Entry Specification's rules, so no byte of a path (a
home folder with spaces, quotes, `$`, `%` or a backslash) can change the command: every
argument is double-quoted, `"`, `` ` ``, `$` and `\\` inside are backslash-escaped, `%` is
doubled (a field code otherwise), and the value as a whole is escaped once more as a desktop
file string (`\\\\` for a backslash). Paths with control characters (a line break would add a
key) are refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from qmgui.core.errors import SettingsError
from qmgui.core.textsafe import has_control

FILE_NAME = "qmgui.desktop"
_EXEC_ESCAPE = {'"': '\\"', "`": "\\`", "$": "\\$", "\\": "\\\\"}


def autostart_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autostart"


def entry_path() -> Path:
    return autostart_dir() / FILE_NAME


def command() -> tuple[str, ...]:
    """The argv that starts this qmgui in the tray."""
    if getattr(sys, "frozen", False):  # the PyInstaller bundle: its own executable
        return (sys.executable, "--minimized")
    return (sys.executable, "-m", "qmgui", "--minimized")


def exec_line(argv: Sequence[str]) -> str:
    """`argv` as the value of a desktop entry's Exec key (already escaped as a string value)."""
    words = []
    for a in argv:
        if has_control(a):
            raise SettingsError(
                f"cannot start qmgui with the session from {a!r}: the path holds a control "
                "character; move qmgui to a folder without one"
            )
        quoted = '"' + "".join(_EXEC_ESCAPE.get(c, c) for c in a).replace("%", "%%") + '"'
        words.append(quoted)
    # the value is also a desktop-file string, whose own escape is the backslash
    return " ".join(words).replace("\\", "\\\\")


def entry_text(argv: Sequence[str]) -> str:
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=qmgui\n"
        "Comment=Start qmgui in the tray with the session\n"
        f"Exec={exec_line(argv)}\n"
        "Icon=qmgui\n"
        "Terminal=false\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


def is_enabled() -> bool:
    try:
        text = entry_path().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    lines = {line.strip() for line in text.splitlines()}
    return "Hidden=true" not in lines and "X-GNOME-Autostart-enabled=false" not in lines


def enable(argv: Sequence[str] | None = None) -> Path:
    """Write the autostart entry (atomically); returns its path."""
    path = entry_path()
    text = entry_text(command() if argv is None else argv)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise SettingsError(
            f"could not write {path} ({e.strerror or e}): check that the folder is writable"
        ) from e
    return path


def disable() -> None:
    path = entry_path()
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise SettingsError(f"could not remove {path} ({e.strerror or e})") from e
