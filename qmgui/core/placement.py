"""Placement: which GPUs each of several models runs on, and with which launch settings.

Every card offers its available memory less the per-GPU reserve, less what already runs there
(`occupied`, e.g. engines started earlier) and less what the models placed before took: engines
on one card share its memory, so each is charged against the others. Host RAM is charged the
same way for the parts that stay on the CPU when a host budget is given.

The rules, in order, and why:
- Which models run: pinned ones first, then the smallest, each admitted only when everything
  admitted so far still packs. The most models run, and adding a card never takes a place
  from a model that had one (a larger model that fits only with the new card is admitted after
  the smaller ones, never in their stead). With splits this is a strong tendency, not a
  guarantee: split shapes change with the cards' room (see tests/core/test_placement.py).
- Where they run: pinned requests (a saved manual placement) on the cards and with the split
  the user chose. One that names a card this machine lacks, or no longer fits, falls back to
  automatic placement with a note: a layout saved on other hardware must not stop a model.
- Then one card each, largest first (memory at the context placement guarantees; ties by
  name), on the card left fullest (best fit): first-fit decreasing keeps the large gaps for the
  large models still to come.
- A tensor split only for models no single card holds with weights plus a usable context,
  after every single-card model (the smallest split first), so a split never takes the room a
  model that fits on one card needed; a split costs transfers between cards on every token.
  It takes the fewest cards, those with the most room, in proportion to their room
  (rebalanced when whole layers overfill a card), and lists the roomiest last because
  llama.cpp gives the output layer (often the largest tensor) to the last card of a split.
  Remote devices (`Gpu.endpoint`, llama.cpp's RPC) are listed first, as llama.cpp orders them.
- An automatic context (`AutoContext`) is placed at its minimum (4096 tokens by default: below
  that a chat model is placed but hardly usable) and grown toward its target only after every
  model is placed, in placement order, so one model's longer context never costs another its
  place.
- A machine without a GPU places every model in host memory (all layers on the CPU), charged
  against the host budget (`qmgui place` gives free RAM less an OS floor), so a laptop gets a
  placement too.
- A model that fits nowhere is a result (`Unplaced`) with the reason and the nearest settings
  that fit: a shorter context, a q8_0 KV cache where the engine accepts it for that model, or
  partial offload (`fit.offload_for_context`).
- Replicas: requests that share an `apart` key (the replicas of one role, `core.roles`) never
  share a card, so each replica has a card of its own to serve from.
- Slots (`Request.max_slots`): after the contexts have grown, a request's slots grow toward
  `max_slots` (bisection on its cards), each slot keeping the context reached with one, so a
  card serves as many full windows as it holds and no more. With `Request.slot_share` the
  model's whole footprint with its slots stays within that share of each of its cards (its
  memory less the reserve): a role that shares its card by design (vision, an LLM reranker)
  leaves the rest to the others; one slot is always kept.
- Idle cards (`widen_idle`): a card nothing runs on, once everything is placed, widens the
  context of a model still below its target: the model is split over its cards and the idle
  ones (roomiest first, the fewest that reach the target), when that reaches the target or
  gives it a quarter more context (`WIDEN_GAIN`; a split costs transfers on every token).
- Stages (`place_stages`): each stage is placed against what the earlier stages left, so the
  search roles are sized first and chat gets the rest (`core.roles`).

The estimator is injected (`estimate=`) so tests and what-if tools can size with anything that
maps (meta, settings, gpus) to a `Footprint`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from qmgui.core import footprint as _footprint
from qmgui.core.errors import SizingError
from qmgui.core.fit import (
    DEFAULT_GPU_RESERVE,
    Budget,
    largest,
    offload_for_context,
    split_warnings,
)
from qmgui.core.footprint import CPU, Footprint, Gpu
from qmgui.core.launch import CTX_PAD, LaunchSettings, pad
from qmgui.core.meta import ModelMeta
from qmgui.core.units import MIB, format_bytes

Estimator = Callable[[ModelMeta, LaunchSettings, Sequence[Gpu]], Footprint]

# The context placement guarantees an automatic request: a system prompt, a few turns and an
# answer. lilbee's fleet planner keeps a floor for the same reason (a big model single-carded
# into a few hundred tokens of KV is placed but useless).
DEFAULT_MIN_CONTEXT = 4096
# The trained context llama-server assumes when a GGUF does not say (launch.resolve).
_DEFAULT_TRAINED = 4096
# Tensor-split values are the cards' room in MiB: proportional, and readable in a command line.
_SPLIT_UNIT = MIB
# Rounds of split rebalancing: each moves whole layers off an overfilled card; two or three
# settle the small models tested, more rarely change anything.
_REBALANCE_ROUNDS = 4
# A card large enough for any model: sizes a request for the largest-first order.
_UNBOUNDED = 1 << 62
# An idle card widens a context only for at least this much more of it (or the target): a
# split costs transfers between the cards on every token, which a few more tokens do not buy.
WIDEN_GAIN = 1.25
# The KV cache type suggested when f16 does not fit: half the bytes, a small quality cost.
QUANT_KV = "q8_0"
_FULL_PRECISION_KV = frozenset({"f32", "f16", "bf16"})


class Nearest(str, enum.Enum):
    """What a suggestion for a model that does not fit changes."""

    CONTEXT = "context"  # a shorter context
    KV_CACHE = "kv_cache"  # a q8_0 KV cache
    OFFLOAD = "offload"  # some layers (or MoE experts) left on the CPU


@dataclass(frozen=True)
class AutoContext:
    """Choose the context: at least `minimum` tokens (what placement guarantees), grown toward
    `target` (None = the trained context; never past it) with the room left at the end."""

    target: int | None = None
    minimum: int = DEFAULT_MIN_CONTEXT


@dataclass(frozen=True)
class Pin:
    """A manual placement: these cards by name, in the order the engine gets them (the last
    holds the output layer), and optionally the user's tensor split over them (() = in
    proportion to their room)."""

    gpus: tuple[str, ...]
    split: tuple[float, ...] = ()


@dataclass(frozen=True)
class Request:
    """One model to place. `context` None keeps `settings.ctx_size` as given (None = trained)."""

    name: str
    meta: ModelMeta
    settings: LaunchSettings = field(default_factory=LaunchSettings)
    context: AutoContext | None = None
    pin: Pin | None = None
    # requests with the same key never share a card (the replicas of one role)
    apart: str | None = None
    # grow the slots toward this after the context, each slot keeping the context reached
    max_slots: int | None = None
    # the slots grow only while the footprint stays within this share of each of its cards
    # (the card's memory less the reserve); None: all the room left
    slot_share: float | None = None


@dataclass(frozen=True)
class Share:
    model: str
    bytes: int


@dataclass(frozen=True)
class DeviceLoad:
    """One device (a GPU, or CPU for host memory): its budget and who uses it, for a bar."""

    device: str
    budget: int | None  # available less the reserve; None = host memory not checked
    occupied: int  # held by what runs outside this placement
    shares: tuple[Share, ...]

    @property
    def used(self) -> int:
        return self.occupied + sum(s.bytes for s in self.shares)

    @property
    def free(self) -> int | None:
        return None if self.budget is None else self.budget - self.used


@dataclass(frozen=True)
class Placed:
    """A model that fits: its cards and the settings that express the placement."""

    name: str
    devices: tuple[str, ...]  # GPU names, in the engine's order (the last gets the output)
    gpu_indices: tuple[int, ...]  # the same cards as positions in the GPUs given: the pin
    settings: LaunchSettings  # ctx_size, n_gpu_layers and tensor_split set explicitly
    footprint: Footprint
    notes: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        return len(self.devices) > 1

    def bytes_on(self, device: str) -> int:
        return _on(self.footprint, device)


@dataclass(frozen=True)
class Suggestion:
    kind: Nearest
    settings: LaunchSettings
    devices: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class Unplaced:
    name: str
    reason: str
    nearest: tuple[Suggestion, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    placed: tuple[Placed, ...]  # in placement order
    unplaced: tuple[Unplaced, ...]
    gpus: tuple[DeviceLoad, ...]  # one per GPU given, in that order
    host: DeviceLoad

    @property
    def fits(self) -> bool:
        return not self.unplaced

    def model(self, name: str) -> Placed | None:
        return next((p for p in self.placed if p.name == name), None)

    def unplaced_model(self, name: str) -> Unplaced | None:
        return next((u for u in self.unplaced if u.name == name), None)


# --- internals ---------------------------------------------------------------------------------


def _on(fp: Footprint, device: str) -> int:
    return next((d.total for d in fp.devices if d.name == device), 0)


@dataclass(frozen=True)
class _Try:
    """One sizing of a request on some cards: the footprint, or why it does not fit."""

    settings: LaunchSettings
    cards: tuple[Gpu, ...]
    footprint: Footprint | None
    over: str | None  # None = fits

    @property
    def fits(self) -> bool:
        return self.over is None


@dataclass
class _Room:
    """What is left while placing (private to one call)."""

    gpu: dict[str, int]
    host: int | None

    def credit(self, fp: Footprint, cards: Sequence[Gpu]) -> _Room:
        """The room as if `fp` were not charged (a placed model re-sizing itself)."""
        gpu = dict(self.gpu)
        for c in cards:
            gpu[c.name] += _on(fp, c.name)
        host = None if self.host is None else self.host + _on(fp, CPU)
        return _Room(gpu, host)

    def charge(self, fp: Footprint, cards: Sequence[Gpu]) -> None:
        for c in cards:
            self.gpu[c.name] -= _on(fp, c.name)
        if self.host is not None:
            self.host -= _on(fp, CPU)


def _size(
    meta: ModelMeta, s: LaunchSettings, cards: tuple[Gpu, ...], room: _Room, estimate: Estimator
) -> _Try:
    try:
        fp = estimate(meta, s, cards)
    except SizingError as e:
        return _Try(s, cards, None, str(e))
    for c in cards:
        need, left = _on(fp, c.name), room.gpu[c.name]
        if need > left:
            return _Try(s, cards, fp, _over(need, left, c.name))
    host = _on(fp, CPU)
    if room.host is not None and host > room.host:
        return _Try(s, cards, fp, _over(host, room.host, "host memory"))
    return _Try(s, cards, fp, None)


def _over(need: int, left: int, where: str) -> str:
    return (
        f"needs {format_bytes(need)} on {where}, {format_bytes(need - left)} more than the "
        f"{format_bytes(max(left, 0))} left"
    )


def _trained(meta: ModelMeta) -> int:
    return meta.context_length or _DEFAULT_TRAINED


def _contexts(req: Request) -> tuple[int | None, int | None]:
    """(the context placement must hold, the context an automatic request grows toward)."""
    if req.context is None:
        return (req.settings.ctx_size or None), None
    trained = _trained(req.meta)
    target = max(min(req.context.target or trained, trained) // CTX_PAD * CTX_PAD, CTX_PAD)
    minimum = min(pad(max(req.context.minimum, 1), CTX_PAD), target)
    return minimum, target


def _n_gpu_layers(req: Request) -> int:
    ngl = req.settings.n_gpu_layers
    return req.meta.n_layer + 1 if ngl is None or ngl < 0 else ngl


def _base(req: Request, ctx: int | None) -> LaunchSettings:
    return replace(req.settings, ctx_size=ctx, n_gpu_layers=_n_gpu_layers(req), tensor_split=())


def _split_of(cards: Sequence[Gpu], room: _Room) -> tuple[float, ...]:
    return tuple(float(max(room.gpu[c.name] // _SPLIT_UNIT, 1)) for c in cards)


def _engine_order(cards: Sequence[Gpu], room: _Room, index: Mapping[str, int]) -> tuple[Gpu, ...]:
    """The roomiest card last: llama.cpp puts the output layer on the split's last card.
    Remote (RPC) devices come first, in the order given: llama.cpp lists them before the local
    GPUs, so the last layers and the output stay local and logits never cross the network."""
    return tuple(
        sorted(
            cards,
            key=lambda c: (
                not c.remote,
                0 if c.remote else room.gpu[c.name],
                index[c.name],
            ),
        )
    )


class _Placer:
    """One `place` call: the cards, the room left and the estimator."""

    def __init__(
        self, gpus: Sequence[Gpu], room: _Room, estimate: Estimator, reserve: int = 0
    ) -> None:
        self.gpus = tuple(gpus)
        self.reserve = reserve
        self.index = {g.name: i for i, g in enumerate(self.gpus)}
        self.by_name = {g.name: g for g in self.gpus}
        self.room = room
        self.estimate = estimate
        self.taken: dict[str, set[str]] = {}  # `apart` key -> the cards its requests hold

    def avoid(self, req: Request) -> frozenset[str]:
        """The cards `req` may not use: those its `apart` siblings hold."""
        return frozenset(self.taken.get(req.apart, ())) if req.apart else frozenset()

    def put(self, tried: _Try, req: Request, notes: list[str], *, pinned: bool = False) -> Placed:
        """Charge `tried` and record its cards for `req`'s siblings."""
        self.room.charge(_fp(tried), tried.cards)
        if req.apart:
            self.taken.setdefault(req.apart, set()).update(c.name for c in tried.cards)
        return _placed(tried, req, self.index, notes, pinned=pinned)

    def size(self, meta: ModelMeta, s: LaunchSettings, cards: tuple[Gpu, ...]) -> _Try:
        return _size(meta, s, cards, self.room, self.estimate)

    def by_room(self, avoid: frozenset[str] = frozenset()) -> list[Gpu]:
        """Cards with room, the roomiest first (ties: the lower index)."""
        cards = [g for g in self.gpus if self.room.gpu[g.name] > 0 and g.name not in avoid]
        return sorted(cards, key=lambda g: (-self.room.gpu[g.name], self.index[g.name]))

    def single(
        self, meta: ModelMeta, s: LaunchSettings, avoid: frozenset[str] = frozenset()
    ) -> tuple[_Try | None, _Try | None]:
        """(the best-fitting single card, the attempt on the roomiest card)."""
        best: _Try | None = None
        best_key: tuple[int, int] | None = None
        roomiest: _Try | None = None
        ranked = self.by_room(avoid)
        for g in self.gpus:
            if g.name in avoid:
                continue
            t = self.size(meta, s, (g,))
            if ranked and g is ranked[0]:
                roomiest = t
            if t.fits and t.footprint is not None:
                key = (self.room.gpu[g.name] - _on(t.footprint, g.name), self.index[g.name])
                if best_key is None or key < best_key:
                    best, best_key = t, key
        return best, roomiest

    def spread(self, meta: ModelMeta, s: LaunchSettings, cards: tuple[Gpu, ...]) -> _Try:
        """A split over `cards` in proportion to their room, rebalanced when whole layers
        overfill one card: each card's share is scaled by the room it has over what it was
        asked to hold, a few rounds at most."""
        split = _split_of(cards, self.room)
        tried = self.size(meta, replace(s, tensor_split=split), cards)
        for _ in range(_REBALANCE_ROUNDS):
            fp = tried.footprint
            if tried.fits or fp is None:
                break
            scaled = [
                x * self.room.gpu[c.name] / max(_on(fp, c.name), 1)
                for x, c in zip(split, cards, strict=True)
            ]
            unit = sum(split) / sum(scaled)
            again = tuple(float(max(round(x * unit), 1)) for x in scaled)
            if again == split:
                break
            split = again
            tried = self.size(meta, replace(s, tensor_split=split), cards)
        return tried

    def split(
        self, meta: ModelMeta, s: LaunchSettings, avoid: frozenset[str] = frozenset()
    ) -> tuple[_Try | None, _Try | None]:
        """(the split over the fewest roomiest cards that fits, the attempt over all of them)."""
        ranked = self.by_room(avoid)
        last: _Try | None = None
        for k in range(2, len(ranked) + 1):
            last = self.spread(meta, s, _engine_order(ranked[:k], self.room, self.index))
            if last.fits:
                return last, last
        return None, last

    def anywhere(
        self,
        meta: ModelMeta,
        s: LaunchSettings,
        *,
        split: bool = True,
        avoid: frozenset[str] = frozenset(),
    ) -> tuple[_Try | None, list[_Try]]:
        """A single card, else (with `split`) a split; with the failed attempts. Without any
        card (a machine with no GPU), host memory: every layer on the CPU. `avoid`: cards
        not to use (an `apart` sibling's)."""
        if s.n_gpu_layers == 0 or not self.gpus:
            t = self.size(meta, replace(s, n_gpu_layers=0), ())
            return (t if t.fits else None), [t]
        one, roomiest = self.single(meta, s, avoid)
        if one is not None:
            return one, []
        if not split:
            return None, [t for t in (roomiest,) if t is not None]
        many, widest = self.split(meta, s, avoid)
        if many is not None:
            return many, []
        return None, [t for t in (roomiest, widest) if t is not None]

    def pinned(self, meta: ModelMeta, s: LaunchSettings, pin: Pin) -> tuple[_Try | None, str]:
        """The saved placement, or why it no longer applies."""
        names = ", ".join(pin.gpus)
        missing = [n for n in pin.gpus if n not in self.by_name]
        if not pin.gpus or missing:
            lacks = ", ".join(missing) if missing else "no card named"
            return None, (
                f"the saved placement on {names or 'no card'} does not match this machine "
                f"(no {lacks}); placed automatically"
            )
        if len(set(pin.gpus)) != len(pin.gpus):
            return None, f"the saved placement names a card twice ({names}); placed automatically"
        if pin.split and len(pin.split) != len(pin.gpus):
            return None, (
                f"the saved tensor split has {len(pin.split)} values for {len(pin.gpus)} cards; "
                "placed automatically"
            )
        cards = tuple(self.by_name[n] for n in pin.gpus)
        split = tuple(float(x) for x in pin.split) if len(cards) > 1 else ()
        if split and (sum(split) <= 0 or any(x < 0 for x in split)):
            return None, "the saved tensor split is not usable; placed automatically"
        if len(cards) > 1 and not split:
            t = self.spread(meta, s, cards)
        else:
            t = self.size(meta, replace(s, tensor_split=split), cards)
        if not t.fits:
            return (
                None,
                f"the saved placement on {names} no longer fits ({t.over}); placed automatically",
            )
        return t, ""


