"""Roles: one llama-server per job of a local AI stack (chat, embed, rerank, vision), planned
together on the GPUs by `core.placement`, each with the launch its job needs.

`qmgui place --role ROLE=MODEL[:KEY=VALUE,...]` reads a `RoleSpec`; `role_launch` turns it and
the model's metadata into the settings, context rule, slot ceiling and extra engine arguments
of each instance; `role_stages` makes the placement requests, replicas included; `shortfalls`
says where chat ended up below what was asked. The rules, and why:

- Order: the search roles (embed, rerank) are sized first, then vision, then chat against what
  is left (`placement.place_stages`), so a large chat model never starves retrieval.
- Slots: chat is memory-aware up to 4 slots (`CHAT_SLOTS`), each keeping the whole window: its
  context grows first with one slot, then the slots grow while the cards hold that many full
  windows (bisection, `Request.max_slots`). Vision (concurrent pages) and an LLM reranker
  (concurrent candidates) grow the same way up to their own ceilings, but only while the
  server's whole footprint stays within half of each of its cards (`SLOT_SHARE`,
  `Request.slot_share`): they share the card by design, with chat placed after them, and a
  card that cannot give them that half leaves them one slot. `slots=` asks for that many
  against all the room left. Embed and cross-encoder
  rerank serve one slot: the card is busy with one pooled batch, more slots only fragment the
  cache; clients batch on the request side.
- Embed: `--embedding` with `--pooling` from the model (`<arch>.pooling_type`; `last` for a
  decoder-only embedder, i.e. a causal model without a pooling key), and batch and micro-batch
  equal to its context, so a whole chunk is accepted in one pass (llama-server refuses a pooled
  input longer than the micro-batch). Its context is the trained one, at most `EMBED_CTX`.
- Rerank: a cross-encoder (rank pooling, `--reranking`) like embed; a causal LM without a rank
  head is served as an LLM reranker (generative: no `--reranking`, flash attention, slots).
- Vision needs its projector (`--mmproj`); without one the role is skipped with a warning.
- Chat's window: placement guarantees chat `CHAT_MIN_CTX` tokens (a grounded answer: a system
  prompt, a retrieved source, the question and room for the answer), so a chat model whose
  cards hold its weights but not that window is not served, with the numbers
  (`grounded_refusal`): below it an agent's prompt is cut or refused on every turn. A `ctx=`
  below it is the user's choice and is the minimum instead. Before refusing, a chat whose
  weights alone fit a card buys that window by leaving layers (for MoE, experts first) in
  system memory (`trade_layers`: the most GPU layers that hold it, placement's offload
  search): a slower chat beats none. Not when `ngl=` was given (the user's choice), and never
  for a speculator head (`NON_TRADABLE`): their estimate falls further behind the longer the
  window, so a search that maximises the window maximises the error.
- Flash attention: off for embed and cross-encoder rerank (one pooled batch); for the others
  `on` where the backend's flash attention is complete (CUDA, ROCm, Metal, the CPU) and the
  engine's `auto` elsewhere (Vulkan, SYCL), which enables it only where it works. A quantized V
  cache needs flash attention, so chat's V cache follows `ctv` only where it is certainly on.
- Remote: `ROLE=remote:ENDPOINT` (a URL, or an SDK's model name) routes the role to a service
  elsewhere: it gets no local server, takes no memory and is left out of placement and the
  exports; only `name=` applies to it.
- Replicas: `replicas=N` instances of a role on distinct cards (`Request.apart`); `auto` is
  one per card. A card left idle widens the contexts of the models that could use it
  (`placement.place_stages(widen_idle=True)`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from qmgui.core.errors import QmguiError
from qmgui.core.export import unique_name
from qmgui.core.launch import CACHE_TYPES, LaunchSettings
from qmgui.core.meta import ModelClass, ModelMeta, Pooling
from qmgui.core.placement import (
    DEFAULT_MIN_CONTEXT,
    AutoContext,
    Nearest,
    Placed,
    Request,
    Unplaced,
)

CHAT_SLOTS = 4  # chat's slot ceiling: concurrent agents, each with the whole window
AUX_SLOTS = 1  # embed and cross-encoder rerank
VISION_SLOTS = 2  # concurrent pages
LLM_RERANK_SLOTS = 4  # concurrent candidates
CHAT_CTX = 32768  # chat's per-slot target: a working window for agents (ctx= asks for another)
VISION_CTX = 8192  # a page or two of image tokens and the answer
LLM_RERANK_CTX = 4096  # a query and one candidate
EMBED_CTX = 4096  # embed/rerank: the trained context, at most this (batch = context)
# vision and an LLM reranker grow their slots only within this share of each of their cards
SLOT_SHARE = 0.5
# the window chat is guaranteed (unless ctx= asks for less): a grounded answer's system
# prompt, one retrieved source, the question and room for the answer (lilbee's
# _MIN_USABLE_CHAT_CTX, the same number)
CHAT_MIN_CTX = 8192
MAX_REPLICAS = 64
# architectures whose chat never trades layers for context: llama.cpp's EAGLE3 speculator
# head scores every position it proposes, so its compute buffer grows with the window while
# estimates price it by the batch (lilbee measured 59648 tokens granted against 1413 MiB)
NON_TRADABLE = frozenset({"eagle3"})
_DEFAULT_TRAINED = 4096
# backends whose flash attention is complete enough to ask for outright; others get "auto"
TRUSTED_FLASH = frozenset({"cuda", "rocm", "hip", "metal", "cpu"})
_FULL_KV = frozenset({"f32", "f16", "bf16"})
_KEY = re.compile(r"[a-z_]+")


class Role(str, enum.Enum):
    CHAT = "chat"
    EMBED = "embed"
    RERANK = "rerank"
    VISION = "vision"


# placement order: the search roles first, then vision, then chat against what is left
STAGES: tuple[tuple[Role, ...], ...] = ((Role.EMBED, Role.RERANK), (Role.VISION,), (Role.CHAT,))


class RerankMode(str, enum.Enum):
    CROSS = "cross"  # a cross-encoder: rank pooling, --reranking
    LLM = "llm"  # a generative model asked per candidate


REMOTE = "remote:"  # ROLE=remote:ENDPOINT: the role is served elsewhere, no local server


class RoleError(QmguiError):
    """A role on the command line cannot be read, or its model cannot take the role."""


@dataclass(frozen=True)
class RoleSpec:
    """`ROLE=MODEL[:KEY=VALUE,...]`: the model for a role and what was asked of it."""

    role: Role
    model: str
    replicas: int | None = 1  # None: auto, one per card
    ctx: int | None = None  # tokens per slot; None: the role's default
    slots: int | None = None  # None: the role's default
    name: str | None = None
    mode: RerankMode | None = None  # rerank only; None: from the model
    fa: str | None = None  # flash attention; None: per role and backend
    ctk: str | None = None
    ctv: str | None = None
    ngl: int | None = None

    @property
    def remote(self) -> str | None:
        """The endpoint of a role served elsewhere (`remote:ENDPOINT`), None for a local one."""
        return self.model[len(REMOTE) :] if self.model.startswith(REMOTE) else None


def _positive(key: str, value: str, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise RoleError(f"{key}={value}: not a whole number") from None
    if not 1 <= n <= hi:
        raise RoleError(f"{key}={value}: give 1 to {hi:,}")
    return n


def _choice(key: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise RoleError(f"{key}={value}: one of {', '.join(choices)}")
    return value


def _options(tail: str) -> list[tuple[str, str]] | None:
    """`k=v,k=v` as pairs, or None when `tail` does not read as options (part of a path)."""
    pairs = []
    for piece in tail.split(","):
        key, eq, value = piece.partition("=")
        key = key.strip()
        if not eq or not _KEY.fullmatch(key):
            return None
        pairs.append((key, value.strip()))
    return pairs


def parse_role(text: str) -> RoleSpec:
    """`ROLE=MODEL[:KEY=VALUE,...]`; RoleError naming the bad part. The options are what
    follows the last `:` when it reads as KEY=VALUE pairs (a Windows path keeps its `C:`)."""
    head, eq, rest = text.partition("=")
    roles = ", ".join(r.value for r in Role)
    if not eq:
        raise RoleError(f"{text!r}: write a role as ROLE=MODEL (ROLE: {roles})")
    try:
        role = Role(head.strip().lower())
    except ValueError:
        raise RoleError(f"{text!r}: unknown role {head.strip()!r} (one of {roles})") from None
    model, sep, tail = rest.rpartition(":")
    pairs = _options(tail) if sep else None
    if pairs is None:
        model, pairs = rest, []
    if not model.strip():
        raise RoleError(f"{text!r}: the {role.value} role names no model")
    spec = RoleSpec(role, model)
    if spec.remote is not None:
        if not spec.remote.strip():
            raise RoleError(f"{text!r}: write a remote role as {role.value}=remote:ENDPOINT")
        if any(key != "name" for key, _ in pairs):
            raise RoleError(f"{text!r}: a remote role runs no local server: only name= applies")
    for key, value in pairs:
        if not value:
            raise RoleError(f"{text!r}: {key}= has no value")
        try:
            spec = _apply(spec, key, value)
        except RoleError as e:
            raise RoleError(f"{text!r}: {e}") from None
    return spec


def _ngl(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise RoleError(f"{key}={value}: not a whole number") from None


def _replicas(key: str, value: str) -> int | None:
    return None if value.lower() == "auto" else _positive(key, value, MAX_REPLICAS)


# KEY=VALUE: the RoleSpec field each key sets and how its value is read
_READERS = {
    "replicas": ("replicas", _replicas),
    "ctx": ("ctx", lambda k, v: _positive(k, v, 1 << 24)),
    "c": ("ctx", lambda k, v: _positive(k, v, 1 << 24)),
    "slots": ("slots", lambda k, v: _positive(k, v, 256)),
    "np": ("slots", lambda k, v: _positive(k, v, 256)),
    "name": ("name", lambda k, v: v),
    "mode": ("mode", lambda k, v: RerankMode(_choice(k, v, [m.value for m in RerankMode]))),
    "fa": ("fa", lambda k, v: _choice(k, v, ("on", "off", "auto"))),
    "ctk": ("ctk", lambda k, v: _choice(k, v, CACHE_TYPES)),
    "ctv": ("ctv", lambda k, v: _choice(k, v, CACHE_TYPES)),
    "ngl": ("ngl", _ngl),
}


def _apply(spec: RoleSpec, key: str, value: str) -> RoleSpec:
    if key not in _READERS:
        known = "replicas, ctx, slots, name, mode, fa, ctk, ctv, ngl"
        raise RoleError(f"unknown key {key!r} (one of {known})")
    if key == "mode" and spec.role is not Role.RERANK:
        raise RoleError("mode= is for the rerank role (cross or llm)")
    field, read = _READERS[key]
    return replace(spec, **{field: read(key, value)})


# --- the launch of one role ---------------------------------------------------------------------


@dataclass(frozen=True)
class RoleLaunch:
    """What a role makes of one model: the metadata as the engine will serve it, the settings
    placement starts from, the context rule and slot ceiling, the extra engine arguments."""

    role: Role
    mode: RerankMode | None
    meta: ModelMeta
    settings: LaunchSettings
    context: AutoContext | None  # None: settings.ctx_size is fixed
    max_slots: int | None  # the slots grow toward this (memory-aware roles)
    ctx_asked: int  # tokens per slot asked for
    slots_asked: int
    args: tuple[str, ...] = ()  # extra engine arguments (--pooling)
    notes: tuple[str, ...] = ()
    slot_share: float | None = None  # the slots grow within this share of each card


def rerank_mode(meta: ModelMeta, asked: RerankMode | None = None) -> RerankMode:
    """A rank head (`pooling_type` rank) is a cross-encoder; a causal model without one is an
    LLM reranker; anything else cannot rerank."""
    if asked is RerankMode.CROSS and meta.pooling is not Pooling.RANK:
        raise RoleError(f"{meta.name} has no rank head (pooling_type rank): not a cross-encoder")
    if asked is not None:
        return asked
    if meta.pooling is Pooling.RANK:
        return RerankMode.CROSS
    if meta.causal and meta.pooling is Pooling.NONE and meta.model_class is ModelClass.LLM:
        return RerankMode.LLM
    raise RoleError(
        f"{meta.name} is neither a cross-encoder (rank pooling) nor a causal LM to rerank with"
    )


def embed_pooling(meta: ModelMeta) -> Pooling:
    """The pooling an embed server runs with: the model's own (`<arch>.pooling_type`), `last`
    for a decoder-only model without one (the last token sees the whole input), `mean` for an
    encoder without one."""
    if meta.pooling is Pooling.RANK:
        raise RoleError(f"{meta.name} is a reranker (rank pooling): give it the rerank role")
    if meta.pooling is not Pooling.NONE:
        return meta.pooling
    return Pooling.LAST if meta.causal else Pooling.MEAN


def flash_for(role: Role, mode: RerankMode | None, backends: Sequence[str]) -> str:
    """`-fa` for a role on these backends (none: the CPU)."""
    if role is Role.EMBED or (role is Role.RERANK and mode is RerankMode.CROSS):
        return "off"
    trusted = all(b.lower() in TRUSTED_FLASH for b in backends or ("cpu",))
    return "on" if trusted else "auto"


_NOT_SERVED = (ModelClass.IMAGE, ModelClass.TTS, ModelClass.ASR, ModelClass.PROJECTOR)


def role_launch(
    spec: RoleSpec,
    meta: ModelMeta,
    *,
    backends: Sequence[str] = (),
    base: LaunchSettings = LaunchSettings(),  # noqa: B008 - frozen, shared safely
) -> RoleLaunch:
    """The launch `spec`'s role makes of `meta` on cards of these `backends` (none: the
    CPU); `base` holds the command line's every-model settings (chat's KV cache types).
    RoleError when the model cannot take the role."""
    role = spec.role
    if meta.model_class in _NOT_SERVED:
        raise RoleError(
            f"{meta.name} is a {meta.model_class.value} model; llama-server cannot serve it "
            f"as {role.value}"
        )
    trained = meta.context_length or _DEFAULT_TRAINED
    mode = rerank_mode(meta, spec.mode) if role is Role.RERANK else None
    fa = spec.fa or flash_for(role, mode, backends)
    ngl = spec.ngl if spec.ngl is not None else base.n_gpu_layers
    common = LaunchSettings(flash_attn=fa, n_gpu_layers=ngl, mmap=base.mmap)
    if role is Role.EMBED or mode is RerankMode.CROSS:
        return _pooled(spec, meta, mode, common, trained)
    if role is Role.CHAT and meta.model_class in (ModelClass.EMBEDDING, ModelClass.RERANK):
        raise RoleError(f"{meta.name} is an {meta.model_class.value} model: it cannot chat")
    served = replace(meta, model_class=ModelClass.LLM, pooling=Pooling.NONE)
    notes: list[str] = []
    ctk, ctv = "f16", "f16"
    if role is Role.CHAT:
        ctk = spec.ctk or base.cache_type_k
        ctv = spec.ctv or base.cache_type_v
        if ctv not in _FULL_KV and fa != "on":
            notes.append(
                f"the V cache stays f16: a {ctv} V cache needs flash attention, which is {fa} here"
            )
            ctv = "f16"
    default_ctx, ceiling = {
        Role.CHAT: (CHAT_CTX, CHAT_SLOTS),
        Role.VISION: (VISION_CTX, VISION_SLOTS),
        Role.RERANK: (LLM_RERANK_CTX, LLM_RERANK_SLOTS),
    }[role]
    target = min(spec.ctx or default_ctx, trained)
    slots = spec.slots or ceiling
    settings = replace(common, parallel=1, cache_type_k=ctk, cache_type_v=ctv)
    floor = CHAT_MIN_CTX if role is Role.CHAT else DEFAULT_MIN_CONTEXT
    context = AutoContext(target=target, minimum=min(floor, target))
    share = SLOT_SHARE if role is not Role.CHAT and spec.slots is None else None
    return RoleLaunch(
        role, mode, served, settings, context, slots, target, slots, notes=tuple(notes),
        slot_share=share,
    )  # fmt: skip


def _pooled(
    spec: RoleSpec, meta: ModelMeta, mode: RerankMode | None, common: LaunchSettings, trained: int
) -> RoleLaunch:
    """Embed or cross-encoder rerank: one slot (unless asked), f16 KV, batch = context."""
    if mode is RerankMode.CROSS:
        served = replace(meta, model_class=ModelClass.RERANK)
        args: tuple[str, ...] = ()
    else:
        pooling = embed_pooling(meta)
        served = replace(meta, model_class=ModelClass.EMBEDDING, pooling=pooling)
        args = ("--pooling", pooling.value)
    ctx = min(spec.ctx or EMBED_CTX, trained)
    slots = spec.slots or AUX_SLOTS
    settings = replace(
        common, parallel=slots, ctx_size=ctx * slots, batch_size=ctx, ubatch_size=ctx
    )
    return RoleLaunch(spec.role, mode, served, settings, None, None, ctx, slots, args)


# --- instances and placement requests -----------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    """One engine of the role set: a replica of a role's model."""

    name: str
    spec: RoleSpec
    replica: int  # 0, 1, ... among the role's replicas
    replicas: int
    launch: RoleLaunch


