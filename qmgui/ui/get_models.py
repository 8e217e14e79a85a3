"""The "Get models" dialog: search Hugging Face, see a repository's GGUF models with their size
and fit on this machine at a chosen context (the best that fits first), and download one into
a model folder with a progress row and Cancel (a cancelled download resumes next time).

Everything slow (the search, the listing and its header reads, the download) runs on worker
threads (`workers.LatestWins`); the download reports through a queued signal and stops at
the next chunk when Cancel sets its token. `downloaded(paths)` is the window's hook (add the
folder as a root, rescan)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from qmgui import notify
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.ui.model_table import BADGE_COLOURS
from qmgui.ui.planning import Badge
from qmgui.ui.workers import LatestWins

ROLE = Qt.ItemDataRole.UserRole
RESERVE = 512 << 20


class _Progress(QObject):
    """Carries download progress from the worker thread to the GUI thread."""

    moved = Signal(object)


def this_machine() -> tuple[str, tuple[Any, ...]]:
    """This machine's GPUs as they read now (worker), with a label."""
    from qmgui.hw.gpus import as_gpus, local_gpus  # noqa: PLC0415

    return "this machine", as_gpus(local_gpus(), lambda g: f"GPU{g.index}")


def _list_repo(
    repo_id: str, ctx: int, hardware: Callable[[], tuple[str, tuple[Any, ...]]]
) -> tuple[Any, list[Any], str]:
    """The listing of `repo_id` and each model's fit on `hardware` at `ctx` (worker)."""
    from qmgui import hub  # noqa: PLC0415

    found = hub.listing(repo_id)
    label, gpus = hardware()
    return found, hub.fit_models(hub.size_models(found), gpus, ctx, reserve=RESERVE), label


