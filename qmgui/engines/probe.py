"""Run an engine binary's `--version`, `--help` and `--list-devices`, bounded, and parse them.

`probe()` checks the executable, runs each command through a `Runner` (the seam tests replace)
and hands the outputs to `qmgui.core.probe.build_probe`, which does all the parsing. The real
runner, `run_bounded`, bounds everything a child can do to us:

- time: each run has a deadline (10 s by default); past it the whole process group is killed;
- the reap: after SIGKILL the child is waited for with a timeout too, so even a process stuck
  in the kernel cannot hang the caller (it is reported as ``unreaped`` instead);
- output: the first `MAX_OUTPUT_BYTES` and the last `TAIL_BYTES` are kept, the middle is
  dropped (a `--help` is ~60 KiB; a crash message is at the end);
- descendants: the child runs in its own process group (session) and the group is killed on
  every path, so helpers it spawned die with it; groups still alive when Python exits are
  killed by an atexit hook. (A hard kill of qmgui itself skips that hook; PR_SET_PDEATHSIG
  would need `preexec_fn`, which is unsafe in a program with threads. A descendant that
  leaves the group with setsid() is out of reach, but cannot stall us: once the child has
  exited, the wait for the rest of its output is bounded too.)

Nothing here raises for a misbehaving binary: a missing file, a hang or a crash is a
`ProbeResult` whose `failure` says so in a sentence.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Protocol

from qmgui.core.probe import (
    ProbeResult,
    RunOutput,
    StartError,
    build_probe,
    probe_commands,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_OUTPUT_BYTES",
    "REAP_S",
    "TAIL_BYTES",
    "Runner",
    "probe",
    "resolve_executable",
    "run_bounded",
]

DEFAULT_TIMEOUT_S = 10.0  # a CUDA build's --list-devices initialises every GPU: seconds
REAP_S = 5.0  # after SIGKILL a process is gone within this unless the kernel is stuck
MAX_OUTPUT_BYTES = 1024 * 1024  # llama-server --help is ~60 KiB; 16x that is not a help text
TAIL_BYTES = 64 * 1024  # kept from the end once the head is full: where errors are printed
POLL_S = 0.05  # how often a silent child is checked for having exited
_READ_CHUNK = 64 * 1024

_POSIX = os.name != "nt"

_live: set[int] = set()  # process groups started here and not yet reaped
_live_lock = threading.Lock()


def _kill_live_groups() -> None:
    with _live_lock:
        pgids = list(_live)
    for pgid in pgids:
        _kill_group(pgid)


atexit.register(_kill_live_groups)


class Runner(Protocol):
    """Runs one command to completion or to its deadline; never raises for the child's sake."""

    def __call__(self, argv: Sequence[str], *, timeout_s: float) -> RunOutput: ...


# --- the bounded run -----------------------------------------------------------------------


class _Capture:
    """The head of the output up to a limit, then a ring buffer of the tail."""

    def __init__(self, max_bytes: int, tail_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.tail_bytes = tail_bytes
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.max_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_len += len(chunk)
        excess = self.tail_len - self.tail_bytes
        while excess > 0:  # keep exactly the last tail_bytes
            first = self.tail[0]
            cut = min(len(first), excess)
            if cut == len(first):
                self.tail.popleft()
            else:
                self.tail[0] = first[cut:]
            self.dropped += cut
            self.tail_len -= cut
            excess -= cut

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.tail:
            return head
        tail = b"".join(self.tail).decode("utf-8", errors="replace")
        if not self.dropped:
            return head + tail
        return f"{head}\n[… {self.dropped} bytes of output left out …]\n{tail}"


def _start_error(exc: OSError) -> StartError:
    if exc.errno == errno.ENOENT:
        return StartError.MISSING
    if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR):
        return StartError.NOT_EXECUTABLE
    return StartError.NOT_STARTED


def _kill_group(pgid: int) -> None:
    if _POSIX:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _has_exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the child has exited, without reaping it: its pid (and so its process group
    id) stays reserved until we kill the group, so the kill cannot hit a recycled id."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # no waitid (Windows): poll() reaps, which is fine there
        return proc.poll() is not None
    try:
        return waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


def _pump_posix(proc: subprocess.Popen[bytes], capture: _Capture, deadline: float) -> bool:
    """Read output until the child exits and its output ends, or the deadline passes.

    Returns True when the child exited in time. Output still in the pipe after the exit is
    drained by the caller once the group is killed.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _has_exited(proc)
            if sel.select(min(remaining, POLL_S)):
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    # every writer closed the pipe; the child has exited or is about to
                    while not _has_exited(proc):
                        if time.monotonic() >= deadline:
                            return False
                        time.sleep(POLL_S / 5)
                    return True
                if chunk:
                    capture.add(chunk)
            if _has_exited(proc):
                return True


def _drain_posix(proc: subprocess.Popen[bytes], capture: _Capture, until: float) -> None:
    """After the group was killed: read what is left, up to EOF or `until`. A descendant that
    left the group (setsid) and holds the pipe open cannot stall us past `until`."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (remaining := until - time.monotonic()) > 0:
            if not sel.select(min(remaining, POLL_S)):
                continue
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                return
            capture.add(chunk)


