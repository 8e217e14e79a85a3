"""The seam in front of processes: a `Runner` starts a `Child`; the real one is `PopenRunner`.

Tests substitute a fake runner to inject faults a real engine cannot be made to produce.

No engine outlives qmgui, whatever dies, unless it was *detached* (below):

- `PopenRunner` starts each engine in its own session, so its process group (pgid = the
  engine's pid) holds the engine and everything it starts: a wrapper script's llama-server
  included. The terminal's signals (Ctrl-C, SIGHUP when it closes) never reach it directly:
  qmgui decides how its engines stop.
- On Linux the kernel SIGKILLs the direct child when qmgui dies (`PR_SET_PDEATHSIG`). That
  signal fires when the *thread* that forked the child ends, so every spawn runs on one
  long-lived spawner thread. It only reaches the direct child; a wrapper script's own child
  would survive it, so:
- a watchdog (`/bin/sh`, started once per qmgui process, in a session of its own, not a child
  of qmgui) holds the read end of a pipe whose write end only qmgui holds; qmgui tells it the
  group of each engine it starts and ends. When qmgui dies, however it dies (kill -9 too), the
  kernel closes the pipe, the watchdog reads end-of-file and ends every group still listed:
  SIGTERM, then SIGKILL after 3 s. A `/bin/sh` is used, not Python, so it works the same from
  the PyInstaller bundle.
- `become_subreaper()` (Linux, `PR_SET_CHILD_SUBREAPER`) makes orphans among qmgui's
  descendants (a wrapper's llama-server when the wrapper died) its own children instead of
  init's, so they stay in its tree while it lives; `qmgui serve` and the window call it.
- every engine carries `QMGUI_ENGINE_TOKEN` in its environment (inherited by what it starts):
  a later qmgui recognises the members of a recorded group by it, never by a pgid alone (pids,
  and so group ids, are reused).

Detached engines. `PopenRunner(output=PATH)` starts an engine that *can* be left running:
its stdout and stderr go straight to the log file `PATH` (appended; stdin is /dev/null), not
to a pipe that would break (EPIPE, SIGPIPE) once qmgui exits, and it gets no parent-death
signal (which cannot be undone after the fork); it still has its own session and is still
watched by the watchdog, so it dies with qmgui like any other engine until it is left:
`watchdog.unwatch(pgid)` (and the run registry marking it detached) is what leaving is, and
`watchdog.watch(pgid)` takes it back. `PopenRunner(output=PATH, detached=True)` starts one
that is never watched (`qmgui serve --detach`). The supervisor follows the log file instead of
the pipe. On Windows a detached engine does not join the Job Object, and an engine that joined
it cannot be left.

On Windows each child joins a Job Object created with KILL_ON_JOB_CLOSE: when qmgui's handle
to the job closes (qmgui exits or is killed) Windows ends every process in it. (The Windows
path cannot run on the Linux machines the tests run on; it is written to the documented Win32
API.)

`terminate_tree` ends a child, every descendant and every member of its group: it lists them
with psutil before sending anything, signals gracefully, kills what lingers and bounds the
reap. Zombies count as gone; a zombie that was adopted (a grandchild reparented to a subreaper
qmgui) is reaped.
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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

import psutil

from qmgui.core.errors import EngineError

REAP_S = 5.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
ENV_TOKEN = "QMGUI_ENGINE_TOKEN"  # in each engine's environment: its members are known by it
WAIT_STEP_S = 0.02
ZOMBIE_WAIT_S = 0.5  # a dead process's parent gets this long to reap it before a stop returns
SAME_PROCESS_S = 0.01  # create_time is a float of the boot clock; equal within this


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


_OUTPUT_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
_OUTPUT_FLAGS |= getattr(os, "O_NOFOLLOW", 0)
_DETACHED_PROCESS = 0x00000008  # Windows: no console of qmgui's


class PopenRunner:
    """Real processes: own process group, die with qmgui (Linux: parent-death signal and the
    watchdog; Windows: a kill-on-close Job Object).

    With `output` the engine writes to that file (which must exist) and can be left running
    (no parent-death signal; still watched); with `detached` too it is never watched."""

    def __init__(self, *, output: str | os.PathLike[str] | None = None, detached: bool = False):
        if detached and output is None:
            raise EngineError("a detached engine needs a log file for its output")
        self.output = None if output is None else os.fspath(output)
        self.detached = detached

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None) -> Child:
        watched = sys.platform != "win32" and not self.detached
        if watched:
            watchdog.start()  # before the first engine: it must be there if qmgui dies next
        child = _spawner.submit(self._popen, list(argv), env).result()
        if watched:
            watchdog.watch(child.pid)  # its own session: the pgid is its pid
        return child

    def _popen(self, argv: list[str], env: Mapping[str, str] | None) -> Child:
        out_fd = None if self.output is None else os.open(self.output, _OUTPUT_FLAGS)
        try:
            return self._popen_to(argv, env, out_fd)
        finally:
            if out_fd is not None:
                os.close(out_fd)

    def _popen_to(
        self, argv: list[str], env: Mapping[str, str] | None, out_fd: int | None
    ) -> Child:
        parent = os.getpid()
        preexec = None
        if sys.platform.startswith("linux") and out_fd is None:

            def preexec() -> None:
                _death_signal_preexec(parent)

        stdout: int = subprocess.PIPE if out_fd is None else out_fd
        full_env = None if env is None else {**os.environ, **env}
        if sys.platform == "win32":
            flags = subprocess.CREATE_NEW_PROCESS_GROUP
            if self.detached:
                flags |= _DETACHED_PROCESS
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                creationflags=flags,
                env=full_env,
            )
            if not self.detached:
                _join_job(proc)
            return proc
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=full_env,
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


def is_running(pid: int, create_time: float | None = None) -> bool:
    """`pid` runs (a zombie does not) and, with `create_time`, is still that very process."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > SAME_PROCESS_S:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


