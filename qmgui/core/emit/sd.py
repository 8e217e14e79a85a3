"""sd-server (stable-diffusion.cpp's HTTP server): the argv for one image model.

Flags as sd-server's usage lists them (examples/server/README.md of leejet/stable-diffusion.cpp):
`-m, --model` takes a full checkpoint (diffusion model, VAE and text encoders in one file);
`--diffusion-model` takes a standalone diffusion model (the Flux, SD3, Wan… GGUFs most people
download), which also needs `--vae` and its text encoders (`--clip_l`, `--clip_g`, `--t5xxl`, or
`--llm` for Qwen-Image / Flux.2); `-l, --listen-ip` and `--listen-port` (default 127.0.0.1:1234);
`--offload-to-cpu`, `--diffusion-fa` and `--vae-tiling` trade speed for VRAM. GPUs are pinned
with the vendor's visibility variable (ggml's device names for sd-server's own device flags
are not documented the same way across versions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import (
    DEFAULT_HOST,
    Command,
    DevicePin,
    Flag,
    Option,
    build,
    merge_extra,
    parse_extra_args,
    place,
    refuse,
)
from qmgui.core.meta import ModelClass

HEALTH_PATH = "/v1/models"  # sd-server's OpenAI-style model list answers once it is up
# tensors of a full checkpoint's VAE and text encoders (the original SD/SDXL layout); a GGUF
# without them holds the diffusion model alone
_FULL_CHECKPOINT_PREFIXES = ("first_stage_model.", "cond_stage_model.", "conditioner.")

_MODEL_GROUP = ("-m", "--model", "--diffusion-model")
F_MODEL = Flag("model", (("-m",), ("--model",)), aliases=_MODEL_GROUP)
F_DIFFUSION_MODEL = Flag(
    "diffusion-model", (("--diffusion-model",),), group="model", aliases=_MODEL_GROUP
)
F_VAE = Flag("vae", (("--vae",),))
F_CLIP_L = Flag("clip_l", (("--clip_l",),))
F_CLIP_G = Flag("clip_g", (("--clip_g",),))
F_T5XXL = Flag("t5xxl", (("--t5xxl",),))
F_LLM = Flag("llm", (("--llm",),), aliases=("--qwen2vl",))
F_OFFLOAD = Flag("offload-to-cpu", (("--offload-to-cpu",),), False)
F_DIFFUSION_FA = Flag("diffusion-fa", (("--diffusion-fa",),), False, aliases=("--fa",))
F_VAE_TILING = Flag("vae-tiling", (("--vae-tiling",),), False)
F_LISTEN_IP = Flag("listen-ip", (("--listen-ip",), ("-l",)))
F_LISTEN_PORT = Flag("listen-port", (("--listen-port",),))
TABLE = (
    F_MODEL,
    F_DIFFUSION_MODEL,
    F_VAE,
    F_CLIP_L,
    F_CLIP_G,
    F_T5XXL,
    F_LLM,
    F_OFFLOAD,
    F_DIFFUSION_FA,
    F_VAE_TILING,
    F_LISTEN_IP,
    F_LISTEN_PORT,
)


@dataclass(frozen=True)
class SdOptions:
    """What an image launch needs beyond the model file; None = not given."""

    vae: str | None = None
    clip_l: str | None = None
    clip_g: str | None = None
    t5xxl: str | None = None
    llm: str | None = None  # the LLM text encoder (Qwen-Image, Flux.2)
    standalone: bool | None = None  # None: decided from the model's tensors
    offload_to_cpu: bool = False
    diffusion_fa: bool = False
    vae_tiling: bool = False

    @property
    def encoders(self) -> tuple[tuple[Flag, str | None], ...]:
        return (
            (F_VAE, self.vae),
            (F_CLIP_L, self.clip_l),
            (F_CLIP_G, self.clip_g),
            (F_T5XXL, self.t5xxl),
            (F_LLM, self.llm),
        )


def is_standalone(model: ModelEntry) -> bool:
    """True when the file holds a diffusion model without its VAE and text encoders."""
    if model.meta is None or not model.meta.tensors:
        return False  # nothing to tell by: a checkpoint is what -m takes
    return not any(t.name.startswith(_FULL_CHECKPOINT_PREFIXES) for t in model.meta.tensors)


def emit_sd(
    model: ModelEntry,
    options: SdOptions = SdOptions(),
    *,
    executable: str,
    port: int | str,
    host: str = DEFAULT_HOST,
    supported_flags: frozenset[str] | None = None,
    devices: DevicePin | None = None,
    extra_args: str | Sequence[str] = (),
) -> Command:
    """The sd-server command for an image model."""
    refused = refuse(model, ModelClass.IMAGE, "sd-server serves image models")
    if refused is not None:
        return refused
    extra = parse_extra_args(extra_args)
    standalone = options.standalone if options.standalone is not None else is_standalone(model)
    path = model.shards[0] if model.shards else model.path
    opts = [Option(F_DIFFUSION_MODEL if standalone else F_MODEL, path)]
    opts += [Option(flag, value) for flag, value in options.encoders if value]
    for flag, on in (
        (F_OFFLOAD, options.offload_to_cpu),
        (F_DIFFUSION_FA, options.diffusion_fa),
        (F_VAE_TILING, options.vae_tiling),
    ):
        if on:
            opts.append(Option(flag))
    opts += [Option(F_LISTEN_IP, host), Option(F_LISTEN_PORT, str(port))]
    warnings: list[str] = []
    if standalone and not options.vae and "--vae" not in extra:
        warnings.append(
            f"{model.name} holds the diffusion model alone: sd-server also needs its VAE "
            "(--vae) and text encoders (--clip_l, --t5xxl or --llm); add them to the model's "
            "extra arguments"
        )
    placed, place_warnings = place(opts, supported=supported_flags)
    kept, _, merge_warnings = merge_extra(placed, extra, TABLE)
    env: dict[str, str] = {}
    if devices is not None:
        pin = devices.env()
        if pin is None:
            warnings.append(f"cannot pin {devices.api} GPUs for sd-server; it may use any GPU")
        else:
            env.update(pin)
    return build(
        executable,
        placed=kept,
        extra=extra,
        env=env,
        warnings=[*warnings, *place_warnings, *merge_warnings],
    )
