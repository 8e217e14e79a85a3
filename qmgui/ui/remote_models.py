"""Models that are not on disk yet: "Open URL…" reads a remote GGUF's header (HTTP range
requests, `qmgui.remote`, on a worker) and the window plans it like a local file, before a
byte of its weights is downloaded. The rows stay for the session, marked "[remote]"; Start on
one downloads it (the Get models dialog, with progress and Cancel), and the downloaded file
replaces the row, keeping the settings chosen for the URL."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QInputDialog, QLineEdit, QWidget

from qmgui import notify
from qmgui.core.discovery import ModelEntry
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.ui.workers import LatestWins

SOURCE = "open URL"
REMOTE = "url"  # ModelEntry.source of a model read over HTTP


def is_remote(entry: ModelEntry | None) -> bool:
    return entry is not None and entry.source == REMOTE


def transfer_words(moved: int, size: int, requests: int) -> str:
    """What reading a header cost, in words ("41.2 KiB in 2 requests, 0.098% of 8.5 GiB")."""
    share = f", {moved / size:.3%} of {format_bytes(size)}" if size else ""
    return f"{format_bytes(moved)} in {requests} request{'s' if requests != 1 else ''}{share}"


class RemoteModels(QObject):
    """The remote rows of the window, and the worker that reads their headers.

    `added(entry)` once a URL's header is read (an unreadable one is a notification naming
    the URL and why, and no row)."""

    added = Signal(object)
    busyChanged = Signal(bool)

    def __init__(
        self,
        parent: QWidget,
        *,
        show_work: Callable[[str], str],
        end_work: Callable[[str], None],
    ) -> None:
        super().__init__(parent)
        self._parent = parent
        self._show_work, self._end_work = show_work, end_work
        self._message = ""
        self._entries: dict[str, ModelEntry] = {}
        self.reader = LatestWins("remote-header", self)
        self.reader.finished.connect(self._on_read)
        self.reader.failed.connect(self._on_failed)
        self.reader.busyChanged.connect(self.busyChanged)

    @property
    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    @property
    def busy(self) -> bool:
        return self.reader.busy

    def ask(self) -> None:
        """Ask for a URL (a dialog) and read it."""
        text, ok = QInputDialog.getText(
            self._parent,
            "Open URL",
            "The URL of a .gguf file (a split set: any shard's).\n"
            "Only its header is read, to plan it before downloading:",
            QLineEdit.EchoMode.Normal,
            "https://huggingface.co/OWNER/REPO/resolve/main/MODEL.gguf",
        )
        if ok and text.strip():
            self.open(text.strip())

    def open(self, url: str) -> None:
        """Read the header at `url` on the worker; the row comes with `added`."""
        from qmgui import remote  # noqa: PLC0415 - network code only when a URL is opened

        if not remote.is_url(url):
            notify.error(
                f"{printable(url)[:200]} is not a URL: give one starting with https:// "
                "(Add folder… opens a file on this machine)",
                source=SOURCE,
            )
            return
        self._end_work(self._message)
        self._message = self._show_work(
            f"Reading the header of {printable(remote.file_name_of(url))} over HTTP…"
        )
        self.reader.submit(lambda: remote.read_url(url))

    def _on_read(self, read: object) -> None:
        from qmgui.remote import RemoteRead  # noqa: PLC0415

        assert isinstance(read, RemoteRead)
        self._end_work(self._message)
        e = read.entry
        if e.error:
            notify.error(f"{printable(e.path)}: {e.error}", source=SOURCE)
            return
        self._entries[e.id] = e
        cost = transfer_words(read.transferred_bytes, read.size_bytes, read.requests)
        notify.info(
            f"{printable(e.name)}: planned from its header ({cost}); Start downloads it",
            source=SOURCE,
        )
        self.added.emit(e)

    def _on_failed(self, text: str) -> None:
        self._end_work(self._message)
        notify.error(text, source=SOURCE)

    def downloaded(self, paths: Sequence[str]) -> list[tuple[ModelEntry, str]]:
        """The remote rows that `paths` (files just downloaded) bring to disk, each with the
        local path of its first file; those rows are dropped."""
        by_name = {os.path.basename(p): os.path.abspath(p) for p in paths}
        done: list[tuple[ModelEntry, str]] = []
        for key, e in list(self._entries.items()):
            names = [os.path.basename(_file_name(u)) for u in (e.shards or (e.path,))]
            if names and all(n in by_name for n in names):
                done.append((e, by_name[names[0]]))
                del self._entries[key]
        return done

    def wait(self) -> None:
        self.reader.cancel()
        self.reader.wait()


def _file_name(url: str) -> str:
    from qmgui.remote import file_name_of  # noqa: PLC0415

    return file_name_of(url)