# -- subreaper ---------------------------------------------------------------------------------


def _prctl(option: int, arg: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result: int = libc.prctl(option, arg, 0, 0, 0)
    return result


def become_subreaper() -> bool:
    """Linux: make this process a child subreaper, so an orphaned descendant (a wrapper
    script's engine whose script died) is reparented to it, not to init, and stays in its
    tree. True when it is one now; elsewhere False (nothing to do).

    The watchdog is started first: started later, it would be adopted too (it is meant to
    outlive this process, not to be its child)."""
    if not sys.platform.startswith("linux"):
        return False
    watchdog.start()
    try:
        return _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    try:
        ok = _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) == 0
    except (OSError, AttributeError):
        return False
    return ok and flag.value != 0


# -- the watchdog ------------------------------------------------------------------------------

# reads "+PGID" / "-PGID" lines; at end-of-file (qmgui is gone) it ends every group still
# listed: SIGTERM, then SIGKILL after 3 s. It ignores the terminal's signals; only qmgui's end
# (its pipe closing) ends it. Nothing but digits is ever used as a group.
WATCHDOG_NAME = "qmgui-watchdog"
MAX_WATCHDOG_RESTARTS = 5
WATCHDOG_SH = r"""trap '' HUP INT TERM QUIT TSTP TTIN TTOU PIPE
g=' '
while IFS= read -r l; do
  n=${l#?}
  case $n in ''|*[!0-9]*) continue ;; esac
  case $l in
    +*) g="$g$n " ;;
    -*) k=' '; for x in $g; do [ "$x" = "$n" ] || k="$k$x "; done; g=$k ;;
  esac
done
set -- $g
[ $# -eq 0 ] && exit 0
for x; do kill -s TERM -- "-$x" 2>/dev/null; done
i=0
while [ $i -lt 30 ]; do
  a=0
  for x; do kill -s 0 -- "-$x" 2>/dev/null && a=1; done
  [ $a -eq 0 ] && exit 0
  sleep 0.1 2>/dev/null || sleep 1
  i=$((i + 1))
done
for x; do kill -s KILL -- "-$x" 2>/dev/null; done
exit 0
"""
# the intermediate shell starts the watchdog in the background (so it is not qmgui's child),
# prints its pid and exits; the pipe goes through fd 3, since a background job's stdin is
# /dev/null before its own redirections apply
_LAUNCH_SH = (
    'exec 3<&0 </dev/null; /bin/sh -c "$1" ' + WATCHDOG_NAME + " <&3 3<&- >/dev/null 2>&1 & echo $!"
)


