"""llama-swap config: golden YAML, read back with PyYAML, held to llama-swap's schema, and each
`cmd` split the way llama-swap splits it gives back the emitted argv."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import PORT_MACRO, Command, DevicePin
from qmgui.core.emit.llama import emit_llama
from qmgui.core.emit.vllm import emit_vllm
from qmgui.core.export import ExportError, footprint_comment, vllm_comment, vllm_reasons
from qmgui.core.export.llama_swap import (
    SwapGroup,
    SwapModel,
    render_cmd,
    render_llama_swap,
    render_run_set,
)
from qmgui.core.fit import Budget, check, gpus_from_sizes
from qmgui.core.launch import LaunchSettings
from qmgui.core.placement import place
from qmgui.core.units import GIB
from qmgui.core.vllm import VllmPins, plan_vllm
from tests.core.test_emit_llama import assert_golden
from tests.core.test_placement import cards, req, toy
from tests.core.test_shell import windows_split
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_mmproj, write_split

EXE = "/opt/llama.cpp/bin/llama-server"

# llama-swap's documented schema (config.example.yaml; proxy/config/config.go, model_config.go)
TOP_LEVEL = {
    "healthCheckTimeout": int,
    "logLevel": str,
    "logTimeFormat": str,
    "logToStdout": str,
    "metricsMaxInMemory": int,
    "captureBuffer": int,
    "startPort": int,
    "sendLoadingState": bool,
    "includeAliasesInList": bool,
    "macros": dict,
    "apiKeys": list,
    "models": dict,
    "groups": dict,
    "hooks": dict,
    "peers": dict,
}
MODEL_KEYS = {
    "cmd": str,
    "cmdStop": str,
    "proxy": str,
    "aliases": list,
    "env": list,
    "checkEndpoint": str,
    "ttl": int,
    "unlisted": bool,
    "useModelName": str,
    "name": str,
    "description": str,
    "concurrencyLimit": int,
    "filters": dict,
    "macros": dict,
    "metadata": dict,
    "sendLoadingState": bool,
}
GROUP_KEYS = {"swap": bool, "exclusive": bool, "persistent": bool, "members": list}


def check_schema(doc: Any) -> None:
    """What llama-swap's LoadConfig accepts (and the keys it knows), as this exporter uses it."""
    assert isinstance(doc, dict)
    for key, value in doc.items():
        assert key in TOP_LEVEL, f"unknown top-level key {key}"
        assert isinstance(value, TOP_LEVEL[key]), key
    assert doc.get("healthCheckTimeout", 120) >= 15
    models = doc["models"]
    aliases: set[str] = set()
    for mid, model in models.items():
        assert isinstance(mid, str) and isinstance(model, dict)
        for key, value in model.items():
            assert key in MODEL_KEYS, f"{mid}: unknown key {key}"
            assert isinstance(value, MODEL_KEYS[key]) and not (
                MODEL_KEYS[key] is int and isinstance(value, bool)
            ), f"{mid}.{key}"
        assert model["cmd"].strip(), "cmd is required"
        assert model.get("ttl", 0) >= 0
        endpoint = model.get("checkEndpoint", "/health")
        assert endpoint == "none" or endpoint.startswith("/")
        for item in model.get("env", []):
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item), item
        # ${PORT} may appear in proxy only when cmd uses it
        if PORT_MACRO in model.get("proxy", ""):
            assert PORT_MACRO in model["cmd"]
        # every macro left must be one llama-swap fills
        for field in ("cmd", "proxy", "checkEndpoint"):
            for name in re.findall(r"\$\{([^}]*)\}", str(model.get(field, ""))):
                assert name in ("PORT", "MODEL_ID"), f"{mid}.{field}: unknown macro {name}"
        for alias in model.get("aliases", []):
            assert alias not in aliases, f"duplicate alias {alias}"
            aliases.add(alias)
    members: set[str] = set()
    for gid, group in doc.get("groups", {}).items():
        for key, value in group.items():
            assert key in GROUP_KEYS and isinstance(value, GROUP_KEYS[key]), f"{gid}.{key}"
        for m in group["members"]:
            assert m in models, f"group {gid}: {m} is not a model"
            assert m not in members, f"{m} in two groups"
            members.add(m)


