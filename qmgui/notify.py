"""The one notifier: every message meant for the user passes through here.

Deep code (settings, discovery, engines) calls ``notify.warning("…")`` instead of opening a
dialog; the GUI subscribes and shows the messages on its own thread, the CLI prints them, and
tests read ``history`` or subscribe. Callbacks run on the thread that posted the message, after
the lock is released, so a subscriber may post or (un)subscribe from inside its callback; a GUI
subscriber must marshal to its thread itself (e.g. through a queued signal).

Tests get a fresh notifier with ``Notifier()``, or reset the module-level one with
``notifier.clear()``.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from typing import TYPE_CHECKING

from qmgui.core.textsafe import printable

if TYPE_CHECKING:
    import logging

__all__ = [
    "HISTORY_SIZE",
    "Level",
    "Message",
    "Notifier",
    "Subscriber",
    "error",
    "info",
    "notifier",
    "warning",
]

HISTORY_SIZE = 200
"""Messages kept for a log view opened late; older ones are dropped first."""

_quiet_fallback = False  # the CLI prints messages itself: no last-resort handler output


def _log() -> logging.Logger:
    """This module's logger; `logging` is imported at the first message (a command that says
    nothing starts without it)."""
    import logging  # noqa: PLC0415

    if _quiet_fallback:
        root = logging.getLogger("qmgui")
        if not any(isinstance(h, logging.NullHandler) for h in root.handlers):
            root.addHandler(logging.NullHandler())
    return logging.getLogger(__name__)


def quiet_fallback() -> None:
    """Keep Python's last-resort logging handler from printing messages a second time (for a
    program that prints every message itself: the command line)."""
    global _quiet_fallback  # noqa: PLW0603 - one switch for the process
    _quiet_fallback = True


class Level(Enum):
    """How much a message matters to the user."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


_LOG_LEVELS = {Level.INFO: 20, Level.WARNING: 30, Level.ERROR: 40}  # logging.INFO, WARNING, ERROR


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Message:
    """One message: ``text`` is the sentence shown, ``detail`` the optional longer part
    (a log excerpt, a traceback), ``source`` the part of qmgui that spoke (e.g. "settings")."""

    level: Level
    text: str
    detail: str | None = None
    source: str | None = None
    time: datetime = field(default_factory=_utc_now)  # aware, UTC

    def __str__(self) -> str:
        where = f"[{self.source}] " if self.source else ""
        return f"{self.level.value}: {where}{self.text}"


Subscriber = Callable[[Message], None]


class Notifier:
    """Posts messages to subscribers and keeps the last ``history_size`` of them; thread-safe."""

    def __init__(self, *, history_size: int = HISTORY_SIZE) -> None:
        if history_size < 1:
            raise ValueError(f"history_size must be at least 1, not {history_size}")
        self._lock = threading.Lock()
        self._history: deque[Message] = deque(maxlen=history_size)
        # Keyed by a token, not by the callback: the same callable may subscribe twice, and
        # bound methods compare equal without being the same object.
        self._subscribers: dict[int, Subscriber] = {}
        self._tokens = itertools.count()

    def info(self, text: str, *, detail: str | None = None, source: str | None = None) -> Message:
        """Post an informational message."""
        return self.post(Message(Level.INFO, text, detail, source))

    def warning(
        self, text: str, *, detail: str | None = None, source: str | None = None
    ) -> Message:
        """Post a warning: something did not work as asked, qmgui carried on."""
        return self.post(Message(Level.WARNING, text, detail, source))

    def error(self, text: str, *, detail: str | None = None, source: str | None = None) -> Message:
        """Post an error: something the user asked for failed."""
        return self.post(Message(Level.ERROR, text, detail, source))

    def post(self, message: Message) -> Message:
        """Record ``message``, log it, and hand it to every subscriber; returns it.

        Messages quote file names, metadata and engine output, any of which may be crafted:
        control characters are written as visible escapes (a name with ESC sequences must not
        recolour the terminal, a newline must not fake a second message); the detail keeps
        its line breaks and tabs."""
        message = _safe(message)
        with self._lock:
            self._history.append(message)
            subscribers = list(self._subscribers.values())
        _log().log(_LOG_LEVELS[message.level], "%s", message)
        for callback in subscribers:
            try:
                callback(message)
            except Exception:
                # One broken subscriber must neither hide the message from the others nor
                # turn a warning into a crash of the code that posted it.
                _log().exception("notifier subscriber %r failed on %r", callback, message.text)
        return message

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with every later message; returns a function that unsubscribes.

        Unsubscribing twice is harmless. Messages already posted are in ``history``.
        """
        with self._lock:
            token = next(self._tokens)
            self._subscribers[token] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(token, None)

        return unsubscribe

    @property
    def history(self) -> tuple[Message, ...]:
        """The kept messages, oldest first (a snapshot)."""
        with self._lock:
            return tuple(self._history)

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def clear_history(self) -> None:
        """Forget the kept messages; subscribers stay (a log view's "Clear" button)."""
        with self._lock:
            self._history.clear()

    def clear(self) -> None:
        """Forget history and subscribers, as if newly built (for test isolation)."""
        with self._lock:
            self._history.clear()
            self._subscribers.clear()


def _safe_detail(detail: str) -> str:
    return "\n".join(
        "\t".join(printable(part) for part in line.split("\t")) for line in detail.split("\n")
    )


def _safe(message: Message) -> Message:
    text = printable(message.text)
    detail = None if message.detail is None else _safe_detail(message.detail)
    source = None if message.source is None else printable(message.source)
    if (text, detail, source) == (message.text, message.detail, message.source):
        return message
    return replace(message, text=text, detail=detail, source=source)


notifier = Notifier()
"""The application's notifier. The functions below look it up at each call, so a test may
replace it (``monkeypatch.setattr(notify, "notifier", Notifier())``) or ``clear()`` it."""


def info(text: str, *, detail: str | None = None, source: str | None = None) -> Message:
    """Post an informational message to the application's notifier."""
    return notifier.info(text, detail=detail, source=source)


def warning(text: str, *, detail: str | None = None, source: str | None = None) -> Message:
    """Post a warning to the application's notifier."""
    return notifier.warning(text, detail=detail, source=source)


def error(text: str, *, detail: str | None = None, source: str | None = None) -> Message:
    """Post an error to the application's notifier."""
    return notifier.error(text, detail=detail, source=source)
