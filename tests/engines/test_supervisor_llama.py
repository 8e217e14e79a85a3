"""The supervisor with the real llama-server and a tiny synthetic model."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import EngineSpec, OutcomeKind, State, Supervisor

BINARY = find_llama_server()
pytestmark = pytest.mark.skipif(BINARY is None, reason="llama-server not found")
ARGS = ("-c", "512", "--no-warmup", "-fit", "off", "-np", "1")


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.synth.factory import PRESETS, write_gguf

    return write_gguf(tmp_path_factory.mktemp("models") / "llama.gguf", PRESETS["llama"])


def spec(model: Path) -> EngineSpec:
    assert BINARY is not None
    return EngineSpec(argv=(BINARY, "--model", str(model), *ARGS), model_bytes=model.stat().st_size)


def _tree(pid: int) -> list[int]:
    p = psutil.Process(pid)
    return [pid, *(c.pid for c in p.children(recursive=True))]


def test_start_ready_models_stop(model: Path) -> None:
    sup = Supervisor(spec(model))
    sup.start()
    assert sup.wait_ready(30), sup.outcome
    assert sup.state == State.READY
    with urllib.request.urlopen(f"{sup.url}/v1/models", timeout=5) as r:
        data = json.load(r)
    assert data["data"], data
    assert sup.pid is not None
    pids = _tree(sup.pid)
    out = sup.stop()
    assert out.was_successful(), out
    assert not any(psutil.pid_exists(p) for p in pids)


def test_sigkill_is_seen_as_crashed_within_a_second(model: Path) -> None:
    sup = Supervisor(spec(model))
    sup.start()
    assert sup.wait_ready(30), sup.outcome
    assert sup.pid is not None
    os.kill(sup.pid, signal.SIGKILL)
    t = time.monotonic()
    out = sup.wait(1.0)
    assert time.monotonic() - t < 1.0
    assert out is not None and out.kind == OutcomeKind.KILLED_BY_SIGNAL
    assert sup.state == State.CRASHED


def test_real_engine_is_restarted_after_a_crash(model: Path) -> None:
    from qmgui.notify import Notifier

    notes = Notifier()
    sup = Supervisor(
        EngineSpec(
            argv=spec(model).argv,
            model_bytes=model.stat().st_size,
            max_restarts=1,
            restart_base_s=0.1,
        ),
        notifier=notes,
    )
    sup.start()
    try:
        assert sup.wait_ready(30), sup.outcome
        first = sup.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (sup.pid == first or sup.state != State.READY) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.state == State.READY and sup.pid != first and sup.restarts == 1
        with urllib.request.urlopen(f"{sup.url}/health", timeout=5) as r:
            assert r.status == 200
        assert "restart 1 of 1" in notes.history[0].text
    finally:
        out = sup.stop()
    assert out.was_successful() and out.restarts == 1


def test_two_engines_side_by_side(model: Path) -> None:
    a, b = Supervisor(spec(model)), Supervisor(spec(model))
    a.start()
    b.start()
    try:
        assert a.wait_ready(30), a.outcome
        assert b.wait_ready(30), b.outcome
        assert a.port != b.port
        for s in (a, b):
            with urllib.request.urlopen(f"{s.url}/health", timeout=5) as r:
                assert r.status == 200
    finally:
        assert a.stop().was_successful()
        assert b.stop().was_successful()


def test_bad_model_exits_during_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    sup = Supervisor(spec(bad))
    sup.start()
    out = sup.wait(30)
    assert out is not None and out.kind == OutcomeKind.EXITED_DURING_LOAD, out
    assert out.log_tail


def test_qmgui_serve_prints_ready_and_exits_on_sigint(model: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgui", "serve", str(model), "-c", "512", "--no-probe", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "QMGUI_TEST_LLAMA_SERVER": str(BINARY),
            "QMGUI_STATE_DIR": str(tmp_path / "state"),
        },
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("ready http://127.0.0.1:"), (first, proc.stderr)
        engines = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        data = json.loads(rest)
        assert data["planned"] and data["actual"]
        assert data["actual"][0]["name"] == "CPU"
        assert data["nvml"] == []  # no NVIDIA GPU here: no per-process figure
        stored = json.loads((tmp_path / "state" / "residuals.json").read_text())
        [entry] = stored["entries"].values()
        assert entry["samples"] == 1 and set(entry["mean"]) >= {"weights", "kv", "compute"}
        assert not any(psutil.pid_exists(p) for p in engines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_ready_engine_logs_its_binary_build_backend_and_devices(model: Path) -> None:
    """At ready, one line names the binary, its build, the backend and the devices, as the
    engine's log (at qmgui's -lv 4, engine_spec) reported them."""
    assert BINARY is not None
    sup = Supervisor(EngineSpec(argv=(BINARY, "--model", str(model), *ARGS, "-lv", "4")))
    sup.start()
    try:
        assert sup.wait_ready(30), sup.outcome
        lines = sup.log.text().splitlines()
    finally:
        sup.stop()
    (line,) = [ln for ln in lines if ln.startswith("# qmgui: engine: ")]
    assert re.fullmatch(r"# qmgui: engine: \S*llama-server, build \d+ \(\S+\), backend CPU, "
                        r"devices CPU", line), line  # fmt: skip


def test_readback_matches_the_plan(model: Path) -> None:
    """What the running engine logged equals the plan: weights, KV and output to the engine's
    0.01 MiB print precision, compute within [measured, +5%]."""
    from qmgui.core.footprint import estimate
    from qmgui.core.gguf_header import read_gguf_header
    from qmgui.core.launch import LaunchSettings
    from qmgui.core.meta import meta_from_gguf
    from qmgui.engines.residuals import readback

    assert BINARY is not None
    sup = Supervisor(
        EngineSpec(
            argv=(BINARY, "--model", str(model), *ARGS, "-lv", "4", "-nr"),
            model_bytes=model.stat().st_size,
        )
    )
    sup.start()
    try:
        assert sup.wait_ready(30), sup.outcome
        meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
        plan = estimate(meta, LaunchSettings(ctx_size=512, parallel=1, repack=False))
        rb = readback(sup.log.text(), plan)
    finally:
        sup.stop()
    (cpu,) = [row for row in rb.rows if row.name == "CPU"]
    precision = 5243  # bytes: half of 0.01 MiB, the engine prints %.2f MiB
    for kind in ("weights", "kv", "output", "other"):
        assert abs(cpu.residual[kind]) <= precision, (kind, cpu.planned, cpu.actual)
    # residual = actual - planned: never planned below the engine, at most 5% above it
    assert -0.05 * cpu.actual["compute"] - precision <= cpu.residual["compute"] <= precision
    assert rb.overruns() == ()  # the plan holds: nothing to warn about
    # the same log against a plan short of compute: said, with the numbers
    from dataclasses import replace

    short = replace(
        plan,
        devices=tuple(
            replace(d, compute=d.compute // 2) if d.name == "CPU" else d for d in plan.devices
        ),
    )
    (overrun,) = readback(sup.log.text(), short).overruns()
    assert overrun.startswith("CPU compute: the engine allocated ")
    assert "more than planned" in overrun and "(100%)" in overrun


def test_an_overrun_within_precision_and_two_percent_is_not_one() -> None:
    from qmgui.engines.residuals import OVERRUN_SHARE, PRINT_PRECISION, DeviceRow, Readback

    planned = {"weights": 100 << 20, "kv": 0, "compute": 50 << 20, "output": 0, "other": 0}
    edge = PRINT_PRECISION + int(OVERRUN_SHARE * (50 << 20))
    within = dict(planned, compute=(50 << 20) + edge)
    beyond = dict(planned, compute=(50 << 20) + edge + 1)
    assert Readback((DeviceRow("GPU0", "CUDA0", planned, within),)).overruns() == ()
    (said,) = Readback((DeviceRow("GPU0", "CUDA0", planned, beyond),)).overruns()
    assert said.startswith("GPU0 compute: the engine allocated 51.0 MiB")


def test_a_context_beyond_the_trained_one_is_planned_as_allocated(model: Path) -> None:
    """-c four times the trained context: the engine allocates it and warns; the plan equals
    what it allocated, buffer by buffer, and carries the same warning in its own words."""
    from qmgui.core.fit import Budget, check
    from qmgui.core.gguf_header import read_gguf_header
    from qmgui.core.launch import LaunchSettings
    from qmgui.core.meta import meta_from_gguf
    from qmgui.engines.llama_run import load_and_stop
    from qmgui.engines.residuals import readback

    assert BINARY is not None
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    ctx = 4 * meta.context_length
    out = load_and_stop(
        BINARY, model, ("-c", str(ctx), "-np", "1", "-lv", "4", "-fit", "off", "--no-warmup"),
        timeout_s=60,
    )  # fmt: skip
    assert out.loaded, out.log[-2000:]
    assert "possible training context overflow" in out.log
    result = check(meta, LaunchSettings(ctx_size=ctx, parallel=1), Budget())
    assert result.footprint.settings.n_ctx_seq == ctx
    rb = readback(out.log, result.footprint)
    assert rb.overruns() == ()
    (cpu,) = [row for row in rb.rows if row.name == "CPU"]
    assert cpu.residual is not None and abs(cpu.residual["kv"]) <= 5243  # 0.01 MiB printed
    assert any("beyond the" in w and "trained on" in w for w in result.warnings)


def test_a_projector_is_planned_as_the_engine_loads_it(tmp_path: Path) -> None:
    """A vision model with its projector (a CLIP mmproj written with the gguf writer, which the
    real server loads): the projector's weights in the plan equal the size the engine prints
    for it; its image warm-up compute buffer is charged as an upper bound, and the plan says so
    (tests/engines/test_projector_compute.py holds it against the engine's)."""
    import re

    from qmgui.core.footprint import estimate
    from qmgui.core.gguf_header import read_gguf_header
    from qmgui.core.launch import LaunchSettings
    from qmgui.core.meta import ModelClass, meta_from_gguf
    from qmgui.engines.llama_run import load_and_stop
    from tests.synth._mmproj import write_mmproj
    from tests.synth.factory import PRESETS, write_gguf

    assert BINARY is not None
    model = write_gguf(tmp_path / "tiny-gemma3.gguf", PRESETS["gemma3"])
    proj = write_mmproj(tmp_path / "mmproj-tiny-gemma3.gguf")
    args = ("--mmproj", str(proj), "-c", "1024", "-lv", "4", "-fit", "off", "--no-warmup")
    out = load_and_stop(BINARY, model, args, timeout_s=60)
    assert out.loaded and "loaded multimodal model" in out.log, out.log[-2000:]
    printed = re.search(r"load_hparams:\s+model size:\s+([\d.]+) MiB", out.log)
    assert printed is not None
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    pmeta = meta_from_gguf(read_gguf_header(proj), file_name=proj.name)
    assert pmeta.model_class == ModelClass.PROJECTOR
    plain = estimate(meta, LaunchSettings(ctx_size=1024))
    with_proj = estimate(meta, LaunchSettings(ctx_size=1024), mmproj=pmeta)
    added = sum(d.weights for d in with_proj.devices) - sum(d.weights for d in plain.devices)
    assert f"{added / 2**20:.2f}" == printed.group(1)
    assert [b.part for b in with_proj.bounds] == ["projector compute"]