def swap_argv(cmd: str, port: int, *, windows: bool = False) -> list[str]:
    """llama-swap's SanitizeCommand: drop `#` lines, fold trailing backslashes, fill ${PORT},
    split with POSIX rules (or Windows ones)."""
    lines = []
    for line in cmd.split("\n"):
        trimmed = line.strip()
        if trimmed.startswith("#"):
            continue
        lines.append(trimmed[:-1] + " " if trimmed.endswith("\\") else line)
    text = "\n".join(lines).replace(PORT_MACRO, str(port))
    return windows_split(text.replace("\n", " ")) if windows else shlex.split(text)


def with_port(argv: tuple[str, ...], port: int) -> list[str]:
    return [a.replace(PORT_MACRO, str(port)) for a in argv]


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "My Models"
    write_gguf(root / "gemma3" / "synth-gemma3.gguf", PRESETS["gemma3"])
    write_mmproj(root / "gemma3" / "mmproj-synth-gemma3.gguf")
    write_gguf(root / "qwen3moe.gguf", PRESETS["qwen3moe"])
    write_split(root / "split", PRESETS["llama"], n_shards=2)
    write_hf_folder(root / "hf-llama")
    return root


def entry(path: Path) -> ModelEntry:
    e = entry_for_path(path)
    assert e.meta is not None
    return e


def swap_models(models: Path) -> list[SwapModel]:
    gpus = gpus_from_sizes([24 * GIB, 12 * GIB])
    gemma = entry(models / "gemma3" / "synth-gemma3.gguf")
    settings = LaunchSettings(ctx_size=8192, parallel=2, cache_type_k="q8_0", flash_attn="on")
    assert gemma.meta is not None
    fp = check(gemma.meta, settings, Budget(gpus=gpus)).footprint
    moe = entry(models / "qwen3moe.gguf")
    hf = entry(models / "hf-llama")
    split = entry(models / "split" / "synth-llama-00001-of-00002.gguf")
    assert hf.meta is not None and split.meta is not None
    hf_plan = plan_vllm(hf.meta, gpu_total_bytes=24 * GIB, budget_bytes=22 * GIB)
    split_plan = plan_vllm(split.meta, gpu_total_bytes=None, budget_bytes=None, is_split_gguf=True)
    assert moe.meta is not None
    moe_plan = plan_vllm(  # tool calling turned off: no tools advertised, and the reason said
        moe.meta,
        gpu_total_bytes=24 * GIB,
        budget_bytes=22 * GIB,
        pins=VllmPins(tool_call_parser="none"),
    )
    return [
        SwapModel(
            id="gemma3",
            command=emit_llama(gemma, settings, executable=EXE, port=PORT_MACRO,
                               devices=DevicePin("cuda", (0, 1)), extra_args="--jinja"),
            ttl=600,
            aliases=("gpt-4o-mini", "vision"),
            name="Gemma 3 (synthetic)",
            comments=(footprint_comment(fp),),
        ),
        SwapModel(
            id="qwen3moe",
            command=emit_llama(moe, LaunchSettings(n_cpu_moe=1), executable=EXE, port=PORT_MACRO),
            aliases=("vision", "coder"),  # "vision" is taken: left out with a warning
            unlisted=True,
        ),
        SwapModel(
            id="hf-llama",
            command=emit_vllm(hf, hf_plan, executable="vllm", port=PORT_MACRO),
            ttl=300,
            comments=(vllm_comment(hf_plan), *vllm_reasons(hf_plan, hf.meta)),
            tools=hf_plan.tool_calling,
        ),
        SwapModel(
            id="qwen3moe-on-vllm",
            command=emit_vllm(moe, moe_plan, executable="vllm", port=PORT_MACRO),
            comments=(vllm_comment(moe_plan), *vllm_reasons(moe_plan, moe.meta)),
            tools=moe_plan.tool_calling,
        ),
        SwapModel(
            id="split-on-vllm",
            command=emit_vllm(split, split_plan, executable="vllm", port=PORT_MACRO),
        ),
    ]  # fmt: skip


