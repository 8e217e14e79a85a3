"""Download a model over HTTP(S) into a model root: resumable, verified, never half-listed.

`qmgui get URL --to DIR` (and later the window's "Get models") calls `download_url`:

- **Where.** The file keeps the name in its URL, which is checked like any hostile name: no
  folder separators, no `.`/`..`, no control characters, not hidden, at most 200 bytes; the
  final path must lie directly in the target folder, and nothing is written through a symlink.
- **Temporary name.** Bytes go to `NAME.part` (discovery skips it: not a `.gguf`, and `.part`
  is one of its partial suffixes), with `NAME.part.json` beside it holding the URL, size and
  ETag; a verified file is fsynced and renamed to `NAME` at the end, so a partial file is never
  listed as a model. A `NAME.part.lock` keeps two downloads of the same file apart.
- **Resume.** A later run (or an automatic retry after a cut connection) asks for
  `Range: bytes=HAVE-` with `If-Range: ETAG`, so a file that changed on the server starts over
  instead of being spliced; a server without byte ranges restarts from zero (and says so).
- **Verify.** The size always; the SHA-256 when one is known: given by the caller, the
  Hugging Face `X-Linked-Etag` of an LFS file, or an ETag that is a SHA-256. A mismatch
  removes the partial file.
- **Room.** Before the first byte, the bytes still missing (all shards of a split set
  together) are compared with the free space of the target folder; too little refuses with how
  much is needed. A disk that fills anyway (another writer) ends with a sentence, and the part
  already written is kept for a resume.
- **Cancel and progress.** A `CancelToken` is checked between chunks (a cancelled download
  resumes later); `progress(Progress)` is called at most every `PROGRESS_EVERY_S`.

Every failure is a `DownloadError` with one sentence (404, 401/403 with `HF_TOKEN`, offline,
timeouts, disk full, checksum, a server that lies about sizes). Standard library only (urllib);
imported only by the commands that download.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPException, HTTPResponse
from typing import Any

from qmgui import __version__
from qmgui.core.errors import DownloadError
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.remote import (
    SCHEMES,
    TIMEOUT_S,
    TOKEN_ENV,
    RemoteFile,
    Transfer,
    _host,
    _Redirects,
    _token_from_env,
    file_name_of,
    shard_urls,
    url_scheme,
)

PART_SUFFIX = ".part"
META_SUFFIX = ".part.json"
LOCK_SUFFIX = ".part.lock"
CHUNK = 1 << 20
PROGRESS_EVERY_S = 0.2
RETRIES = 3  # automatic resumes after a cut connection, within one run
RETRY_DELAY_S = 1.0
MAX_NAME_BYTES = 200  # leaves room for the temporary suffixes within 255
_SHA256 = re.compile(r'^(?:W/)?"?([0-9a-fA-F]{64})"?$')
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d{1,19})-(\d{1,19})/(\d{1,19})\s*$", re.IGNORECASE)
_BAD_NAME_CHARS = re.compile(r'[\x00-\x1f\x7f/\\<>:"|?*]')

DiskUsage = Callable[[str], Any]  # shutil.disk_usage's shape: an object with .free


class DownloadCancelled(DownloadError):
    """The download was cancelled; the part already written is kept and a later run resumes."""


class CancelToken:
    """Set by whoever may cancel (the window's Cancel button, Ctrl-C); read between chunks."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass(frozen=True)
class Progress:
    """Where a download stands: the file (`index` of `count`), its bytes, and all files'."""

    name: str
    index: int
    count: int
    done: int
    total: int
    all_done: int
    all_total: int
    resumed_from: int = 0


@dataclass(frozen=True)
class Fetched:
    """One file downloaded (or found complete already)."""

    path: str
    size: int
    sha256: str | None  # the checksum it was verified against, when one was known
    resumed_from: int  # bytes that were already on disk when this run started
    fetched: int  # bytes received in this run
    already_there: bool = False


@dataclass(frozen=True)
class DownloadResult:
    files: list[Fetched]
    notes: list[str] = field(default_factory=list)  # sentences for the user (restarts, ...)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]


@dataclass
class _Remote:
    """What the server says about one file before its bytes are asked for."""

    url: str
    name: str
    size: int
    etag: str | None
    sha256: str | None
    ranges: bool


def check_file_name(name: str) -> str | None:
    """Why `name` (from a URL or a repository: attacker-controlled) cannot be a file in the
    target folder, or None when it can."""
    if not name or name in (".", ".."):
        return "it is empty"
    if _BAD_NAME_CHARS.search(name):
        return "it holds a folder separator, a control character or a character Windows forbids"
    if name.startswith((".", " ")) or name.endswith((".", " ")):
        return "it starts or ends with a dot or a space"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def target_path(folder: str, name: str) -> str:
    """The path of `name` directly inside `folder`; DownloadError when the name could escape
    it or is not a usable file name."""
    why = check_file_name(name)
    if why is not None:
        raise DownloadError(
            f"refusing the file name {printable(name)[:120]!r}: {why}; qmgui writes only plain "
            "file names inside the target folder"
        )
    path = os.path.join(folder, name)
    if os.path.dirname(os.path.abspath(path)) != os.path.abspath(folder):
        raise DownloadError(f"refusing the file name {printable(name)[:120]!r}: it leaves {folder}")
    return path


class _Recording(_Redirects):
    """The redirect handler of qmgui.remote (http(s) only, the token to the named host only),
    keeping the headers of each redirect: Hugging Face puts an LFS file's SHA-256 and size
    (`X-Linked-Etag`, `X-Linked-Size`) on the redirect, not on the CDN's answer."""

    def __init__(self, auth_host: str) -> None:
        super().__init__(auth_host)
        self.seen: list[Any] = []

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        self.seen.append(headers)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Client:
    """One file's requests: sentences for failures come from qmgui.remote's wording."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self.auth_host = _host(url)
        self.words = RemoteFile(url, Transfer(), token=token, timeout=timeout)

    def fail(self, reason: str) -> DownloadError:
        return DownloadError(f"{printable(self.url)[:300]}: {reason}")

    def open(self, headers: dict[str, str]) -> tuple[HTTPResponse, list[Any]]:
        handler = _Recording(self.auth_host)
        opener = urllib.request.build_opener(handler)
        headers = {
            "Accept-Encoding": "identity",
            "User-Agent": f"qmgui/{__version__}",
            **headers,
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            resp = opener.open(
                urllib.request.Request(self.url, headers=headers), timeout=self.timeout
            )
        except urllib.error.HTTPError as e:
            e.close()
            raise self.fail(self.words._http_sentence(e.code, str(e.reason))) from None
        except urllib.error.URLError as e:
            raise self.fail(self.words._network_sentence(e.reason)) from None
        except (OSError, HTTPException, ValueError) as e:
            raise self.fail(self.words._network_sentence(e)) from None
        return resp, handler.seen

    def probe(self, name: str) -> _Remote:
        """Size, ETag, checksum and range support, from a one-byte range request."""
        resp, redirects = self.open({"Range": "bytes=0-0"})
        try:
            size = -1
            ranges = resp.status == 206
            if ranges:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if m:
                    size = int(m.group(3))
            else:
                declared = resp.headers.get("Content-Length", "")
                if declared.isdigit() and len(declared) <= 19:
                    size = int(declared)
            if size < 0:
                raise self.fail(
                    "the server does not say how large the file is (no Content-Length or "
                    "Content-Range); qmgui cannot check the download or the disk space"
                )
            etag = resp.headers.get("ETag")
            sha = None
            for h in [*redirects, resp.headers]:
                for key in ("X-Linked-Etag", "ETag"):
                    m2 = _SHA256.match((h.get(key) or "").strip())
                    if m2:
                        sha = m2.group(1).lower()
            linked_sizes = [h.get("X-Linked-Size", "") for h in redirects]
            for linked in linked_sizes:
                if linked.isdigit() and len(linked) <= 19 and int(linked) != size:
                    raise self.fail(
                        f"the server gives two sizes for the file ({linked} and {size} bytes); "
                        "try again later"
                    )
        finally:
            resp.close()
        return _Remote(self.url, name, size, etag.strip() if etag else None, sha, ranges)


def _read_meta(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read(65536))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_meta(path: str, remote: _Remote) -> None:
    tmp = path + ".new"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(tmp, flags, 0o644), "w", encoding="utf-8") as f:
        json.dump({"url": remote.url, "size": remote.size, "etag": remote.etag}, f)
    os.replace(tmp, path)


def _file_size(path: str) -> int:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return -1
    if not os.path.isfile(path) or os.path.islink(path):
        raise DownloadError(
            f"{path} exists and is not a plain file; remove it or choose another folder"
        )
    return st.st_size


def _usable_have(remote: _Remote, part: str, meta: str) -> int:
    """Bytes of the temporary file a resume can keep: 0 when it belongs to another URL,
    another size or ETag, or the server cannot resume."""
    have = _file_size(part)
    if have <= 0:
        return 0
    saved = _read_meta(meta)
    same = (
        saved.get("url") == remote.url
        and saved.get("size") == remote.size
        and (remote.etag is None or saved.get("etag") == remote.etag)
    )
    if not same or not remote.ranges or have > remote.size:
        return 0
    return have


def _hash_of(path: str, upto: int, cancel: CancelToken | None) -> Any:
    h = hashlib.sha256()
    left = upto
    with open(path, "rb") as f:
        while left > 0:
            if cancel is not None and cancel.cancelled:
                raise DownloadCancelled("cancelled while checking the part already downloaded")
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h


def _disk_sentence(e: OSError, folder: str, name: str, done: int, total: int) -> DownloadError:
    where = f"after {format_bytes(done)} of {format_bytes(total)} of {printable(name)}"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError(
            f"the disk holding {printable(folder)} is full {where}; free some space and run "
            "the same command again to resume"
        )
    return DownloadError(
        f"cannot write to {printable(folder)} {where} ({printable(e.strerror or str(e))}); "
        "check the folder's permissions and the disk"
    )


class _Run:
    """One call of `download_url`: the files, the progress, the cancel token."""

    def __init__(
        self,
        folder: str,
        *,
        token: str | None,
        timeout: float,
        progress: Callable[[Progress], None] | None,
        cancel: CancelToken | None,
        retries: int,
        retry_delay: float,
        chunk: int,
    ) -> None:
        self.folder = folder
        self.token = token
        self.timeout = timeout
        self.progress = progress
        self.cancel = cancel
        self.retries = retries
        self.retry_delay = retry_delay
        self.chunk = chunk
        self.notes: list[str] = []
        self.all_done = 0
        self.all_total = 0
        self.last_report = 0.0
        self.resumed_from = 0  # of the file being fetched

    def report(
        self, remote: _Remote, index: int, count: int, done: int, start: int, *, force: bool = False
    ) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self.last_report < PROGRESS_EVERY_S:
            return
        self.last_report = now
        self.progress(
            Progress(
                remote.name, index, count, done, remote.size, self.all_done, self.all_total, start
            )
        )

    def check_cancel(self, name: str, done: int, total: int) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise DownloadCancelled(
                f"cancelled after {format_bytes(done)} of {format_bytes(total)} of "
                f"{printable(name)}; run the same download again to resume"
            )

    def _resumable(self, remote: _Remote, part: str, meta: str) -> int:
        """The bytes of an earlier part this download keeps (notes say what it cannot)."""
        have = _usable_have(remote, part, meta)
        if have == 0 and _file_size(part) > 0:
            why = (
                "the server cannot resume"
                if not remote.ranges
                else "it is of another file or version"
            )
            self.notes.append(
                f"{printable(remote.name)}: the earlier partial download was discarded ({why})"
            )
        if not remote.ranges:
            self.notes.append(
                f"{printable(remote.name)}: the server does not support byte ranges, so a cut "
                "or cancelled download of it starts over"
            )
        return have

    def fetch(
        self, remote: _Remote, path: str, index: int, count: int, sha256: str | None
    ) -> Fetched:
        part, meta = path + PART_SUFFIX, path + META_SUFFIX
        client = _Client(remote.url, self.token, self.timeout)
        have = self._resumable(remote, part, meta)
        started_with = self.resumed_from = have
        want = sha256 or remote.sha256
        hasher = _hash_of(part, have, self.cancel) if want and have else hashlib.sha256()
        _write_meta(meta, remote)
        fetched = 0
        attempts = 0
        while True:
            try:
                have, hasher, got = self._stream(
                    client, remote, part, have, hasher, where=(index, count)
                )
                fetched += got
                break
            except DownloadCancelled:
                raise
            except DownloadError as e:
                if have <= 0 or not remote.ranges or "resume" in str(e):
                    raise
                raise DownloadError(
                    f"{e}; the {format_bytes(have)} downloaded so far are kept: run the same "
                    "command again to resume"
                ) from None
            except _Cut as cut:
                fetched += cut.got
                have, hasher = cut.have, cut.hasher
                attempts += 1
                if not remote.ranges:
                    raise client.fail(
                        f"the connection broke after {format_bytes(have)} of "
                        f"{format_bytes(remote.size)} ({cut.why}), and this server does not "
                        "support byte ranges, so the download cannot resume: try again "
                        "(it starts over)"
                    ) from None
                if attempts > self.retries:
                    raise client.fail(
                        f"the connection broke after {format_bytes(have)} of "
                        f"{format_bytes(remote.size)} ({cut.why}); run the same command again "
                        "to resume from there"
                    ) from None
                self.notes.append(
                    f"{printable(remote.name)}: the connection broke at {have} of {remote.size} "
                    f"bytes ({cut.why}); resumed"
                )
                time.sleep(self.retry_delay)
        if have != remote.size:
            raise client.fail(f"received {have} bytes of {remote.size}; run again to resume")
        digest = hasher.hexdigest() if want else None
        if want and digest != want:
            for p in (part, meta):
                with contextlib.suppress(OSError):
                    os.remove(p)
            raise client.fail(
                f"the downloaded file does not match its SHA-256 (expected {want}, got "
                f"{digest}); the partial file was removed: try again"
            )
        os.replace(part, path)
        with contextlib.suppress(OSError):
            os.remove(meta)
        _fsync_dir(self.folder)
        return Fetched(path, remote.size, want, started_with, fetched)

    def _stream(
        self,
        client: _Client,
        remote: _Remote,
        part: str,
        have: int,
        hasher: Any,
        *,
        where: tuple[int, int],
    ) -> tuple[int, Any, int]:
        index, count = where
        if have == remote.size:  # complete already (a resume of a finished part)
            return have, hasher, 0
        headers: dict[str, str] = {}
        if have > 0:
            headers["Range"] = f"bytes={have}-"
            if remote.etag and not remote.etag.startswith("W/"):
                headers["If-Range"] = remote.etag
        resp, _ = client.open(headers)
        got = 0
        try:
            if have > 0 and resp.status == 200:
                self.notes.append(
                    f"{printable(remote.name)}: the server sent the whole file (it changed, or "
                    "does not resume); started over"
                )
                self.all_done -= have
                have, hasher = 0, hashlib.sha256()
            if resp.status == 200 and resp.headers.get("Content-Length") != str(remote.size):
                raise client.fail(
                    "the file changed on the server since the download began (another size); "
                    "run the same command again"
                )
            if have > 0:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if (
                    resp.status != 206
                    or not m
                    or int(m.group(1)) != have
                    or int(m.group(3)) != remote.size
                ):
                    raise client.fail(
                        "the server answered the resume with other bytes than asked for; remove "
                        f"{printable(part)} and try again"
                    )
            flags = (
                os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
            )
            fd = os.open(part, flags, 0o644)
            try:
                os.ftruncate(fd, have)
                os.lseek(fd, have, os.SEEK_SET)
                while have < remote.size:
                    self.check_cancel(remote.name, have, remote.size)
                    try:
                        data = resp.read1(min(self.chunk, remote.size - have))
                    except (OSError, HTTPException) as e:
                        raise _Cut(
                            have, hasher, got, printable(str(e))[:80] or type(e).__name__
                        ) from None
                    if not data:
                        raise _Cut(have, hasher, got, "the server closed the connection")
                    try:
                        _write_all(fd, data)
                    except OSError as e:
                        raise _disk_sentence(
                            e, self.folder, remote.name, have, remote.size
                        ) from None
                    hasher.update(data)
                    have += len(data)
                    got += len(data)
                    self.all_done += len(data)
                    self.report(remote, index, count, have, self.resumed_from)
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            resp.close()
        self.report(remote, index, count, have, self.resumed_from, force=True)
        return have, hasher, got


class _Cut(Exception):
    """The connection broke mid-body: how far it got (for a resume)."""

    def __init__(self, have: int, hasher: Any, got: int, why: str) -> None:
        super().__init__(why)
        self.have, self.hasher, self.got, self.why = have, hasher, got, why


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def download_url(
    url: str,
    folder: str,
    *,
    sha256: str | None = None,
    token: str | None = None,
    timeout: float = TIMEOUT_S,
    progress: Callable[[Progress], None] | None = None,
    cancel: CancelToken | None = None,
    retries: int = RETRIES,
    retry_delay: float = RETRY_DELAY_S,
    chunk: int = CHUNK,
    disk_usage: DiskUsage = shutil.disk_usage,
) -> DownloadResult:
    """Download the file at `url` (every shard of a split set, from any shard's URL) into
    `folder`. `token` defaults to $HF_TOKEN and goes to the URL's host only. Raises
    DownloadError (DownloadCancelled when `cancel` was set) with a sentence; what was already
    downloaded is kept for the next call, which resumes it."""
    if url_scheme(url) not in SCHEMES:
        raise DownloadError(
            f"only http:// and https:// URLs can be downloaded, not "
            f"{printable(url_scheme(url))[:20]}://"
        )
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise DownloadError("--sha256 must be 64 hexadecimal digits")
    if token is None:
        token = _token_from_env()
    if token is not None and not re.fullmatch(r"[\x21-\x7e]{1,4096}", token):
        raise DownloadError(f"{TOKEN_ENV} holds characters no access token has; set it again")
    if not os.path.isdir(folder):
        raise DownloadError(
            f"{printable(folder)} is not a folder; create it first or choose another"
        )
    try:
        urls = shard_urls(url)
    except ValueError as e:
        raise DownloadError(str(e)) from None
    if sha256 is not None and len(urls) > 1:
        raise DownloadError("--sha256 names one file; a split set's shards each have their own")
    jobs = [(u, target_path(folder, file_name_of(u))) for u in urls]

    from filelock import FileLock, Timeout  # noqa: PLC0415 - only downloads lock

    run = _Run(
        folder,
        token=token,
        timeout=timeout,
        progress=progress,
        cancel=cancel,
        retries=retries,
        retry_delay=retry_delay,
        chunk=chunk,
    )
    locks = []
    try:
        for _, path in jobs:
            lock = FileLock(path + LOCK_SUFFIX)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                raise DownloadError(
                    f"another download of {printable(os.path.basename(path))} into "
                    f"{printable(folder)} is running; wait for it or cancel it"
                ) from None
            locks.append(lock)
        return _download(run, jobs, sha256, disk_usage)
    finally:
        for lock in locks:
            lock.release()
            with contextlib.suppress(OSError):
                os.remove(lock.lock_file)


def _download(
    run: _Run, jobs: list[tuple[str, str]], sha256: str | None, disk_usage: DiskUsage
) -> DownloadResult:
    remotes: list[_Remote] = []
    for u, path in jobs:
        run.check_cancel(os.path.basename(path), 0, 0)
        remotes.append(_Client(u, run.token, run.timeout).probe(os.path.basename(path)))
    missing = 0
    complete: list[bool] = []
    for remote, (_, path) in zip(remotes, jobs, strict=True):
        size = _file_size(path)
        if size == remote.size:
            complete.append(True)
            continue
        if size >= 0:
            raise DownloadError(
                f"{printable(path)} already exists with another size ({size} bytes, the server's "
                f"is {remote.size}); remove it or choose another folder"
            )
        complete.append(False)
        have = _usable_have(remote, path + PART_SUFFIX, path + META_SUFFIX)
        missing += remote.size - have
        run.all_done += have
    run.all_total = sum(r.size for r in remotes)
    free = int(disk_usage(run.folder).free)
    if missing > free:
        raise DownloadError(
            f"not enough room in {printable(run.folder)}: the download needs "
            f"{format_bytes(missing)} more and {format_bytes(free)} is free; free "
            f"{format_bytes(missing - free)} or choose another folder"
        )
    files: list[Fetched] = []
    for i, (remote, (_, path), done) in enumerate(
        zip(remotes, jobs, complete, strict=True), start=1
    ):
        if done:
            run.all_done += remote.size
            files.append(Fetched(path, remote.size, None, remote.size, 0, already_there=True))
            continue
        files.append(run.fetch(remote, path, i, len(jobs), sha256))
    return DownloadResult(files, run.notes)
