"""A launch with CPU weight repacking on (the default), against the real llama-server: the
plan's repacked copies equal the engine's CPU_REPACK buffer, the readback sees no overrun, and
`qmgui serve` prints the planned copies beside the actual ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import EngineSpec, Supervisor

BINARY = find_llama_server()
pytestmark = pytest.mark.skipif(BINARY is None, reason="llama-server not found")
PRECISION = 5243  # bytes: half of 0.01 MiB, the engine prints %.2f MiB


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.synth.factory import PRESETS, Q, write_gguf

    spec = replace(PRESETS["llama"], weight_type=Q.Q4_0)
    return write_gguf(tmp_path_factory.mktemp("models") / "llama-q4_0.gguf", spec)


def test_readback_of_a_repacking_launch(model: Path) -> None:
    from qmgui.core.build_rules import build_number
    from qmgui.core.footprint import EngineRules, estimate
    from qmgui.core.gguf_header import read_gguf_header
    from qmgui.core.launch import LaunchSettings
    from qmgui.core.meta import meta_from_gguf
    from qmgui.core.readback import parse_llama_log
    from qmgui.core.repack import parse_system_info
    from qmgui.engines.residuals import readback

    assert BINARY is not None
    args = ("-c", "512", "--no-warmup", "-fit", "off", "-np", "1", "-lv", "4")
    sup = Supervisor(EngineSpec(argv=(BINARY, "--model", str(model), *args), model_bytes=1))
    sup.start()
    try:
        assert sup.wait_ready(30), sup.outcome
        log = sup.log.text()
    finally:
        sup.stop()
    cpu = parse_system_info(log)
    assert cpu is not None
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    info = parse_llama_log(log).build  # the rules of the build that ran
    build = None if info is None else build_number(info.number, info.commit)
    rules = EngineRules(build=build, cpu=cpu)
    plan = estimate(meta, LaunchSettings(ctx_size=512, parallel=1), rules=rules)
    rb = readback(log, plan)
    (row,) = [r for r in rb.rows if r.name == "CPU"]
    assert row.actual is not None
    if not row.actual["other"]:
        pytest.skip("this CPU repacks no Q4_0 weights (no AVX2, NEON or AMX)")
    assert plan.host.repack > 0
    for kind in ("weights", "other"):  # the mapped span, the copies
        assert abs(row.residual[kind]) <= PRECISION, (kind, row.planned, row.actual)
    assert rb.overruns() == ()


def test_serve_prints_the_planned_copies(model: Path, tmp_path: Path) -> None:
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
        planned = next(d for d in data["planned"] if d["name"] == "CPU")
        actual = next(d for d in data["actual"] if d["name"] == "CPU")
        if not actual["repack"]:
            pytest.skip("this CPU repacks no Q4_0 weights (no AVX2, NEON or AMX)")
        assert abs(planned["repack"] - actual["repack"]) <= PRECISION, (planned, actual)
        assert abs(planned["weights"] - actual["weights"]) <= PRECISION, (planned, actual)
        assert not any(psutil.pid_exists(p) for p in engines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