def replica_count(spec: RoleSpec, n_gpus: int) -> int:
    """`replicas=N`, or one per card for auto (one on a machine without a GPU)."""
    return spec.replicas if spec.replicas is not None else max(1, n_gpus)


def role_instances(
    launches: Sequence[tuple[RoleSpec, RoleLaunch]], n_gpus: int, taken: set[str] | None = None
) -> list[Instance]:
    """Each role's replicas as named instances (`NAME` for one, `NAME-1`, `NAME-2`... for
    several; names made unique against `taken`, which they join)."""
    taken = set() if taken is None else taken
    out: list[Instance] = []
    for spec, launch in launches:
        n = replica_count(spec, n_gpus)
        base = spec.name or spec.role.value
        for i in range(n):
            name = unique_name(base if n == 1 else f"{base}-{i + 1}", taken)
            out.append(Instance(name, spec, i, n, launch))
    return out


def role_stages(instances: Sequence[Instance]) -> list[list[Request]]:
    """The placement requests in `STAGES` order; a role's replicas never share a card."""
    groups: dict[int, str] = {}
    stages: list[list[Request]] = [[] for _ in STAGES]
    for inst in instances:
        key = groups.setdefault(id(inst.spec), f"{inst.spec.role.value}#{len(groups)}")
        stage = next(i for i, roles in enumerate(STAGES) if inst.spec.role in roles)
        stages[stage].append(
            Request(
                inst.name,
                inst.launch.meta,
                inst.launch.settings,
                context=inst.launch.context,
                apart=key if inst.replicas > 1 else None,
                max_slots=inst.launch.max_slots,
                slot_share=inst.launch.slot_share,
            )
        )
    return [s for s in stages if s]


