"""No orphans, whatever dies: wrapper-script backends, kill -9 and SIGHUP of `qmgui serve`,
zombies, the subreaper, and the run registry under concurrent writers.

The backend here is a wrapper script named `llama-server` that runs the engine *without*
`exec`, so the engine is a grandchild of qmgui: what `PR_SET_PDEATHSIG` on the direct child
cannot cover. The engine is the tiny Python stand-in (`supervisor_child.py`) and, where it can
load a model on this machine, the real llama-server.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from qmgui.engines.llama_run import find_llama_server, load_and_stop
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.runner import WATCHDOG_NAME
from qmgui.engines.supervisor import EngineSpec, OutcomeKind, State, Supervisor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")

CHILD = str(Path(__file__).with_name("supervisor_child.py"))
ROOT = Path(__file__).resolve().parents[2]
LLAMA = find_llama_server()
LLAMA_ARGS = ("-c", "512", "--no-warmup", "-fit", "off", "-np", "1")
READY_S = 30.0


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.synth.factory import PRESETS, write_gguf

    return write_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf", PRESETS["llama"])


@pytest.fixture(scope="module")
def llama_usable(model: Path) -> str:
    """The real llama-server, when it can load the tiny model on this machine's CPU."""
    if LLAMA is None:
        pytest.skip("llama-server not found")
    out = load_and_stop(LLAMA, model, LLAMA_ARGS, timeout_s=30)
    if not out.loaded:
        pytest.skip(f"llama-server cannot load a model on this machine: {out}")
    return LLAMA


def wrapper(folder: Path, engine: str) -> Path:
    """A backend named llama-server that runs `engine` without exec (it stays the parent)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "llama-server"
    inner = f'"{sys.executable}" "{CHILD}" healthy' if engine == "fake" else f'"{engine}"'
    path.write_text(f'#!/bin/sh\necho "wrapper $$"\n{inner} "$@"\necho "wrapper done $?"\n')
    path.chmod(0o755)
    return path


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its reaper."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_dead(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after `timeout`."""
    until = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if not dead(p)]
        if not alive or time.monotonic() >= until:
            return alive
        time.sleep(0.05)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


class Serve:
    """`qmgui serve` in a subprocess with a wrapper backend."""

    def __init__(self, tmp: Path, model: Path, engine: str, *extra: str) -> None:
        self.env = {
            **os.environ,
            "QMGUI_TEST_LLAMA_SERVER": str(wrapper(tmp / "bin", engine)),
            "PYTHONPATH": str(ROOT),
        }
        argv = [sys.executable, "-m", "qmgui", "serve", str(model), "-c", "512", "--no-probe"]
        self.proc = subprocess.Popen(
            [*argv, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=ROOT,
        )
        self.ready = ""

    def wait_ready(self) -> str:
        assert self.proc.stdout is not None
        self.ready = self.proc.stdout.readline()
        if not self.ready.startswith("ready "):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"serve did not get ready: {self.ready!r} {err}")
        return self.ready

    def engine_pids(self) -> tuple[int, int]:
        """(the wrapper, the engine it runs)."""
        wrap = psutil.Process(self.proc.pid).children()
        assert len(wrap) == 1, wrap
        engine = wrap[0].children()
        assert len(engine) == 1, engine
        return wrap[0].pid, engine[0].pid

    def watchdog_pid(self) -> int | None:
        """serve's watchdog: the one whose stdin is the pipe serve writes to."""
        mine = set()
        for fd in os.listdir(f"/proc/{self.proc.pid}/fd"):
            with contextlib.suppress(OSError):
                mine.add(os.readlink(f"/proc/{self.proc.pid}/fd/{fd}"))
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if (
                    p.cmdline()[-1:] == [WATCHDOG_NAME]
                    and os.readlink(f"/proc/{p.pid}/fd/0") in mine
                ):
                    return p.pid
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def serves() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        s.close()


def cli(*args: str) -> tuple[int, str]:
    from qmgui.cli import main

    out = io.StringIO()
    rc = main(list(args), out=out, err=io.StringIO())
    return rc, out.getvalue()


