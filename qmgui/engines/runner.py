"""The seam in front of processes: a `Runner` starts a `Child`; the real one is `PopenRunner`.

Tests substitute a fake runner to inject faults a real engine cannot be made to produce.
`PopenRunner` puts each child in its own process group and, on Linux, asks the kernel to
SIGKILL it when qmgui dies (`PR_SET_PDEATHSIG`). That signal fires when the *thread* that
forked the child ends, so every spawn runs on one long-lived spawner thread. On Windows each
child joins a Job Object created with KILL_ON_JOB_CLOSE: when qmgui's handle to the job closes
(qmgui exits or is killed) Windows ends every process in it. (The Windows path cannot run on
the Linux machines the tests run on; it is written to the documented Win32 API.)

`terminate_tree` ends a child and every descendant: it lists them with psutil before sending
anything, signals gracefully, kills what lingers and bounds the reap.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

import psutil

from qmgui.core.errors import EngineError

REAP_S = 5.0
PR_SET_PDEATHSIG = 1


class Child(Protocol):
    """What the supervisor needs of a started process (`subprocess.Popen` satisfies it)."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class Runner(Protocol):
    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None) -> Child:
        """Start `argv` with stdout and stderr on one pipe; OSError when it cannot start."""
        ...


def _death_signal_preexec(parent: int) -> None:
    """In the child before exec: die with the parent (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, getattr(signal, "SIGKILL", 9), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


# one long-lived thread forks every child, so PR_SET_PDEATHSIG fires only when qmgui exits
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="qmgui-spawn")


if sys.platform == "win32":
    from ctypes import wintypes

    _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000
    _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION = 9  # JOBOBJECTINFOCLASS value

    class _BasicLimits(ctypes.Structure):
        _fields_ = (
            ("PerProcessUserTimeLimit", ctypes.c_int64),
            ("PerJobUserTimeLimit", ctypes.c_int64),
            ("LimitFlags", wintypes.DWORD),
            ("MinimumWorkingSetSize", ctypes.c_size_t),
            ("MaximumWorkingSetSize", ctypes.c_size_t),
            ("ActiveProcessLimit", wintypes.DWORD),
            ("Affinity", ctypes.c_size_t),
            ("PriorityClass", wintypes.DWORD),
            ("SchedulingClass", wintypes.DWORD),
        )

    class _IoCounters(ctypes.Structure):
        _fields_ = tuple(
            (n, ctypes.c_uint64)
            for n in (
                "ReadOperationCount",
                "WriteOperationCount",
                "OtherOperationCount",
                "ReadTransferCount",
                "WriteTransferCount",
                "OtherTransferCount",
            )
        )

    class _ExtendedLimits(ctypes.Structure):
        _fields_ = (
            ("BasicLimitInformation", _BasicLimits),
            ("IoInfo", _IoCounters),
            ("ProcessMemoryLimit", ctypes.c_size_t),
            ("JobMemoryLimit", ctypes.c_size_t),
            ("PeakProcessMemoryUsed", ctypes.c_size_t),
            ("PeakJobMemoryUsed", ctypes.c_size_t),
        )

    _job: dict[str, int] = {}

    def _kill_on_close_job() -> int:
        """One job for the app's life; Windows kills its processes when the handle closes."""
        if "handle" not in _job:
            k32 = ctypes.WinDLL("kernel32", use_last_error=True)
            handle = k32.CreateJobObjectW(None, None)
            if not handle:
                raise OSError(ctypes.get_last_error(), "CreateJobObjectW failed")
            info = _ExtendedLimits()
            info.BasicLimitInformation.LimitFlags = _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
            if not k32.SetInformationJobObject(
                handle,
                _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
                ctypes.byref(info),
                ctypes.sizeof(info),
            ):
                raise OSError(ctypes.get_last_error(), "SetInformationJobObject failed")
            _job["handle"] = int(handle)
        return _job["handle"]

    def _join_job(proc: subprocess.Popen[bytes]) -> None:
        """Best effort: a child that cannot join still runs, it just may outlive a crash."""
        with contextlib.suppress(OSError, AttributeError):
            k32 = ctypes.WinDLL("kernel32", use_last_error=True)
            k32.AssignProcessToJobObject(_kill_on_close_job(), int(proc._handle))  # type: ignore[attr-defined]