def shortfalls(inst: Instance, placed: Placed) -> list[str]:
    """Chat served below the slots or the context per slot asked for: a sentence saying so,
    since agents beyond the slots wait and look stalled."""
    if inst.spec.role is not Role.CHAT:
        return []
    r = placed.footprint.settings
    asked_ctx, asked_slots = inst.launch.ctx_asked, inst.launch.slots_asked
    if r.n_ctx_seq >= asked_ctx and r.n_seq >= asked_slots:
        return []
    return [
        f"{inst.name} downsized: {r.n_seq} slot(s) x {r.n_ctx_seq} tokens (asked: up to "
        f"{asked_slots} x {asked_ctx}); requests beyond {r.n_seq} at once wait for a free "
        "slot. A smaller model or a lower ctx= frees room for more slots"
    ]


def grounded_refusal(inst: Instance, unplaced: Unplaced) -> Unplaced:
    """A chat that placement could not give its minimum window (`CHAT_MIN_CTX`, or the `ctx=`
    asked below it), where a shorter window would fit: the reason says so with the numbers.
    Anything else is returned as it is."""
    context = inst.launch.context
    if inst.spec.role is not Role.CHAT or context is None:
        return unplaced
    shorter = next((n for n in unplaced.nearest if n.kind is Nearest.CONTEXT), None)
    fits = shorter.settings.ctx_size if shorter is not None else None
    if fits is None or fits >= context.minimum:
        return unplaced
    reason = (
        f"{inst.launch.meta.name} loads, but the memory left after its weights holds only a "
        f"{fits}-token context, and a grounded answer needs about {context.minimum} tokens "
        "(a system prompt, a retrieved source, the question and room for the answer), so it "
        "is not served. Use a smaller model or quant, or ask for less with ctx="
    )
    return replace(unplaced, reason=reason)


