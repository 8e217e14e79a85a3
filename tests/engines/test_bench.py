"""`qmgui bench` against the real llama-server and the tiny synthetic model: it starts the
model's engine (the command `qmgui serve` runs), measures it, keeps the result and stops
what it started; a running engine of the model is measured and left running. Every engine
started here is stopped by the `registry` fixture.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from qmgui import notify
from qmgui.core.bench import BenchResult
from qmgui.engines.bench import MAX_RESULTS, BenchStore
from qmgui.engines.llama_run import find_llama_server, load_and_stop
from qmgui.engines.registry import RunRegistry
from qmgui.engines.residuals import machine_name

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")

ROOT = Path(__file__).resolve().parents[2]
LLAMA = find_llama_server()
SMALL = ("--prompt-tokens", "64", "--gen-tokens", "16")


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunRegistry]:
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
    if LLAMA is None:
        pytest.skip("llama-server not found")
    out = load_and_stop(LLAMA, model, ("-c", "512", "--no-warmup", "-fit", "off"), timeout_s=30)
    if not out.loaded:
        pytest.skip(f"llama-server cannot load a model on this machine: {out}")
    return LLAMA


def cli(*args: str) -> tuple[int, str, str]:
    from qmgui.cli import main

    out, err = io.StringIO(), io.StringIO()
    rc = main(list(args), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def llama_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "llama" in p.name()]


def test_bench_starts_measures_keeps_and_stops(
    registry: RunRegistry, model: Path, llama_usable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QMGUI_TEST_LLAMA_SERVER", llama_usable)
    rc, out, err = cli("bench", str(model), "-c", "1024", "--no-probe", *SMALL, "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["prompt_tokens_per_s"] > 0 and data["generation_tokens_per_s"] > 0
    assert (data["prompt_tokens"], data["gen_tokens"]) == (64, 16)
    assert data["model"] == "tiny" and data["model_id"] == str(model)
    assert data["started"] is True and data["machine"] == machine_name()
    assert data["build"] and data["devices"] == ["CPU"]
    assert "-c 1024" in data["settings"] and "--port" not in data["settings"]
    assert "started for the benchmark" in err
    # kept, and read back for the same model and settings
    found = BenchStore().latest(str(model), data["settings"])
    assert found is not None and found[1] is True
    assert found[0] == BenchResult.from_json(data)
    # nothing left running: no process, no registry entry
    assert llama_processes() == []
    assert registry.running() == []
    # the human line
    rc, out, err = cli("bench", str(model), "-c", "1024", "--no-probe", *SMALL)
    assert rc == 0, err
    assert out.startswith("tiny: ") and " t/s generation (16 tokens) on " in out
    assert llama_processes() == []


def test_bench_measures_a_running_engine_and_leaves_it_running(
    registry: RunRegistry, model: Path, llama_usable: str
) -> None:
    env = {**os.environ, "QMGUI_TEST_LLAMA_SERVER": llama_usable, "PYTHONPATH": str(ROOT)}
    serve = [sys.executable, "-m", "qmgui", "serve", str(model), "-c", "1024", "--no-probe"]
    done = subprocess.run(
        [*serve, "--detach"], check=False, capture_output=True, text=True, env=env, timeout=90
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.split()[1]
    [entry] = registry.running()
    done = subprocess.run(
        [sys.executable, "-m", "qmgui", "bench", str(model), "--no-probe", *SMALL, "--json"],
        check=False, capture_output=True, text=True, env=env, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["url"] == url and data["started"] is False
    assert data["generation_tokens_per_s"] > 0 and data["prompt_tokens_per_s"] > 0
    assert "left running" in done.stderr
    # still serving, the same process
    assert [e.pid for e in registry.running()] == [entry.pid]
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        assert r.status == 200


def test_bench_refuses_an_engine_that_is_not_llama_server(
    registry: RunRegistry, tmp_path: Path
) -> None:
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 256,
                "max_position_embeddings": 512,
            }
        )
    )
    (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    rc, out, err = cli("bench", str(d), "--no-probe")
    assert rc != 0 and out == ""
    assert "llama-server" in err
    assert registry.running() == []


def test_the_store_is_bounded_and_survives_a_broken_file(tmp_path: Path) -> None:
    from tests.core.test_bench import result

    store = BenchStore(tmp_path / "bench.json")
    assert store.latest("/m/tiny.gguf", "x", machine="box") is None
    for i in range(MAX_RESULTS + 5):
        store.record(
            result(settings=f"-c {i}", measured_at=f"2026-12-02T01:{i // 60:02d}:{i % 60:02d}")
        )
    kept = store.results()
    assert len(kept) == MAX_RESULTS
    assert kept[0].settings == f"-c {MAX_RESULTS + 4}"  # the oldest went
    r, same = store.latest("/m/tiny.gguf", "-c 2", machine="box") or (None, None)
    assert r is not None and not same and r.settings == f"-c {MAX_RESULTS + 4}"
    r, same = store.latest("/m/tiny.gguf", "-c 100", machine="box") or (None, None)
    assert r is not None and same
    assert store.latest("/m/tiny.gguf", "-c 100", machine="other") is None
    (tmp_path / "bench.json").write_text("{not json")
    assert store.results() == []
    assert any("could not be read" in m.text for m in notify.notifier.history)
    store.record(result())
    assert len(store.results()) == 1


FAKE_LLAMA_BENCH = """#!/bin/sh
echo "$@" > "$(dirname "$0")/args.txt"
cat <<'TABLE'
| model | size | params | backend | threads | test | t/s |
| --- | ---: | ---: | --- | ---: | ---: | ---: |
| llama ?B F16 | 2.00 MiB | 1.05 M | CPU | 2 | pp32 | 25000.00 ± 10.00 |
| llama ?B F16 | 2.00 MiB | 1.05 M | CPU | 2 | tg8 | 900.50 ± 3.00 |

build: 1234abcd (10435)
TABLE
"""


def test_bench_with_llama_bench_reads_its_table(
    registry: RunRegistry, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if LLAMA is None:
        pytest.skip("llama-server not found")
    build = tmp_path / "build"
    build.mkdir()
    (build / "llama-server").symlink_to(LLAMA)
    monkeypatch.setenv("QMGUI_TEST_LLAMA_SERVER", str(build / "llama-server"))
    rc, _, err = cli("bench", str(model), "--no-probe", "--llama-bench")
    assert rc == 1 and "has no llama-bench beside it" in err
    bench = build / "llama-bench"
    bench.write_text(FAKE_LLAMA_BENCH)
    bench.chmod(0o755)
    args = ("--prompt-tokens", "32", "--gen-tokens", "8", "-ctk", "q8_0", "--json")
    rc, out, err = cli("bench", str(model), "--no-probe", "--llama-bench", *args)
    assert rc == 0, err
    data = json.loads(out)
    assert data["method"] == "llama-bench" and data["build"] == "b10435 (1234abcd)"
    assert (data["prompt_tokens"], data["prompt_tokens_per_s"]) == (32, 25000.0)
    assert (data["gen_tokens"], data["generation_tokens_per_s"]) == (8, 900.5)
    assert data["devices"] == ["CPU"]
    ran = (build / "args.txt").read_text().split()
    assert ran[:8] == ["-m", str(model), "-p", "32", "-n", "8", "-o", "md"]
    assert ran[ran.index("-ctk") + 1] == "q8_0"
    found = BenchStore().latest(str(model), data["settings"])
    assert found is not None and found[0].method == "llama-bench"
    assert llama_processes() == [] and registry.running() == []
