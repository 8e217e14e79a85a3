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
  every `${NAME}` (letters, digits, `_`, `-`) left in `cmd`, `proxy`, `checkEndpoint`, `name`
  or an alias after its own macros is an error, and llama-swap has no escape for it. Before
  parsing, it also replaces `${env.NAME}` anywhere in the raw file text with that environment
  variable (and fails when one is unset), scanning the values it parsed.

Names are data here (docs/architecture.md, "Exports"): every key and value goes
through PyYAML, and a string holding `$` or anything but plain printable text is written
double-quoted with `$` as `\\x24`, so the file's raw text holds no `${` but the port macros
(and the secret references below). In `cmd`, a word's `${` is split by the quoting itself
(POSIX: `'a$''{b}'`; Windows: `"a$"{"b}"`), which the splitter joins back and no macro pass
sees. Comments are one line each, control characters written as visible escapes. A display
name or alias that holds a macro is left out, a model id llama-swap would read as
`${env.NAME}` (or that is not UTF-8) is renamed, with a warning. The value of `--api-key` or
`--hf-token` is written `"${env.QMGUI_API_KEY}"` / `"${env.HF_TOKEN}"`: llama-swap fills it from
its own environment when it loads the config (and refuses to start while it is unset).

Each model's estimated VRAM is written as a comment above it (for a vLLM launch, with the
reasons behind its context, utilization, KV pool and tool-call parser), and a model that takes
tools (`SwapModel.tools`: a vLLM launch with a tool-call parser) is advertised with
`metadata: {capabilities: {tools: true}}`, which llama-swap passes through to `/v1/models`.
`render_run_set` writes the run set of a placement (`core.placement`): each model's command
carries its cards and split, and models that share cards are a group that runs together
(`swap: false`, `exclusive: false`), preloaded at start (`hooks.on_startup.preload`). `proxy`
names 127.0.0.1 because the engines listen on loopback only (`localhost` may resolve to ::1
first).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from qmgui.core.emit import PORT_MACRO, Command
from qmgui.core.export import (
    PORT,
    EnvRef,
    Export,
    ExportError,
    Word,
    comment_lines,
    export_words,
    footprint_comment,
    line_groups,
    takes_port,
    unique_name,
)
from qmgui.core.footprint import CPU
from qmgui.core.placement import Placed, Placement
from qmgui.core.shell import ENV_NAME, has_surrogate, quote_posix_word, quote_windows_word
from qmgui.core.textsafe import has_control, printable