def _demand(req: Request, gpus: Sequence[Gpu], estimate: Estimator) -> int:
    """Bytes a request needs at the context placement guarantees, on one unbounded card: the
    size for the largest-first order (0 when the settings cannot be sized)."""
    ctx, _ = _contexts(req)
    s = _base(req, ctx)
    card = (Gpu(gpus[0].name, _UNBOUNDED, backend=gpus[0].backend),) if gpus else ()
    try:
        fp = estimate(req.meta, s, card)
    except SizingError:
        return 0
    return sum(d.total for d in fp.devices)


def _placed(
    tried: _Try, req: Request, index: Mapping[str, int], notes: list[str], *, pinned: bool = False
) -> Placed:
    assert tried.footprint is not None
    names = tuple(c.name for c in tried.cards)
    if len(names) > 1 and not pinned:
        ts = ",".join(f"{x:g}" for x in tried.settings.tensor_split)
        notes.append(
            f"split over {', '.join(names)} (tensor split {ts}): no single card holds it with "
            f"{tried.footprint.settings.n_ctx} tokens of context"
        )
        notes.extend(split_warnings(req.meta, tried.footprint, Budget(gpus=tried.cards)))
    return Placed(
        name=req.name,
        devices=names,
        gpu_indices=tuple(index[n] for n in names),
        settings=tried.settings,
        footprint=tried.footprint,
        notes=tuple(notes),
    )