def trade_layers(
    inst: Instance, unplaced: Unplaced, free: Mapping[str, int | None]
) -> tuple[LaunchSettings, str] | None:
    """The settings with which a chat that placement could not give its minimum window holds
    it on one card by leaving layers (MoE: experts first) in system memory, from placement's
    offload suggestion, and a note saying so. None where it may not trade: another role,
    `ngl=` given, a speculator head (`NON_TRADABLE`), no offload that holds the window, or
    weights that alone exceed the card's `free` memory (past that the model would answer from
    host memory: the trade would buy a window for a model too slow to use)."""
    context = inst.launch.context
    if inst.spec.role is not Role.CHAT or inst.spec.ngl is not None or context is None:
        return None
    meta = inst.launch.meta
    if meta.architecture in NON_TRADABLE:
        return None
    offload = next((n for n in unplaced.nearest if n.kind is Nearest.OFFLOAD), None)
    if offload is None or len(offload.devices) != 1:
        return None
    room = free.get(offload.devices[0])
    if room is None or meta.weight_bytes > room:
        return None
    n = offload.settings
    settings = replace(inst.launch.settings, n_gpu_layers=n.n_gpu_layers, n_cpu_moe=n.n_cpu_moe)
    moe = f", experts of {n.n_cpu_moe} layers on the CPU" if n.n_cpu_moe else ""
    note = (
        f"{n.n_gpu_layers} of {meta.n_layer + 1} layers on the GPU{moe}, the rest in system "
        f"memory, to hold the {context.minimum}-token window a grounded answer needs (slower; "
        "ngl= keeps them all and refuses instead)"
    )
    return settings, note
