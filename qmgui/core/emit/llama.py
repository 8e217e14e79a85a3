"""llama-server (llama.cpp): the argv for one launch of a GGUF model with `LaunchSettings`.

What it writes, in order: `-m` (the first shard: llama.cpp opens the others itself), `--mmproj`
when the model has a projector, every knob the settings set (`-c`, `-np`, `-kvu`/`-no-kvu`, `-b`
and `-ub` when not the default, `-ctk`/`-ctv` when not f16, `-fa on|off|auto`, `-ngl`,
`--n-cpu-moe`/`--cpu-moe`, `-ts`, `--swa-full`, `-nkvo`, `--no-mmap`, `--no-repack`),
`--embedding`/`--reranking` for those classes, the GPU pin (`--rpc host:port,…` for remote
devices, then `--device`, or the vendor's visibility variable in the environment), `-fit off`,
`--host`, `--port`, `-lv 4`, and last the user's extra arguments, which replace a derived flag
they repeat.

Two flags exist for qmgui's own promises rather than the user's settings:
- `-fit off`: since b6xxx llama-server fits unset values (context, layers) to free memory on
  its own after the preview was shown; qmgui planned every value, so the launch must run the
  plan it showed. Left out silently on builds without `-fit`, which do not adjust anything.
- `-lv 4`: verbosity 4 logs every buffer the engine allocates, which `qmgui.core.readback`
  compares with the plan.

Flags are spelled the way the build's `--help` lists them (`supported_flags`): the short form
when it has it, else a long or older one; a flag it lacks is left out with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    skipped,
)
from qmgui.core.launch import DEFAULT_BATCH, DEFAULT_UBATCH, LaunchSettings
from qmgui.core.meta import ModelClass

HEALTH_PATH = "/health"  # 200 once the model is loaded, 503 while loading
READBACK_VERBOSITY = 4  # -lv 4 logs the buffer sizes qmgui.core.readback reads back
DEFAULT_CACHE_TYPE = "f16"  # llama-server's -ctk / -ctv default

# --- flags (common/arg.cpp of llama.cpp; preferred spelling first) -------------------------------
F_MODEL = Flag("model", (("-m",), ("--model",)))
# a model planned from its URL (not downloaded): the engine fetches it itself
F_MODEL_URL = Flag("model-url", (("-mu",), ("--model-url",)))
F_MMPROJ = Flag(
    "mmproj", (("--mmproj",), ("-mm",)), aliases=("--no-mmproj", "-mmu", "--mmproj-url")
)
F_CTX = Flag("ctx-size", (("-c",), ("--ctx-size",)))
F_PARALLEL = Flag("parallel", (("-np",), ("--parallel",)))
_KVU = ("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified")
F_KVU = Flag("kv-unified", (("-kvu",), ("--kv-unified",)), False, aliases=_KVU)
F_NO_KVU = Flag(
    "no-kv-unified", (("-no-kvu",), ("--no-kv-unified",)), False, "kv-unified", aliases=_KVU
)
F_BATCH = Flag("batch-size", (("-b",), ("--batch-size",)))
F_UBATCH = Flag("ubatch-size", (("-ub",), ("--ubatch-size",)))
F_CTK = Flag("cache-type-k", (("-ctk",), ("--cache-type-k",)))
F_CTV = Flag("cache-type-v", (("-ctv",), ("--cache-type-v",)))
F_FA = Flag("flash-attn", (("-fa",), ("--flash-attn",)))
F_NGL = Flag("n-gpu-layers", (("-ngl",), ("--n-gpu-layers",), ("--gpu-layers",)))
_MOE = ("--n-cpu-moe", "-ncmoe", "--cpu-moe", "-cmoe")
F_N_CPU_MOE = Flag("n-cpu-moe", (("--n-cpu-moe",), ("-ncmoe",)), group="cpu-moe", aliases=_MOE)
F_CPU_MOE = Flag("cpu-moe", (("--cpu-moe",), ("-cmoe",)), False, aliases=_MOE)
F_TENSOR_SPLIT = Flag("tensor-split", (("-ts",), ("--tensor-split",)))
F_DEVICE = Flag("device", (("--device",), ("-dev",)))
F_RPC = Flag("rpc", (("--rpc",),))
F_SWA_FULL = Flag("swa-full", (("--swa-full",),), False)
F_NO_KV_OFFLOAD = Flag(
    "no-kv-offload",
    (("-nkvo",), ("--no-kv-offload",)),
    False,
    "kv-offload",
    aliases=("-kvo", "--kv-offload"),
)
# `--no-mmap` became a deprecated alias of `--load-mode none` (b11xxx); either stops mmap
F_NO_MMAP = Flag(
    "no-mmap",
    (("--no-mmap",), ("--load-mode", "none"), ("-lm", "none")),
    False,
    "mmap",
    aliases=("--mmap", "--mlock", "--direct-io", "-dio"),
)
F_NO_REPACK = Flag("no-repack", (("--no-repack",), ("-nr",)), False, "repack", ("--repack",))
F_EMBEDDING = Flag("embedding", (("--embedding",), ("--embeddings",)), False)
F_RERANKING = Flag("reranking", (("--reranking",), ("--rerank",)), False)
F_FIT = Flag("fit", (("-fit",), ("--fit",)), quiet=True)
F_HOST = Flag("host", (("--host",),))
F_PORT = Flag("port", (("--port",),))
F_VERBOSITY = Flag(
    "verbosity",
    (("-lv",), ("--verbosity",), ("--log-verbosity",)),
    aliases=("-v", "--verbose", "--log-verbose"),
)
TABLE = (
    F_MODEL,
    F_MODEL_URL,
    F_MMPROJ,
    F_CTX,
    F_PARALLEL,
    F_KVU,
    F_NO_KVU,
    F_BATCH,
    F_UBATCH,
    F_CTK,
    F_CTV,
    F_FA,
    F_NGL,
    F_N_CPU_MOE,
    F_CPU_MOE,
    F_TENSOR_SPLIT,
    F_RPC,
    F_DEVICE,
    F_SWA_FULL,
    F_NO_KV_OFFLOAD,
    F_NO_MMAP,
    F_NO_REPACK,
    F_EMBEDDING,
    F_RERANKING,
    F_FIT,
    F_HOST,
    F_PORT,
    F_VERBOSITY,
)
# chosen by the router in router mode (tools/server/README.md, "Model presets")
ROUTER_OWNED = frozenset({"host", "port"})
_SERVED = (ModelClass.LLM, ModelClass.EMBEDDING, ModelClass.RERANK)


def _number(x: float) -> str:
    return format(x, "g")


def cannot_serve(model: ModelEntry) -> str | None:
    """Why llama-server cannot serve this model, or None."""
    if model.format != "gguf":
        return (
            f"{model.name}: llama-server reads GGUF files only; serve this Hugging Face "
            "folder with vLLM"
        )
    if model.error:
        return f"{model.name}: {model.error}"
    cls = model.model_class
    if cls is not None and cls not in _SERVED:
        return (
            f"{model.name}: llama-server serves chat, embedding and rerank models; this is "
            f"a {cls.value} model"
        )
    return None


def _ngl(model: ModelEntry, n: int) -> str:
    # negative means "all layers" here (LaunchSettings, footprint); llama.cpp now reads -1 as
    # "auto", so write the count itself: every layer plus the output layer
    if n >= 0 or model.meta is None:
        return str(n) if n >= 0 else "999"
    return str(model.meta.n_layer + 1)


def _moe(model: ModelEntry) -> bool:
    """Whether the model has experts (unknown metadata: assume it may)."""
    return model.meta is None or model.meta.is_moe


def _settings_options(model: ModelEntry, s: LaunchSettings) -> list[Option]:
    opts: list[Option] = []
    ctx = s.ctx_size or (model.meta.context_length if model.meta else None)
    if ctx:
        # always written: builds differ on what an absent -c means (4096, or the trained one)
        opts.append(Option(F_CTX, str(ctx)))
    if s.parallel is not None:
        opts.append(Option(F_PARALLEL, str(s.parallel)))
    if s.kv_unified is not None:
        opts.append(Option(F_KVU if s.kv_unified else F_NO_KVU))
    if s.batch_size != DEFAULT_BATCH:
        opts.append(Option(F_BATCH, str(s.batch_size)))
    if s.ubatch_size != DEFAULT_UBATCH:
        opts.append(Option(F_UBATCH, str(s.ubatch_size)))
    if s.cache_type_k != DEFAULT_CACHE_TYPE:
        opts.append(Option(F_CTK, s.cache_type_k))
    if s.cache_type_v != DEFAULT_CACHE_TYPE:
        opts.append(Option(F_CTV, s.cache_type_v))
    opts.append(Option(F_FA, s.flash_attn))
    if s.n_gpu_layers is not None:
        opts.append(Option(F_NGL, _ngl(model, s.n_gpu_layers)))
    # experts on the CPU: only for a mixture of experts (a dense model has none to move;
    # llama_options says why the flag is left out)
    if s.cpu_moe and _moe(model):
        opts.append(Option(F_CPU_MOE))
    elif s.n_cpu_moe > 0 and _moe(model):
        opts.append(Option(F_N_CPU_MOE, str(s.n_cpu_moe)))
    if s.tensor_split:
        opts.append(Option(F_TENSOR_SPLIT, ",".join(_number(x) for x in s.tensor_split)))
    return opts


def _switch_options(model: ModelEntry, s: LaunchSettings) -> list[Option]:
    opts: list[Option] = []
    if s.swa_full:
        opts.append(Option(F_SWA_FULL))
    if not s.kv_offload:
        opts.append(Option(F_NO_KV_OFFLOAD))
    if not s.mmap:
        opts.append(Option(F_NO_MMAP))
    if not s.repack:
        opts.append(Option(F_NO_REPACK))
    if model.model_class == ModelClass.EMBEDDING:
        opts.append(Option(F_EMBEDDING))
    elif model.model_class == ModelClass.RERANK:
        opts.append(Option(F_RERANKING))
    return opts


def _has(flag: Flag, supported: frozenset[str] | None) -> bool:
    return supported is None or any(s[0] in supported for s in flag.spellings)


def llama_options(
    model: ModelEntry,
    settings: LaunchSettings,
    *,
    port: int | str | None,
    host: str | None = DEFAULT_HOST,
    supported_flags: frozenset[str] | None = None,
    devices: DevicePin | None = None,
    device_flag_only: bool = False,
    verbosity: int | None = READBACK_VERBOSITY,
    fit_off: bool = True,
) -> tuple[list[Option], dict[str, str], list[str]]:
    """The derived options (before spelling), the environment and warnings.

    `device_flag_only`: pin GPUs with `--device` or not at all (a preset cannot set a
    per-model environment)."""
    where = model.shards[0] if model.shards else model.path
    opts = [Option(F_MODEL_URL if model.source == "url" else F_MODEL, where)]
    if model.mmproj:
        opts.append(Option(F_MMPROJ, model.mmproj))
    opts += _settings_options(model, settings)
    env: dict[str, str] = {}
    warnings: list[str] = []
    if (settings.cpu_moe or settings.n_cpu_moe > 0) and not _moe(model):
        warnings.append(
            f"{'--cpu-moe' if settings.cpu_moe else '--n-cpu-moe'} left out: {model.name} is "
            "not a mixture of experts (it has no experts to keep on the CPU)"
        )
    if devices is not None:
        pin_env = devices.env()
        if devices.rpc:
            # remote devices exist only when named: llama.cpp adds them before the local GPUs
            opts.append(Option(F_RPC, ",".join(devices.rpc)))
        if _has(F_DEVICE, supported_flags) or device_flag_only:
            opts.append(Option(F_DEVICE, devices.names))
        elif pin_env is not None:
            env.update(pin_env)
        elif devices.cpu_only:
            warnings.append(
                "cannot keep the engine off the GPUs: this build has no --device and "
                f"{devices.api} has no visibility variable; it may offload to the GPU"
            )
        else:
            warnings.append(
                f"cannot pin GPUs {devices.visible}: this build has no --device and "
                f"{devices.api} has no visibility variable; it may use every GPU"
            )
    opts += _switch_options(model, settings)
    if fit_off:
        opts.append(Option(F_FIT, "off"))
    if host is not None:
        opts.append(Option(F_HOST, host))
    if port is not None:
        opts.append(Option(F_PORT, str(port)))
    if verbosity is not None:
        opts.append(Option(F_VERBOSITY, str(verbosity)))
    return opts, env, warnings


def emit_llama(
    model: ModelEntry,
    settings: LaunchSettings = LaunchSettings(),  # noqa: B008 - frozen, shared safely
    *,
    executable: str,
    port: int | str,
    host: str = DEFAULT_HOST,
    supported_flags: frozenset[str] | None = None,
    valueless_flags: frozenset[str] = frozenset(),
    devices: DevicePin | None = None,
    extra_args: str | Sequence[str] = (),
    verbosity: int | None = READBACK_VERBOSITY,
    fit_off: bool = True,
) -> Command:
    """The llama-server command for `model` with `settings` on one build.

    `supported_flags`: the flags the build's `--help` lists (None: assume every flag).
    `valueless_flags`: flags it takes as bare switches (`-fa` on builds before `-fa on|off|auto`).
    `extra_args`: the user's own arguments, appended last; one that repeats a derived flag
    replaces it. A string is split like a shell does (`qmgui.core.emit.split_args`); a list
    is taken as arguments already split."""
    reason = cannot_serve(model)
    if reason is not None:
        return skipped(reason)
    extra = parse_extra_args(extra_args)
    opts, env, warnings = llama_options(
        model,
        settings,
        port=port,
        host=host,
        supported_flags=supported_flags,
        devices=devices,
        verbosity=verbosity,
        fit_off=fit_off,
    )
    placed, place_warnings = place(opts, supported=supported_flags, valueless=valueless_flags)
    kept, groups, merge_warnings = merge_extra(placed, extra, TABLE)
    if "device" in groups and env:
        pinned = ", ".join(f"{k}={v}" for k, v in env.items())
        merge_warnings.append(f"extra argument --device replaces the derived {pinned}")
        env = {}
    return build(
        executable,
        placed=kept,
        extra=extra,
        env=env,
        warnings=[*warnings, *place_warnings, *merge_warnings],
    )