def test_golden_config_reads_back_and_follows_the_schema(models: Path) -> None:
    items = swap_models(models)
    result = render_llama_swap(
        items,
        groups={"chat": SwapGroup(members=("gemma3", "hf-llama"), swap=False, exclusive=False)},
        header=("written by a test",),
    )
    assert_golden("llama_swap.yaml", result.text, models)
    doc = yaml.safe_load(result.text)
    check_schema(doc)
    assert set(doc["models"]) == {"gemma3", "qwen3moe", "hf-llama", "qwen3moe-on-vllm"}
    # a vLLM launch with a tool-call parser is advertised as taking tools; the others are not
    assert doc["models"]["hf-llama"]["metadata"] == {"capabilities": {"tools": True}}
    assert all("metadata" not in doc["models"][m] for m in ("gemma3", "qwen3moe-on-vllm"))
    # the reasons above each vLLM entry (reference 000: context, utilization, KV pin, parser)
    assert "  # max-model-len: " in result.text
    assert "  # gpu-memory-utilization: " in result.text
    assert "  # KV pool: " in result.text and "pinned" in result.text
    assert "  # tool-call parser: tool calling turned off" in result.text
    assert "  # no tool-call parser: vLLM answers requests that carry tools" in result.text
    gemma = doc["models"]["gemma3"]
    assert gemma["env"] == ["CUDA_VISIBLE_DEVICES=0,1"] or "--device" in gemma["cmd"]
    assert gemma["ttl"] == 600 and gemma["aliases"] == ["gpt-4o-mini", "vision"]
    assert gemma["proxy"] == "http://127.0.0.1:${PORT}"
    assert gemma["checkEndpoint"] == "/health"
    assert doc["models"]["qwen3moe"]["aliases"] == ["coder"]
    assert doc["models"]["qwen3moe"]["unlisted"] is True
    assert doc["groups"]["chat"] == {
        "swap": False, "exclusive": False, "persistent": False, "members": ["gemma3", "hf-llama"],
    }  # fmt: skip
    assert "# estimated VRAM: GPU0" in result.text
    assert "# split-on-vllm: left out (synth-llama: vLLM cannot load split GGUF" in result.text
    assert any("alias 'vision' is taken" in w for w in result.warnings)
    assert any(w.startswith("split-on-vllm: left out") for w in result.warnings)
    # each cmd, split the way llama-swap does, is the emitted argv on the port it picks
    for item in items:
        if item.id in doc["models"]:
            got = swap_argv(doc["models"][item.id]["cmd"], 5800)
            assert got == with_port(item.command.argv, 5800)


def test_tricky_arguments_survive_posix_and_windows_splitting() -> None:
    argv = (
        "C:\\Program Files\\llama\\llama-server.exe",
        "-m",
        '/m/it\'s a "model".gguf',
        "--alias",
        "#hash",
        "--listen=0.0.0.0:" + PORT_MACRO,
        "--port",
        PORT_MACRO,
        "--empty",
        "",
        "ünï 模型",
    )
    for windows in (False, True):
        text = render_cmd(argv, windows=windows)
        assert "${PORT}" in text
        assert swap_argv(text, 5801, windows=windows) == with_port(argv, 5801)


def test_commands_llama_swap_would_misread_are_left_out() -> None:
    def model(mid: str, *argv: str, env: dict[str, str] | None = None) -> SwapModel:
        return SwapModel(id=mid, command=Command(argv=("srv", *argv), env=env or {}))

    result = render_llama_swap(
        [
            model("macro", "-m", "/m/${HOME}/x.gguf", "--port", PORT_MACRO),
            model("newline", "-m", "a\nb", "--port", PORT_MACRO),
            model("fixed-port", "--port", "9000"),
            model("env", "--port", PORT_MACRO, env={"X": "${env.SECRET}"}),
            model("ok", "--port", PORT_MACRO),
            model("ok", "--port", PORT_MACRO, "-v"),
        ]
    )
    doc = yaml.safe_load(result.text)
    check_schema(doc)
    assert set(doc["models"]) == {"macro", "ok", "ok-2"}
    # a word's own ${ is quoted apart, so llama-swap's macro pass never sees it
    assert swap_argv(doc["models"]["macro"]["cmd"], 5800)[2] == "/m/${HOME}/x.gguf"
    reasons = "\n".join(result.warnings)
    assert "macro" not in reasons and "control character" in reasons
    assert "does not take the port from llama-swap" in reasons
    assert "environment variable X" in reasons
    assert "two models are named ok; the second is ok-2" in reasons