def _context_words(tried: Sequence[_Try], ctx: int | None) -> str:
    fp = next((t.footprint for t in tried if t.footprint is not None), None)
    if fp is not None:
        return f"{fp.settings.n_ctx} tokens of context"
    return f"{ctx} tokens of context" if ctx else "its trained context"


def _host_reason(tried: Sequence[_Try], ctx: int | None) -> str:
    """Why a model does not fit in host memory (every layer on the CPU)."""
    t = tried[0] if tried else None
    if t is None or t.over is None:
        return "host memory has no room left"
    if t.footprint is None:  # the engine refuses the settings
        return t.over
    return f"does not fit in host memory with {_context_words(tried, ctx)}: it {t.over}"


def _reason(tried: Sequence[_Try], ctx: int | None) -> str:
    if any(t.footprint is None for t in tried):  # the engine refuses the settings
        return next(t.over for t in tried if t.over is not None)
    parts = []
    for t in tried:
        names = [c.name for c in t.cards]
        if len(names) == 1:
            where = f"on {names[0]} (the card with the most room)"
        else:
            where = f"split over {', '.join(names)}"
        parts.append(f"{where} it {t.over}")
    if not parts:
        return "no card has any room left"
    return f"does not fit with {_context_words(tried, ctx)}: " + "; ".join(parts)


