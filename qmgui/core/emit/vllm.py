"""vLLM: `vllm serve PATH` with the flags `qmgui.core.vllm.plan_vllm` derived.

The sizing (max-model-len, utilization, the pinned KV pool, the tool-call parser, tensor
parallelism, the tokenizer when pinned) is the plan's; this module only frames it: the
executable, `serve` and the model path (the GGUF file or the Hugging Face folder), the plan's
flags, `--served-model-name` (vLLM answers 404 to any other model name, so a router in front of
it must be told the one to send), `--host`, `--port`, then the user's extra arguments. A plan
that vLLM cannot serve (a split GGUF, a class other than chat) gives no command, with the plan's
reason as the warning.

Extra arguments win over derived flags: the plan already drops its memory flags and parser when
the user's arguments carry them (so build the plan with the same `VllmPins.extra_args`); any
other flag they repeat is dropped here too. vLLM's parser reads `--max_model_len` and
`--max-model-len` alike, so flags are compared with underscores folded to dashes.
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
    Placed,
    build,
    merge_extra,
    parse_extra_args,
    place,
    skipped,
)
from qmgui.core.vllm import (
    FLAG_AUTO_TOOL_CHOICE,
    FLAG_DTYPE,
    FLAG_GPU_UTIL,
    FLAG_KV_CACHE_BYTES,
    FLAG_KV_CACHE_DTYPE,
    FLAG_MAX_MODEL_LEN,
    FLAG_PIPELINE_PARALLEL,
    FLAG_QUANTIZATION,
    FLAG_TENSOR_PARALLEL,
    FLAG_TOKENIZER,
    FLAG_TOOL_CALL_PARSER,
    VllmPlan,
)

HEALTH_PATH = "/health"  # vLLM's OpenAI server: 200 once the engine is up
SERVE = "serve"

F_HOST = Flag("host", (("--host",),))
F_PORT = Flag("port", (("--port",),))
F_SERVED_NAME = Flag("served-model-name", (("--served-model-name",),))
# the plan's flags, grouped the way they replace each other: a hand-written utilization or KV
# pool stands for both memory flags (reference 001), a parser for both tool-call flags
_MEMORY = "memory"
_TOOLS = "tool-calling"
PLAN_FLAGS = (
    Flag("max-model-len", ((FLAG_MAX_MODEL_LEN,),)),
    Flag("gpu-memory-utilization", ((FLAG_GPU_UTIL,),), group=_MEMORY),
    Flag("kv-cache-memory-bytes", ((FLAG_KV_CACHE_BYTES,),), group=_MEMORY,
         aliases=("--kv-cache-memory",)),
    Flag("tensor-parallel-size", ((FLAG_TENSOR_PARALLEL,), ("-tp",))),
    Flag("pipeline-parallel-size", ((FLAG_PIPELINE_PARALLEL,), ("-pp",))),
    Flag("quantization", ((FLAG_QUANTIZATION,), ("-q",))),
    Flag("dtype", ((FLAG_DTYPE,),)),
    Flag("kv-cache-dtype", ((FLAG_KV_CACHE_DTYPE,),)),
    Flag("tokenizer", ((FLAG_TOKENIZER,),)),
    Flag("enable-auto-tool-choice", ((FLAG_AUTO_TOOL_CHOICE,),), False, group=_TOOLS),
    Flag("tool-call-parser", ((FLAG_TOOL_CALL_PARSER,),), group=_TOOLS),
)  # fmt: skip
TABLE = (*PLAN_FLAGS, F_HOST, F_PORT, F_SERVED_NAME)
_BY_TOKEN = {s[0]: f for f in PLAN_FLAGS for s in f.spellings}


def normalize(flag: str) -> str:
    """vLLM's argument parser folds `_` to `-` in flag names."""
    return flag.replace("_", "-")


def _plan_options(args: Sequence[str]) -> tuple[list[Option], list[str]]:
    """The plan's flat argument list back as options (each flag with its value, if any)."""
    opts: list[Option] = []
    unknown: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        flag = _BY_TOKEN.get(token)
        if flag is None:
            unknown.append(token)
            i += 1
        elif flag.takes_value and i + 1 < len(args):
            opts.append(Option(flag, args[i + 1]))
            i += 2
        else:
            opts.append(Option(flag))
            i += 1
    return opts, unknown


def _without_tail(args: tuple[str, ...], tail: tuple[str, ...]) -> tuple[str, ...]:
    if tail and args[-len(tail) :] == tail:
        return args[: -len(tail)]
    return args


def emit_vllm(
    model: ModelEntry,
    plan: VllmPlan,
    *,
    executable: str,
    port: int | str,
    host: str = DEFAULT_HOST,
    served_model_name: str | None = None,
    supported_flags: frozenset[str] | None = None,
    devices: DevicePin | None = None,
    extra_args: str | Sequence[str] = (),
) -> Command:
    """The `vllm serve` command for `model` as `plan` sized it.

    `extra_args`: the user's arguments; pass the same ones the plan got in
    `VllmPins.extra_args`, so the plan leaves out the memory and parser flags they set.
    `served_model_name`: the name clients send (default: the model's name)."""
    if plan.skipped:
        return skipped(f"{model.name}: {plan.reason or 'vLLM cannot serve this model'}")
    if model.error:
        return skipped(f"{model.name}: {model.error}")
    extra = parse_extra_args(extra_args)
    derived, unknown = _plan_options(_without_tail(plan.args, extra))
    derived += [
        Option(F_SERVED_NAME, served_model_name or model.name),
        Option(F_HOST, host),
        Option(F_PORT, str(port)),
    ]
    placed, warnings = place(derived, supported=supported_flags)
    # anything in the plan this module has no table entry for is kept as it is, before ours
    passthrough = [Placed(Flag("plan", ((t,),), False), (t,), None) for t in unknown]
    kept, _, merge_warnings = merge_extra(placed, extra, TABLE, normalize=normalize)
    env: dict[str, str] = {}
    if devices is not None:
        pin = devices.env()
        if pin is None:
            warnings.append(f"cannot pin {devices.api} GPUs for vLLM; it may use every GPU")
        else:
            env.update(pin)
    return build(
        executable,
        leading=(SERVE, model.path),
        placed=[*passthrough, *kept],
        extra=extra,
        env=env,
        warnings=[*warnings, *merge_warnings],
    )