class PopenRunner:
    """Real processes: own process group, die with qmgui (Linux: parent-death signal;
    Windows: a kill-on-close Job Object)."""

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None) -> Child:
        return _spawner.submit(self._popen, list(argv), env).result()

    @staticmethod
    def _popen(argv: list[str], env: Mapping[str, str] | None) -> Child:
        parent = os.getpid()
        preexec = None
        if sys.platform.startswith("linux"):

            def preexec() -> None:
                _death_signal_preexec(parent)

        if sys.platform == "win32":
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
                env=None if env is None else {**os.environ, **env},
            )
            _join_job(proc)
            return proc
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
            preexec_fn=preexec,  # noqa: PLW1509 - async-signal-safe: prctl and getppid only
        )


def resolve_executable(name: str, env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(path, "") when `name` can run, else (None, a sentence saying why)."""
    path_var = (env or {}).get("PATH", os.environ.get("PATH"))
    if os.sep in name or (os.altsep and os.altsep in name):
        if not os.path.exists(name):
            return None, f"{name} does not exist"
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            return None, f"{name} is not an executable file (check its permissions)"
        return name, ""
    found = shutil.which(name, path=path_var)
    if found is None:
        return None, f"{name} was not found on PATH; install it or give its full path"
    return found, ""


def process_identity(pid: int) -> float | None:
    """The create_time of `pid`, or None when it is gone."""
    try:
        created: float = psutil.Process(pid).create_time()
        return created
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _tree(pid: int, create_time: float | None) -> list[psutil.Process]:
    """`pid` (when it is still the process that was started) and its descendants."""
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) > 0.01:
            return []  # the pid was reused: not ours
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


@dataclass(frozen=True)
class StopResult:
    graceful: bool  # everything ended before SIGKILL was needed
    killed: int  # processes that had to be SIGKILLed
    seconds: float


def terminate_tree(
    pid: int,
    *,
    create_time: float | None,
    grace_s: float,
    sig: int = signal.SIGTERM,
    wait_root: Callable[[float], bool] | None = None,
    reap_s: float = REAP_S,
) -> StopResult:
    """End `pid`, all its descendants (listed before any signal) and its process group.

    `wait_root(timeout) -> ended` waits for the root when the caller owns it (its own child,
    reaped by its own thread); otherwise psutil waits. EngineError when something survives
    SIGKILL past `reap_s`. A pid whose create_time differs is not touched."""
    start = time.monotonic()
    procs = _tree(pid, create_time)
    if not procs:
        if wait_root is not None:
            wait_root(reap_s)
        return StopResult(graceful=True, killed=0, seconds=time.monotonic() - start)
    root, descendants = procs[0], procs[1:]
    waited = descendants if wait_root is not None else procs

    def root_done(timeout: float) -> bool:
        return True if wait_root is None else wait_root(timeout)

    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)
    deadline = time.monotonic() + grace_s
    root_gone = root_done(grace_s)
    _, alive = psutil.wait_procs(waited, timeout=max(0.0, deadline - time.monotonic()))
    targets = list(alive) if root_gone or wait_root is None else [root, *alive]
    killed = 0
    for p in targets:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.kill()
            killed += 1
    # helpers that left the tree but stayed in the group go too (POSIX process groups;
    # on Windows the psutil tree above and the Job Object cover them)
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    _, still = psutil.wait_procs(alive, timeout=reap_s)
    if not root_done(reap_s):
        raise EngineError(f"process {pid} did not die after SIGKILL")
    if still:
        pids = ", ".join(str(p.pid) for p in still)
        raise EngineError(f"processes {pids} did not die after SIGKILL")
    return StopResult(graceful=killed == 0, killed=killed, seconds=time.monotonic() - start)