class _Nearest:
    """The settings closest to the request that fit, for a model that does not."""

    def __init__(self, placer: _Placer) -> None:
        self.p = placer

    def where(self) -> list[tuple[Gpu, ...]]:
        """The card sets worth trying: the roomiest card, then every card with room."""
        ranked = self.p.by_room()
        out: list[tuple[Gpu, ...]] = [(ranked[0],)] if ranked else []
        if len(ranked) > 1:
            out.append(_engine_order(ranked, self.p.room, self.p.index))
        return out

    def at(self, meta: ModelMeta, s: LaunchSettings, cards: tuple[Gpu, ...]) -> _Try:
        if len(cards) > 1:
            return self.p.spread(meta, s, cards)
        return self.p.size(meta, s, cards)

    def context(self, meta: ModelMeta, s: LaunchSettings) -> Suggestion | None:
        top = pad(s.ctx_size or _trained(meta), CTX_PAD) // CTX_PAD - 1
        best: tuple[int, _Try] | None = None
        for cards in self.where():

            def ok(k: int, cards: tuple[Gpu, ...] = cards) -> bool:
                return self.at(meta, replace(s, ctx_size=k * CTX_PAD), cards).fits

            k = largest(1, top, ok)
            if k is not None and (best is None or k > best[0]):
                best = (k, self.at(meta, replace(s, ctx_size=k * CTX_PAD), cards))
        if best is None:
            return None
        t = best[1]
        return Suggestion(
            Nearest.CONTEXT,
            t.settings,
            tuple(c.name for c in t.cards),
            f"fits with a context of {best[0] * CTX_PAD} tokens",
        )

    def kv_cache(self, meta: ModelMeta, s: LaunchSettings) -> Suggestion | None:
        if s.cache_type_k not in _FULL_PRECISION_KV and s.cache_type_v not in _FULL_PRECISION_KV:
            return None
        # a quantized V cache needs flash attention (launch.resolve); the estimator refuses
        # q8_0 where the engine would (a head size its blocks do not divide, MLA K != V)
        q = replace(s, cache_type_k=QUANT_KV, cache_type_v=QUANT_KV, flash_attn="on")
        for cards in self.where():
            t = self.at(meta, q, cards)
            if t.footprint is None:  # refused for this model: no suggestion
                return None
            if t.fits:
                return Suggestion(
                    Nearest.KV_CACHE,
                    t.settings,
                    tuple(c.name for c in t.cards),
                    f"fits with a {QUANT_KV} KV cache (flash attention on)",
                )
        return None

    def offload(self, meta: ModelMeta, s: LaunchSettings) -> Suggestion | None:
        ranked = self.p.by_room()
        if not ranked:
            return None
        card = ranked[0]
        # offload_for_context sizes with the full footprint model (fit.check); the card is
        # given with its room as free memory and no further reserve
        budget = Budget(
            gpus=(Gpu(card.name, card.total_bytes, self.p.room.gpu[card.name], card.backend),),
            gpu_reserve=0,
            host_bytes=self.p.room.host,
        )
        try:
            r = offload_for_context(meta, s, budget)
        except SizingError:
            return None
        if not r.fits or r.nearest is None:
            return None
        n = r.nearest
        moe = f", experts of {n.n_cpu_moe} layers on the CPU" if n.n_cpu_moe else ""
        return Suggestion(
            Nearest.OFFLOAD,
            n,
            (card.name,),
            f"fits on {card.name} with {n.n_gpu_layers} of {meta.n_layer + 1} layers on the "
            f"GPU{moe}",
        )

    def all(self, meta: ModelMeta, s: LaunchSettings) -> tuple[Suggestion, ...]:
        found = (self.context(meta, s), self.kv_cache(meta, s), self.offload(meta, s))
        return tuple(x for x in found if x is not None)


