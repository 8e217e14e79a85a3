"""A llama.cpp router preset file (`llama-server --models-preset models.ini`).

The format, as llama.cpp's tools/server/README.md ("Model presets") and common/preset.cpp
define it and this exporter relies on:
- one `[section]` per model, named as clients will ask for it; a section for a model the router
  does not already know must name the file with `model = PATH` (absolute paths recommended);
- keys are llama-server's arguments without leading dashes (long or short form, or the
  `LLAMA_ARG_*` variable): `ctx-size = 8192`; a switch is `key = true`, and a negative switch
  names its negative form (`no-mmap = true`); `version = 1` at the top is reserved;
- a value runs to the end of the line and stops at `;` or `#` (comments) and at surrounding
  spaces and tabs; no quoting exists. A value holding `;`, `#`, a line break, NUL, bytes that
  are not UTF-8 or surrounding spaces therefore cannot be written, and that model is left out
  with a warning;
- a section header is `[` + anything but `]` + `]` (a line break included, so a name could
  start a section of its own); `[*]` is the global preset every model inherits and the lines
  before any header are the section `default`. A model's name is its section when it holds no
  bracket, control character or surrounding space and is neither of those two; otherwise the
  section is the name made safe (visible escapes, brackets as parentheses) and a warning says
  so. A key from the user's arguments must be llama.cpp's `[a-zA-Z_][a-zA-Z0-9_.-]*`, or the
  router refuses the whole file: any other is left out with a warning;
- comments are one line each, control characters written as visible escapes
  (`textsafe.printable`); no byte of a name can add a key or a section;
- the router sets host, port and aliases itself, so those are not written; per-model
  environment variables do not exist, so a GPU pin is written as `device = CUDA0,CUDA1`;
- secrets are not written: `api-key` is the router's own, and `hf-token` is left out with a
  warning to set `HF_TOKEN` in the router's environment (llama-server reads it from there).
Values are the same the llama-server emitter derives (qmgui.core.emit.llama), spelled long.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import DevicePin, flag_head, merge_extra, parse_extra_args, place
from qmgui.core.emit.llama import (
    READBACK_VERBOSITY,
    ROUTER_OWNED,
    TABLE,
    cannot_serve,
    llama_options,
)
from qmgui.core.export import Export, comment_lines, unique_name
from qmgui.core.launch import LaunchSettings
from qmgui.core.shell import has_surrogate
from qmgui.core.textsafe import REDACTED, has_control, printable

PRESET_VERSION = 1
# keys the router controls (README: "removed or overwritten upon loading")
_ROUTER_KEYS = frozenset({"host", "port", "alias", "a", "api-key", "hf-repo", "hf", "hfr"})
_BAD_VALUE_CHARS = (";", "#", "\n", "\r", "\0")
# llama.cpp's `ident`: a key outside it fails the whole file
_KEY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.-]*\Z")
# `*` is the global preset, `default` the lines before any header
_RESERVED_SECTIONS = frozenset({"*", "default"})
# secret keys: never written; the variable llama-server reads the value from instead
_SECRET_KEYS = {"hf-token": "HF_TOKEN", "hft": "HF_TOKEN"}
_SECRET_ROUTER_KEYS = frozenset({"api-key"})


@dataclass(frozen=True)
class PresetModel:
    """One model of the preset file."""

    name: str
    model: ModelEntry
    settings: LaunchSettings = field(default_factory=LaunchSettings)
    devices: DevicePin | None = None
    extra_args: tuple[str, ...] = ()  # the user's arguments, already split into words
    comments: tuple[str, ...] = ()


def _section_name(name: str) -> str:
    """The section for `name`: itself when a header can hold it as it is, else made safe."""
    if (
        name
        and not any(c in name for c in "[]")
        and not has_control(name)
        and not has_surrogate(name)
        and name == name.strip(" \t")
    ):
        return name
    # a header is `[` + anything but `]` + `]`: one line, no brackets, no surrounding space
    text = printable(" ".join(name.split()))
    return text.replace("]", ")").replace("[", "(").strip(" \t") or "model"


def _comment(text: str) -> str:
    return "".join(f"; {line}\n" for line in comment_lines(text))


def _extra_pairs(extra: Sequence[str]) -> list[tuple[str, str]]:
    """The user's arguments as preset keys: `--flag value`, `--flag=value`, or a switch."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(extra):
        head = flag_head(extra[i])
        if head is None:
            i += 1  # a stray value: nothing to attach it to
            continue
        key = head.lstrip("-")
        if "=" in extra[i]:
            pairs.append((key, extra[i].split("=", 1)[1]))
            i += 1
        elif i + 1 < len(extra) and flag_head(extra[i + 1]) is None:
            pairs.append((key, extra[i + 1]))
            i += 2
        else:
            pairs.append((key, "true"))
            i += 1
    return pairs