def _pump_threaded(proc: subprocess.Popen[bytes], capture: _Capture, deadline: float) -> bool:
    """Windows: pipes cannot be selected, so a daemon thread reads while we wait."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lock = threading.Lock()

    def reader() -> None:
        with contextlib.suppress(OSError):
            for chunk in iter(lambda: os.read(fd, _READ_CHUNK), b""):
                with lock:
                    capture.add(chunk)

    thread = threading.Thread(target=reader, name="qmgui-probe-reader", daemon=True)
    thread.start()
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
        exited = True
    except subprocess.TimeoutExpired:
        exited = False
    thread.join(timeout=REAP_S if exited else 0)
    return exited


def _end(
    proc: subprocess.Popen[bytes], reap_s: float, capture: _Capture
) -> tuple[int | None, bool]:
    """Kill the whole group, drain the pipe, reap the child (bounded); (returncode, reaped)."""
    if _POSIX:
        _kill_group(proc.pid)
        _drain_posix(proc, capture, time.monotonic() + min(reap_s, 1.0))
    else:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            # the tree, not just the child; taskkill is bounded like everything else
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                capture_output=True,
                timeout=reap_s,
                check=False,
            )
        with contextlib.suppress(OSError):
            proc.kill()
    try:
        code = proc.wait(timeout=reap_s)
    except subprocess.TimeoutExpired:
        return None, False
    with _live_lock:
        _live.discard(proc.pid)
    return code, True


def run_bounded(
    argv: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    reap_s: float = REAP_S,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
    tail_bytes: int = TAIL_BYTES,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> RunOutput:
    """Run `argv` with no stdin, stdout and stderr captured together, within `timeout_s`.

    The child and everything it starts in its process group are killed when it exits or
    times out; the reap is bounded by `reap_s`. A start failure (missing file, no permission)
    is returned as `RunOutput.start_error`, never raised.
    """
    args = tuple(argv)
    start = time.monotonic()
    flags = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0) if not _POSIX else 0
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=_POSIX,  # its own process group, killed as one
            creationflags=flags,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    except OSError as exc:
        return RunOutput(
            args,
            start_error=_start_error(exc),
            start_detail=exc.strerror or str(exc),
            timeout_s=timeout_s,
        )
    with _live_lock:
        _live.add(proc.pid)
    capture = _Capture(max_output_bytes, tail_bytes)
    exited = False
    code: int | None = None
    reaped = False
    try:
        pump = _pump_posix if _POSIX else _pump_threaded
        exited = pump(proc, capture, start + timeout_s)
    finally:
        code, reaped = _end(proc, reap_s, capture)
        if proc.stdout is not None:
            proc.stdout.close()
    return RunOutput(
        args,
        output=capture.text(),
        returncode=code if exited else None,
        timed_out=not exited,
        truncated=capture.truncated,
        unreaped=not reaped,
        wall_s=time.monotonic() - start,
        timeout_s=timeout_s,
    )


# --- probing -----------------------------------------------------------------------------------


def resolve_executable(executable: str) -> str | None:
    """The file `executable` names: a path as given (``~`` expanded), or a bare name looked up
    on PATH. None when there is no such file."""
    path = os.path.expanduser(executable)
    if os.sep in path or (os.altsep and os.altsep in path):
        return path if os.path.lexists(path) else None
    return shutil.which(path) or (path if os.path.exists(path) else None)


def _precheck(executable: str) -> tuple[str, RunOutput | None]:
    """Resolve the path and catch what would fail at start with a clearer reason."""
    path = resolve_executable(executable)
    if path is None:
        where = "no such file" if os.sep in executable else "not on PATH"
        return executable, RunOutput(
            (executable,), start_error=StartError.MISSING, start_detail=where
        )
    if not os.path.exists(path):
        return path, RunOutput((path,), start_error=StartError.MISSING, start_detail="broken link")
    if os.path.isdir(path):
        return path, RunOutput(
            (path,), start_error=StartError.NOT_EXECUTABLE, start_detail="it is a folder"
        )
    if _POSIX and not os.access(path, os.X_OK):
        return path, RunOutput(
            (path,), start_error=StartError.NOT_EXECUTABLE, start_detail="no execute permission"
        )
    return path, None


def _default_runner(argv: Sequence[str], *, timeout_s: float) -> RunOutput:
    return run_bounded(argv, timeout_s=timeout_s)


def probe(
    executable: str,
    *,
    kind: str = "llama",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    runner: Runner | None = None,
    commands: Sequence[Sequence[str]] | None = None,
) -> ProbeResult:
    """Probe one engine binary: `commands` (default: `probe_commands(kind)`), each bounded by
    `timeout_s`, parsed into a `ProbeResult`.

    The runs stop early when the binary cannot be started or a run times out (a binary that
    hangs on `--version` would hang on the rest: one timeout is enough to say so).
    """
    path, early = _precheck(executable)
    if early is not None:
        return build_probe(path, [early])
    run = runner or _default_runner
    outputs: list[RunOutput] = []
    for args in commands if commands is not None else probe_commands(kind):
        out = run([path, *args], timeout_s=timeout_s)
        outputs.append(out)
        if not out.started or out.timed_out:
            break
    return build_probe(path, outputs)
