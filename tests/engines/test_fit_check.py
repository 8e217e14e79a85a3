"""Engine checks (llama-server's own -fit projection beside the plan) are recorded in the
residual store apart from a launch's readbacks: their own key and source, MiB per part."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from qmgui.core.footprint import DeviceFootprint, Footprint
from qmgui.core.projection import parse_projection
from qmgui.core.units import MIB
from qmgui.engines.fit_check import FitCheck, check_launch
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.residuals import (
    CHECK,
    LAUNCH,
    ResidualStore,
    engine_check,
    read_residuals,
    readback,
)
from tests.core.test_projection import LOG as PROJECTION_LOG
from tests.engines.test_supervisor_more import LOG as LAUNCH_LOG
from tests.synth.factory import PRESETS, write_gguf

BUILD_LINE = "0.00.006.706 I cmn  common_param: common_params_print_info: build 4242 (abc1234)\n"


def _plan() -> Footprint:
    devices = (  # the engine projects 2000/500/500 on CUDA0 and 0/1/5 on the host
        DeviceFootprint("GPU0", weights=2000 * MIB + 5, kv=400 * MIB, output=100 * MIB,
                        compute=500 * MIB + MIB // 2),
        DeviceFootprint("CPU", kv=MIB, compute=7 * MIB),
    )  # fmt: skip
    return Footprint(settings=None, n_gpu_layers=99, layer_devices=(), devices=devices)  # type: ignore[arg-type]


def _fit(log: str = BUILD_LINE + PROJECTION_LOG) -> FitCheck:
    return FitCheck(parse_projection(log), log)


def test_a_check_is_compared_per_device_and_part() -> None:
    check = engine_check(_fit(), _plan(), model="m.gguf")
    gpu, host = check.rows
    assert (gpu.device, gpu.engine_device, gpu.agrees) == ("GPU0", "CUDA0 (H200)", True)
    assert gpu.engine_mib == (2000, 500, 500)
    assert (host.device, host.agrees) == ("CPU", False)
    assert host.residual_mib == {"weights": 0.0, "context": 0.0, "compute": -2.0}
    assert check.residuals_mib()["compute"] == pytest.approx(-2.5)
    assert check.build == "b4242-abc1234" and check.model == "m.gguf"
    assert check.settings == {"n_gpu_layers": 99}
    assert json.loads(json.dumps(check.to_json()))["source"] == CHECK


def test_checks_are_kept_apart_from_launch_readbacks(tmp_path: Path) -> None:
    store = ResidualStore(tmp_path / "r.json")
    check = engine_check(_fit(), _plan())
    assert check.architecture is None  # a projection's log does not name it: meta does
    check = type(check)(check.rows, "b4242-abc1234", "llama", "m.gguf", {"n_ctx": 4096})
    store.record(readback(LAUNCH_LOG, _plan()), machine="box")  # b4242-abc1234, llama too
    store.record_check(check, machine="box")
    entry = store.record_check(check, machine="box")
    assert entry is not None and entry["source"] == CHECK and entry["samples"] == 2
    assert entry["agreed"] == 0  # the host row differs
    assert entry["mean_mib"] == {"weights": 0.0, "context": 0.0, "compute": -2.5}
    assert entry["recent"][-1]["settings"] == {"n_ctx": 4096}
    raw = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["entries"]
    assert set(raw) == {"box|b4242-abc1234|llama", "check|box|b4242-abc1234|llama"}
    # the sizing correction reads the launch's readback only, never the projection
    launch = read_residuals(build="b4242-abc1234", architecture="llama", machine="box",
                            path=tmp_path / "r.json")  # fmt: skip
    assert launch is not None and raw["box|b4242-abc1234|llama"]["samples"] == 1
    assert raw["box|b4242-abc1234|llama"]["source"] == LAUNCH
    summary = store.summary()
    assert [e["samples"] for e in summary[LAUNCH]] == [1]
    assert [e["samples"] for e in summary[CHECK]] == [2]


def test_a_check_alone_is_no_sizing_correction(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    check = engine_check(_fit(), _plan())
    ResidualStore(path).record_check(type(check)(check.rows, "b1-x", "llama"), machine="box")
    assert read_residuals(build="b1-x", architecture="llama", machine="box", path=path) is None


def test_an_entry_written_before_the_source_mark_is_a_launch(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    entry = {"machine": "box", "build": "b1-x", "architecture": "llama", "samples": 3,
             "mean": {"weights": 5}}  # fmt: skip
    path.write_text(json.dumps({"version": 1, "entries": {"box|b1-x|llama": entry}}))
    assert ResidualStore(path).summary() == {LAUNCH: [entry], CHECK: []}
    assert read_residuals(build="b1-x", architecture="llama", machine="box", path=path)


def test_no_projection_records_nothing(tmp_path: Path) -> None:
    store = ResidualStore(tmp_path / "r.json")
    check = engine_check(FitCheck((), "", "no projection within 60 s"), _plan())
    assert not check.comparable and check.error
    assert store.record_check(check) is None
    assert not (tmp_path / "r.json").exists()


def test_the_real_engine_check_is_recorded(tmp_path: Path) -> None:
    """check_launch runs the real llama-server as far as its projection, stops it, and
    records the comparison (build from its log, architecture and settings from the plan)."""
    from qmgui.core.footprint import estimate
    from qmgui.core.gguf_header import read_gguf_header
    from qmgui.core.launch import LaunchSettings
    from qmgui.core.meta import meta_from_gguf

    engine = find_llama_server()
    if engine is None:
        pytest.skip("llama-server not found")
    model = write_gguf(tmp_path / "m.gguf", PRESETS["llama"])
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    plan = estimate(meta, LaunchSettings(ctx_size=1024, parallel=1))
    store = ResidualStore(tmp_path / "r.json")
    argv = [engine, "-m", str(model), "-c", "1024", "-np", "1", "-ngl", "0"]
    check = check_launch(argv, plan, meta=meta, store=store)
    assert check.error == "" and check.comparable, check.error
    (host,) = check.rows
    assert host.device == "CPU" and host.engine_device == "Host"
    assert check.model == "m.gguf" and check.architecture == "llama"
    assert check.build is not None and check.build.startswith("b")
    assert check.settings["n_ctx"] == 1024
    (entry,) = store.summary()[CHECK]
    assert entry["architecture"] == "llama" and entry["build"] == check.build
    assert entry["recent"][0]["devices"][0]["engine_mib"] == list(host.engine_mib)
    assert store.summary()[LAUNCH] == []
    left = [p for p in psutil.process_iter(["cmdline"]) if str(model) in (p.info["cmdline"] or [])]
    assert left == []
    assert check_launch(argv, plan, meta=meta, store=store, record=False).comparable
    assert store.summary()[CHECK][0]["samples"] == 1  # record=False: not folded in


def test_a_checks_rows_read_as_compared_rows() -> None:
    """The window shows core.projection.compared's rows: a check's rows carry the same keys
    and values (plus the residual), so it can show a recorded check unchanged."""
    from qmgui.core.projection import compared

    check = engine_check(_fit(), _plan())
    plain = compared(_fit().devices, _plan().devices)
    for row, old in zip(check.rows, plain, strict=True):
        new = row.to_json()
        assert {k: new[k] for k in old} == old