class Watchdog:
    """The one watchdog of this process (`watchdog`): `start()` once, `watch(pgid)` per engine
    started, `unwatch(pgid)` once its group is empty. Best effort: a watchdog that cannot
    start or write is said once; the engines still run (and still die with qmgui's direct
    death signal)."""

    def __init__(self, shell: str = "/bin/sh") -> None:
        self._shell = shell
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid: int | None = None
        self._groups: set[int] = set()
        self._failed = False
        self._restarts = 0

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._pid

    def start(self) -> bool:
        """Start it unless it runs; False when it cannot run here."""
        with self._lock:
            return self._ensure()

    def _ensure(self) -> bool:
        if self._fd is not None:
            return True
        if self._failed or sys.platform == "win32":
            return False
        try:
            read_end, write_end = os.pipe()
        except OSError:
            return self._give_up("no pipe")
        try:
            proc = subprocess.Popen(
                [self._shell, "-c", _LAUNCH_SH, "sh", WATCHDOG_SH],
                stdin=read_end,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not in the terminal's process group
            )
            out, _ = proc.communicate(timeout=10)
            pid = int(out.strip())
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            os.close(write_end)
            return self._give_up(str(e))
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        self._fd, self._pid = write_end, pid
        for pgid in sorted(self._groups):  # a restarted watchdog learns the live groups again
            self._send(f"+{pgid}", restart=False)
        return True

    def _give_up(self, why: str) -> bool:
        from qmgui import notify  # noqa: PLC0415 - only on this rare path

        self._failed = True
        notify.warning(
            f"the engine watchdog could not start ({why}): if qmgui is killed, an engine "
            "started through a wrapper script may keep running (`qmgui engines list` finds it)",
            source="engines",
        )
        return False

    def _send(self, line: str, *, restart: bool = True) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, f"{line}\n".encode())
        except BlockingIOError:
            pass  # the watchdog is stopped and its pipe full: nothing to do but go on
        except OSError:  # it died (EPIPE): start another one, which learns every group
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = self._pid = None
            self._restarts += 1
            if self._restarts > MAX_WATCHDOG_RESTARTS:
                self._give_up("it keeps ending")
            elif restart:
                self._ensure()

    def watch(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)
            if self._ensure():
                self._send(f"+{pgid}")

    def unwatch(self, pgid: int) -> None:
        with self._lock:
            if pgid in self._groups:
                self._groups.discard(pgid)
                self._send(f"-{pgid}")

    def watched(self) -> set[int]:
        with self._lock:
            return set(self._groups)

    def _after_fork(self) -> None:
        """In a forked child (no exec): drop the write end, so only qmgui keeps the watchdog
        waiting. The lock may be held by a thread that does not exist here: a new one."""
        self._lock = threading.Lock()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = self._pid = None
        self._groups = set()


watchdog = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=watchdog._after_fork)


# -- process groups ----------------------------------------------------------------------------


def group_of(pid: int) -> int | None:
    """The process group of `pid` (POSIX), None when it is gone or unknown."""
    getpgid = getattr(os, "getpgid", None)
    if getpgid is None:
        return None
    try:
        pgid: int = getpgid(pid)
        return pgid
    except OSError:
        return None


def _own_group(pgid: int) -> bool:
    """A group that must never be signalled: qmgui's own, or init's."""
    getpgrp = getattr(os, "getpgrp", None)
    return pgid <= 1 or (getpgrp is not None and pgid == getpgrp())


def carries_token(p: psutil.Process, token: str) -> bool:
    try:
        return p.environ().get(ENV_TOKEN) == token
    except (psutil.Error, OSError):
        return False


def group_members(pgid: int | None, token: str | None) -> list[psutil.Process]:
    """The live processes (zombies left out) of group `pgid` that carry `token` in their
    environment; every live member when `token` is None (only for a group known to be ours)."""
    if pgid is None or _own_group(pgid) or sys.platform == "win32":
        return []
    me = os.getpid()
    found: list[psutil.Process] = []
    for p in psutil.process_iter():
        if p.pid == me or group_of(p.pid) != pgid:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if token is None or carries_token(p, token):
            found.append(p)
    return found


def reap_adopted(pgid: int | None, *, exclude: int | None = None) -> int:
    """Reap zombies of group `pgid` that are this process's children (orphans it adopted as a
    subreaper), `exclude` (the engine itself, reaped by its own waiter) left alone."""
    if pgid is None or sys.platform == "win32":
        return 0
    reaped = 0
    with contextlib.suppress(psutil.Error):
        for c in psutil.Process().children():
            if c.pid == exclude:
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if c.status() == psutil.STATUS_ZOMBIE and group_of(c.pid) == pgid:
                    os.waitpid(c.pid, os.WNOHANG)
                    reaped += 1
    return reaped


def _root(pid: int, create_time: float | None) -> psutil.Process | None:
    """`pid` when it is still the process that was started (a zombie is not)."""
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) > SAME_PROCESS_S:
            return None  # the pid was reused: not ours
        return None if root.status() == psutil.STATUS_ZOMBIE else root
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _descendants(root: psutil.Process) -> list[psutil.Process]:
    try:
        return root.children(recursive=True)
    except psutil.Error:
        return []


def _gone(p: psutil.Process, *, owned: int | None) -> bool:
    """Ended: no such process, another one under its pid, or a zombie (reaped here when it is
    an adopted child; `owned` is reaped by its own waiter)."""
    try:
        if not p.is_running():
            return True
        if p.status() != psutil.STATUS_ZOMBIE:
            return False
        if p.pid != owned and p.ppid() == os.getpid():
            with contextlib.suppress(OSError):
                os.waitpid(p.pid, os.WNOHANG)
        return True
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _wait_gone(
    procs: Sequence[psutil.Process], until: float, *, owned: int | None
) -> list[psutil.Process]:
    """Wait until each of `procs` is gone or `until` passes; those still alive."""
    alive = list(procs)
    while True:
        alive = [p for p in alive if not _gone(p, owned=owned)]
        if not alive or time.monotonic() >= until:
            return alive
        time.sleep(WAIT_STEP_S)


