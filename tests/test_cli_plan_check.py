"""`qmgui plan --check` records its comparison with the engine's projection in the residual
store as an engine check, which `qmgui doctor` lists apart from a launch's readbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.residuals import CHECK, LAUNCH, ResidualStore
from tests.synth.factory import PRESETS, write_gguf
from tests.test_cli import run


def test_plan_check_is_recorded_as_an_engine_check(tmp_path: Path) -> None:
    engine = find_llama_server()
    if engine is None:
        pytest.skip("llama-server not found")
    model = write_gguf(tmp_path / "m.gguf", PRESETS["llama"])
    code, out, err = run("plan", str(model), "-c", "1024", "--check", "--backend", engine,
                         "--json")  # fmt: skip
    assert code == 0, err
    check = json.loads(out)["check"]
    assert check["error"] is None and check["build"]
    (cpu,) = check["devices"]
    assert set(cpu["residual_mib"]) == {"weights", "context", "compute"}
    summary = ResidualStore().summary()
    assert summary[LAUNCH] == []
    (entry,) = summary[CHECK]
    assert entry["architecture"] == "llama" and entry["build"] == check["build"]
    last = entry["recent"][-1]
    assert last["model"] == "m.gguf" and last["settings"]["n_ctx"] == 1024
    assert last["devices"][0]["engine_mib"] == cpu["engine_mib"]
    code, out, _ = run("plan", str(model), "-c", "1024", "--check", "--backend", engine)
    assert "recorded with the memory residuals as an engine check" in out
    assert ResidualStore().summary()[CHECK][0]["samples"] == 2
    code, out, _ = run("doctor")
    assert "engine check (a projection, not an allocation) of llama on" in out
    assert "launch readback" not in out  # no launch was read back: none is claimed
