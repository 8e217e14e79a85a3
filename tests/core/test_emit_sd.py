"""sd-server emitter: a full checkpoint takes -m, a diffusion model alone --diffusion-model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import DevicePin
from qmgui.core.emit.sd import SdOptions, emit_sd, is_standalone
from qmgui.core.meta import ModelClass, TensorEntry
from tests.core.test_emit_llama import assert_golden, command_text
from tests.synth.factory import PRESETS, write_gguf

SD = "/opt/sd.cpp/sd-server"


def image_entry(tmp_path: Path, name: str, tensor_names: tuple[str, ...]) -> ModelEntry:
    """A real GGUF on disk, its metadata turned into an image model's."""
    path = write_gguf(tmp_path / "image models" / f"{name}.gguf", PRESETS["llama"])
    e = entry_for_path(path)
    assert e.meta is not None
    tensors = tuple(TensorEntry(n, "F16", (4,), 8) for n in tensor_names)
    meta = replace(e.meta, architecture="flux", model_class=ModelClass.IMAGE, tensors=tensors)
    return replace(e, name=name, meta=meta)


@pytest.fixture
def flux(tmp_path: Path) -> ModelEntry:
    return image_entry(tmp_path, "flux1-dev-Q4_0", ("double_blocks.0.img_attn.qkv.weight",))


@pytest.fixture
def sdxl(tmp_path: Path) -> ModelEntry:
    names = ("model.diffusion_model.input_blocks.0.0.weight", "first_stage_model.decoder.x")
    return image_entry(tmp_path, "sdxl-base", names)


def test_full_checkpoint_takes_model(sdxl: ModelEntry, tmp_path: Path) -> None:
    assert not is_standalone(sdxl)
    cmd = emit_sd(sdxl, executable=SD, port=1234)
    assert cmd.argv[1:3] == ("-m", sdxl.path)
    assert cmd.argv[-4:] == ("--listen-ip", "127.0.0.1", "--listen-port", "1234")
    assert cmd.warnings == ()
    assert_golden("emit_sd_checkpoint.txt", command_text(cmd), tmp_path)


def test_standalone_diffusion_model_with_its_encoders(flux: ModelEntry, tmp_path: Path) -> None:
    assert is_standalone(flux)
    opts = SdOptions(
        vae="/models/flux/ae.safetensors",
        clip_l="/models/flux/clip_l.safetensors",
        t5xxl="/models/flux/t5xxl Q8.gguf",
        offload_to_cpu=True,
        diffusion_fa=True,
    )
    cmd = emit_sd(flux, opts, executable=SD, port=1234, devices=DevicePin("vulkan", (1,)))
    assert cmd.argv[1:3] == ("--diffusion-model", flux.path)
    assert cmd.env == {"GGML_VK_VISIBLE_DEVICES": "1"}
    assert cmd.warnings == ()
    assert_golden("emit_sd_flux.txt", command_text(cmd), tmp_path)


def test_standalone_without_vae_warns(flux: ModelEntry) -> None:
    cmd = emit_sd(flux, executable=SD, port=1)
    assert any("needs its VAE" in w for w in cmd.warnings)
    quiet = emit_sd(flux, executable=SD, port=1, extra_args="--vae /m/ae.safetensors")
    assert not any("needs its VAE" in w for w in quiet.warnings)


def test_extra_model_flag_replaces_ours(flux: ModelEntry) -> None:
    cmd = emit_sd(flux, executable=SD, port=1, extra_args="-m /other/full.safetensors")
    assert "--diffusion-model" not in cmd.argv
    assert any("replaces the derived --diffusion-model" in w for w in cmd.warnings)


def test_an_llm_is_not_an_image_model(tmp_path: Path) -> None:
    e = entry_for_path(write_gguf(tmp_path / "q.gguf", PRESETS["qwen3"]))
    cmd = emit_sd(e, executable=SD, port=1)
    assert not cmd.runnable and "serves image models" in cmd.warnings[0]
