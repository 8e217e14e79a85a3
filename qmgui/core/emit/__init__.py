"""Emitters: from a plan to the argv (and environment) that one engine kind runs.

One module per engine kind (`llama`, `vllm`, `sd`, `whisper`, `custom`), each returning a frozen
`Command`: the argv as a tuple (never a shell string), the environment it needs on top of the
inherited one, and warnings in words. Everything here is pure: the build's capabilities arrive
as values (`supported_flags`, the flags its `--help` lists; None = assume it has every flag).

The pieces shared by the kinds live in this module:

- `Flag`: one engine option with its spellings (preferred first; a build may know only an
  older one), whether it takes a value, and the group of spellings that set the same thing
  (`-kvu` and `-no-kvu`), so a user's extra argument can replace the derived one.
- `place()`: picks the spelling the build knows, or leaves the flag out with a warning.
- `split_args()`: splits the user's extra arguments (shell-like quoting, backslashes kept
  literally so Windows paths survive).
- `merge_extra()`: the user's extra arguments go last and win: a derived flag of the same
  group is dropped, with a warning naming both.

Errors in the user's input (an unclosed quote, an unknown template placeholder) raise
`EmitError`, a `QmguiError` with a sentence the user can act on.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from qmgui.core.discovery import ModelEntry
from qmgui.core.errors import QmguiError
from qmgui.core.footprint import Gpu
from qmgui.core.meta import ModelClass
from qmgui.core.probe import ProbeResult

DEFAULT_HOST = "127.0.0.1"  # engines listen on loopback only; a proxy or the user opens them up
# stands for the port where a config fills it in (llama-swap's macro; scripts use a variable)
PORT_MACRO = "${PORT}"

# the values llama.cpp's argument parser reads as on / off (common/arg.cpp is_truthy/is_falsey)
TRUTHY = frozenset({"on", "enabled", "true", "1"})
FALSY = frozenset({"off", "disabled", "false", "0"})


class EmitError(QmguiError):
    """A command could not be written from the user's input (extra arguments, a template)."""


