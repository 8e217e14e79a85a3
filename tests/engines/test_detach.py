"""Detached engines: `qmgui serve --detach` leaves the engine running on its own (output to its
log file, own session, no watchdog), `qmgui engines list|stop` find and stop it by model name,
a supervisor can leave an engine it started (`set_detached` + `release`), and `Adopted`
follows the log file of the engine it adopts. Engines not detached still die with qmgui
(`test_orphans.py`). Every process started here is stopped by the `registry` fixture.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from qmgui.engines.adopt import Adopted
from qmgui.engines.llama_run import find_llama_server, load_and_stop
from qmgui.engines.registry import RunRegistry
from qmgui.engines.runner import group_members, watchdog
from qmgui.engines.supervisor import EngineSpec, OutcomeKind, State, Supervisor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")

CHILD = str(Path(__file__).with_name("supervisor_child.py"))
ROOT = Path(__file__).resolve().parents[2]
LLAMA = find_llama_server()
LLAMA_ARGS = ("-c", "512", "--no-warmup", "-fit", "off", "-np", "1")
READY_S = 60.0


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunRegistry]:
    """A registry in a temporary state folder; whatever is still registered at the end is
    stopped (whole group), whichever process started it."""
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))
    reg = RunRegistry()
    yield reg
    for e in reg.entries():
        reg.stop(e, grace_s=2)


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


def cli(*args: str) -> tuple[int, str, str]:
    from qmgui.cli import main

    out, err = io.StringIO(), io.StringIO()
    rc = main(list(args), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def serve_detached(model: Path, binary: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QMGUI_TEST_LLAMA_SERVER": binary, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "qmgui", "serve", str(model), "-c", "512", "--no-probe"]
    return subprocess.run(
        [*argv, "--detach", *extra],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=READY_S + 30,
    )


def health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        status: int = r.status
        return status


def test_serve_detach_list_and_stop_by_name(
    registry: RunRegistry, model: Path, llama_usable: str
) -> None:
    done = serve_detached(model, llama_usable)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("ready http://127.0.0.1:"), done.stdout
    url = first.split()[1]
    # the CLI process has exited: the engine still serves, on its own
    assert health(url) == 200
    [entry] = registry.running()
    assert entry.detached and entry.model == "tiny" and entry.log_path is not None
    assert not entry.owner_alive()
    engine = psutil.Process(entry.pid)
    assert os.getsid(entry.pid) == entry.pid  # its own session
    log = Path(entry.log_path).read_text(errors="replace")
    assert "# qmgui:" in log and "listening on" in log  # it writes its own log
    rc, out, _ = cli("engines", "list", "--json")
    assert rc == 0
    [listed] = json.loads(out)
    assert listed["model"] == "tiny" and listed["pid"] == entry.pid and listed["url"] == url
    assert listed["port"] == entry.port and listed["detached"] and listed["uptime_s"] >= 0
    rc, out, _ = cli("engines", "list")
    assert rc == 0 and out.startswith(f"tiny  pid {entry.pid}  port {entry.port}  {url}  up ")
    rc, out, err = cli("engines", "stop", "tiny", "--grace", "5")
    assert rc == 0, err
    assert f"stopped {entry.pid} (tiny)" in out
    assert not psutil.pid_exists(entry.pid) or engine.status() == psutil.STATUS_ZOMBIE
    assert group_members(entry.pgid, None) == []  # the whole group is gone
    assert cli("engines", "list", "--json")[:2] == (0, "[]\n")


def test_serve_detach_of_an_engine_that_fails_to_load_exits_1(
    registry: RunRegistry, tmp_path: Path, model: Path
) -> None:
    engine = tmp_path / "bin" / "llama-server"
    engine.parent.mkdir()
    engine.write_text(
        '#!/bin/sh\necho "llama_model_load: error loading model: synthetic failure"\nexit 1\n'
    )
    engine.chmod(0o755)
    done = serve_detached(model, str(engine))
    assert done.returncode == 1, done.stdout
    assert "ready" not in done.stdout
    assert "synthetic failure" in done.stderr, done.stderr  # the engine's own reason
    assert registry.running() == []


def test_stop_engines_by_name_and_unknown_names(registry: RunRegistry) -> None:
    sup = Supervisor(
        EngineSpec(argv=(sys.executable, CHILD, "healthy"), name="child-a"),
        registry=registry,
        detached=True,
    )
    sup.start()
    assert sup.wait_ready(20), sup.outcome
    sup.release()
    rc, _, err = cli("engines", "stop", "no-such-model")
    assert rc == 1 and "no-such-model is not an engine" in err
    rc, out, err = cli("engines", "stop", "child-a", "--grace", "2")
    assert rc == 0, err
    assert "stopped" in out and registry.running() == []


def test_a_supervised_engine_is_left_running_and_adopted_with_its_log(
    registry: RunRegistry,
) -> None:
    sup = Supervisor(
        EngineSpec(argv=(sys.executable, CHILD, "healthy"), name="child"),
        registry=registry,
        output_file=True,
        model_id="m-1",
    )
    sup.start()
    assert sup.wait_ready(20), sup.outcome
    assert sup.can_detach and sup.pid is not None and sup.log.path is not None
    pid = sup.pid
    assert pid in watchdog.watched()  # until it is left, it dies with qmgui
    assert any("child starting" in ln for ln in sup.log.tail())  # followed from the file
    [before] = registry.running()
    assert not before.detached and before.log_path == str(sup.log.path)
    sup.set_detached(True)
    assert pid not in watchdog.watched()
    outcome = sup.release()
    assert outcome.kind == OutcomeKind.LEFT_RUNNING and sup.state == State.STOPPED
    assert psutil.pid_exists(pid)
    [entry] = registry.adoptable()
    assert entry.pid == pid and entry.detached and entry.model_id == "m-1"
    with open(entry.log_path or "", "a") as f:
        f.write("written after the adoption began\n")
    adopted = Adopted(entry, registry=registry, poll_s=0.1)
    adopted.start()
    assert adopted.wait_ready(10)
    # the log follower reads the file on its own thread: give it a moment on a busy machine
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
        any("child starting" in ln for ln in adopted.log.tail())
        and any("after the adoption" in ln for ln in adopted.log.tail())
    ):
        time.sleep(0.05)
    assert adopted.logs and any("child starting" in ln for ln in adopted.log.tail())
    assert any("after the adoption" in ln for ln in adopted.log.tail())
    assert adopted.uptime_s() > 0 and adopted.url == sup.url
    assert adopted.spec().argv == entry.argv
    stopped = adopted.stop(2)
    assert stopped.kind == OutcomeKind.STOPPED and stopped.log_path == entry.log_path
    assert registry.entries() == []


def test_a_load_failure_is_read_from_the_log_file(registry: RunRegistry) -> None:
    sup = Supervisor(
        EngineSpec(argv=(sys.executable, CHILD, "exit"), name="child"),
        registry=registry,
        output_file=True,
    )
    sup.start()
    outcome = sup.wait(20)
    assert outcome is not None and outcome.kind == OutcomeKind.EXITED_DURING_LOAD
    assert "synthetic failure" in outcome.message


HOLDER = """
import sys
import time
from qmgui.engines.registry import RunRegistry
from qmgui.engines.supervisor import EngineSpec, Supervisor
spec = EngineSpec(argv=(sys.executable, sys.argv[1], "healthy"), name="child")
sup = Supervisor(spec, registry=RunRegistry(), output_file=True)
sup.start()
assert sup.wait_ready(20), sup.outcome
if sys.argv[2] == "leave":
    sup.set_detached(True)