def _grow(placer: _Placer, placed: Placed, meta: ModelMeta, target: int) -> Placed:
    """The largest context up to `target` that the model's cards still hold."""
    cards = tuple(placer.by_name[n] for n in placed.devices)
    room = placer.room.credit(placed.footprint, cards)
    lo = placed.footprint.settings.n_ctx // CTX_PAD
    hi = target // CTX_PAD
    if hi <= lo:
        return placed

    def at(k: int) -> _Try:
        return _size(
            meta, replace(placed.settings, ctx_size=k * CTX_PAD), cards, room, placer.estimate
        )

    k = largest(lo, hi, lambda k: at(k).fits)
    if k is None or k == lo:
        return placed
    grown = at(k)
    assert grown.footprint is not None
    placer.room = room
    placer.room.charge(grown.footprint, cards)
    return replace(placed, settings=grown.settings, footprint=grown.footprint)


def _grow_all(placer: _Placer, placed: list[Placed], requests: Sequence[Request]) -> None:
    """Grow the automatic contexts, in placement order, into the room everything left."""
    by_name = {r.name: r for r in requests}
    for i, p in enumerate(placed):
        _, target = _contexts(by_name[p.name])
        if target is not None:
            placed[i] = _grow(placer, p, by_name[p.name].meta, target)


