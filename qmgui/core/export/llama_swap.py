"""A llama-swap `config.yaml`: one entry per model, started on demand behind one endpoint.

What was checked against llama-swap's documented schema (its `config.example.yaml` and
`proxy/config/config.go` / `model_config.go`, read for this exporter; the tests load the output
back and hold it to these rules):
- top level: `healthCheckTimeout` (seconds, minimum 15), `models` (required: a mapping from the
  model id clients send to its settings), `groups` (optional: id -> `swap`, `exclusive`,
  `persistent`, `members`; a model may be in one group only, members must be model ids);
- per model: `cmd` (required; one string, split into argv by llama-swap itself: POSIX shell
  rules on Linux and macOS, `CommandLineToArgvW` rules on Windows; lines starting with `#` are
  dropped as comments), `proxy` (default `http://localhost:${PORT}`), `ttl` (seconds idle
  before unloading, 0 = never), `checkEndpoint` (a path that answers 200 when ready, or
  `none`), `env` (a list of `NAME=value` strings), `aliases` (names unique across all models),
  `unlisted` (hidden from `/v1/models`), `name` (display name);
- `${PORT}` is a macro llama-swap fills with a free port per model, and only when `cmd` uses it;
  every `${…}` in `cmd` is read as a macro (an unknown one fails the whole config), so a command
  whose own words contain `${` cannot be exported and is left out with a warning.

Each model's estimated VRAM is written as a comment above it. `render_run_set` writes the run
set of a placement (`core.placement`): each model's command carries its cards and split, and
models that share cards are a group that runs together (`swap: false`, `exclusive: false`),
preloaded at start (`hooks.on_startup.preload`). `proxy` names 127.0.0.1 because
the engines listen on loopback only (`localhost` may resolve to ::1 first).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from qmgui.core.emit import PORT_MACRO, Command, flag_head
from qmgui.core.export import Export, ExportError, footprint_comment, unique_name
from qmgui.core.footprint import CPU
from qmgui.core.placement import Placed, Placement
from qmgui.core.shell import quote_posix_word, quote_windows_word

# llama-swap's default is 120 s; a large model from a slow disk takes longer than that to load
DEFAULT_HEALTH_CHECK_TIMEOUT = 300
MIN_HEALTH_CHECK_TIMEOUT = 15  # llama-swap raises anything lower to 15
PROXY = f"http://127.0.0.1:{PORT_MACRO}"
_MACRO = re.compile(r"\$\{")
_GROUP_ID = re.compile(r"[^A-Za-z0-9]+")


@dataclass(frozen=True)
class SwapModel:
    """One model of the config: its command (emitted with `port=PORT_MACRO`) and settings."""

    id: str  # the model name clients send
    command: Command
    check_endpoint: str = "/health"
    ttl: int = 0  # seconds idle before llama-swap stops it; 0 = keep it until swapped out
    aliases: tuple[str, ...] = ()
    unlisted: bool = False
    name: str | None = None  # display name in /v1/models
    comments: tuple[str, ...] = ()  # written above the entry (the VRAM estimate)


@dataclass(frozen=True)
class SwapGroup:
    """Models that may run together (`swap: false`) or replace each other (`swap: true`)."""

    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


class _Literal(str):
    """A string dumped as a YAML literal block (`|`), one argument group per line."""


class _Dumper(yaml.SafeDumper):
    pass


def _literal(dumper: yaml.SafeDumper, data: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


_Dumper.add_representer(_Literal, _literal)


def _dump(data: Any) -> str:
    return yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096, indent=2
    )


def _quote_windows(token: str) -> str:
    quoted = quote_windows_word(token)
    # a line starting with # is a comment to llama-swap; quotes keep the word
    return f'"{quoted}"' if quoted.startswith("#") else quoted


def _word(token: str, *, windows: bool) -> str:
    quote = _quote_windows if windows else quote_posix_word
    if PORT_MACRO not in token:
        return quote(token)
    # the macro stays bare so llama-swap sees it; the text around it is quoted on its own
    pieces = token.split(PORT_MACRO)
    return PORT_MACRO.join(quote(p) if p else "" for p in pieces)


def render_cmd(argv: Sequence[str], *, windows: bool = False) -> str:
    """The argv as llama-swap's `cmd`: the executable, then one flag and its values a line."""
    lines: list[list[str]] = []
    for i, token in enumerate(argv):
        if i == 0 or flag_head(token) is not None or i == 1:
            lines.append([])
        lines[-1].append(_word(token, windows=windows))
    return "\n".join(" ".join(line) for line in lines) + "\n"


