"""whisper-server (whisper.cpp's HTTP server): the argv for one speech-to-text model.

Flags as whisper-server's usage prints them (examples/server of ggml-org/whisper.cpp):
`-m, --model FNAME`, `--host HOST` (default 127.0.0.1), `--port PORT` (default 8080),
`-t, --threads N`, and on recent builds `-fa`/`-nfa` (flash attention, on by default) and
`-ng, --no-gpu`. whisper-server takes one GPU index (`-dev`, recent builds only), so GPUs are
pinned with the vendor's visibility variable instead, which every build honours.
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

# whisper-server binds its port only after the model loaded, and "/" serves its page
HEALTH_PATH = "/"

F_MODEL = Flag("model", (("-m",), ("--model",)))
F_HOST = Flag("host", (("--host",),))
F_PORT = Flag("port", (("--port",),))
F_THREADS = Flag("threads", (("-t",), ("--threads",)))
_FA = ("-fa", "--flash-attn", "-nfa", "--no-flash-attn")
F_FLASH_ATTN = Flag("flash-attn", (("-fa",), ("--flash-attn",)), False, aliases=_FA)
F_NO_FLASH_ATTN = Flag(
    "no-flash-attn", (("-nfa",), ("--no-flash-attn",)), False, "flash-attn", aliases=_FA
)
F_NO_GPU = Flag("no-gpu", (("-ng",), ("--no-gpu",)), False)
TABLE = (F_MODEL, F_HOST, F_PORT, F_THREADS, F_FLASH_ATTN, F_NO_FLASH_ATTN, F_NO_GPU)


@dataclass(frozen=True)
class WhisperOptions:
    """None = whisper-server's default."""

    threads: int | None = None
    flash_attn: bool | None = None
    use_gpu: bool = True


def emit_whisper(
    model: ModelEntry,
    options: WhisperOptions = WhisperOptions(),
    *,
    executable: str,
    port: int | str,
    host: str = DEFAULT_HOST,
    supported_flags: frozenset[str] | None = None,
    devices: DevicePin | None = None,
    extra_args: str | Sequence[str] = (),
) -> Command:
    """The whisper-server command for a speech-to-text model."""
    refused = refuse(model, ModelClass.ASR, "whisper-server transcribes speech")
    if refused is not None:
        return refused
    extra = parse_extra_args(extra_args)
    opts = [Option(F_MODEL, model.path)]
    if options.threads is not None:
        opts.append(Option(F_THREADS, str(options.threads)))
    if options.flash_attn is not None:
        opts.append(Option(F_FLASH_ATTN if options.flash_attn else F_NO_FLASH_ATTN))
    if not options.use_gpu:
        opts.append(Option(F_NO_GPU))
    opts += [Option(F_HOST, host), Option(F_PORT, str(port))]
    placed, warnings = place(opts, supported=supported_flags)
    kept, _, merge_warnings = merge_extra(placed, extra, TABLE)
    env: dict[str, str] = {}
    if devices is not None:
        pin = devices.env()
        if pin is None:
            warnings.append(f"cannot pin {devices.api} GPUs for whisper-server")
        else:
            env.update(pin)
    return build(
        executable, placed=kept, extra=extra, env=env, warnings=[*warnings, *merge_warnings]
    )
