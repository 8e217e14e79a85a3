"""Reading a llama-server or `vllm serve` command line into a model's profile (`qmgui import`,
the window's "Paste command…"): what it maps to profile values (every spelling and alias the
emitter writes, and those a probed build lists), what it keeps as extra arguments, and notes
on what it dropped. Pure; the profile itself is `qmgui.core.profile`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qmgui.core.emit import FALSY, TRUTHY, EmitError, split_args
from qmgui.core.emit import llama as emit_llama
from qmgui.core.errors import QmguiError
from qmgui.core.launch import CACHE_TYPES
from qmgui.core.vllm import (
    FLAG_AUTO_TOOL_CHOICE,
    FLAG_DTYPE,
    FLAG_GPU_UTIL,
    FLAG_KV_CACHE_DTYPE,
    FLAG_MAX_MODEL_LEN,
    FLAG_TENSOR_PARALLEL,
    FLAG_TOKENIZER,
    FLAG_TOOL_CALL_PARSER,
)

# --- reading a command line ------------------------------------------------------------------


class CommandError(QmguiError):
    """A command line that cannot be read as a launch (a sentence for the user)."""


@dataclass(frozen=True)
class ParsedCommand:
    """What `parse_command` read: the engine kind, the model named (None: none named), the
    profile values mapped from known flags, the tokens kept as extra arguments, and notes on
    what was dropped or looks wrong."""

    engine: str
    model: str | None
    values: dict[str, Any]
    extra_args: tuple[str, ...]
    notes: tuple[str, ...]
    mapped: tuple[str, ...]  # the flags as written that became profile values

    def profile(self) -> dict[str, Any]:
        """The profile to store: the mapped values and the kept extra arguments."""
        out = dict(self.values)
        if self.extra_args:
            out["extra_args"] = [quote_token(t) for t in self.extra_args]
        return out


_PLAIN = re.compile(r"[^\s'\"]+\Z")


def quote_token(token: str) -> str:
    """`token` written so `split_args` reads it back as that one token."""
    if token and _PLAIN.match(token):
        return token
    parts = re.split(r"(')", token)
    return "".join('"\'"' if p == "'" else f"'{p}'" for p in parts if p) or "''"


Parse = Callable[[str, str], Any]  # (flag as written, value) -> profile value


def _int(lo: int, hi: int, what: str) -> Parse:
    def parse(flag: str, value: str) -> int:
        text = value.strip().lower()
        mult = 1
        if text[-1:] in ("k", "m") and text[:-1].isdigit():  # vLLM reads 32k
            mult = 1024 if text[-1] == "k" else 1024 * 1024
            text = text[:-1]
        try:
            n = int(text) * mult
        except ValueError:
            raise CommandError(f"{flag} {value}: give {what}") from None
        if not lo <= n <= hi:
            raise CommandError(f"{flag} {value}: give {what}")
        return n

    return parse


def _choice(choices: Iterable[str], what: str) -> Parse:
    options = tuple(choices)

    def parse(flag: str, value: str) -> str:
        if value not in options:
            raise CommandError(f"{flag} {value}: {what} is one of {', '.join(options)}")
        return value

    return parse


def _text(flag: str, value: str) -> str:
    if not value.strip():
        raise CommandError(f"{flag}: give a value")
    return value


def _util(flag: str, value: str) -> float:
    try:
        u = float(value)
    except ValueError:
        u = math.nan
    if not (math.isfinite(u) and 0 < u <= 1):
        raise CommandError(f"{flag} {value}: give a fraction of the card above 0, at most 1")
    return u


def _split(flag: str, value: str) -> list[float]:
    try:
        split = [float(x) for x in value.replace("/", ",").split(",")]
    except ValueError:
        split = []
    if not split or not all(math.isfinite(x) and x >= 0 for x in split) or not any(split):
        raise CommandError(f"{flag} {value}: give a share per GPU, e.g. 3,1")
    return split


def _flash(flag: str, value: str) -> str:
    v = value.lower()
    if v == "auto":
        return "auto"
    if v in TRUTHY:
        return "on"
    if v in FALSY:
        return "off"
    raise CommandError(f"{flag} {value}: flash attention is on, off or auto")


_DEVICE = re.compile(r"[A-Za-z]+(\d+)\Z")


def _devices(flag: str, value: str) -> list[int]:
    out: list[int] = []
    for raw in value.split(","):
        part = raw.strip()
        match = _DEVICE.match(part) if not part.isdigit() else None
        if part.isdigit():
            out.append(int(part))
        elif match:
            out.append(int(match.group(1)))
        else:
            raise CommandError(f"{flag} {value}: give devices such as CUDA0,CUDA1")
    return out


_NGL_ALL = ("all",)
_CTX = _int(0, 1 << 24, "a context of 0 (the trained one) or more tokens")
_PORT = _int(1, 65535, "a port from 1 to 65535")


def _ngl(flag: str, value: str) -> int | None:
    v = value.strip().lower()
    if v in _NGL_ALL:
        return -1
    if v == "auto":
        return None
    n: int = _int(-1, 1 << 31, "a number of layers, -1 or all")(flag, value)
    return n


# llama-server: spelling -> (profile key, parser); built from the emitter's tables so the
# spellings and aliases stay the ones qmgui writes
_LLAMA: dict[str, tuple[str, Parse]] = {}
for _flag, _key, _parse in (
    (emit_llama.F_MODEL, "model", _text),
    (emit_llama.F_CTX, "ctx_size", _CTX),
    (emit_llama.F_CTK, "cache_type_k", _choice(CACHE_TYPES, "the K cache type")),
    (emit_llama.F_CTV, "cache_type_v", _choice(CACHE_TYPES, "the V cache type")),
    (emit_llama.F_NGL, "n_gpu_layers", _ngl),
    (emit_llama.F_N_CPU_MOE, "n_cpu_moe", _int(0, 1 << 31, "a number of layers")),
    (emit_llama.F_TENSOR_SPLIT, "tensor_split", _split),
    (emit_llama.F_DEVICE, "devices", _devices),
    (emit_llama.F_PORT, "port", _PORT),
):
    for _t in (s[0] for s in _flag.spellings):
        _LLAMA[_t] = (_key, _parse)
_LLAMA["--mmproj"] = _LLAMA["-mm"] = ("mmproj", _text)
_LLAMA["-np"] = _LLAMA["--parallel"] = ("parallel", _int(-1, 256, "1 to 256 slots, or -1"))
_LLAMA_SWITCHES = {"--cpu-moe": "cpu_moe", "-cmoe": "cpu_moe"}
_FLASH = ("-fa", "--flash-attn")
_NO_FLASH = ("-nfa", "--no-flash-attn")
# dropped, with a note: qmgui writes these itself
_OWN_VALUE = {
    "--host": "--host {v} dropped: qmgui serves on 127.0.0.1 (a proxy opens it up)",
    **dict.fromkeys(
        ("-lv", "--verbosity", "--log-verbosity"),
        "{f} {v} dropped: qmgui writes -lv 4 to read the buffer sizes back",
    ),
    **dict.fromkeys(("-fit", "--fit"), "{f} {v} dropped: qmgui plans every value (-fit off)"),
}
_OWN_SWITCH = {
    **dict.fromkeys(
        ("-v", "--verbose", "--log-verbose"),
        "{f} dropped: qmgui writes -lv 4 to read the buffer sizes back",
    ),
}

_VLLM: dict[str, tuple[str, Parse]] = {
    "--model": ("model", _text),
    FLAG_MAX_MODEL_LEN: ("ctx_size", _int(1, 1 << 24, "a context of 1 or more tokens")),
    FLAG_GPU_UTIL: ("gpu_memory_utilization", _util),
    FLAG_TENSOR_PARALLEL: ("tensor_parallel_size", _int(1, 1024, "1 or more GPUs")),
    "-tp": ("tensor_parallel_size", _int(1, 1024, "1 or more GPUs")),
    FLAG_TOKENIZER: ("tokenizer", _text),
    FLAG_TOOL_CALL_PARSER: ("tool_call_parser", _text),
    FLAG_DTYPE: ("dtype", _text),
    FLAG_KV_CACHE_DTYPE: ("kv_cache_dtype", _text),
    "--port": ("port", _PORT),
}
_VLLM_OWN_VALUE = {"--host": _OWN_VALUE["--host"]}
_VLLM_OWN_SWITCH = {
    FLAG_AUTO_TOOL_CHOICE: "{f} dropped: qmgui writes it with the tool-call parser",
}
_VISIBLE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _flag_head(token: str) -> str | None:
    if not token.startswith("-") or len(token) < 2 or token[1].isdigit() or token[1] == ".":
        return None
    return token.split("=", 1)[0]


def _engine_of(words: list[str], notes: list[str]) -> tuple[str, list[str]]:
    """The engine kind and the words after the executable (and `serve`)."""
    if not words:
        raise CommandError("the command is empty: paste a llama-server or vllm serve command")
    first = words[0]
    if first.startswith("-"):
        return "llama", words  # only the flags were pasted
    name = os.path.basename(first.replace("\\", "/")).lower()
    rest = words[1:]
    if name.startswith("python"):
        if len(rest) >= 2 and rest[0] == "-m" and rest[1].startswith("vllm"):
            rest = rest[2:]
            return "vllm", rest[1:] if rest[:1] == ["serve"] else rest
        if len(rest) >= 2 and rest[0] == "-m" and "llama" in rest[1]:
            return "llama", rest[2:]
        raise CommandError(f"{first}: not a llama-server or vllm command")
    if "vllm" in name:
        return "vllm", rest[1:] if rest[:1] == ["serve"] else rest
    if "llama" not in name and "server" not in name:
        notes.append(f"{first} is read as a llama-server")
    return "llama", rest


def command_words(command: str | Sequence[str]) -> list[str]:
    """The words of a command line (line continuations joined), or of an argv as given."""
    if not isinstance(command, str):
        return list(command)
    text = re.sub(r"[\\`]\r?\n", " ", command)  # bash and PowerShell line continuations
    try:
        return split_args(text, what="the command")
    except EmitError as e:
        raise CommandError(str(e)) from None


def _environment(words: list[str], notes: list[str]) -> list[int] | None:
    """Take the `NAME=value` prefixes off `words`: a GPU visibility variable is the devices."""
    devices: list[int] | None = None
    while words and _ENV.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        if name not in _VISIBLE:
            notes.append(f"environment {name} dropped: set it where qmgui runs")
            continue
        try:
            devices = _devices(name, value)
        except CommandError:
            notes.append(f"{name}={value} dropped: not a list of GPU numbers")
    return devices


@dataclass
class _Reader:
    """One pass over the words after the executable."""

    engine: str
    rest: list[str]
    known_flags: frozenset[str] | None
    valueless: frozenset[str]
    aliases: dict[str, str] = field(default_factory=dict)
    i: int = 0
    model: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mapped: list[str] = field(default_factory=list)

    def run(self) -> None:
        if self.engine == "vllm" and self.rest and _flag_head(self.rest[0]) is None:
            self.model = self.rest[0]
            self.i = 1
        while self.i < len(self.rest):
            token = self.rest[self.i]
            head = _flag_head(token)
            if head is None:
                self._word(token)
            else:
                self._flag(token, head, token.split("=", 1)[1] if "=" in token else None)
            self.i += 1

    def _next_word(self) -> str | None:
        j = self.i + 1
        return self.rest[j] if j < len(self.rest) and _flag_head(self.rest[j]) is None else None

    def _value(self, flag: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        nxt = self._next_word()
        if nxt is None:
            raise CommandError(f"{flag} needs a value: nothing follows it")
        self.i += 1
        return nxt

    def _word(self, token: str) -> None:
        if self.engine == "llama" and self.model is None and token.lower().endswith(".gguf"):
            self.model = token
            self.notes.append(f"{token}: read as the model (llama-server takes it with -m)")
            return
        self.extra.append(token)
        self.notes.append(f"{token!r} follows no flag that takes it; kept as an argument")

    def _flag(self, token: str, head: str, inline: str | None) -> None:
        llama = self.engine == "llama"
        key = head if llama or not head.startswith("--") else head.replace("_", "-")
        if llama:
            key = self.aliases.get(key, key)
        table = _LLAMA if llama else _VLLM
        if key in table:
            self._mapped(head, inline, *table[key])
        elif llama and key in _LLAMA_SWITCHES:
            self.values[_LLAMA_SWITCHES[key]] = True
            self.mapped.append(head)
        elif llama and key in (*_FLASH, *_NO_FLASH):
            self._flash(head, inline, off=key in _NO_FLASH)
        elif key in (_OWN_VALUE if llama else _VLLM_OWN_VALUE):
            message = (_OWN_VALUE if llama else _VLLM_OWN_VALUE)[key]
            self.notes.append(message.format(f=head, v=self._value(head, inline)))
        elif key in (_OWN_SWITCH if llama else _VLLM_OWN_SWITCH):
            self.notes.append((_OWN_SWITCH if llama else _VLLM_OWN_SWITCH)[key].format(f=head))
        else:
            self._kept(token, head, inline)

    def _mapped(self, head: str, inline: str | None, name: str, parse: Parse) -> None:
        raw = self._value(head, inline)
        value = parse(head, raw)
        if name == "model":
            self.model = value
        elif value is None:
            self.notes.append(f"{head} {raw} dropped: it is the engine's default")
        else:
            self.values[name] = value
            self.mapped.append(f"{head} {raw}")

    def _flash(self, head: str, inline: str | None, *, off: bool) -> None:
        nxt = self._next_word() if inline is None else None
        if off:
            value = "off"
        elif inline is not None:
            value = _flash(head, inline)
        elif nxt is not None and nxt.lower() in ({"auto"} | TRUTHY | FALSY):
            value = _flash(head, nxt)
            self.i += 1
        else:
            value = "on"  # builds before -fa on|off|auto: a bare switch
        self.values["flash_attn"] = value
        self.mapped.append(head if off else f"{head} {value}")

    def _kept(self, token: str, head: str, inline: str | None) -> None:
        self.extra.append(token)
        known = self.known_flags
        if known is not None and head not in known:
            self.notes.append(f"{head} is not in this build's --help; kept anyway")
        takes_value = head not in self.valueless and (known is None or head in known)
        nxt = self._next_word() if inline is None and takes_value else None
        if nxt is not None and not (self.engine == "llama" and nxt.lower().endswith(".gguf")):
            self.i += 1
            self.extra.append(nxt)


def probe_aliases(groups: Iterable[Sequence[str]]) -> dict[str, str]:
    """Spellings a build's `--help` lists beside one qmgui reads (each group: the spellings of
    one option), mapped to that one: what the build calls `-c` is read as `-c`."""
    known = {*_LLAMA, *_LLAMA_SWITCHES, *_FLASH, *_NO_FLASH, *_OWN_VALUE, *_OWN_SWITCH}
    out: dict[str, str] = {}
    for spellings in groups:
        canon = next((sp for sp in spellings if sp in known), None)
        if canon is not None:
            out.update({sp: canon for sp in spellings if sp not in known})
    return out


def parse_command(
    command: str | Sequence[str],
    *,
    known_flags: frozenset[str] | None = None,
    valueless: frozenset[str] = frozenset(),
    aliases: Mapping[str, str] | None = None,
) -> ParsedCommand:
    """Read a llama-server (or `vllm serve`) command line into profile values.

    `command` is a shell line (quotes, `\\` line continuations and `NAME=value` environment
    prefixes read as bash does, backslashes otherwise kept for Windows paths) or an argv.
    `known_flags`/`valueless`: what the target build's `--help` lists, when probed; a kept
    flag it does not list gets a note. `aliases`: more spellings of the flags qmgui reads
    (`probe_aliases` of the build's option groups). Raises CommandError with a sentence for an empty
    command, an unclosed quote, a known flag without its value or with a value it refuses."""
    words = command_words(command)
    notes: list[str] = []
    env_devices = _environment(words, notes)
    engine, rest = _engine_of(words, notes)
    reader = _Reader(engine, rest, known_flags, valueless, aliases=dict(aliases or {}), notes=notes)
    reader.run()
    values = reader.values
    if env_devices is not None and "devices" not in values:
        values["devices"] = env_devices
        reader.mapped.append("visible devices " + ",".join(map(str, env_devices)))
    if values.get("cpu_moe"):
        values.pop("n_cpu_moe", None)
    return ParsedCommand(
        engine=engine,
        model=reader.model,
        values=values,
        extra_args=tuple(reader.extra),
        notes=tuple(reader.notes),
        mapped=tuple(reader.mapped),
    )
