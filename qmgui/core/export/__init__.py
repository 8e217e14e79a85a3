"""Exports: plans rendered as files other tools run (llama-swap, scripts, llama.cpp presets).

Each exporter is pure: it takes emitted `Command`s (or the plan behind them) and returns an
`Export`, the file's text plus warnings in words. Writing the file is the caller's job.

Names are data in every file written here: no byte of a model name, path, node address or
extra argument can change the file's structure (docs/architecture.md, "Exports"):
- the port: a command is emitted with `port=PORT_MARK`, a word no argument can hold (argv words
  never contain NUL), so a file named `${PORT}.gguf` stays a file name; commands emitted with
  `PORT_MACRO` still work, and then every `${PORT}` is the port, a literal one included;
- secrets: the value of `--api-key` and `--hf-token` is never written down; an export reads it
  from an environment variable (`SECRET_ENV`) the user sets, and says which;
- comments: written with `textsafe.printable`, one line each, no control character.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from qmgui.core.emit import PORT_MACRO, flag_head
from qmgui.core.errors import QmguiError
from qmgui.core.footprint import CPU, Footprint
from qmgui.core.meta import ModelMeta
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.core.vllm import VllmPlan

# what the exporters read as the port when a command holds it (`emit_*(port=PORT_MARK)`)
PORT_MARK = "\0qmgui-port\0"

# flags whose value is a secret: an export passes it from this environment variable instead
SECRET_ENV = {"--api-key": "QMGUI_API_KEY", "--hf-token": "HF_TOKEN", "-hft": "HF_TOKEN"}


class ExportError(QmguiError):
    """The inputs of an export contradict each other (a group naming a model not exported)."""


@dataclass(frozen=True)
class Export:
    """A rendered file and what the user should know about it."""

    text: str
    warnings: tuple[str, ...] = ()


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name-2`, `name-3`… when taken; the result is added to `taken`."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


def footprint_comment(fp: Footprint) -> str:
    """One line for a config comment: the planned memory per GPU and in host memory; a figure
    that holds an upper bound (a buffer qmgui cannot model, `core.bounds`) reads "≤ …", and the
    bound is named after it."""
    bounded = {b.device for b in fp.bounds}
    gpus = [
        f"{d.name} {'≤ ' if d.name in bounded else ''}{format_bytes(d.total)}"
        for d in fp.devices
        if d.name != CPU
    ]
    r = fp.settings
    bounds = "".join(
        f"; {b.part} on {b.device} is an upper bound ({format_bytes(b.bytes)})" for b in fp.bounds
    )
    return (
        f"estimated VRAM: {', '.join(gpus) if gpus else 'none (CPU only)'}; host "
        f"{format_bytes(fp.host.total)} (context {r.n_ctx}, {r.n_seq} slots, KV "
        f"{r.cache_type_k}/{r.cache_type_v}, {fp.n_gpu_layers} GPU layers){bounds}"
    )


def vllm_comment(plan: VllmPlan) -> str:
    """One line for a config comment: what vLLM takes on each GPU (its share, up front)."""
    n = plan.tensor_parallel * plan.pipeline_parallel
    gpus = f" on each of {n} GPUs" if n > 1 else ""
    return (
        f"estimated VRAM: {format_bytes(plan.charge_bytes)}{gpus} (vLLM, max-model-len "
        f"{plan.max_model_len}, gpu-memory-utilization {plan.gpu_memory_utilization:g})"
    )


def vllm_reasons(plan: VllmPlan, meta: ModelMeta | None = None) -> list[str]:
    """The reasons behind a vLLM launch, a line each, for the comment above its entry
    (reference 000): what the model is (architecture, weights, format), why the context and
    the utilization are what they are, the KV pool, the tool-call parser (and, without one,
    that vLLM refuses requests carrying tools), and the plan's other notes."""
    lines: list[str] = []
    if meta is not None:
        fmt = "GGUF" if meta.format == "gguf" else "safetensors (Hugging Face folder)"
        lines.append(
            f"model: {meta.architecture}, {format_bytes(meta.weight_bytes)} of weights, {fmt}"
        )
    if plan.kv_cache_memory_bytes is not None:
        lines.append(f"KV pool: {format_bytes(plan.kv_cache_memory_bytes)} pinned")
    else:
        lines.append("KV pool: not pinned, vLLM fills its share with KV blocks")
    lines += plan.notes
    if not plan.tool_calling:
        lines.append("no tool-call parser: vLLM answers requests that carry tools with an error")
    return lines


