"""A custom engine: the argv comes from the user's template with placeholders filled in.

The template is split into words first (like a shell, backslashes kept literally), and each word
then has its placeholders replaced, so a model path with spaces stays one argument and nothing in
a path is ever read as template syntax. `{{` and `}}` are literal braces. The template holds the
arguments after the backend's executable; with no executable it is the whole command.

A placeholder with no value for this model (`{mmproj}` for a model without a projector, `{ngl}`
when no layer count was set) removes its word, and the flag word right before it when the
placeholder was the whole word (`--mmproj {mmproj}` disappears as a pair). An unknown placeholder
is an `EmitError` naming it and the ones that exist.
"""

from __future__ import annotations

import os
import string
from collections.abc import Mapping, Sequence

from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import (
    DEFAULT_HOST,
    Command,
    EmitError,
    flag_head,
    parse_extra_args,
    split_args,
)
from qmgui.core.launch import LaunchSettings

HEALTH_PATH = "/health"  # a guess for an unknown server; exports let the user set another

PLACEHOLDERS: dict[str, str] = {
    "model": "the model file (the first shard of a split set) or folder",
    "model_dir": "the folder that holds the model",
    "name": "the model's name",
    "mmproj": "the vision projector, when the model has one",
    "host": "the address to listen on",
    "port": "the port to listen on",
    "ctx": "the context size (the one set, else the trained one)",
    "ngl": "the GPU layer count, when one is set",
    "parallel": "the slot count, when one is set",
    "ctk": "the K cache type",
    "ctv": "the V cache type",
    "fa": "flash attention: on, off or auto",
}
_FORMATTER = string.Formatter()


def _values(
    model: ModelEntry, s: LaunchSettings, *, port: int | str, host: str
) -> dict[str, str | None]:
    path = model.shards[0] if model.shards else model.path
    ctx = s.ctx_size or (model.meta.context_length if model.meta else None)
    return {
        "model": path,
        "model_dir": os.path.dirname(path) if model.format == "gguf" else path,
        "name": model.name,
        "mmproj": model.mmproj,
        "host": host,
        "port": str(port),
        "ctx": str(ctx) if ctx else None,
        "ngl": str(s.n_gpu_layers) if s.n_gpu_layers is not None else None,
        "parallel": str(s.parallel) if s.parallel is not None else None,
        "ctk": s.cache_type_k,
        "ctv": s.cache_type_v,
        "fa": s.flash_attn,
    }


def _fields(word: str, template: str) -> list[tuple[str, str | None]]:
    """The word as (literal text, placeholder or None) pieces; EmitError on bad syntax."""
    try:
        parsed = list(_FORMATTER.parse(word))
    except ValueError:
        raise EmitError(
            f"the command template {template!r} has an unmatched '{{' or '}}' in {word!r}; "
            "write {{ and }} for literal braces"
        ) from None
    pieces: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (spec or conversion):
            raise EmitError(
                f"the command template writes {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}; placeholders take no format: write {{{name}}}"
            )
        if name is not None and name not in PLACEHOLDERS:
            known = ", ".join(f"{{{k}}}" for k in PLACEHOLDERS)
            raise EmitError(
                f"the command template names {{{name}}}, which qmgui does not fill; "
                f"use one of {known}"
            )
        pieces.append((literal, name))
    return pieces


def render_template(template: str, values: Mapping[str, str | None]) -> tuple[list[str], list[str]]:
    """The template's words with placeholders filled; words left out, in warnings."""
    words: list[str] = []
    warnings: list[str] = []
    prev_was_flag = False
    for word in split_args(template, what="the command template"):
        pieces = _fields(word, template)
        missing = [name for _, name in pieces if name is not None and values.get(name) is None]
        if missing:
            whole = len(pieces) == 1 and not pieces[0][0]
            dropped = [word]
            if whole and prev_was_flag:
                dropped.insert(0, words.pop())
            warnings.append(f"left out {' '.join(dropped)}: no {', '.join(missing)} for this model")
            prev_was_flag = False
            continue
        text = "".join(lit + ((values[name] or "") if name else "") for lit, name in pieces)
        words.append(text)
        prev_was_flag = all(name is None for _, name in pieces) and flag_head(word) is not None
    return words, warnings


def emit_custom(
    model: ModelEntry,
    template: str,
    settings: LaunchSettings = LaunchSettings(),  # noqa: B008 - frozen, shared safely
    *,
    executable: str,
    port: int | str,
    host: str = DEFAULT_HOST,
    env: Mapping[str, str] | None = None,
    extra_args: str | Sequence[str] = (),
) -> Command:
    """The command a custom backend's template describes for `model`."""
    words, warnings = render_template(template, _values(model, settings, port=port, host=host))
    argv = [executable, *words] if executable.strip() else words
    if not argv:
        raise EmitError("the custom backend has neither an executable nor a command template")
    if model.error:
        warnings.append(f"{model.name}: {model.error}")
    return Command(
        argv=(*argv, *parse_extra_args(extra_args)), env=dict(env or {}), warnings=tuple(warnings)
    )