def _problem(model: SwapModel) -> str | None:
    """Why this model's command cannot go into a llama-swap config, or None."""
    cmd = model.command
    if not cmd.runnable:
        return "; ".join(cmd.warnings) or "no command"
    if not any(PORT_MACRO in a for a in cmd.argv):
        return f"its command does not take the port from llama-swap ({PORT_MACRO})"
    for a in cmd.argv:
        if _MACRO.search(a.replace(PORT_MACRO, "")):
            return f"the argument {a!r} holds '${{', which llama-swap reads as a macro"
        if any(ord(c) < 32 for c in a):
            return f"the argument {a!r} holds a control character (a line break or tab)"
    for name, value in cmd.env.items():
        if _MACRO.search(value) or any(ord(c) < 32 for c in value):
            return f"the environment variable {name} cannot be written to a llama-swap config"
    return None


def _entry(model: SwapModel, aliases: list[str], *, windows: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if model.name:
        entry["name"] = model.name
    entry["cmd"] = _Literal(render_cmd(model.command.argv, windows=windows))
    entry["proxy"] = PROXY
    entry["checkEndpoint"] = model.check_endpoint
    entry["ttl"] = model.ttl
    entry["env"] = [f"{k}={v}" for k, v in model.command.env.items()]
    entry["aliases"] = aliases
    entry["unlisted"] = model.unlisted
    return entry


def _groups(
    groups: Mapping[str, SwapGroup], ids: Mapping[str, str], skipped: set[str]
) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    warnings: list[str] = []
    seen: dict[str, str] = {}
    for gid, group in groups.items():
        members = []
        for m in group.members:
            if m in skipped:
                warnings.append(f"group {gid}: {m} was left out of the config")
                continue
            if m not in ids:
                raise ExportError(f"group {gid!r} names {m!r}, which is not an exported model")
            if m in seen:
                raise ExportError(f"{m!r} is in groups {seen[m]!r} and {gid!r}; llama-swap "
                                  "allows one group per model")  # fmt: skip
            seen[m] = gid
            members.append(ids[m])
        out[gid] = {
            "swap": group.swap,
            "exclusive": group.exclusive,
            "persistent": group.persistent,
            "members": members,
        }
    return out, warnings


def render_llama_swap(
    models: Sequence[SwapModel],
    *,
    health_check_timeout: int = DEFAULT_HEALTH_CHECK_TIMEOUT,
    groups: Mapping[str, SwapGroup] | None = None,
    windows: bool = False,
    header: Sequence[str] = (),
    preload: Sequence[str] = (),
) -> Export:
    """The config.yaml text for `models` (`windows`: quote `cmd` for llama-swap on Windows).
    `preload`: model ids llama-swap starts when it starts (`hooks.on_startup.preload`)."""
    warnings: list[str] = []
    taken_ids: set[str] = set()
    taken_aliases: set[str] = set()
    ids: dict[str, str] = {}  # the id asked for -> the id written
    skipped: set[str] = set()
    chunks: list[str] = []
    for model in models:
        problem = _problem(model)
        if problem is not None:
            warnings.append(f"{model.id}: left out of the llama-swap config: {problem}")
            chunks.append(f"  # {model.id}: left out ({problem})\n")
            skipped.add(model.id)
            continue
        mid = unique_name(model.id, taken_ids)
        if mid != model.id:
            warnings.append(f"two models are named {model.id}; the second is {mid}")
        ids.setdefault(model.id, mid)
        aliases = []
        for alias in model.aliases:
            if alias in taken_aliases or alias in taken_ids:
                warnings.append(f"{mid}: alias {alias!r} is taken by another model; left out")
                continue
            taken_aliases.add(alias)
            aliases.append(alias)
        comments = [*model.comments, *(f"warning: {w}" for w in model.command.warnings)]
        block = "".join(f"# {line}\n" for c in comments for line in c.splitlines())
        block += _dump({mid: _entry(model, aliases, windows=windows)})
        chunks.append(textwrap.indent(block, "  "))
    text = "".join(f"# {line}\n" for line in header)
    text += _dump({"healthCheckTimeout": max(health_check_timeout, MIN_HEALTH_CHECK_TIMEOUT)})
    text += "models:" + ("\n" + "".join(chunks) if ids else " {}\n" + "".join(chunks))
    group_map, group_warnings = _groups(groups or {}, ids, skipped)
    if group_map:
        text += _dump({"groups": group_map})
    started = [ids[m] for m in preload if m in ids]
    if started:
        text += _dump({"hooks": {"on_startup": {"preload": started}}})
    return Export(text=text, warnings=(*warnings, *group_warnings))


# --- a run set: several models placed together (core.placement) ---------------------------------


def run_set_groups(placement: Placement) -> dict[str, SwapGroup]:
    """llama-swap groups for the models a placement runs together.

    Placed models that share a card, directly or through another model, are one group that
    runs together (`swap: false`): the placement charged each against the others, so all of
    them fit at once. Different groups hold different cards, so starting one must not unload
    another (`exclusive: false`). Models on the CPU alone share host memory: one group `cpu`.
    Group ids name the cards, in the order given (`gpu0+gpu2`, `rpc0-10-0-0-2-50052`)."""
    index = {d.device: i for i, d in enumerate(placement.gpus)}
    parent = {p.name: p.name for p in placement.placed}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[str, str] = {}
    for p in placement.placed:
        for d in p.devices or (CPU,):
            if d in owner:
                parent[root(p.name)] = root(owner[d])
            else:
                owner[d] = p.name
    members: dict[str, list[str]] = {}
    for p in placement.placed:
        members.setdefault(root(p.name), []).append(p.name)
    groups: dict[str, SwapGroup] = {}
    for names in members.values():
        cards = sorted({d for n in names for d in _devices(placement, n) if d in index},
                       key=index.__getitem__)  # fmt: skip
        gid = "+".join(_GROUP_ID.sub("-", c).strip("-").lower() for c in cards) or "cpu"
        groups[gid] = SwapGroup(members=tuple(names), swap=False, exclusive=False)
    return groups


def _devices(placement: Placement, name: str) -> tuple[str, ...]:
    placed = placement.model(name)
    return placed.devices if placed is not None else ()


def placement_comment(placed: Placed) -> str:
    """One line for a config comment: where the placement put the model and with what."""
    s = placed.settings
    where = ", ".join(placed.devices) if placed.devices else "the CPU"
    split = f", tensor split {','.join(f'{x:g}' for x in s.tensor_split)}" if placed.split else ""
    r = placed.footprint.settings
    return f"placed on {where}{split}; context {r.n_ctx}, {r.n_seq} slots"


def render_run_set(
    placement: Placement,
    commands: Mapping[str, Command],
    *,
    ttl: int = 0,
    windows: bool = False,
    header: Sequence[str] = (),
    preload: bool = True,
) -> Export:
    """A llama-swap config that serves a placement's run set on a headless server.

    `commands` holds each placed model's command, emitted with the placement's settings and
    cards (`--device`, `-ts`, `-c`, `-ngl`) and `port=PORT_MACRO`. Co-resident models share a
    group (`run_set_groups`); with `preload` llama-swap starts them all when it starts. Models
    the placement could not place are named in the header and left out."""
    models = [
        SwapModel(
            id=p.name,
            command=commands.get(p.name) or Command((), warnings=(f"{p.name}: no command",)),
            ttl=ttl,
            comments=(placement_comment(p), footprint_comment(p.footprint), *p.notes),
        )
        for p in placement.placed
    ]
    left_out = [f"{u.name}: not placed: {u.reason}" for u in placement.unplaced]
    result = render_llama_swap(
        models,
        groups=run_set_groups(placement),
        windows=windows,
        header=(*header, *left_out),
        preload=[p.name for p in placement.placed] if preload else (),
    )
    return Export(result.text, (*left_out, *result.warnings))