def test_groups_must_name_exported_models_once() -> None:
    ok = [SwapModel(id=m, command=Command(argv=("s", "--port", PORT_MACRO))) for m in "ab"]
    with pytest.raises(ExportError, match="names 'c', which is not an exported model"):
        render_llama_swap(ok, groups={"g": SwapGroup(members=("a", "c"))})
    with pytest.raises(ExportError, match="allows one group per model"):
        render_llama_swap(ok, groups={"g": SwapGroup(("a",)), "h": SwapGroup(("a",))})


def test_no_models_is_still_a_valid_config() -> None:
    result = render_llama_swap([SwapModel(id="x", command=Command(argv=(), warnings=("no",)))])
    doc = yaml.safe_load(result.text)
    assert doc["models"] == {}
    check_schema(doc)


# --- a placement's run set ---------------------------------------------------------------------


def test_a_run_set_groups_co_resident_models_and_carries_each_placement(tmp_path: Path) -> None:
    """Six models on four cards, sized by the toy estimator of the placement tests (weights
    plus 224 MiB of KV each). Best fit, largest first: d (7.2 GiB) takes GPU1 (the first of
    the two 8 GiB cards), a GPU3, b GPU2, e the 2.8 GiB left on GPU3; c (14.2 GiB) fits on
    no card and splits over the two roomiest, GPU2 (3872 MiB left) and GPU0 (12288 MiB), the
    roomiest last. So b and c run together (GPU2), a and e (GPU3), d alone; f fits nowhere
    and is named in the config, not exported."""
    reqs = [req("a", 5), req("b", 5), req("c", 14), req("d", 7), req("e", 1), req("f", 40)]
    gpus = cards(12, 8, 9, 8)
    p = place(reqs, gpus, reserve=0, estimate=toy)
    assert {x.name: x.devices for x in p.placed} == {
        "a": ("GPU3",),
        "b": ("GPU2",),
        "c": ("GPU2", "GPU0"),
        "d": ("GPU1",),
        "e": ("GPU3",),
    }
    path = write_gguf(tmp_path / "tiny.gguf", PRESETS["llama"])
    tiny = entry(path)
    commands = {
        x.name: emit_llama(
            tiny,
            x.settings,
            executable=EXE,
            port=PORT_MACRO,
            devices=DevicePin.for_devices(x.devices, gpus, "cuda"),
        )
        for x in p.placed
    }
    result = render_run_set(p, commands)
    doc = yaml.safe_load(result.text)
    check_schema(doc)
    assert set(doc["models"]) == {"a", "b", "c", "d", "e"}
    groups = {gid: g["members"] for gid, g in doc["groups"].items()}
    assert groups == {"gpu0+gpu2": ["b", "c"], "gpu3": ["a", "e"], "gpu1": ["d"]}
    for g in doc["groups"].values():
        assert g["swap"] is False and g["exclusive"] is False
    assert sorted(doc["hooks"]["on_startup"]["preload"]) == ["a", "b", "c", "d", "e"]
    c = swap_argv(doc["models"]["c"]["cmd"], 5801)
    assert c[c.index("--device") + 1] == "CUDA2,CUDA0"
    assert c[c.index("-ts") + 1] == "3872,12288"
    assert c[c.index("-c") + 1] == "4096"
    assert c[c.index("-ngl") + 1] == str(N_TOY_LAYERS + 1)
    assert "-ts" not in swap_argv(doc["models"]["a"]["cmd"], 5801)
    assert "f: not placed" in result.text
    assert any(w.startswith("f: not placed") for w in result.warnings)


N_TOY_LAYERS = 7