print(sup.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["keep", "leave"])
def test_an_engine_that_can_be_left_dies_with_qmgui_unless_it_was_left(
    how: str, registry: RunRegistry
) -> None:
    """The window's engines have no parent-death signal (it cannot be undone): the watchdog
    ends them when their qmgui is killed, unless they were left (detached)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, CHILD, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None
        pid = int(holder.stdout.readline())
        holder.kill()
        holder.wait(10)
        # the watchdog's SIGTERM comes at once; give it longer than its SIGKILL step (3 s)
        deadline = time.monotonic() + (8 if how == "keep" else 4)
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if how == "keep":
            assert not _alive(pid), "an engine not left outlived its qmgui"
        else:
            assert _alive(pid), "a left engine died with its qmgui"
            [entry] = registry.running()
            assert entry.pid == pid and entry.detached
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        for e in registry.entries():
            registry.stop(e, grace_s=2)
        with contextlib.suppress(ChildProcessError, NameError):
            os.waitpid(pid, os.WNOHANG)  # a zombie handed to this process as a subreaper


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_log_file_the_engine_writes_is_followed_and_rotated(tmp_path: Path) -> None:
    import threading

    from qmgui.engines.logs import LogSink, follow_file

    sink = LogSink(tmp_path / "e.log", from_file=True, max_bytes=400, backups=2)
    assert sink.path is not None
    sink.write_line("# qmgui: first")  # qmgui's own line: to the file only, back via the follower
    assert sink.tail() == []
    fd = os.open(sink.path, os.O_WRONLY | os.O_APPEND)  # the engine's own descriptor
    ended = threading.Event()
    follower = threading.Thread(
        target=follow_file,
        args=(sink.path, sink),
        kwargs={"done": ended.is_set, "poll_s": 0.01, "rotate": True},
    )
    follower.start()
    try:
        for i in range(60):
            os.write(fd, f"line {i:04d} of the engine\n".encode())
            if i % 10 == 9:
                time.sleep(0.05)  # the follower catches up and rotates
        os.write(fd, b"no newline at the end")
    finally:
        os.close(fd)
        ended.set()
        follower.join(5)
    lines = sink.tail()
    assert lines[0] == "# qmgui: first" and lines[-1] == "no newline at the end"
    assert lines[1:-1] == [f"line {i:04d} of the engine" for i in range(60)]
    backup = sink.path.with_name("e.log.1")
    assert backup.exists() and (backup.stat().st_mode & 0o777) == 0o600
    assert sink.path.stat().st_size < 400 + 60 * 25 // 2  # it was emptied along the way
    sink.close()
