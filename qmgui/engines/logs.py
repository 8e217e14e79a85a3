"""An engine's output: the last lines in memory and every line in a rotating file.

Files go under `platformdirs.user_log_dir("qmgui")`, or `$QMGUI_LOG_DIR` when set, one per
start, named `<model>-<YYYYmmdd-HHMMSS>-<n>.log`; the folder is created 0700 and each file
0600 (created exclusively: never a file or a link that was already there).

Logging is best effort: a write that fails (a full disk, a file made read-only) is counted
(`errors`, `last_error`), reported once through `on_error`, and never raised: the reader
thread keeps draining the engine's pipe, so the engine never blocks on a full pipe and never
dies of a log. The ring buffer keeps every line whatever the disk does.

Secrets never reach the file nor the ring (but see below: a file the engine writes itself
has its output as it wrote it): every line has the `secrets` given (an `--api-key`
value, the contents of an `--api-key-file`, `*_TOKEN` / `*_KEY` environment values; see
`secret_values`) replaced by `<redacted>` before it is kept, so an engine that echoes its
key does not write it down.

An engine that can be left running writes its output to its log file itself
(`qmgui.engines.runner.PopenRunner(output=...)`): its sink is made with `from_file=True`, so
`write_line` (qmgui's own `# qmgui:` lines) only appends to the file, and the supervisor
following the file hands each line to `remember` for the ring. Such a file is rotated by
copy and truncate (`truncate_copy`, when the follower has caught up past `MAX_BYTES` and
nothing came for a poll: the engine's appends go on at the new end; a line written in the
instant between the copy and the truncation would be lost), and it holds the engine's output
as it wrote it: the redaction applies to the ring and to qmgui's lines only (the file is
0600). `follow_file` starts again at the top of a file that was truncated under it.

`prune_logs` keeps the newest `KEEP_PER_MODEL` logs per model and at most `MAX_TOTAL_BYTES`
in all, deleting the oldest first (a log and its rotated parts count as one); the files this
process is writing are never deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import platformdirs

from qmgui.core.textsafe import REDACTED, SECRET_FLAGS, is_secret_env

ENV_LOG_DIR = "QMGUI_LOG_DIR"
RING_LINES = 2000
MAX_BYTES = 8 << 20  # per file before it rotates
BACKUPS = 2
KEEP_PER_MODEL = 10  # logs kept per model name (the newest)
MAX_TOTAL_BYTES = 200 << 20  # all logs together
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words out of every line
SECRET_FILE_BYTES = 64 << 10  # what is read of an --api-key-file
API_KEY_FILE = "--api-key-file"
NAME_CHARS = 80
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
_FLAGS |= getattr(os, "O_NOFOLLOW", 0)
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
_LOG_NAME = re.compile(r"^(?P<model>.+)-\d{8}-\d{6}-\d+(?:-\d+)?\.log(?:\.\d+)?$")

_open_paths: set[str] = set()  # files this process's sinks are writing
_open_lock = threading.Lock()


def log_dir() -> Path:
    """Where engine logs go (created on demand by `LogSink`)."""
    env = os.environ.get(ENV_LOG_DIR)
    return Path(env) if env else Path(platformdirs.user_log_dir("qmgui"))


def log_name(name: str) -> str:
    """`name` as the start of a log file name: no separators, no control characters, no
    leading dot, bounded."""
    safe = _UNSAFE.sub("_", name).strip("._") or "engine"
    return safe[:NAME_CHARS]


def _open_exclusive(path: Path) -> tuple[int, Path]:
    """A new file at `path` (or `path` with `-N` before `.log` when taken), 0600."""
    stem, suffix = (path.name[:-4], ".log") if path.name.endswith(".log") else (path.name, "")
    candidate = path
    for n in range(1, 1000):
        try:
            return os.open(candidate, _FLAGS, 0o600), candidate
        except FileExistsError:
            candidate = path.with_name(f"{stem}-{n}{suffix}")
    raise FileExistsError(f"no free log file name beside {path}")


def _read_secret_file(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = f.read(SECRET_FILE_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def secret_values(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secrets an engine started with `argv` and `env` knows: values of secret flags, the
    lines of an `--api-key-file`, values of secret-named environment variables (`env`, which
    is what the engine gets on top of qmgui's own environment, and qmgui's own). Longest
    first, so a secret that contains another is replaced whole."""
    found: set[str] = set()
    for i, tok in enumerate(argv):
        flag, eq, value = tok.partition("=")
        if flag not in SECRET_FLAGS:
            continue
        if not eq:
            if i + 1 >= len(argv):
                continue
            value = argv[i + 1]
        found.add(value)
        if flag == API_KEY_FILE:
            found.update(_read_secret_file(value))
    for source in (os.environ, env or {}):
        found.update(v for k, v in source.items() if is_secret_env(k))
    return tuple(sorted((s for s in found if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True))


def redact_line(line: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s in line:
            line = line.replace(s, REDACTED)
    return line


class LogSink:
    """Thread-safe: `write_line` from the reader thread, `tail`/`text` from anywhere. Never
    raises once made (a path that cannot be opened is an OSError from the constructor)."""

    def __init__(
        self,
        path: Path | None,
        *,
        ring_lines: int = RING_LINES,
        max_bytes: int = MAX_BYTES,
        backups: int = BACKUPS,
        secrets: Sequence[str] = (),
        on_error: Callable[[OSError], None] | None = None,
        from_file: bool = False,
    ) -> None:
        self.from_file = from_file and path is not None
        self.rotate_at = max_bytes  # from a file: its follower rotates it (`truncate_copy`)
        if self.from_file:
            max_bytes = 1 << 62  # the engine holds the file open: never renamed away
        self._ring: deque[str] = deque(maxlen=ring_lines)
        self._lock = threading.Lock()
        self._max_bytes = max_bytes
        self._backups = backups
        self._secrets = tuple(secrets)
        self._on_error = on_error
        self._size = 0
        self._fd: int | None = None
        self.errors = 0  # lines (or rotations) that could not be written
        self.last_error: OSError | None = None
        self.last_line_at: float | None = None  # time.monotonic() of the latest line
        self.count = 0  # lines kept in the ring so far (more than it holds, in time)
        self.path = path
        if path is not None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd, self.path = _open_exclusive(path)
            with _open_lock:
                _open_paths.add(str(self.path))

    def write_line(self, line: str) -> None:
        line = redact_line(line.rstrip("\r\n"), self._secrets)
        failure: OSError | None = None
        first = False
        with self._lock:
            if not self.from_file or self._fd is None:
                self._ring.append(line)  # from a file, the follower brings it back
                self.count += 1
                self.last_line_at = time.monotonic()
            if self._fd is None:
                return
            try:
                self._write((line + "\n").encode("utf-8", errors="backslashreplace"))
                if self._size > self._max_bytes:
                    self._rotate()
            except OSError as e:
                if self.from_file:
                    self._ring.append(line)
                    self.count += 1
                failure = e
                first = self.errors == 0
                self.errors += 1
                self.last_error = e
        if failure is not None and first and self._on_error is not None:
            with contextlib.suppress(Exception):  # a listener's fault is not the engine's
                self._on_error(failure)

    def remember(self, line: str) -> None:
        """Keep a line read back from the log file in the ring (redacted), not written again."""
        line = redact_line(line.rstrip("\r\n"), self._secrets)
        with self._lock:
            self._ring.append(line)
            self.count += 1
            self.last_line_at = time.monotonic()

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            self._size += n
            view = view[n:]

    def _rotate(self) -> None:
        assert self.path is not None
        assert self._fd is not None
        for i in range(self._backups, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        fd = os.open(self.path, _FLAGS, 0o600)  # the old one was just renamed away
        os.close(self._fd)
        self._fd = fd
        self._size = 0

    def truncate_copy(self) -> bool:
        """For a file the engine writes itself: its content becomes the first backup (older
        ones move up) and it is emptied; the engine's appends go on at its new end. False
        (counted as an error) when that failed."""
        with self._lock:
            if self.path is None:
                return False
            try:
                for i in range(self._backups, 1, -1):
                    src = self.path.with_name(f"{self.path.name}.{i - 1}")
                    if src.exists():
                        os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
                backup = self.path.with_name(f"{self.path.name}.1")
                with contextlib.suppress(FileNotFoundError):
                    backup.unlink()
                with open(self.path, "rb") as src_f:
                    fd = os.open(backup, _FLAGS, 0o600)
                    with os.fdopen(fd, "wb") as dst_f:
                        shutil.copyfileobj(src_f, dst_f)
                os.truncate(self.path, 0)
                self._size = 0
            except OSError as e:
                self.errors += 1
                self.last_error = e
                return False
        return True

    def tail(self, n: int | None = None) -> list[str]:
        """The last `n` lines kept in memory (all kept ones by default)."""
        with self._lock:
            lines = list(self._ring)
        return lines if n is None else lines[-n:] if n > 0 else []

    def text(self) -> str:
        """The lines kept in memory, joined."""
        return "\n".join(self.tail())

    def error_words(self) -> str:
        """A sentence about failed writes, or "" when there were none."""
        with self._lock:
            n, e = self.errors, self.last_error
        if not n:
            return ""
        why = (e.strerror or str(e)) if e is not None else "an error"
        lines = "1 line" if n == 1 else f"{n} lines"
        return f"{lines} of its output could not be written to {self.path} ({why})"

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
        with _open_lock:
            _open_paths.discard(str(self.path))


@dataclass
class _Unit:
    """One log and its rotated parts."""

    model: str
    files: list[Path] = field(default_factory=list)
    size: int = 0
    mtime: float = 0.0


def _units(folder: Path) -> dict[str, _Unit]:
    units: dict[str, _Unit] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return units
    for entry in entries:
        m = _LOG_NAME.match(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        base = re.sub(r"\.\d+$", "", entry.name)
        unit = units.setdefault(base, _Unit(m.group("model")))
        unit.files.append(Path(entry.path))
        unit.size += st.st_size
        unit.mtime = max(unit.mtime, st.st_mtime)
    return units


def prune_logs(
    folder: Path | None = None,
    *,
    keep_per_model: int = KEEP_PER_MODEL,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    protect: Iterable[Path] = (),
) -> list[Path]:
    """Delete the oldest logs beyond `keep_per_model` per model, then the oldest until all
    together are at most `max_total_bytes`. Files open in this process and `protect` are
    kept. Returns the files deleted; failures are ignored (pruning never fails a start)."""
    folder = log_dir() if folder is None else folder
    with _open_lock:
        keep = {*_open_paths, *(str(p) for p in protect)}
    units = sorted(_units(folder).values(), key=lambda u: u.mtime, reverse=True)
    protected = [u for u in units if any(str(f) in keep for f in u.files)]
    doomed: list[_Unit] = []
    seen: dict[str, int] = {}
    kept: list[_Unit] = []
    for u in units:
        seen[u.model] = seen.get(u.model, 0) + 1
        if seen[u.model] > keep_per_model and u not in protected:
            doomed.append(u)
        else:
            kept.append(u)
    total = sum(u.size for u in kept)
    for u in reversed(kept):  # oldest first
        if total <= max_total_bytes:
            break
        if u in protected:
            continue
        doomed.append(u)
        total -= u.size
    deleted: list[Path] = []
    for u in doomed:
        for f in u.files:
            with contextlib.suppress(OSError):
                f.unlink()
                deleted.append(f)
    return deleted


FOLLOW_POLL_S = 0.05
FOLLOW_CHUNK = 1 << 16  # the longest line kept whole; a longer one is split


def follow_file(
    path: Path,
    sink: LogSink,
    *,
    offset: int = 0,
    done: Callable[[], bool] = lambda: False,
    halt: threading.Event | None = None,
    poll_s: float = FOLLOW_POLL_S,
    rotate: bool = False,
) -> int:
    """Hand every line written to `path` from `offset` on to `sink.remember`, until `done()`
    was true before a read that found nothing more (the writer ended: all it wrote is read)
    or `halt` is set. Returns the offset after the last whole line read (where to go on).
    With `rotate`, a file read past `sink.rotate_at` is rotated (`sink.truncate_copy`); a
    file that shrank under it (rotated by another) is read again from its top."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, on every path
    except OSError:
        return offset
    pending = b""
    quiet = False  # nothing came for a whole poll: the moment to rotate (a writer is idle)
    with f:
        f.seek(offset)
        while True:
            finished = done()
            try:
                chunk = f.read(FOLLOW_CHUNK)
            except OSError:
                chunk = b""
                finished = True
            if chunk:
                quiet = False
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) >= FOLLOW_CHUNK:
                    lines.append(pending)
                    pending = b""
                for raw in lines:
                    with contextlib.suppress(Exception):  # a line lost, never the follower
                        sink.remember(raw.decode("utf-8", errors="replace"))
                continue
            if finished or (halt is not None and halt.is_set()):
                if pending and finished:
                    sink.remember(pending.decode("utf-8", errors="replace"))
                    pending = b""
                return f.tell() - len(pending)
            if _back_to_top(f, sink, rotate=rotate and quiet and not pending):
                pending = b""
                continue
            if halt is not None:
                halt.wait(poll_s)
            else:
                time.sleep(poll_s)
            quiet = True


def _back_to_top(f: IO[bytes], sink: LogSink, *, rotate: bool) -> bool:
    """Caught up with the file: seek to its top when it was truncated under the reader (a
    rotation by another) or, with `rotate`, when it is past `sink.rotate_at` and was rotated."""
    try:
        size = os.fstat(f.fileno()).st_size
    except OSError:
        size = f.tell()
    if size < f.tell() or (rotate and f.tell() >= sink.rotate_at and sink.truncate_copy()):
        f.seek(0)
        return True
    return False


def tail_offset(path: Path, max_bytes: int) -> int:
    """Where the last `max_bytes` of `path` start, moved to the start of a line (0 when the
    file is shorter or unreadable)."""
    try:
        size = path.stat().st_size
        if size <= max_bytes:
            return 0
        with open(path, "rb") as f:
            f.seek(size - max_bytes)
            rest = f.read(max_bytes)
    except OSError:
        return 0
    cut = rest.find(b"\n")
    return size - max_bytes + (cut + 1 if cut >= 0 else 0)