def _loads(
    gpus: Sequence[Gpu],
    placed: Sequence[Placed],
    *,
    reserve: int,
    host_bytes: int | None,
    occupied: Mapping[str, int],
) -> tuple[tuple[DeviceLoad, ...], DeviceLoad]:
    def shares(device: str) -> tuple[Share, ...]:
        found = (Share(p.name, p.bytes_on(device)) for p in placed)
        return tuple(s for s in found if s.bytes > 0)

    cards = tuple(
        DeviceLoad(g.name, max(g.available - reserve, 0), occupied.get(g.name, 0), shares(g.name))
        for g in gpus
    )
    return cards, DeviceLoad(CPU, host_bytes, occupied.get(CPU, 0), shares(CPU))


def place(
    requests: Sequence[Request],
    gpus: Sequence[Gpu],
    *,
    reserve: int = DEFAULT_GPU_RESERVE,
    host_bytes: int | None = None,
    occupied: Mapping[str, int] | None = None,
    grow_context: bool = True,
    widen_idle: bool = False,
    estimate: Estimator = _footprint.estimate,
) -> Placement:
    """Place several models on the GPUs (rules in the module docstring).

    `reserve` is kept free on every GPU; `host_bytes` is the host RAM budget for the parts on
    the CPU (None = not checked); `occupied` is memory already in use per device name (GPU
    names and "CPU"), e.g. engines that keep running. `grow_context=False` leaves automatic
    contexts at their minimum: for callers that only ask whether models fit. `widen_idle`
    lets a card left idle widen the context of a model below its target.
    Same inputs, in any order, give the same placement."""
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise SizingError("two models to place have the same name; each needs its own")
    if len({g.name for g in gpus}) != len(gpus):
        raise SizingError("two GPUs have the same name; each needs its own")
    used = dict(occupied or {})
    start = _Room(
        {g.name: max(g.available - reserve - used.get(g.name, 0), 0) for g in gpus},
        None if host_bytes is None else host_bytes - used.get(CPU, 0),
    )
    sizing = memoized(estimate)
    size = {r.name: _demand(r, gpus, sizing) for r in requests}

    def pack(reqs: Sequence[Request]) -> tuple[_Placer, _Packed]:
        placer = _Placer(gpus, _Room(dict(start.gpu), start.host), sizing, reserve)
        return placer, _pack(placer, reqs, size)

    # which models run: pinned ones, then the smallest, each admitted only when everything
    # admitted so far still packs; then where they run: `_pack`
    admitted: list[Request] = []
    rejected: list[Request] = []
    for req in sorted(requests, key=lambda r: (r.pin is None, size[r.name], r.name)):
        _, trial = pack([*admitted, req])
        (rejected if trial.failed else admitted).append(req)
    placer, packed = pack(admitted)
    placed = packed.placed
    unplaced: list[Unplaced] = []
    for req in rejected:  # what is left may still hold one of them on its own
        notes = [*packed.notes.get(req.name, ())]
        ctx, _ = _contexts(req)
        s = _base(req, ctx)
        found, failed = placer.anywhere(req.meta, s, avoid=placer.avoid(req))
        if found is not None:
            placed.append(placer.put(found, req, notes))
            continue
        if req.pin is not None:
            notes.append(placer.pinned(req.meta, s, req.pin)[1])
        on_cards = s.n_gpu_layers and gpus
        reason = _reason(failed, ctx) if on_cards else _host_reason(failed, ctx)
        nearest = _Nearest(placer).all(req.meta, s) if failed and gpus else ()
        unplaced.append(Unplaced(req.name, reason, nearest, tuple(notes)))
    if grow_context:
        _grow_all(placer, placed, requests)
        if widen_idle:
            _widen_all(placer, placed, requests, used)
        _grow_slots_all(placer, placed, requests)
    cards, host = _loads(gpus, placed, reserve=reserve, host_bytes=host_bytes, occupied=used)
    return Placement(tuple(placed), tuple(unplaced), cards, host)


