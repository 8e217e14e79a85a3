"""Crash restarts, idle stop, readback with residuals, and adopting survivors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from qmgui.core.footprint import DeviceFootprint, Footprint
from qmgui.core.readback import parse_llama_log
from qmgui.engines.adopt import NO_LOGS, Adopted
from qmgui.engines.ports import free_port
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.residuals import ResidualStore, engine_pids, read_residuals, readback
from qmgui.engines.supervisor import EngineSpec, OutcomeKind, State, Supervisor, idle_words
from qmgui.hw.nvml import read_nvml
from qmgui.notify import Notifier
from tests.hw.fake_nvml import FakeNvml

CHILD = str(Path(__file__).with_name("supervisor_child.py"))
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


def child_spec(mode: str, *extra: str, **kw: object) -> EngineSpec:
    return EngineSpec(argv=(sys.executable, CHILD, mode, *extra), name=f"child-{mode}", **kw)  # type: ignore[arg-type]


# -- crash restart -------------------------------------------------------------------------


def test_backoff_doubles_and_is_capped() -> None:
    spec = child_spec("healthy", max_restarts=5, restart_base_s=0.5, restart_max_s=3)
    assert [spec.restart_delay_s(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert child_spec("healthy").max_restarts == 0  # off by default


def test_crash_after_ready_is_restarted_then_given_up() -> None:
    notes = Notifier()
    states: list[State] = []
    spec = child_spec("healthy", max_restarts=2, restart_base_s=0.05)
    sup = Supervisor(spec, notifier=notes, on_state=lambda s, st: states.append(st))
    sup.start()
    pids = []
    for _ in range(3):
        assert sup.wait_ready(10), sup.outcome
        pid = sup.pid
        assert pid is not None and pid not in pids
        pids.append(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while sup.pid == pid and not sup.state.final and time.monotonic() < deadline:
            time.sleep(0.02)
    out = sup.wait(5)
    assert out is not None and out.kind == OutcomeKind.KILLED_BY_SIGNAL, out
    assert out.restarts == 2 and sup.restarts == 2
    assert "restarted 2 times after crashing; qmgui gave up" in str(out)
    assert sup.state == State.CRASHED
    assert [m.text for m in notes.history] == [
        "child-healthy was killed by SIGKILL after it was ready; restarting it in 0.05 s "
        "(restart 1 of 2).",
        "child-healthy was killed by SIGKILL after it was ready; restarting it in 0.1 s "
        "(restart 2 of 2).",
    ]
    assert states.count(State.READY) == 3
    assert states.count(State.STARTING) == 3


def test_stop_during_the_backoff_is_clean() -> None:
    sup = Supervisor(child_spec("healthy", max_restarts=3, restart_base_s=30))
    sup.start()
    assert sup.wait_ready(10)
    assert sup.pid is not None
    os.kill(sup.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while sup.state != State.STARTING and time.monotonic() < deadline:
        time.sleep(0.02)
    t = time.monotonic()
    out = sup.stop()
    assert time.monotonic() - t < 5
    assert out.kind == OutcomeKind.STOPPED and out.restarts == 1


# -- idle stop -----------------------------------------------------------------------------


def test_idle_engine_is_stopped_and_touch_keeps_it() -> None:
    sup = Supervisor(child_spec("healthy", idle_ttl_s=0.6))
    sup.start()
    assert sup.wait_ready(10)
    for _ in range(6):  # 1.2 s of activity keeps it up
        time.sleep(0.2)
        sup.touch()
        assert sup.state == State.READY
    out = sup.wait(5)
    assert out is not None and out.kind == OutcomeKind.IDLE, out
    assert out.was_successful() and sup.state == State.STOPPED
    assert out.idle_s is not None and 0.6 <= out.idle_s < 2
    assert "was stopped after 0.01 minutes idle" in str(out)


def test_idle_words() -> None:
    assert idle_words(600) == "10 minutes"
    assert idle_words(60) == "1 minute"
    assert idle_words(30) == "0.5 minutes"


# -- readback with residuals ---------------------------------------------------------------

LOG = """\
build: 4242 (abc1234) with cc for x86_64-linux-gnu
print_info: arch             = llama
load_tensors:        CUDA0 model buffer size =   100.00 MiB
load_tensors:        CUDA1 model buffer size =    50.00 MiB
load_tensors:   CPU_Mapped model buffer size =    10.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =    20.00 MiB
llama_kv_cache:      CUDA1 KV buffer size =    20.00 MiB
sched_reserve:      CUDA0 compute buffer size =     8.00 MiB
sched_reserve:      CUDA1 compute buffer size =     8.00 MiB
sched_reserve:  CUDA_Host compute buffer size =     2.00 MiB
"""


def _footprint() -> Footprint:
    devices = (
        DeviceFootprint("GPU0", weights=90 * MIB, kv=20 * MIB, compute=8 * MIB),
        DeviceFootprint("GPU1", weights=50 * MIB, kv=20 * MIB, compute=10 * MIB),
        DeviceFootprint("CPU", weights=10 * MIB, compute=2 * MIB),
    )
    return Footprint(settings=None, n_gpu_layers=99, layer_devices=(), devices=devices)  # type: ignore[arg-type]


def test_log_fixture_parses() -> None:
    report = parse_llama_log(LOG)
    assert [d.device for d in report.devices] == ["CUDA0", "CUDA1", "CPU"] or {
        d.device for d in report.devices
    } == {"CUDA0", "CUDA1", "CPU"}
    assert report.build is not None and report.architecture == "llama"


def test_readback_maps_devices_and_nvml_processes() -> None:
    nvml = read_nvml(FakeNvml("two-gpus-with-processes.json"))
    # 40211 (on both GPUs in the recording) stands for the engine; 51234 is someone else
    rb = readback(LOG, _footprint(), nvml, pids={40211})
    names = [(r.name, r.engine_device) for r in rb.rows]
    assert names == [("GPU0", "CUDA0"), ("GPU1", "CUDA1"), ("CPU", "CPU")]
    gpu0 = rb.rows[0]
    assert gpu0.residual == {"weights": 10 * MIB, "kv": 0, "compute": 0, "output": 0, "other": 0}
    assert rb.rows[1].residual == {
        "weights": 0,
        "kv": 0,
        "compute": -2 * MIB,
        "output": 0,
        "other": 0,
    }
    assert gpu0.nvml_bytes == 19327352832
    assert rb.rows[1].nvml_bytes == 21474836480 and rb.rows[2].nvml_bytes is None
    assert [(p.gpu_index, p.pid) for p in rb.processes] == [(0, 40211), (1, 40211)]
    assert rb.residuals() == {
        "weights": 10 * MIB,
        "kv": 0,
        "compute": -2 * MIB,
        "output": 0,
        "other": 0,
    }
    assert rb.build == "b4242-abc1234" and rb.architecture == "llama"
    json.dumps(rb.to_json())
    assert readback(LOG, _footprint(), nvml).processes == ()  # no pids, no figure


def test_residual_store_means_and_reads(tmp_path: Path) -> None:
    store = ResidualStore()
    assert store.path == tmp_path / "state" / "residuals.json"
    rb = readback(LOG, _footprint())
    store.record(rb, machine="box")
    entry = store.record(rb, machine="box")
    assert entry is not None and entry["samples"] == 2
    got = read_residuals(build="b4242-abc1234", architecture="llama", machine="box")
    assert got == {"weights": 10 * MIB, "kv": 0, "compute": -2 * MIB, "output": 0, "other": 0}
    assert read_residuals(build="b1", architecture="llama", machine="box") is None
    assert not list((tmp_path / "state").glob(".residuals-*"))  # no temp files left


def test_corrupt_residual_store_is_moved_aside_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("[1, 2", encoding="utf-8")
    notes = Notifier()
    store = ResidualStore(path, notifier=notes)
    assert store.read(build=None, architecture=None) is None
    assert len(list(tmp_path.glob("r.json.bad-*"))) == 1
    assert "could not be read" in notes.history[0].text
    assert store.record(readback(LOG, _footprint()), machine="m") is not None
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == 1


def test_engine_pids_include_children() -> None:
    sup = Supervisor(child_spec("grandchild"))
    sup.start()
    try:
        assert sup.wait_ready(10)
        line = next(ln for ln in sup.log.tail() if ln.startswith("grandchild pid"))
        assert int(line.split()[-1]) in engine_pids(sup.pid)
    finally:
        sup.stop()


# -- adoption ------------------------------------------------------------------------------


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its reaper (init reaps an orphan in its own time)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _survivor(reg: RunRegistry) -> tuple[subprocess.Popen[bytes], RunEntry]:
    port = free_port()
    argv = [sys.executable, CHILD, "grandchild", "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    entry = RunEntry(proc.pid, psutil.Process(proc.pid).create_time(), tuple(argv), port)
    reg.record(entry)
    return proc, entry


def test_adopt_watches_health_and_stops_the_tree() -> None:
    reg = RunRegistry()
    proc, entry = _survivor(reg)
    try:
        [found] = reg.survivors()
        assert found == entry
        eng = Adopted(found, registry=reg, poll_s=0.1)
        eng.start()
        assert eng.wait_ready(10), eng.outcome
        tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        out = eng.stop(grace_s=2)
        proc.wait(5)
        assert out.kind == OutcomeKind.STOPPED and NO_LOGS in str(out)
        assert eng.state == State.STOPPED and not eng.logs
        assert all(_dead(p) for p in tree[1:])
        assert reg.survivors() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_adopted_exit_is_seen() -> None:
    reg = RunRegistry()
    proc, entry = _survivor(reg)
    try:
        eng = Adopted(entry, registry=reg, poll_s=0.05)
        eng.start()
        assert eng.wait_ready(10)
        for c in psutil.Process(proc.pid).children(recursive=True):
            c.kill()
        proc.kill()
        proc.wait(5)
        out = eng.wait(5)
        assert out is not None and out.kind == OutcomeKind.CRASHED and eng.state == State.CRASHED
        assert "exit status is unknown" in str(out) and NO_LOGS in str(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_adopting_a_gone_process_fails_in_words() -> None:
    eng = Adopted(RunEntry(999_999_99, 1.0, ("llama-server",), 1))
    eng.start()
    assert eng.state == State.FAILED
    assert eng.outcome is not None and "no longer running" in str(eng.outcome)


# -- the `qmgui engines` command -----------------------------------------------------------


def test_cli_engines_list_and_stop() -> None:
    import io

    from qmgui.cli import main

    reg = RunRegistry()
    proc, entry = _survivor(reg)
    try:
        out = io.StringIO()
        assert main(["engines", "list", "--json"], out=out) == 0
        assert [e["pid"] for e in json.loads(out.getvalue())] == [entry.pid]
        err = io.StringIO()
        assert main(["engines", "stop", "999999999"], out=io.StringIO(), err=err) == 1
        assert "not an engine qmgui started" in err.getvalue()
        out = io.StringIO()
        assert main(["engines", "stop", str(entry.pid), "--grace", "2"], out=out) == 0
        assert f"stopped {entry.pid}" in out.getvalue()
        proc.wait(5)
        out = io.StringIO()
        assert main(["engines", "list"], out=out) == 0
        assert "no engines started by qmgui are running" in out.getvalue()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_residual_store_keeps_every_writer_across_processes(tmp_path: Path) -> None:
    """Four processes record 10 samples each into one store at once: the mean counts all 40."""
    path = tmp_path / "r.json"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.engines.test_supervisor_more import LOG, _footprint\n"
        "from qmgui.engines.residuals import ResidualStore, readback\n"
        "store = ResidualStore(Path(sys.argv[1]))\n"
        "rb = readback(LOG, _footprint())\n"
        "for _ in range(10):\n"
        "    store.record(rb, machine='box')\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=Path(__file__).parents[2])
        for _ in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    (entry,) = json.loads(path.read_text(encoding="utf-8"))["entries"].values()
    assert entry["samples"] == 40