@dataclass(frozen=True)
class Command:
    """One engine launch: argv (executable first), extra environment, warnings.

    An empty argv means the engine cannot serve this model at all; the warnings say why."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "warnings", tuple(self.warnings))

    @property
    def runnable(self) -> bool:
        return bool(self.argv)

    def to_json(self) -> dict[str, object]:
        return {"argv": list(self.argv), "env": dict(self.env), "warnings": list(self.warnings)}


Spelling = tuple[str, ...]  # the tokens written before the value: ("-c",) or ("-lm", "none")


@dataclass(frozen=True)
class Flag:
    """An engine option: its spellings (preferred first), whether a value follows, and its
    group: every token that sets the same thing, used to let extra arguments replace it."""

    name: str  # the long name without dashes: the key in llama.cpp's preset files
    spellings: tuple[Spelling, ...]
    takes_value: bool = True
    group: str = ""  # defaults to `name`; `kv-unified` holds both -kvu and -no-kvu
    aliases: tuple[str, ...] = ()  # more tokens of the group (negations, old names)
    quiet: bool = False  # left out silently when the build lacks it (nothing depends on it)

    @property
    def key(self) -> str:
        return self.group or self.name

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(s[0] for s in self.spellings) | frozenset(self.aliases)


@dataclass(frozen=True)
class Option:
    """A derived flag and its value (None for a switch)."""

    flag: Flag
    value: str | None = None


@dataclass(frozen=True)
class Placed:
    """An option as written for one build: the spelling it knows, then the value."""

    flag: Flag
    tokens: tuple[str, ...]
    value: str | None  # the option's value as derived (None for a switch)


def _pick(flag: Flag, supported: frozenset[str] | None, *, prefer_long: bool) -> Spelling | None:
    known = [s for s in flag.spellings if supported is None or s[0] in supported]
    if prefer_long:
        known.sort(key=lambda s: not s[0].startswith("--"))  # stable: keeps the table order
    return known[0] if known else None


def place(
    options: Iterable[Option],
    *,
    supported: frozenset[str] | None,
    valueless: frozenset[str] = frozenset(),
    prefer_long: bool = False,
) -> tuple[list[Placed], list[str]]:
    """Write each option with a spelling the build knows; leave out (with a warning) those it
    does not. `valueless` names flags this build takes as plain switches although we give them a
    value (`-fa` before llama.cpp had `-fa on|off|auto`): on becomes the bare switch, off is
    left out (their default), anything else is left out with a warning."""
    placed: list[Placed] = []
    warnings: list[str] = []
    for opt in options:
        spelling = _pick(opt.flag, supported, prefer_long=prefer_long)
        shown = " ".join((*opt.flag.spellings[0], *([opt.value] if opt.value is not None else [])))
        if spelling is None:
            if not opt.flag.quiet:
                warnings.append(f"left out {shown}: this build does not know {_names(opt.flag)}")
            continue
        if opt.flag.takes_value and spelling[0] in valueless and opt.value is not None:
            value = opt.value.lower()
            if value in TRUTHY:
                placed.append(Placed(opt.flag, spelling, opt.value))
            elif value not in FALSY:
                warnings.append(
                    f"left out {shown}: this build takes {spelling[0]} as a plain switch "
                    f"(on or absent), so {opt.value!r} cannot be written; its default (off) applies"
                )
            continue
        tokens = (*spelling, opt.value) if opt.flag.takes_value and opt.value else spelling
        placed.append(Placed(opt.flag, tokens, opt.value))
    return placed, warnings


def _names(flag: Flag) -> str:
    return " or ".join(s[0] for s in flag.spellings)


def split_args(text: str, *, what: str = "the extra arguments") -> list[str]:
    """Split a user's argument string like a POSIX shell does, except that backslashes are kept
    as they are (so `C:\\models\\x.gguf` stays a path). Quote with '…' or "…" to keep spaces."""
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    lexer.escape = ""
    try:
        return list(lexer)
    except ValueError as e:
        raise EmitError(
            f"cannot split {what} {text!r}: {e.args[0].lower()}; close the quote or remove it"
        ) from None


def parse_extra_args(extra: str | Sequence[str]) -> tuple[str, ...]:
    """The user's extra arguments as tokens: a string is split with `split_args`; a sequence
    is taken as tokens already split (an argv fragment)."""
    if isinstance(extra, str):
        return tuple(split_args(extra))
    return tuple(extra)


def split_each(items: Iterable[str]) -> tuple[str, ...]:
    """Several argument strings (a model's stored extra arguments, repeated `--extra`), each
    split with `split_args`, as one token list."""
    return tuple(token for item in items for token in split_args(item))


def flag_head(token: str, *, normalize: Callable[[str], str] | None = None) -> str | None:
    """The flag a token names (`--ctx-size=8` -> `--ctx-size`), or None for a value."""
    if not token.startswith("-") or len(token) < 2 or token[1].isdigit() or token[1] == ".":
        return None  # a value such as -1 or -.5
    head = token.split("=", 1)[0]
    return normalize(head) if normalize else head


def merge_extra(
    placed: list[Placed],
    extra: Sequence[str],
    table: Iterable[Flag],
    *,
    normalize: Callable[[str], str] | None = None,
) -> tuple[list[Placed], set[str], list[str]]:
    """Drop the derived options that the user's extra arguments set again (theirs win, and a
    second copy in a command reads as a bug). Returns what is kept, the groups the extra
    arguments set, and a warning per dropped option."""
    groups_by_token: dict[str, str] = {}
    for flag in table:
        for token in flag.tokens:
            groups_by_token[normalize(token) if normalize else token] = flag.key
    named: dict[str, str] = {}  # group -> the user's token
    for token in extra:
        head = flag_head(token, normalize=normalize)
        if head is not None and head in groups_by_token:
            named.setdefault(groups_by_token[head], head)
    kept, warnings = [], []
    for p in placed:
        if p.flag.key in named:
            warnings.append(
                f"extra argument {named[p.flag.key]} replaces the derived {' '.join(p.tokens)}"
            )
        else:
            kept.append(p)
    return kept, set(named), warnings


def build(
    executable: str,
    *,
    leading: Sequence[str] = (),
    placed: Sequence[Placed] = (),
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    warnings: Sequence[str] = (),
) -> Command:
    """executable, leading words (`serve PATH`), the derived options, then the extra ones."""
    if not executable.strip():
        raise EmitError("no executable to run: set the engine's path in the backend registry")
    argv = [executable, *leading]
    for p in placed:
        argv += p.tokens
    argv += extra
    return Command(argv=tuple(argv), env=dict(env or {}), warnings=tuple(warnings))


def skipped(reason: str) -> Command:
    """No command: this engine cannot serve the model, and `reason` says why."""
    return Command(argv=(), warnings=(reason,))


def refuse(model: ModelEntry, serves: ModelClass, what: str) -> Command | None:
    """`skipped` for a model that could not be read or is not of the class this engine
    serves (`what` says what the engine does, e.g. "transcribes speech"); None when fine."""
    if model.error:
        return skipped(f"{model.name}: {model.error}")
    if model.model_class not in (None, serves):
        cls = model.model_class.value if model.model_class else "?"
        return skipped(f"{model.name}: {what}; this is a {cls} model")
    return None


# --- device pinning ------------------------------------------------------------------------------

# the GPU APIs a build can be compiled for, their llama.cpp device names and the variable that
# hides the other GPUs from the driver (docs/build.md and docs/multi-gpu.md of llama.cpp;
# GGML_VK_VISIBLE_DEVICES: ggml-vulkan.cpp, "emulate CUDA_VISIBLE_DEVICES")
DEVICE_PREFIX = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "sycl": "SYCL", "metal": "MTL"}
RPC_PREFIX = "RPC"  # ggml-rpc's device names (RPC0, RPC1… on recent builds)
NO_DEVICE = "none"  # llama-server's --device value for "offload nothing"
_API_OF_PREFIX = {prefix: api for api, prefix in DEVICE_PREFIX.items()}
# a device named as the engine's --list-devices names it: CUDA0, ROCm1, Vulkan2, SYCL0, MTL0
_ENGINE_NAME = re.compile(r"^(?P<prefix>CUDA|ROCm|Vulkan|SYCL|MTL)(?P<index>\d{1,4})$")
VISIBILITY_VAR = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "HIP_VISIBLE_DEVICES",
    "vulkan": "GGML_VK_VISIBLE_DEVICES",
}


@dataclass(frozen=True)
class DevicePin:
    """Run on these GPUs only: the API the build uses (a backend's variant) and the indices
    as that API numbers them; `rpc` adds remote devices (llama.cpp `rpc-server` endpoints,
    `host:port`), which llama.cpp numbers RPC0, RPC1… in `--rpc` order and lists first."""

    api: str  # cuda, rocm, vulkan, sycl, metal
    indices: tuple[int, ...]
    rpc: tuple[str, ...] = ()
    # no GPU at all (`--device none`): every GPU the engine offered was refused
    cpu_only: bool = False

    def __post_init__(self) -> None:
        if self.api not in DEVICE_PREFIX:
            raise EmitError(
                f"cannot pin GPUs of a {self.api!r} build; one of {', '.join(DEVICE_PREFIX)}"
            )
        if self.cpu_only:
            if self.indices or self.rpc:
                raise EmitError("a CPU-only pin names no devices")
            return
        if (not self.indices and not self.rpc) or any(i < 0 for i in self.indices):
            raise EmitError("a device pin needs one or more GPU indices (0, 1, …)")
        for endpoint in self.rpc:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit() or "," in endpoint:
                raise EmitError(f"not an rpc-server address: {endpoint!r} (give host:port)")

    @property
    def names(self) -> str:
        """llama.cpp's `--device` list: CUDA0,CUDA1 (RPC0,RPC1 first with `rpc`); `none`
        for a CPU-only pin."""
        if self.cpu_only:
            return NO_DEVICE
        remote = [f"{RPC_PREFIX}{i}" for i in range(len(self.rpc))]
        return ",".join([*remote, *(f"{DEVICE_PREFIX[self.api]}{i}" for i in self.indices)])

    @property
    def visible(self) -> str:
        return ",".join(str(i) for i in self.indices)

    def env(self) -> dict[str, str] | None:
        """The vendor's visibility variable, or None when the API has none we can set (or
        there are no local GPUs to show: an empty list hides them differently per API)."""
        var = VISIBILITY_VAR.get(self.api)
        if self.cpu_only:  # an empty list hides every GPU from the CUDA and HIP runtimes
            return {var: ""} if var and self.api in ("cuda", "rocm") else None
        return {var: self.visible} if var and self.indices else None

    @classmethod
    def none(cls, api: str | None) -> DevicePin:
        """Keep the engine off every GPU (`--device none`)."""
        return cls(api if api in DEVICE_PREFIX else "cuda", (), cpu_only=True)

    @classmethod
    def for_devices(
        cls, devices: Sequence[str], gpus: Sequence[Gpu], api: str | None
    ) -> DevicePin | None:
        """The pin for a placement's cards (`devices` by name, in the engine's order) out of
        the machine's `gpus`: remote ones by endpoint, local ones by their index among the
        local GPUs (how the API numbers them), or by the engine's own number where the GPUs
        carry the engine's names (`Vulkan2` is index 2 of the Vulkan API, whatever GPUs the
        plan left out before it). None for a CPU-only placement."""
        by_name = {g.name: g for g in gpus}
        local = [g.name for g in gpus if not g.remote]
        missing = [d for d in devices if d not in by_name]
        if missing:
            raise EmitError(f"no GPU named {', '.join(missing)} among those planned for")
        rpc = tuple(by_name[d].endpoint or "" for d in devices if by_name[d].remote)
        named = [d for d in devices if not by_name[d].remote]
        engine = [m for d in named if (m := _ENGINE_NAME.match(d))]
        apis = {m["prefix"] for m in engine}
        if named and len(engine) == len(named) and len(apis) == 1:
            api = _API_OF_PREFIX[apis.pop()]
            indices = tuple(int(m["index"]) for m in engine)
        else:
            indices = tuple(local.index(d) for d in named)
        if not rpc and not indices:
            return None
        return cls(api or "cuda", indices, rpc)


# --- what a probed build knows -------------------------------------------------------------------


def flags_from_probe(probe: ProbeResult) -> tuple[frozenset[str] | None, frozenset[str]]:
    """`(supported_flags, valueless_flags)` for the emitters from a build's probe: every
    spelling its `--help` lists, and those it lists without a value. A probe that read no
    options gives `(None, ∅)`: assume every flag rather than leave them all out."""
    if not probe.flag_groups:
        return None, frozenset()
    valueless = frozenset(
        s for g in probe.flag_groups if not g.removed and not g.takes_value for s in g.spellings
    )
    return probe.flags, valueless