def place_stages(
    stages: Sequence[Sequence[Request]],
    gpus: Sequence[Gpu],
    *,
    reserve: int = DEFAULT_GPU_RESERVE,
    host_bytes: int | None = None,
    occupied: Mapping[str, int] | None = None,
    widen_idle: bool = False,
    estimate: Estimator = _footprint.estimate,
) -> Placement:
    """Place `stages` one after the other, each against the room the earlier ones left (the
    search roles first, chat against what is left: `core.roles`); one placement of them all.

    With `widen_idle`, a card still idle after the last stage widens the context of a model
    below its target (whichever stage placed it, in placement order)."""
    names = [r.name for stage in stages for r in stage]
    if len(set(names)) != len(names):
        raise SizingError("two models to place have the same name; each needs its own")
    first = dict(occupied or {})
    used = dict(first)
    sizing = memoized(estimate)
    placed: list[Placed] = []
    unplaced: list[Unplaced] = []
    for stage in stages:
        p = place(stage, gpus, reserve=reserve, host_bytes=host_bytes, occupied=used,
                  estimate=sizing)  # fmt: skip
        for x in p.placed:
            for d in x.footprint.devices:
                used[d.name] = used.get(d.name, 0) + d.total
        placed.extend(p.placed)
        unplaced.extend(p.unplaced)
    if widen_idle and placed:
        room = _Room(
            {g.name: max(g.available - reserve - used.get(g.name, 0), 0) for g in gpus},
            None if host_bytes is None else host_bytes - used.get(CPU, 0),
        )
        placer = _Placer(gpus, room, sizing, reserve)
        requests = [r for stage in stages for r in stage]
        _widen_all(placer, placed, requests, first)
        _grow_slots_all(placer, placed, requests)
    cards, host = _loads(gpus, placed, reserve=reserve, host_bytes=host_bytes, occupied=first)
    return Placement(tuple(placed), tuple(unplaced), cards, host)


def _grow_slots(
    placer: _Placer, placed: Placed, meta: ModelMeta, ceiling: int, share: float | None = None
) -> Placed:
    """The most slots up to `ceiling` whose each keeps the context the model has with one, on
    its cards (bisection: more slots only ever need more memory); with `share`, only while
    the footprint stays within that share of each card's memory less the reserve."""
    fp = placed.footprint
    if fp.settings.n_seq != 1 or ceiling <= 1:
        return placed
    per_slot = fp.settings.n_ctx_seq
    cards = tuple(placer.by_name[n] for n in placed.devices)
    room = placer.room.credit(fp, cards)

    def at(n: int) -> _Try:
        s = replace(placed.settings, parallel=n, ctx_size=n * per_slot)
        return _size(meta, s, cards, room, placer.estimate)

    def within(t: _Try) -> bool:
        if share is None:
            return True
        return all(
            _on(_fp(t), c.name) <= share * max(c.available - placer.reserve, 0) for c in cards
        )

    def ok(n: int) -> bool:
        if n == 1:
            return True
        t = at(n)
        return t.fits and within(t)

    n = largest(1, ceiling, ok)
    if n is None or n == 1:
        return placed
    grown = at(n)
    placer.room = room
    placer.room.charge(_fp(grown), cards)
    return replace(placed, settings=grown.settings, footprint=_fp(grown))


def _grow_slots_all(placer: _Placer, placed: list[Placed], requests: Sequence[Request]) -> None:
    by_name = {r.name: r for r in requests}
    for i, p in enumerate(placed):
        req = by_name.get(p.name)
        if req is not None and req.max_slots:
            placed[i] = _grow_slots(placer, p, req.meta, req.max_slots, req.slot_share)