def preset_options(
    item: PresetModel, *, supported_flags: frozenset[str] | None = None
) -> tuple[list[tuple[str, str]], list[str]]:
    """The key/value pairs of one section and the warnings."""
    opts, _, warnings = llama_options(
        item.model,
        item.settings,
        port=None,
        host=None,
        supported_flags=supported_flags,
        devices=item.devices,
        device_flag_only=True,
        verbosity=READBACK_VERBOSITY,
    )
    placed, place_warnings = place(opts, supported=supported_flags, prefer_long=True)
    extra = parse_extra_args(item.extra_args)
    kept, _, merge_warnings = merge_extra(placed, extra, TABLE)
    pairs = [
        (p.tokens[0].lstrip("-"), " ".join(p.tokens[1:]) or "true")
        for p in kept
        if p.flag.key not in ROUTER_OWNED
    ]
    for key, value in _extra_pairs(extra):
        if key in _ROUTER_KEYS:
            shown = REDACTED if key in _SECRET_ROUTER_KEYS else printable(value)
            warnings.append(f"left out {key} = {shown}: the router sets it")
        elif key in _SECRET_KEYS:
            warnings.append(
                f"left out {key}: a preset file holds no secrets; set {_SECRET_KEYS[key]} in "
                "the router's environment"
            )
        elif not _KEY.match(key):
            warnings.append(f"left out '{printable(key)}': not a key a preset file can hold")
        else:
            pairs.append((key, value))
    return pairs, [*warnings, *place_warnings, *merge_warnings]


def _bad_value(pairs: Sequence[tuple[str, str]]) -> str | None:
    for key, value in pairs:
        if has_surrogate(value):
            return (
                f"{key} = '{printable(value)}' cannot be written: its bytes are not UTF-8 text "
                "(rename the file or folder)"
            )
        if any(c in value for c in _BAD_VALUE_CHARS) or value != value.strip(" \t"):
            return (
                f"{key} = '{printable(value)}' cannot be written: a preset value ends at ';' or "
                "'#' and loses surrounding spaces (rename the file or folder)"
            )
    return None


def render_models_ini(
    items: Sequence[PresetModel],
    *,
    supported_flags: frozenset[str] | None = None,
    header: Sequence[str] = (),
) -> Export:
    """The preset file for `items`; models llama-server cannot serve are left out, noted."""
    text = "".join(_comment(line) for line in header)
    text += f"version = {PRESET_VERSION}\n"
    warnings: list[str] = []
    taken: set[str] = set(_RESERVED_SECTIONS)
    for item in items:
        pairs, item_warnings = preset_options(item, supported_flags=supported_flags)
        reason = cannot_serve(item.model) or _bad_value(pairs)
        if reason is not None:
            warnings.append(f"{item.name}: left out of models.ini: {reason}")
            text += "\n" + _comment(f"{printable(item.name)}: left out ({reason})")
            continue
        name = unique_name(_section_name(item.name), taken)
        if name != item.name:
            warnings.append(f"{item.name}: written as section [{name}]")
        text += "\n"
        for line in [*item.comments, *(f"warning: {w}" for w in item_warnings)]:
            text += _comment(line)
        text += f"[{name}]\n"
        text += "".join(f"{key} = {value}\n" for key, value in pairs)
        warnings += [f"{name}: {w}" for w in item_warnings]
    return Export(text=text, warnings=tuple(warnings))