class GetModelsDialog(QDialog):
    def __init__(
        self,
        parent: QWidget | None,
        *,
        folder: str = "",
        downloaded: Callable[[Sequence[str]], None] | None = None,
        hardware: Callable[[], tuple[str, tuple[Any, ...]]] = this_machine,
    ) -> None:
        super().__init__(parent)
        # the window's hardware choice (this machine or a what-if profile): what "fits" means
        self._hardware = hardware
        self._queue: list[tuple[list[tuple[str, str | None]], str]] = []  # waiting downloads
        self.setWindowTitle("Get models")
        self.setObjectName("get-models-dialog")
        self.resize(760, 520)
        self._downloaded = downloaded
        self._found: Any = None
        self._cancel: Any = None
        self.searcher = LatestWins("hub-search", self)
        self.lister = LatestWins("hub-list", self)
        self.getter = LatestWins("hub-get", self)
        self._progress = _Progress(self)
        self._progress.moved.connect(self._on_progress, Qt.ConnectionType.QueuedConnection)
        self._build(folder)
        self._connect()

    def _build(self, folder: str) -> None:
        self.query = QLineEdit(self)
        self.query.setPlaceholderText("Search Hugging Face for GGUF models (e.g. qwen3 8b)")
        self.search_button = QPushButton("Search", self)
        self.repos = QListWidget(self)
        self.repos.setAccessibleName("Repositories")
        self.ctx = QSpinBox(self)
        self.ctx.setRange(512, 1 << 20)
        self.ctx.setSingleStep(4096)
        self.ctx.setValue(8192)
        self.ctx.setPrefix("context ")
        self.models = QTreeWidget(self)
        self.models.setHeaderLabels(["Quant", "Size", "Fit", "Files"])
        self.models.setRootIsDecorated(False)
        self.models.setAccessibleName("Models of the repository")
        self.folder = QLineEdit(folder, self)
        self.folder.setPlaceholderText("the model folder to download into")
        self.browse = QPushButton("Browse…", self)
        self.download_button = QPushButton("Download", self)
        self.download_button.setEnabled(False)
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setEnabled(False)
        self.status = QLabel("", self)
        self.status.setWordWrap(True)
        self.queue_label = QLabel("", self)
        self.queue_label.setWordWrap(True)
        self.queue_label.hide()
        self._lay_out()

    def _lay_out(self) -> None:
        top = QHBoxLayout()
        top.addWidget(self.query, 1)
        top.addWidget(self.search_button)
        middle = QHBoxLayout()
        middle.addWidget(self.repos, 1)
        right = QVBoxLayout()
        right.addWidget(self.ctx)
        right.addWidget(self.models, 1)
        middle.addLayout(right, 2)
        where = QHBoxLayout()
        where.addWidget(QLabel("Into:", self))
        where.addWidget(self.folder, 1)
        where.addWidget(self.browse)
        where.addWidget(self.download_button)
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        row.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addLayout(middle, 1)
        layout.addLayout(where)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.queue_label)

    def _connect(self) -> None:
        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.repos.currentItemChanged.connect(lambda *_: self.list_current())
        self.ctx.editingFinished.connect(self.list_current)
        self.models.currentItemChanged.connect(lambda *_: self._update_buttons())
        self.folder.textChanged.connect(lambda *_: self._update_buttons())
        self.browse.clicked.connect(self._browse)
        self.download_button.clicked.connect(self.download)
        self.cancel_button.clicked.connect(self.cancel)
        self.searcher.finished.connect(self._on_found)
        self.lister.finished.connect(self._on_listed)
        self.getter.finished.connect(self._on_got)
        for runner in (self.searcher, self.lister, self.getter):
            runner.failed.connect(self._on_failed)

    # --- actions -----------------------------------------------------------------------------

    def search(self) -> None:
        text = self.query.text().strip()
        if not text:
            return
        from qmgui import hub  # noqa: PLC0415

        self.status.setText(f"Searching for {text!r}…")
        self.searcher.submit(lambda: hub.search(text))

    def list_current(self) -> None:
        item = self.repos.currentItem()
        if item is None:
            return
        repo, ctx, hardware = str(item.data(ROLE)), self.ctx.value(), self._hardware
        self.models.clear()
        self._found = None
        self._update_buttons()
        self.status.setText(f"Reading the models of {repo} (their headers, for the fit)…")
        self.lister.submit(lambda: _list_repo(repo, ctx, hardware))

    def download(self) -> None:
        """Download the chosen model of the listed repository (and its projector)."""
        item = self.models.currentItem()
        if item is None or self._found is None:
            return
        from qmgui import hub  # noqa: PLC0415

        self._fetch(hub.download_jobs(self._found, item.data(0, ROLE)), printable(item.text(3)))

    def download_url(self, url: str, label: str) -> bool:
        """Download the GGUF at `url` (every shard of a split set) into the folder on show:
        the window's Start on a model planned from its URL. False when a download runs."""
        return self._fetch([(url, None)], printable(label))

    def _fetch(self, jobs: list[tuple[str, str | None]], label: str) -> bool:
        """Start downloading `jobs`, or queue them behind the running download."""
        folder = self.folder.text().strip()
        if not jobs or not folder:
            return False
        if self.getter.busy or self._queue:
            self._queue.append((jobs, label))
            self._show_queue()
            return True
        from qmgui import download  # noqa: PLC0415

        cancel = download.CancelToken()
        self._cancel = cancel
        moved = self._progress.moved

        def work() -> list[str]:
            os.makedirs(folder, exist_ok=True)  # the folder on show, named by the user
            paths: list[str] = []
            for url, sha in jobs:
                result = download.download_url(
                    url, folder, sha256=sha, cancel=cancel, progress=moved.emit
                )
                paths += result.paths
            return paths

        self.bar.setValue(0)
        self.cancel_button.setEnabled(True)
        self.status.setText(f"Downloading {label}…")
        self.getter.submit(work)
        self._update_buttons()
        return True

    def _show_queue(self) -> None:
        waiting = ", ".join(label for _, label in self._queue)
        self.queue_label.setText(f"Queued: {waiting}" if waiting else "")
        self.queue_label.setVisible(bool(waiting))

    def _next(self) -> None:
        """The running download ended: start the first waiting one."""
        if self._queue and not self.getter.busy:
            jobs, label = self._queue.pop(0)
            self._show_queue()
            self._fetch(jobs, label)

    def cancel(self) -> None:
        """Cancel the running download (kept for a resume) and forget the queued ones."""
        self._queue.clear()
        self._show_queue()
        if self._cancel is not None:
            self._cancel.cancel()
            self.status.setText("Cancelling (what was downloaded is kept for a resume)…")

    def wait(self) -> None:
        """Join the workers (the window on close, tests before they end)."""
        self.cancel()
        for runner in (self.searcher, self.lister, self.getter):
            runner.wait()

    def closeEvent(self, event: Any) -> None:
        self.cancel()
        super().closeEvent(event)

    # --- results -----------------------------------------------------------------------------

    def _on_found(self, hits: list[Any]) -> None:
        self.repos.clear()
        for h in hits:
            gated = "  (gated: needs HF_TOKEN)" if h.gated else ""
            item = QListWidgetItem(f"{h.repo_id}  ·  {h.downloads:,} downloads{gated}")
            item.setData(ROLE, h.repo_id)
            self.repos.addItem(item)
        self.status.setText(f"{len(hits)} repositories" if hits else "Nothing found")

    def _on_listed(self, result: tuple[Any, list[Any], str]) -> None:
        from qmgui import hub  # noqa: PLC0415

        found, fits, where = result
        self._found = found
        self.models.clear()
        best = None
        for f in fits:
            m = f.model
            fit = "fits" if f.fits else "?" if f.fits is None else "does not fit"
            files = m.first.path + (f" ({len(m.files)} shards)" if m.shard_count > 1 else "")
            extra = hub.projector_for(m)
            if extra is not None:
                files += f" + {extra.path.rsplit('/', 1)[-1]}"
            item = QTreeWidgetItem([m.quant or "-", format_bytes(m.size), fit, printable(files)])
            item.setData(0, ROLE, m)
            if f.fits is not None:  # the table's badge colours
                item.setForeground(2, BADGE_COLOURS[Badge.FITS if f.fits else Badge.NO_FIT])
            if f.note:
                item.setToolTip(2, printable(f.note))
            self.models.addTopLevelItem(item)
            if f.fits and best is None:
                best = item
        if best is not None:
            self.models.setCurrentItem(best)  # the best that fits, offered first
        for col in range(3):
            self.models.resizeColumnToContents(col)
        self.status.setText(
            f"{found.repo_id}: {len(fits)} models at context {self.ctx.value()} on {where}"
        )
        self._update_buttons()

    def _on_progress(self, p: Any) -> None:
        if p.all_total:
            self.bar.setValue(int(1000 * p.all_done / p.all_total))
        self.status.setText(
            f"{printable(p.name)}: {format_bytes(p.done)} of {format_bytes(p.total)}"
        )

    def _on_got(self, paths: list[str]) -> None:
        self._cancel = None
        self.cancel_button.setEnabled(False)
        self.bar.setValue(1000)
        self.status.setText(f"Downloaded {len(paths)} file(s) into {self.folder.text()}")
        self._update_buttons()
        if self._downloaded is not None:
            self._downloaded(paths)
        self._next()

    def _on_failed(self, text: str) -> None:
        self._cancel = None
        self.cancel_button.setEnabled(False)
        self.status.setText(text)
        self._update_buttons()
        with contextlib.suppress(RuntimeError):
            notify.warning(text, source="get models")
        self._next()  # a failed download does not hold up the others

    def _update_buttons(self) -> None:
        self.download_button.setEnabled(
            self.models.currentItem() is not None
            and self._found is not None
            and bool(self.folder.text().strip())
        )
        self.download_button.setText("Queue download" if self.getter.busy else "Download")

    def _browse(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Download into", self.folder.text())
        if chosen:
            self.folder.setText(chosen)