def comment_lines(text: str) -> list[str]:
    """`text` as comment lines for a file another program reads: one per line of `text`, each
    with its control characters written as visible escapes (`textsafe.printable`)."""
    return [printable(line) for line in text.split("\n")]


@dataclass(frozen=True)
class Port:
    """The port, in a word of an exported command."""


@dataclass(frozen=True)
class EnvRef:
    """A secret's value, read from the environment variable `name` when the file runs."""

    name: str


PORT = Port()
Part: TypeAlias = str | Port | EnvRef
Word: TypeAlias = tuple[Part, ...]


@dataclass(frozen=True)
class Words:
    """An argv as an exporter writes it: each word as literal text, the port and secrets."""

    words: tuple[Word, ...]
    secrets: dict[str, str]  # environment variable -> the flag it stands for

    def notes(self, where: str) -> list[str]:
        """One sentence per secret: which variable to set (`where`: "before running it")."""
        return [
            f"the value of {flag} is not written here: set {var} {where}"
            for var, flag in sorted(self.secrets.items())
        ]


def port_marker(argv: Sequence[str]) -> str:
    """The placeholder `argv` was emitted with: `PORT_MARK` when it holds it, else PORT_MACRO."""
    return PORT_MARK if any(PORT_MARK in a for a in argv) else PORT_MACRO


def takes_port(argv: Sequence[str]) -> bool:
    """Whether the command takes its port from the exporter."""
    mark = port_marker(argv)
    return any(mark in a for a in argv)


def _with_port(word: str, mark: str) -> Word:
    if mark not in word:
        return (word,)
    parts: list[Part] = []
    for i, piece in enumerate(word.split(mark)):
        if i:
            parts.append(PORT)
        if piece:
            parts.append(piece)
    return tuple(parts)


def export_words(argv: Sequence[str]) -> Words:
    """`argv` as an exporter writes it: the port placeholder as `PORT`, and the value of each
    secret flag (`SECRET_ENV`, as `--flag VALUE` or `--flag=VALUE`) as an `EnvRef`."""
    mark = port_marker(argv)
    words: list[Word] = []
    secrets: dict[str, str] = {}
    hide: str | None = None
    for i, a in enumerate(argv):
        if hide is not None:
            words.append((EnvRef(hide),))
            hide = None
            continue
        head = flag_head(a) if i else None
        var = SECRET_ENV.get(head) if head else None
        if var is not None and head is not None:
            secrets[var] = head
            if "=" in a:
                words.append((f"{head}=", EnvRef(var)))
            else:
                words.append((a,))
                hide = var
            continue
        words.append(_with_port(a, mark))
    return Words(tuple(words), secrets)


def literal_head(word: Word) -> str:
    """The literal text a word starts with ('' when it starts with the port or a secret)."""
    return word[0] if word and isinstance(word[0], str) else ""


def line_groups(words: Sequence[Word]) -> list[list[Word]]:
    """The words a line each: the executable, its first argument, then each flag with its
    values (the layout of the scripts and of llama-swap's `cmd`)."""
    lines: list[list[Word]] = []
    for i, word in enumerate(words):
        if i <= 1 or flag_head(literal_head(word)) is not None:
            lines.append([])
        lines[-1].append(word)
    return lines