@pytest.mark.parametrize("engine", ["fake", "llama"])
def test_kill_9_of_serve_ends_the_engine_behind_a_wrapper(
    engine: str, tmp_path: Path, model: Path, serves: list[Serve], request: pytest.FixtureRequest
) -> None:
    binary = "fake" if engine == "fake" else request.getfixturevalue("llama_usable")
    s = Serve(tmp_path, model, binary)
    serves.append(s)
    s.wait_ready()
    wrap, eng = s.engine_pids()
    watchdog = s.watchdog_pid()
    t = time.monotonic()
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(10)
    try:
        assert wait_dead([wrap, eng], 10) == [], "the wrapped engine outlived qmgui"
        gone_after = time.monotonic() - t
        assert watchdog is not None and wait_dead([watchdog], 10) == []  # its work done
    finally:
        kill_all([wrap, eng])
    assert gone_after < 5, gone_after  # SIGTERM from the watchdog, not a 3 s SIGKILL wait
    rc, out = cli("engines", "list", "--json")
    assert rc == 0 and json.loads(out) == []
    assert RunRegistry().entries() == []  # the dead serve's entry was pruned as stale


def test_engines_list_finds_and_stops_the_orphan_of_a_wrapper(
    tmp_path: Path, model: Path, serves: list[Serve]
) -> None:
    """Without its watchdog (killed too), qmgui's death leaves the engine: the registry still
    knows it by its group and token, though its recorded process (the wrapper) is gone."""
    s = Serve(tmp_path, model, "fake")
    serves.append(s)
    s.wait_ready()
    wrap, eng = s.engine_pids()
    try:
        watchdog = s.watchdog_pid()
        if watchdog is not None:
            os.kill(watchdog, signal.SIGKILL)
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        assert wait_dead([wrap], 5) == []  # the direct child: PR_SET_PDEATHSIG
        assert wait_dead([eng], 1) == [eng]  # the grandchild runs on, an orphan
        rc, out = cli("engines", "list", "--json")
        assert rc == 0
        [listed] = json.loads(out)
        assert listed["pid"] == wrap and listed["pids"] == [eng] and listed["left_running"]
        assert listed["pgid"] == wrap
        rc, out = cli("engines", "stop", str(wrap), "--grace", "5")
        assert rc == 0 and f"stopped {wrap}" in out
        assert dead(eng)
        assert cli("engines", "list", "--json") == (0, "[]\n")
    finally:
        kill_all([wrap, eng])


def test_sighup_stops_serve_gracefully_and_forgets_the_engine(
    tmp_path: Path, model: Path, serves: list[Serve]
) -> None:
    s = Serve(tmp_path, model, "fake")
    serves.append(s)
    s.wait_ready()
    wrap, eng = s.engine_pids()
    [entry] = RunRegistry().entries()
    assert entry.pid == wrap and entry.pgid == wrap and entry.owner == s.proc.pid
    s.proc.send_signal(signal.SIGHUP)  # the terminal closed
    try:
        _, err = s.proc.communicate(timeout=20)
        assert s.proc.returncode == 0, err
        assert "was stopped." in err and "ignored the stop signal" not in err
        assert wait_dead([wrap, eng], 5) == []
    finally:
        kill_all([wrap, eng])
    assert RunRegistry().entries() == []