def _let_parents_reap(
    procs: Sequence[psutil.Process],
    wait_s: float = ZOMBIE_WAIT_S,
    *,
    group: int | None = None,
    exclude: int | None = None,
) -> None:
    """Give the zombies among `procs` a moment to be reaped by their parent (init, for the
    orphans of an engine), so their pids are really free when a stop returns. Those of
    `group` that became this process's own (a subreaper adopts the children of a parent that
    died in the meantime: a router's models) are reaped here, each turn."""
    until = time.monotonic() + wait_s
    left = list(procs)
    while left and time.monotonic() < until:
        reap_adopted(group, exclude=exclude)
        left = [p for p in left if _still_listed(p)]
        if left:
            time.sleep(WAIT_STEP_S)
    reap_adopted(group, exclude=exclude)


def _still_listed(p: psutil.Process) -> bool:
    try:
        return p.is_running()
    except psutil.Error:
        return False


def _signal(procs: Sequence[psutil.Process], pgid: int | None, sig: int) -> int:
    sent = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)
            sent += 1
    if pgid is not None and hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    return sent


def _targets(
    pid: int, create_time: float | None, pgid: int | None, token: str | None
) -> tuple[psutil.Process | None, dict[int, psutil.Process], int | None]:
    """The root (when still ours), everything to signal, and the group when it is ours."""
    root = _root(pid, create_time)
    if pgid is None and root is not None and group_of(pid) == pid:
        pgid = pid  # a group leader of its own (how engines are started)
    members: list[psutil.Process] = []
    ours_group: int | None = None
    if pgid is not None and not _own_group(pgid):
        if root is not None and group_of(pid) == pgid:
            ours_group = pgid  # the root's own group, and the root is ours
            members = group_members(pgid, None)
        elif token is not None:
            members = group_members(pgid, token)
            ours_group = pgid if members else None
    procs: dict[int, psutil.Process] = {}
    for p in [*([root, *_descendants(root)] if root is not None else []), *members]:
        procs.setdefault(p.pid, p)
    return root, procs, ours_group


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
    pgid: int | None = None,
    token: str | None = None,
) -> StopResult:
    """End `pid`, all its descendants and its process group `pgid` (all listed before any
    signal): `sig` first, SIGKILL for what is left after `grace_s`.

    The group counts as ours when `pid` is still the process that was started (its
    create_time matches), or when a live member carries `token` (a wrapper's engine whose
    wrapper died): only then is it signalled. `wait_root(timeout) -> ended` waits for the root
    when the caller owns it (its own child, reaped by its own thread); otherwise it is polled.
    EngineError when something survives SIGKILL past `reap_s`."""
    start = time.monotonic()
    root, procs, ours_group = _targets(pid, create_time, pgid, token)
    if not procs and ours_group is None:
        if wait_root is not None:
            wait_root(reap_s)
        return StopResult(graceful=True, killed=0, seconds=time.monotonic() - start)
    owned = pid if wait_root is not None else None
    others = [p for p in procs.values() if not (wait_root is not None and p.pid == pid)]
    _signal(list(procs.values()), ours_group, sig)
    deadline = time.monotonic() + grace_s
    root_gone = True if wait_root is None else wait_root(grace_s)
    alive = _wait_gone(others, deadline, owned=owned)
    if ours_group is not None:  # what joined the group meanwhile
        known = {p.pid for p in alive}
        alive += [
            m
            for m in group_members(ours_group, token)
            if m.pid not in known and m.pid != owned and not _gone(m, owned=owned)
        ]
    targets = [*alive, *([] if root_gone or root is None else [root])]
    killed = _signal(targets, None, getattr(signal, "SIGKILL", signal.SIGTERM))
    if ours_group is not None:  # helpers that left the tree but stayed in the group go too
        _signal([], ours_group, getattr(signal, "SIGKILL", signal.SIGTERM))
    still = _wait_gone(alive, time.monotonic() + reap_s, owned=owned)
    if wait_root is not None and not wait_root(reap_s):
        raise EngineError(f"process {pid} did not die after SIGKILL")
    if still:
        pids = ", ".join(str(p.pid) for p in still)
        raise EngineError(f"processes {pids} did not die after SIGKILL")
    _let_parents_reap(others, group=ours_group, exclude=owned)
    return StopResult(graceful=killed == 0, killed=killed, seconds=time.monotonic() - start)