def _widen(
    placer: _Placer, placed: Placed, meta: ModelMeta, target: int, idle: list[Gpu]
) -> Placed:
    """`placed` split over its cards and the fewest idle ones (roomiest first) that reach
    `target`, else all of them; unchanged when that gives it no more context."""
    fp = placed.footprint
    have = fp.settings.n_ctx
    if have >= target or not idle or not placed.devices:
        return placed
    own = tuple(placer.by_name[n] for n in placed.devices)
    before = placer.room
    room = before.credit(fp, own)
    placer.room = room
    best: tuple[int, _Try] | None = None
    extra = sorted(idle, key=lambda g: (-room.gpu[g.name], placer.index[g.name]))
    for k in range(1, len(extra) + 1):
        cards = _engine_order((*own, *extra[:k]), room, placer.index)
        s = replace(placed.settings, tensor_split=())

        def at(c: int, cards: tuple[Gpu, ...] = cards, s: LaunchSettings = s) -> _Try:
            return placer.spread(meta, replace(s, ctx_size=c * CTX_PAD), cards)

        c = largest(have // CTX_PAD + 1, target // CTX_PAD, lambda c: at(c).fits)
        if c is not None and (best is None or c > best[0]):
            best = (c, at(c))
        if best is not None and best[0] * CTX_PAD >= target:
            break
    if best is None or (best[0] * CTX_PAD < target and best[0] * CTX_PAD < have * WIDEN_GAIN):
        placer.room = before
        return placed
    tried = best[1]
    placer.room.charge(_fp(tried), tried.cards)
    names = tuple(c.name for c in tried.cards)
    added = ", ".join(n for n in names if n not in placed.devices)
    ts = ",".join(f"{x:g}" for x in tried.settings.tensor_split)
    note = (
        f"widened onto idle {added} (tensor split {ts}): {_fp(tried).settings.n_ctx} tokens "
        f"of context instead of {have}"
    )
    return replace(
        placed,
        devices=names,
        gpu_indices=tuple(placer.index[n] for n in names),
        settings=tried.settings,
        footprint=_fp(tried),
        notes=(*placed.notes, note),
    )


def _widen_all(
    placer: _Placer,
    placed: list[Placed],
    requests: Sequence[Request],
    occupied: Mapping[str, int],
) -> None:
    """Let the cards nothing runs on widen the automatic contexts still below their target,
    in placement order (a card another engine uses is not idle)."""
    by_name = {r.name: r for r in requests}
    busy = {n for p in placed for n in p.devices} | {n for n, b in occupied.items() if b > 0}
    for i, p in enumerate(placed):
        idle = [g for g in placer.gpus if g.name not in busy and placer.room.gpu[g.name] > 0]
        req = by_name.get(p.name)
        if req is None or not idle:
            continue
        _, target = _contexts(req)
        if target is None:
            continue
        placed[i] = _widen(placer, p, req.meta, target, idle)
        busy.update(placed[i].devices)


@dataclass
class _Packed:
    placed: list[Placed]
    failed: list[Request]
    notes: dict[str, list[str]]


def _pack(placer: _Placer, reqs: Sequence[Request], size: Mapping[str, int]) -> _Packed:
    """Where the models go: pinned ones as saved, then one card each (largest first, best
    fit), then the splits (smallest first), so a split never takes the room a model that fits
    on one card needed."""
    notes: dict[str, list[str]] = {r.name: [] for r in reqs}
    placed: list[Placed] = []
    auto: list[Request] = []
    for req in sorted(reqs, key=lambda r: (r.pin is None, -size[r.name], r.name)):
        if req.pin is None:
            auto.append(req)
            continue
        tried, why = placer.pinned(req.meta, _base(req, _contexts(req)[0]), req.pin)
        if tried is None:
            notes[req.name].append(why)
            auto.append(req)
            continue
        placed.append(placer.put(tried, req, notes[req.name], pinned=True))
    deferred: list[Request] = []
    for req in auto:
        s = _base(req, _contexts(req)[0])
        found, _ = placer.anywhere(req.meta, s, split=False, avoid=placer.avoid(req))
        if found is None:
            deferred.append(req)
            continue
        placed.append(placer.put(found, req, notes[req.name]))
    failed: list[Request] = []
    for req in sorted(deferred, key=lambda r: (size[r.name], r.name)):
        s = _base(req, _contexts(req)[0])
        found, _ = placer.anywhere(req.meta, s, avoid=placer.avoid(req))
        if found is None:
            failed.append(req)
            continue
        placed.append(placer.put(found, req, notes[req.name]))
    return _Packed(placed, failed, notes)


def memoized(estimate: Estimator) -> Estimator:
    """`estimate`, remembering its answers: a placement asks for the same sizing many times.
    Keep it for one call; it holds every footprint it returned."""
    seen: dict[tuple[int, LaunchSettings, tuple[Gpu, ...]], Footprint] = {}

    def cached(meta: ModelMeta, s: LaunchSettings, gpus: Sequence[Gpu]) -> Footprint:
        key = (id(meta), s, tuple(gpus))
        hit = seen.get(key)
        if hit is None:
            hit = seen[key] = estimate(meta, s, gpus)
        return hit

    return cached


def _fp(t: _Try) -> Footprint:
    assert t.footprint is not None
    return t.footprint
