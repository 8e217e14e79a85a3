"""The supervisor with tiny Python children for what a real engine cannot be made to do."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
import pytest

from qmgui.core.readback import parse_llama_log
from qmgui.engines import oom
from qmgui.engines.logs import LogSink
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.runner import Child
from qmgui.engines.supervisor import (
    EngineSpec,
    OutcomeKind,
    State,
    Supervisor,
    engine_line,
    launch_argv,
)
from qmgui.notify import Notifier

CHILD = str(Path(__file__).with_name("supervisor_child.py"))


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


def child_spec(mode: str, *extra: str, **kw: object) -> EngineSpec:
    return EngineSpec(argv=(sys.executable, CHILD, mode, *extra), name=f"child-{mode}", **kw)  # type: ignore[arg-type]


def test_ready_then_stop_leaves_nothing(tmp_path: Path) -> None:
    states: list[State] = []
    sup = Supervisor(child_spec("healthy"), on_state=lambda s, st: states.append(st))
    sup.start()
    assert sup.wait_ready(10), sup.outcome
    pid = sup.pid
    assert pid is not None
    out = sup.stop()
    assert out.was_successful() and out.kind == OutcomeKind.STOPPED
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert states == [State.STARTING, State.LOADING, State.READY, State.STOPPING, State.STOPPED]
    assert sup.log.path is not None and sup.log.path.parent == tmp_path / "logs"
    assert "child starting" in sup.log.path.read_text()


def test_missing_executable_is_an_outcome() -> None:
    sup = Supervisor(EngineSpec(argv=("/nonexistent/llama-server", "-m", "x")))
    sup.start()
    assert sup.state == State.FAILED
    assert sup.outcome is not None and sup.outcome.kind == OutcomeKind.NOT_FOUND
    assert "does not exist" in str(sup.outcome)


def test_not_executable_is_an_outcome(tmp_path: Path) -> None:
    f = tmp_path / "engine"
    f.write_text("#!/bin/sh\n")
    sup = Supervisor(EngineSpec(argv=(str(f),)))
    sup.start()
    assert sup.outcome is not None and sup.outcome.kind == OutcomeKind.NOT_EXECUTABLE
    assert "permissions" in str(sup.outcome)


def test_fixed_port_taken_is_refused_before_launch() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sup = Supervisor(child_spec("healthy", port=port))
        sup.start()
        assert sup.outcome is not None and sup.outcome.kind == OutcomeKind.PORT_TAKEN
        assert str(port) in str(sup.outcome)


def test_never_healthy_times_out_and_is_stopped() -> None:
    sup = Supervisor(child_spec("never", load_base_s=1.0, model_bytes=0))
    sup.start()
    out = sup.wait(10)
    assert out is not None and out.kind == OutcomeKind.NEVER_HEALTHY, out
    assert sup.state == State.FAILED
    assert "did not become ready within 1 s" in str(out)


def test_load_timeout_scales_with_model_size() -> None:
    spec = child_spec("never", load_base_s=10, load_per_gib_s=5, model_bytes=4 << 30)
    assert spec.load_timeout_s == 30


def test_exit_during_load_carries_the_log() -> None:
    sup = Supervisor(child_spec("exit"))
    sup.start()
    out = sup.wait(10)
    assert out is not None and out.kind == OutcomeKind.EXITED_DURING_LOAD
    assert out.returncode == 1
    assert "synthetic failure" in str(out)
    assert any("error loading model" in ln for ln in out.log_tail)


def test_out_of_memory_pinned_context_fails_with_words() -> None:
    sup = Supervisor(child_spec("oom", "-c", "32768", "--fits", "8192"))
    sup.start()
    out = sup.wait(10)
    assert out is not None and out.kind == OutcomeKind.OUT_OF_MEMORY
    assert "pinned" in str(out)


def test_out_of_memory_downshifts_and_tells_the_user() -> None:
    notes = Notifier()
    spec = child_spec("oom", "-c", "32768", "--fits", "8192", downshift=True)
    sup = Supervisor(spec, notifier=notes)
    sup.start()
    assert sup.wait_ready(20), sup.outcome
    assert sup.downshifts == [(32768, 16384), (16384, 8192)]
    assert sup.argv is not None and oom.ctx_of(sup.argv) == 8192
    assert [m.text for m in notes.history] == [
        "child-oom ran out of memory while loading the model at context 32768; restarting it "
        "at context 16384.",
        "child-oom ran out of memory while loading the model at context 16384; restarting it "
        "at context 8192.",
    ]
    assert sup.stop().was_successful()


def test_the_reduction_is_forgotten_once_the_engine_is_ready() -> None:
    # ready at 8192 after two halvings; a crash then restarts it at 32768 again (memory may
    # have been freed), which halves down the whole ladder once more
    spec = child_spec("oom", "-c", "32768", "--fits", "8192", downshift=True,
                      max_restarts=1, restart_base_s=0.05)  # fmt: skip
    sup = Supervisor(spec)
    sup.start()
    assert sup.wait_ready(20), sup.outcome
    assert sup.downshifts == [(32768, 16384), (16384, 8192)]
    pid = sup.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while (sup.pid == pid or not sup.wait_ready(0.1)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sup.state == State.READY and sup.pid != pid
    ladder = [(32768, 16384), (16384, 8192)]
    assert sup.downshifts == ladder + ladder  # the restart asked for 32768 again
    assert "the reduction is forgotten: a restart asks for context 32768 again" in sup.log.text()
    assert sup.stop().was_successful()


def test_a_ready_llama_server_logs_its_binary_build_backend_and_devices() -> None:
    log = "\n".join(
        [
            "build: 6123 (abc1234) with cc for x86_64-linux-gnu",
            "load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
            "load_tensors:        CUDA1 model buffer size =  1000.00 MiB",
            "load_tensors:   CPU_Mapped model buffer size =   100.00 MiB",
        ]
    )
    assert engine_line("/opt/llama/llama-server", parse_llama_log(log)) == (
        "engine: /opt/llama/llama-server, build 6123 (abc1234), backend CUDA, "
        "devices CUDA0, CUDA1, CPU"
    )
    bare = engine_line("/x/llama-server", parse_llama_log("nothing useful"))
    assert bare == "engine: /x/llama-server, build not reported, backend CPU, devices none reported"
    sup = Supervisor(child_spec("healthy"))
    sup.start()
    assert sup.wait_ready(10), sup.outcome
    assert f"# qmgui: engine: {sys.executable}, build not reported" in sup.log.text()
    assert sup.stop().was_successful()


def test_out_of_memory_stops_at_the_floor() -> None:
    sup = Supervisor(child_spec("oom", "-c", "8192", "--fits", "1000", downshift=True))
    sup.start()
    out = sup.wait(20)
    assert out is not None and out.kind == OutcomeKind.OUT_OF_MEMORY
    assert sup.downshifts == [(8192, 4096)]
    assert "floor" in str(out)


def test_ignoring_sigterm_needs_sigkill() -> None:
    sup = Supervisor(child_spec("ignore-term"), stop_grace_s=0.5)
    sup.start()
    assert sup.wait_ready(10)
    time.sleep(0.2)  # let it install its handler... it did before serving; be sure
    t = time.monotonic()
    out = sup.stop()
    assert time.monotonic() - t < 3
    assert out.kind == OutcomeKind.STOPPED
    assert "ignored the stop signal" in str(out)


def test_grandchild_is_killed_too() -> None:
    sup = Supervisor(child_spec("grandchild"))
    sup.start()
    assert sup.wait_ready(10)
    line = next(ln for ln in sup.log.tail() if ln.startswith("grandchild pid"))
    gpid = int(line.split()[-1])
    assert psutil.pid_exists(gpid)
    sup.stop()
    assert _dead(gpid)


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its reaper (init reaps an orphan in its own time)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigkill_after_ready_is_a_crash_seen_fast() -> None:
    sup = Supervisor(child_spec("healthy"))
    sup.start()
    assert sup.wait_ready(10)
    assert sup.pid is not None
    os.kill(sup.pid, signal.SIGKILL)
    t = time.monotonic()
    out = sup.wait(5)
    assert time.monotonic() - t < 1.0
    assert out is not None and out.kind == OutcomeKind.KILLED_BY_SIGNAL
    assert sup.state == State.CRASHED
    assert "SIGKILL after it was ready" in str(out)
    assert sup.stop() is out or sup.stop() == out


class _FailingRunner:
    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None) -> Child:
        raise PermissionError(13, "Permission denied")


def test_runner_seam_injects_a_start_failure() -> None:
    sup = Supervisor(child_spec("healthy"), runner=_FailingRunner())
    sup.start()
    out = sup.wait(5)
    assert out is not None and out.kind == OutcomeKind.START_FAILED
    assert "Permission denied" in str(out)


def test_stop_before_start_and_twice() -> None:
    sup = Supervisor(child_spec("healthy"))
    assert sup.stop().kind == OutcomeKind.STOPPED
    sup2 = Supervisor(child_spec("healthy"))
    sup2.start()
    first = sup2.stop()
    assert sup2.stop() == first


def test_launch_argv_fills_port_and_host() -> None:
    spec = EngineSpec(argv=("srv", "--port", "8080", "-m", "x"))
    assert launch_argv(spec, spec.argv, 9) == (
        "srv",
        "--port",
        "9",
        "-m",
        "x",
        "--host",
        "127.0.0.1",
    )
    tmpl = EngineSpec(argv=("srv", "--listen={host}:{port}"))
    assert launch_argv(tmpl, tmpl.argv, 7) == ("srv", "--listen=127.0.0.1:7")


def test_ctx_helpers() -> None:
    assert oom.ctx_of(["x", "-c", "8192"]) == 8192
    assert oom.ctx_of(["x", "--ctx-size=100"]) == 100
    assert oom.ctx_of(["x"]) is None
    assert oom.with_ctx(["x", "--ctx-size", "8192"], 4096) == ("x", "--ctx-size", "4096")
    assert oom.with_ctx(["x"], 4096) == ("x", "-c", "4096")
    assert oom.next_ctx(32768) == 16384
    assert oom.next_ctx(6000) == 4096
    assert oom.next_ctx(4096) is None
    assert oom.next_ctx(None) is None


def test_log_sink_ring_and_rotation(tmp_path: Path) -> None:
    sink = LogSink(tmp_path / "e.log", ring_lines=3, max_bytes=50, backups=1)
    for i in range(20):
        sink.write_line(f"line {i:02d} xxxxxxxx")
    assert sink.tail() == ["line 17 xxxxxxxx", "line 18 xxxxxxxx", "line 19 xxxxxxxx"]
    assert sink.tail(1) == ["line 19 xxxxxxxx"]
    assert (tmp_path / "e.log.1").exists()
    sink.close()


def test_registry_offers_survivors_and_drops_stale(tmp_path: Path) -> None:
    reg = RunRegistry()
    assert reg.path.parent == tmp_path / "state"
    sup = Supervisor(child_spec("healthy"), registry=reg)
    sup.start()
    assert sup.wait_ready(10)
    me = psutil.Process()
    reg.record(RunEntry(999_999_99, 1.0, ("gone",), 1))  # a pid that does not exist
    reg.record(RunEntry(me.pid, me.create_time() + 5, ("reused",), 2))  # same pid, other process
    running = reg.running()
    assert [e.pid for e in running] == [sup.pid]
    assert running[0].port == sup.port
    assert running[0].owner == me.pid  # this process runs it: not left by an earlier run
    assert reg.survivors() == []
    assert [e.pid for e in reg.entries()] == [sup.pid]  # the stale ones were dropped
    result = reg.stop(running[0], grace_s=2)  # as another qmgui would: not its child
    assert result.killed == 0
    assert sup.wait(5) is not None
    assert reg.running() == []
    sup.stop()


def test_an_unreadable_run_registry_is_kept_aside(tmp_path: Path) -> None:
    from qmgui import notify
    from qmgui.engines.registry import RunRegistry

    path = tmp_path / "engines.json"
    path.write_text("{not json", encoding="utf-8")
    assert RunRegistry(path).survivors() == []
    kept = list(tmp_path.glob("engines.json.bad-*"))
    assert len(kept) == 1
    assert kept[0].read_text(encoding="utf-8") == "{not json"
    assert any("could not be read" in m.text for m in notify.notifier.history)
