"""The command line: the same core as the window, headless, with `--json` for scripts.

Each command lives in its own module with `register(subparsers)` adding its parser and setting
`func` to the function that runs it: `func(args, out) -> exit status`. User messages go through
the notifier and are printed on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import io
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TextIO, cast

from qmgui import __version__, notify
from qmgui.core.textsafe import terminal_text

EXIT_BROKEN_PIPE = 141  # what a shell reports for a program ended by SIGPIPE (128 + 13)

EXIT_OK = 0
EXIT_USAGE = 2
# the order commands are listed in `qmgui --help`; modules not named here follow, sorted
ORDER = (
    "scan", "roots", "plan", "place", "preview", "import_cmd", "serve", "export", "backends",
    "doctor",
)  # fmt: skip


WINDOW_HELP = """\
the window:
  qmgui                      open the window (on a desktop; without a display the
                             command line scans instead and says so)
  qmgui --minimized          start in the tray (what "Start with the session" runs)
  qmgui --theme light|dark   open the window in a light or dark theme
  qmgui --screenshot F.png [--models DIR] [--select NAME] [--size WxH]
                             open the window offscreen, save a picture of it, quit
  qmgui PATH                 scan a folder or a model file (same as qmgui scan PATH)
"""


def _command_names() -> list[str]:
    """The modules of this package, in `qmgui --help` order (a command is a module with a
    `register(subparsers)`)."""
    import pkgutil  # noqa: PLC0415 - a listing for --help, not on a command's path

    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    return names


# commands whose module has another name (`import` is a Python keyword)
_MODULE_OF = {"import": "import_cmd"}


def _module_for(word: str) -> str | None:
    """The module of the command `word`, or None when it names none."""
    if word in _MODULE_OF:
        return _MODULE_OF[word]
    if not word.isidentifier() or word.startswith("_"):
        return None
    try:  # a lookup of the one module, not a listing of the package (a `plan` starts faster)
        spec = importlib.util.find_spec(f"{__name__}.{word}")
    except (ImportError, ValueError):
        return None
    return word if spec is not None else None


def _command_modules(only: str | None = None) -> list[ModuleType]:
    """Every module of this package with a `register(subparsers)`: adding a command is adding
    a module. With `only` (a command's name), just its module: `qmgui plan ...` imports the
    plan command and what it needs, not every command's (settings, engines, exporters)."""
    if only is not None:
        module = importlib.import_module(f"{__name__}.{only}")
        if hasattr(module, "register"):
            return [module]
    modules = [importlib.import_module(f"{__name__}.{n}") for n in _command_names()]
    return [m for m in modules if hasattr(m, "register")]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qmgui",
        description="Find local AI models and size their launches per GPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=WINDOW_HELP,
    )
    p.add_argument("--version", action="version", version=f"qmgui {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(only):
        module.register(sub)
    return p


def join_extra(argv: Sequence[str]) -> list[str]:
    """`--extra WORD` as `--extra=WORD`: argparse refuses a value that starts with a dash
    (`--extra --jinja`), so the word after `--extra` is joined to it, whatever it starts with.
    Words after a lone `--` are left alone."""
    out: list[str] = []
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out.extend(words[i:])
            break
        if word == "--extra" and i + 1 < len(words):
            out.append(f"--extra={words[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def _is_path(word: str, parser: argparse.ArgumentParser) -> bool:
    """Not a command name, and an existing path (or one that looks like a path)."""
    commands: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update(action.choices)
    if word in commands:
        return False
    return os.path.exists(word) or os.sep in word or word.endswith(".gguf")


class TerminalOut(io.TextIOBase):
    """stdout when it is a terminal: what a command prints goes through `terminal_text`, so a
    crafted model name, path or metadata string cannot send escape sequences to the terminal.
    Piped or redirected output (JSON, an exported config, a script) is left byte for byte."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream

    def write(self, s: str) -> int:
        self._stream.write(terminal_text(s))
        return len(s)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._stream.fileno()


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    to_stdout = out is sys.stdout
    with contextlib.suppress(AttributeError, ValueError):
        if out.isatty() and not isinstance(out, TerminalOut):
            out = cast(TextIO, TerminalOut(out))
    err = err or sys.stderr
    argv = join_extra(sys.argv[1:] if argv is None else argv)
    # a command named first: only its module is imported, so `qmgui plan` starts fast
    parser = build_parser(_module_for(argv[0]) if argv else None)
    if argv and not argv[0].startswith("-") and _is_path(argv[0], parser):
        argv = ["scan", *argv]  # `qmgui ~/models`: what a user means is a scan of it
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help/--version
        return int(e.code or 0)
    # every message for the user goes through the notifier; the CLI prints them on stderr
    # (and keeps Python's last-resort logging handler from printing them a second time)
    notify.quiet_fallback()
    unsubscribe = notify.notifier.subscribe(lambda m: print(f"qmgui: {m.text}", file=err))
    try:
        if args.command is None:
            # no window yet: show what qmgui finds on this machine, and how to ask for more
            from qmgui.__main__ import display_available  # noqa: PLC0415

            if not display_available():
                print(
                    "qmgui: no display (DISPLAY and WAYLAND_DISPLAY are unset), so no window: "
                    "run qmgui in a desktop session (or ssh -X) for it, or "
                    "`qmgui --screenshot shot.png` for a picture of it",
                    file=err,
                )
            print(
                "qmgui: scanning the configured roots and the LM Studio, Ollama and "
                "Hugging Face stores; `qmgui --help` for more",
                file=err,
            )
            args = parser.parse_args(["scan"])
        gc.enable()  # off while qmgui.__main__ imported the command (start-up speed)
        return int(args.func(args, out))
    except BrokenPipeError:
        # the reader went away (`qmgui scan | head`): what it wanted was printed; stop quietly
        # and keep Python from complaining about the flush of the closed stdout at exit
        if to_stdout:
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    finally:
        unsubscribe()
