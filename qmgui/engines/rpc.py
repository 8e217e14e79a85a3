"""llama.cpp's `rpc-server`: a device on another machine (or on loopback, for tests).

`find_rpc_server()` looks for the binary beside the llama-server qmgui would use (the pip
wheel ships `ggml-rpc-server` next to `llama-server`; a llama.cpp build names it
`rpc-server`). `rpc_server()` starts one on a free loopback port in its own process group,
waits until it accepts connections and kills the group on the way out, whatever happened in
between: no child outlives the `with` block.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qmgui.core.errors import EngineError
from qmgui.engines.llama_run import HOST, find_llama_server, free_port

BINARY_NAMES = ("rpc-server", "ggml-rpc-server")
READY_S = 10.0  # it binds its port within milliseconds; a slow disk loads it in seconds
REAP_S = 5.0
POLL_S = 0.02


def find_rpc_server(env: Mapping[str, str] | None = None) -> str | None:
    """An rpc-server beside the llama-server `find_llama_server` finds, else one on PATH."""
    server = find_llama_server(env)
    if server is not None:
        folder = Path(server).resolve().parent
        for name in BINARY_NAMES:
            candidate = folder / name
            if os.access(candidate, os.X_OK):
                return str(candidate)
    env = os.environ if env is None else env
    for name in BINARY_NAMES:
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    return None


@dataclass(frozen=True)
class RpcServer:
    """A running rpc-server: where it listens (`endpoint` is what `--rpc` takes)."""

    host: str
    port: int
    pid: int

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


@contextlib.contextmanager
def rpc_server(
    binary: str,
    *,
    port: int | None = None,
    threads: int = 1,
    devices: Sequence[str] = (),
    ready_s: float = READY_S,
) -> Iterator[RpcServer]:
    """Run `binary` on 127.0.0.1 (`port`, or a free one) for the duration of the block,
    offering `devices` (its backend's names, e.g. Vulkan0; default: its own choice).

    Raises EngineError when it cannot be started or does not listen within `ready_s`. A probe
    connection is made to learn that it listens; rpc-server serves one client at a time and
    takes the next, so the probe costs nothing."""
    port = port or free_port()
    argv = [binary, "--host", HOST, "--port", str(port), "--threads", str(threads)]
    if devices:
        argv += ["--device", ",".join(devices)]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:
        raise EngineError(f"could not start {binary}: {e.strerror or e}") from e
    try:
        deadline = time.monotonic() + ready_s
        while not _listening(HOST, port):
            if proc.poll() is not None:
                raise EngineError(
                    f"{binary} exited with status {proc.returncode} before listening on "
                    f"{HOST}:{port}"
                )
            if time.monotonic() >= deadline:
                raise EngineError(f"{binary} did not listen on {HOST}:{port} within {ready_s} s")
            time.sleep(POLL_S)
        yield RpcServer(HOST, port, proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired as e:
            raise EngineError(f"{binary} (pid {proc.pid}) did not die after SIGKILL") from e