# llama-swap's default is 120 s; a large model from a slow disk takes longer than that to load
DEFAULT_HEALTH_CHECK_TIMEOUT = 300
MIN_HEALTH_CHECK_TIMEOUT = 15  # llama-swap raises anything lower to 15
PROXY = f"http://127.0.0.1:{PORT_MACRO}"
_GROUP_ID = re.compile(r"[^A-Za-z0-9]+")
# what llama-swap reads as a macro in a parsed value (config.go: macroPatternRegex, envMacroRegex)
_MACRO_REF = re.compile(r"\$\{(?:[a-zA-Z0-9_-]+|env\.[a-zA-Z_][a-zA-Z0-9_]*)\}")
_ENV_MACRO = re.compile(r"\$\{env\.[a-zA-Z_][a-zA-Z0-9_]*\}")
# characters a YAML stream may hold as they are (YAML 1.1 and 1.2 `c-printable`), less the ones
# some readers take for a line break or a byte-order mark
_YAML_TEXT = re.compile(
    "[\t\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*\\Z"
)
_NOT_YAML_TEXT = re.compile(
    "[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)
# strings PyYAML may write in its own style (plain or single-quoted, one line); any other is
# written double-quoted by `_Dumper`
_PLAIN_TEXT = re.compile(
    "[\x20-\x23\x25-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*\\Z"
)


@dataclass(frozen=True)
class SwapModel:
    """One model of the config: its command (emitted with `port=PORT_MARK`) and settings."""

    id: str  # the model name clients send
    command: Command
    check_endpoint: str = "/health"
    ttl: int = 0  # seconds idle before llama-swap stops it; 0 = keep it until swapped out
    aliases: tuple[str, ...] = ()
    unlisted: bool = False
    name: str | None = None  # display name in /v1/models
    comments: tuple[str, ...] = ()  # written above the entry (the VRAM estimate)
    # the model takes `tools` (a vLLM launch with a tool-call parser): advertised in /v1/models
    tools: bool = False


@dataclass(frozen=True)
class SwapGroup:
    """Models that may run together (`swap: false`) or replace each other (`swap: true`)."""

    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


class _Literal(str):
    """A string dumped as a YAML literal block (`|`), one argument group per line."""


class _Macro(str):
    """A string of this module's own that holds a macro llama-swap fills (`PROXY`)."""


def _yaml_escape(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    if c == "$":
        return "\\x24"  # llama-swap's ${env.…} pass reads the raw text: keep `${` out of it
    if c in "\t\n":
        return "\\t" if c == "\t" else "\\n"
    n = ord(c)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


class _Dumper(yaml.SafeDumper):
    def write_double_quoted(self, text: str, split: bool = True) -> None:
        """One line: every character but plain printable text escaped, `$` included."""
        self.write_indicator('"', True)
        data = "".join(
            c if _PLAIN_TEXT.match(c) and c not in '"\\' else _yaml_escape(c) for c in text
        )
        self.column += len(data)
        self.stream.write(data)
        self.write_indicator('"', False)


def _str(dumper: _Dumper, data: str) -> yaml.ScalarNode:
    style = None if _PLAIN_TEXT.match(data) else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _literal(dumper: _Dumper, data: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


_Dumper.add_representer(str, _str)
_Dumper.add_representer(_Literal, _literal)
_Dumper.add_representer(
    _Macro, lambda d, data: d.represent_scalar("tag:yaml.org,2002:str", str(data))
)


def _dump(data: Any) -> str:
    text = yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=2**31, indent=2
    )
    assert isinstance(text, str)
    return text


def _comment(prefix: str, text: str) -> str:
    """`text` as YAML comment lines: visible escapes for control characters and for anything a
    YAML reader refuses, and `${` written `\\x24{` (llama-swap fills `${env.…}` in raw text)."""
    return "".join(
        prefix
        + "# "
        + _NOT_YAML_TEXT.sub(lambda m: _yaml_escape(m.group()), line).replace("${", "\\x24{")
        + "\n"
        for line in comment_lines(text)
    )


def _posix_piece(text: str) -> str:
    # `$` is never bare; inside single quotes `${` becomes `$''{`: the same word, no macro
    return quote_posix_word(text).replace("${", "$''{")


def _windows_piece(text: str) -> str:
    always = (
        "$" in text
        or text.endswith("\\")  # a line ending in a backslash is joined to the next one
        or text.startswith("#")  # a line starting with # is a comment to llama-swap
    )
    # inside double quotes `${` becomes `$"{"`: the quote ends before `{` and starts after it
    return quote_windows_word(text, always=always).replace("${", '$"{"')


def _render_word(word: Word, *, windows: bool) -> str:
    quote = _windows_piece if windows else _posix_piece
    out = []
    for part in word:
        if part is PORT:
            out.append(PORT_MACRO)
        elif isinstance(part, EnvRef):
            out.append(f'"${{env.{part.name}}}"')
        else:
            assert isinstance(part, str)
            out.append(quote(part))
    return "".join(out) or quote("")


def render_cmd(argv: Sequence[str], *, windows: bool = False) -> str:
    """The argv as llama-swap's `cmd`: the executable, then one flag and its values a line."""
    lines = line_groups(export_words(argv).words)
    return (
        "\n".join(" ".join(_render_word(w, windows=windows) for w in line) for line in lines) + "\n"
    )


def _unwritable(text: str) -> str | None:
    """Why `text` cannot be written into a `cmd` or an `env` entry as it is, or None."""
    if has_surrogate(text):
        return "holds bytes that are not UTF-8, which a YAML file cannot carry"
    if has_control(text) or not _YAML_TEXT.match(text):
        return (
            "holds a control character (a line break or tab) or one YAML cannot hold, which "
            "llama-swap's cmd cannot carry"
        )
    return None


def _problem(model: SwapModel) -> str | None:
    """Why this model's command cannot go into a llama-swap config, or None."""
    cmd = model.command
    if not cmd.runnable:
        return "; ".join(cmd.warnings) or "no command"
    if not takes_port(cmd.argv):
        return f"its command does not take the port from llama-swap ({PORT_MACRO})"
    for word in export_words(cmd.argv).words:
        for part in word:
            if isinstance(part, str) and (why := _unwritable(part)) is not None:
                return f"the argument '{printable(part)}' {why}"
    for name, value in cmd.env.items():
        if not ENV_NAME.match(name) or _unwritable(value) is not None or "${" in value:
            return (
                f"the environment variable {printable(name)} cannot be written to a llama-swap "
                "config"
            )
    return None


def _written_id(mid: str) -> str:
    """The id as written: itself, unless llama-swap would read it as `${env.…}` or it is not
    text a YAML file holds (then its visible escape, `${` as `$_{`)."""
    if not has_surrogate(mid) and _ENV_MACRO.search(mid) is None:
        return mid
    return printable(mid).replace("${", "$_{")


def _entry(model: SwapModel, name: str | None, aliases: list[str], cmd: str) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if name:
        entry["name"] = name
    entry["cmd"] = _Literal(cmd)
    entry["proxy"] = _Macro(PROXY)
    entry["checkEndpoint"] = model.check_endpoint
    entry["ttl"] = model.ttl
    entry["env"] = [f"{k}={v}" for k, v in model.command.env.items()]
    entry["aliases"] = aliases
    entry["unlisted"] = model.unlisted
    if model.tools:
        # llama-swap has no capabilities key; `metadata` is what it passes through as it is in
        # each model's /v1/models record, so a client can tell a model that takes tools
        entry["metadata"] = {"capabilities": {"tools": True}}
    return entry


def _label_problem(text: str) -> str | None:
    if _MACRO_REF.search(text):
        return "llama-swap would read its ${…} as a macro"
    if has_surrogate(text):
        return "it is not UTF-8 text"
    return None


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
        out[_written_id(gid)] = {
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
    secrets: dict[str, str] = {}
    chunks: list[str] = []
    for model in models:
        problem = _problem(model)
        if problem is not None:
            warnings.append(f"{model.id}: left out of the llama-swap config: {problem}")
            chunks.append(_comment("  ", f"{printable(model.id)}: left out ({problem})"))
            skipped.add(model.id)
            continue
        written = _written_id(model.id)
        mid = unique_name(written, taken_ids)
        if written != model.id:
            warnings.append(f"{model.id}: written as {mid}: {_id_reason(model.id)}")
        elif mid != model.id:
            warnings.append(f"two models are named {model.id}; the second is {mid}")
        ids.setdefault(model.id, mid)
        chunk, model_secrets = _model_chunk(
            model, mid, _aliases(model, mid, taken_aliases, taken_ids, warnings), warnings,
            windows=windows,
        )  # fmt: skip
        secrets.update(model_secrets)
        chunks.append(chunk)
    text = "".join(_comment("", line) for line in header)
    text += "".join(
        _comment("", f"set {var} before starting llama-swap: it passes the value of {flag}")
        for var, flag in sorted(secrets.items())
    )
    text += _dump({"healthCheckTimeout": max(health_check_timeout, MIN_HEALTH_CHECK_TIMEOUT)})
    text += "models:" + ("\n" + "".join(chunks) if ids else " {}\n" + "".join(chunks))
    group_map, group_warnings = _groups(groups or {}, ids, skipped)
    if group_map:
        text += _dump({"groups": group_map})
    started = list(dict.fromkeys(ids[m] for m in preload if m in ids))
    if started:
        text += _dump({"hooks": {"on_startup": {"preload": started}}})
    secret_warnings = [
        f"the value of {flag} is not written to the config: set {var} in llama-swap's environment"
        for var, flag in sorted(secrets.items())
    ]
    return Export(text=text, warnings=(*warnings, *group_warnings, *secret_warnings))


def _aliases(
    model: SwapModel, mid: str, taken: set[str], taken_ids: set[str], warnings: list[str]
) -> list[str]:
    aliases = []
    for alias in model.aliases:
        if alias in taken or alias in taken_ids:
            warnings.append(f"{mid}: alias {alias!r} is taken by another model; left out")
            continue
        why = _label_problem(alias)
        if why is not None:
            warnings.append(f"{mid}: alias {alias!r} left out: {why}")
            continue
        taken.add(alias)
        aliases.append(alias)
    return aliases


def _model_chunk(
    model: SwapModel, mid: str, aliases: list[str], warnings: list[str], *, windows: bool
) -> tuple[str, dict[str, str]]:
    """The model's comments and entry, indented under `models:`, and its secrets."""
    name = model.name
    if name and (why := _label_problem(name)) is not None:
        warnings.append(f"{mid}: display name {name!r} left out: {why}")
        name = None
    words = export_words(model.command.argv)
    comments = [*model.comments, *(f"warning: {w}" for w in model.command.warnings)]
    block = "".join(_comment("", c) for c in comments)
    entry = _entry(model, name, aliases, render_cmd(model.command.argv, windows=windows))
    block += _dump({mid: entry})
    return textwrap.indent(block, "  "), words.secrets


def _id_reason(mid: str) -> str:
    if has_surrogate(mid):
        return "its name is not UTF-8 text"
    return "llama-swap would read its ${env.…} as an environment variable"


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
    left_out = [f"{printable(u.name)}: not placed: {u.reason}" for u in placement.unplaced]
    result = render_llama_swap(
        models,
        groups=run_set_groups(placement),
        windows=windows,
        header=(*header, *left_out),
        preload=[p.name for p in placement.placed] if preload else (),
    )
    return Export(result.text, (*left_out, *result.warnings))
