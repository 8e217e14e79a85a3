"""A model's profile: the launch values a user saved for one model, applied on every path.

A profile is a plain mapping of the stored override's field names (`qmgui.settings.
ModelOverride`) to values; a missing key or None means "not saved: let the planner choose".
This module is pure: `apply_profile` fills launch settings from a profile, `vllm_pins` turns it
into vLLM pins, `profile_from_settings` keeps only what differs from the defaults, `describe`
says it in words. Reading a llama-server or `vllm serve` command line into a profile
(`qmgui import`, the window's Paste command) lives in `qmgui.core.command_import`.
Loading and saving live in `qmgui.service.profile`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

from qmgui.core.launch import LaunchSettings

if TYPE_CHECKING:  # the vLLM planner is imported when a vLLM launch is pinned, not by `plan`
    from qmgui.core.vllm import VllmPins

Profile = Mapping[str, Any]

_DEFAULTS = LaunchSettings()
# profile key -> the LaunchSettings field it sets (same names)
LAUNCH_FIELDS = (
    "ctx_size",
    "parallel",
    "cache_type_k",
    "cache_type_v",
    "flash_attn",
    "n_gpu_layers",
    "n_cpu_moe",
    "cpu_moe",
    "tensor_split",
)
VLLM_FIELDS = (
    "vllm_budget_bytes",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "tokenizer",
    "tool_call_parser",
    "dtype",
    "kv_cache_dtype",
)
OTHER_FIELDS = ("backend_id", "devices", "extra_args", "mmproj", "port")
PROFILE_FIELDS = (*LAUNCH_FIELDS, *VLLM_FIELDS, *OTHER_FIELDS)
# what the window's plan panel edits (its values are the effective ones: nothing to fill)
PANEL_FIELDS = frozenset({*LAUNCH_FIELDS, "extra_args"})

_WORDS = {
    "ctx_size": "context",
    "parallel": "slots",
    "cache_type_k": "K cache",
    "cache_type_v": "V cache",
    "flash_attn": "flash attention",
    "n_gpu_layers": "GPU layers",
    "n_cpu_moe": "CPU experts (layers)",
    "cpu_moe": "all experts on the CPU",
    "tensor_split": "split",
    "vllm_budget_bytes": "vLLM budget",
    "gpu_memory_utilization": "GPU memory utilization",
    "tensor_parallel_size": "tensor parallel",
    "tokenizer": "tokenizer",
    "tool_call_parser": "tool-call parser",
    "dtype": "dtype",
    "kv_cache_dtype": "KV cache dtype",
    "backend_id": "backend",
    "devices": "devices",
    "extra_args": "extra arguments",
    "mmproj": "projector",
    "port": "port",
}


def is_set(value: Any) -> bool:
    """A profile value that means something (None, an empty list, False: not saved)."""
    return value is not None and value is not False and value not in ([], ())


def clean(profile: Profile) -> dict[str, Any]:
    """The saved values of `profile`, in `PROFILE_FIELDS` order, unknown keys dropped."""
    return {k: profile[k] for k in PROFILE_FIELDS if k in profile and is_set(profile[k])}


def apply_profile(
    s: LaunchSettings, profile: Profile | None, *, given: Iterable[str] = ()
) -> LaunchSettings:
    """`s` with the profile's values filled in where `s` is at the engine's default and the
    field is not in `given` (set explicitly on the command line, or shown by the window)."""
    if not profile:
        return s
    skip = frozenset(given)
    changes: dict[str, Any] = {}
    for key in LAUNCH_FIELDS:
        value = profile.get(key)
        if key in skip or not is_set(value) or getattr(s, key) != getattr(_DEFAULTS, key):
            continue
        if key == "tensor_split":
            value = tuple(float(x) for x in value or ())
        if key == "ctx_size" and not value:
            continue
        changes[key] = value
    if changes.get("cpu_moe"):
        changes.pop("n_cpu_moe", None)
    return replace(s, **changes) if changes else s


def extra_args_of(profile: Profile | None) -> tuple[str, ...]:
    """The profile's extra arguments as tokens (each stored string split like a shell)."""
    if not profile:
        return ()
    from qmgui.core.emit import split_args  # noqa: PLC0415 - keeps `qmgui plan`'s start light

    items: Iterable[str] = profile.get("extra_args") or ()
    return tuple(t for item in items for t in split_args(item))


def vllm_pins(
    profile: Profile | None,
    *,
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
    tensor_parallel: int | None = None,
    gpu_memory_utilization: float | None = None,
    tokenizer: str | None = None,
    tool_call_parser: str | None = None,
) -> VllmPins:
    """The vLLM pins of a launch: what the caller gives explicitly wins, the profile fills
    the rest (its `ctx_size` is the `--max-model-len`)."""
    from qmgui.core.vllm import VllmPins  # noqa: PLC0415

    p = profile or {}
    return VllmPins(
        max_model_len=max_model_len or p.get("ctx_size") or None,
        gpu_memory_utilization=gpu_memory_utilization or p.get("gpu_memory_utilization"),
        tensor_parallel_size=tensor_parallel or p.get("tensor_parallel_size"),
        dtype=p.get("dtype"),
        kv_cache_dtype=p.get("kv_cache_dtype"),
        tool_call_parser=tool_call_parser or p.get("tool_call_parser"),
        tokenizer=tokenizer or p.get("tokenizer"),
        extra_args=tuple(extra_args),
    )


def profile_from_settings(
    s: LaunchSettings, defaults: LaunchSettings = _DEFAULTS
) -> dict[str, Any]:
    """The launch values of `s` that differ from `defaults` (the window's starting point for
    the model), as profile values."""
    out: dict[str, Any] = {}
    for key in LAUNCH_FIELDS:
        value, default = getattr(s, key), getattr(defaults, key)
        if value == default or not is_set(value):
            continue
        out[key] = list(value) if key == "tensor_split" else value
    if out.get("cpu_moe"):
        out.pop("n_cpu_moe", None)
    return out


def _value_words(key: str, value: Any) -> str:
    if key == "ctx_size" and isinstance(value, int):
        return f"{value:,}"
    if key == "tensor_split":
        return ",".join(format(float(x), "g") for x in value)
    if key == "devices":
        return ",".join(str(x) for x in value)
    if key == "extra_args":
        return " ".join(value)
    if key == "vllm_budget_bytes":
        return f"{value / 2**30:.1f} GiB"
    if key == "n_gpu_layers" and value == -1:
        return "all"
    if key == "cpu_moe":
        return "yes"
    return str(value)


def describe(profile: Profile | None) -> list[str]:
    """Each saved value in words: ["context 16,384", "K cache q8_0", …]."""
    return [f"{_WORDS[k]} {_value_words(k, v)}" for k, v in clean(profile or {}).items()]


def field_words(key: str) -> str:
    return _WORDS.get(key, key)


def settings_fields() -> tuple[str, ...]:
    """The LaunchSettings fields (for a check that `LAUNCH_FIELDS` names real ones)."""
    return tuple(f.name for f in fields(LaunchSettings))