def test_host_override_is_honoured_with_a_warning(
    tmp_path: Path, model: Path, serves: list[Serve]
) -> None:
    s = Serve(tmp_path, model, "fake", "--extra=--host 0.0.0.0")
    serves.append(s)
    ready = s.wait_ready()
    port = int(ready.rsplit(":", 1)[1])
    assert ready.startswith("ready http://127.0.0.1:")  # reached through loopback
    _, eng = s.engine_pids()
    listening = [
        c.laddr
        for c in psutil.Process(eng).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    assert [(a.ip, a.port) for a in listening] == [("0.0.0.0", port)]
    s.proc.send_signal(signal.SIGTERM)
    _, err = s.proc.communicate(timeout=20)
    assert s.proc.returncode == 0, err
    # said once, before it listens, with where the API key it was given is kept
    assert err.count("reachable from the network") == 1, err
    assert "listening on 0.0.0.0: reachable from the network" in err
    assert "api-key" in err


def test_the_supervisor_ends_a_wrappers_engine_when_the_wrapper_dies(tmp_path: Path) -> None:
    """The wrapper (the recorded process) is killed: the engine it left in the group goes too,
    and the crash is reported as the wrapper's."""
    sup = Supervisor(EngineSpec(argv=(str(wrapper(tmp_path, "fake")),), name="wrapped"))
    sup.start()
    try:
        assert sup.wait_ready(10), sup.outcome
        assert sup.pid is not None
        [eng] = psutil.Process(sup.pid).children()
        os.kill(sup.pid, signal.SIGKILL)
        out = sup.wait(10)
        assert out is not None and out.kind == OutcomeKind.KILLED_BY_SIGNAL
        assert sup.state == State.CRASHED
        assert wait_dead([eng.pid], 5) == []
    finally:
        sup.stop()


def test_stop_covers_the_whole_group(tmp_path: Path) -> None:
    sup = Supervisor(EngineSpec(argv=(str(wrapper(tmp_path, "fake")),), name="wrapped"))
    sup.start()
    assert sup.wait_ready(10), sup.outcome
    assert sup.pid is not None
    pids = [sup.pid, *(c.pid for c in psutil.Process(sup.pid).children(recursive=True))]
    assert len(pids) == 2 and all(os.getpgid(p) == sup.pid for p in pids)
    out = sup.stop()
    assert out.kind == OutcomeKind.STOPPED and "ignored" not in str(out)
    assert wait_dead(pids, 1) == []


_SUBREAPER_DRIVER = """
import os, subprocess, sys, time
import psutil
from qmgui.engines.runner import become_subreaper, is_subreaper
assert not is_subreaper()
assert become_subreaper() and is_subreaper()
sh = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE, text=True)
orphan = int(sh.stdout.readline())
sh.wait()
parent = psutil.Process(orphan).ppid()
os.kill(orphan, 9)
os.waitpid(orphan, 0)  # ours to reap
print(parent == os.getpid())
"""


def test_become_subreaper_adopts_orphans() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SUBREAPER_DRIVER],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_a_zombie_engine_is_not_running() -> None:
    reg = RunRegistry()
    proc = subprocess.Popen(["true"])
    try:
        ct = psutil.Process(proc.pid).create_time()
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        reg.record(RunEntry(proc.pid, ct, ("llama-server",), 8080))
        assert reg.survivors() == []
        assert reg.entries() == []  # dropped as stale
    finally:
        proc.wait(5)


_WRITER = """
import os, sys, time
from pathlib import Path
import psutil
from qmgui.engines.registry import RunEntry, RunRegistry
go = Path(sys.argv[1]); n = int(sys.argv[2]); base = int(sys.argv[3])
me = psutil.Process()
while not go.exists():
    time.sleep(0.001)
reg = RunRegistry()
for i in range(n):  # stale entries (pids that do not exist): only the file's merge keeps them
    reg.record(RunEntry(base + i, 1.0, ("fake", str(i)), None))
    reg.running() if i % 5 == 0 else None  # prune meanwhile, as a starting serve does
reg.record(RunEntry(me.pid, me.create_time(), ("engine",), base, owner=me.pid,
                    owner_create_time=me.create_time()))
print("recorded", flush=True)
sys.stdin.readline()
reg.remove(me.pid)
"""


def test_five_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    go = tmp_path / "go"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(go), "12", str(40_000_000 + 1000 * k)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for k in range(5)
    ]
    try:
        time.sleep(1.0)  # all of them imported and waiting
        go.touch()
        for w in writers:
            assert w.stdout is not None
            assert w.stdout.readline().strip() == "recorded"
        reg = RunRegistry()
        live = {w.pid for w in writers}
        # every writer's own entry survived the others' writes and prunes
        assert live <= {e.pid for e in reg.entries()}
        assert {e.pid for e in reg.running()} == live
        rc, out = cli("engines", "list", "--json")
        assert rc == 0 and {e["pid"] for e in json.loads(out)} == live
        assert reg.survivors() == []  # each is run by a live qmgui: not left behind
        for w in writers:
            w.communicate("\n", timeout=20)
            assert w.returncode == 0
        assert reg.entries() == []  # each removed its own; the stale ones went meanwhile
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(5)


def test_stale_entries_of_dead_and_reused_pids_are_pruned() -> None:
    reg = RunRegistry()
    me = psutil.Process()
    other = subprocess.Popen(["sleep", "30"])
    try:
        reg.record(RunEntry(999_999_99, 1.0, ("gone",), 1))
        ct = psutil.Process(other.pid).create_time()
        reg.record(RunEntry(other.pid, ct + 5, ("reused",), 2))  # its pid, another process
        reg.record(RunEntry(me.pid, me.create_time(), ("me",), 3))
        assert [e.argv for e in reg.running()] == [("me",)]
        assert [e.argv for e in reg.entries()] == [("me",)]
        reg.remove(me.pid)
        assert reg.entries() == []
    finally:
        other.kill()
        other.wait(5)
