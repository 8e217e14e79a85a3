"""Conservative bounds for the buffers qmgui cannot model (issue 17, item 4: never a silent
"fits").

A plan charges every buffer a launch allocates. Where qmgui has no exact model of one (a
compute graph without a layout in `core.compute`, a deep or contradictory header, a vision
projector's encoder graph), the plan charges an upper bound instead of nothing, and says so:
each is a `Bound` on the footprint (which part, on which device, how many bytes, why), and a
verdict that depends on one reads "fits (bound)".

Both bounds here are built from the tensors the graph must hold, read off the weights'
shapes (a matmul's output is `n_tokens` rows as wide as its weight's second dimension), with
factors checked against every measured run (tests/core/test_bounds.py: b11434 over every
model its `test-llama-archs` writes, and the projectors tests/synth writes). They are
bounds in that sense: never below a measurement so far, not proven for every graph.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from qmgui.core.launch import Resolved
from qmgui.core.meta import ModelMeta

__all__ = [
    "COMPUTE_BOUND_FACTOR",
    "PROJECTOR_DYNAMIC_PATCHES",
    "Bound",
    "compute_bound",
    "projector_compute_bound",
]

_F32 = 4
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Bound:
    """A buffer planned as an upper bound: `part` ("compute", "projector compute"), the
    device it is charged to, the bytes charged, and why there is no exact figure."""

    part: str
    device: str
    bytes: int
    why: str

    def to_json(self) -> dict[str, object]:
        return {"part": self.part, "device": self.device, "bytes": self.bytes, "why": self.why}


# --- the model's compute graph -----------------------------------------------------------------

# Each layer's live set is bounded by this many copies of everything its matmuls output for
# one ubatch (plus the residual stream): norms, activations, RoPE copies, the GLU product and
# reshaped copies each take at most one more tensor of a matmul output's size. Over the 894
# runs of tests/core/fixtures/compute/bounds_b11434.json (every architecture b11434 knows,
# 1k to 64k cells) the whole bound is 1.22x the measured buffer at the least (test_bounds).
COMPUTE_BOUND_FACTOR = 3
# A sparse-attention indexer (DeepSeek-V3.2's DSA and its kin) grows the buffer by 4-6 f32 per
# cell and token on b11434 (its scores, the top-k selection, its mask; 16 to 64k cells): 8
_INDEXER_FLOATS = 8
# llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
_NO_FLASH_ATTN = frozenset({"grok"})
_BLK = re.compile(r"^blk\.([0-9]{1,9})\.")


def _layer_widths(meta: ModelMeta) -> dict[int, int]:
    """Per layer: the summed output width of its matmuls for one token (a 2-D weight's second
    dimension; an expert tensor's times the experts used per token)."""
    out: dict[int, int] = {}
    used = max(meta.n_expert_used, 1)
    for t in meta.tensors:
        m = _BLK.match(t.name)
        if m is None or len(t.shape) < 2:
            continue
        il = int(m.group(1))
        rows = t.shape[1]
        if len(t.shape) >= 3 and t.shape[2] > 1:
            rows *= min(used, t.shape[2])  # experts: ne2 is the expert count
        out[il] = out.get(il, 0) + rows
    return out


def _recurrent_floats(meta: ModelMeta) -> int:
    """Floats of one sequence's recurrent state in one layer (conv + SSM/WKV), generously:
    the larger of what the header's SSM, RWKV and linear-attention dimensions give."""
    best = 0
    if meta.ssm is not None:
        s = meta.ssm
        conv = max(s.conv_kernel, 1) * (s.inner_size + 2 * s.group_count * s.state_size)
        best = max(best, conv + s.state_size * s.inner_size)
    if meta.rwkv is not None:
        best = max(best, (meta.rwkv.token_shift_count + meta.rwkv.head_size) * meta.n_embd)
    la = meta.linear_attn
    if la is not None:
        d = la.n_head * la.head_dim
        best = max(best, 3 * max(la.conv_kernel, 4) * d + la.head_dim * d)
    if meta.shortconv_l_cache:
        best = max(best, meta.n_embd * meta.shortconv_l_cache)
    return best


def compute_bound(meta: ModelMeta, r: Resolved, *, embeddings: bool) -> int:
    """An upper bound on llama-server's compute buffer for one launch, without a graph layout.

    The worst-case reservation is a prompt ubatch of T = min(n_ctx, n_ubatch) tokens over the
    whole KV cache (core.compute). Charged, all at once:
      inputs: the token embedding rows, the mixed-batch copy and the layer input
              (3 x n_embd x T f32), token ids and positions;
      a layer: COMPUTE_BOUND_FACTOR x (its matmuls' outputs + 2 x n_embd) x T f32, for the
              widest layer;
      attention, per cell of a stream's cache and token (a graph without a KV cache attends
              over its batch): two f32 masks (full and sliding); without flash attention the
              scores, n_head f32; with a sparse-attention indexer, _INDEXER_FLOATS more (its
              scores, their top-k selection and its own mask);
      states: three copies of every sequence's recurrent state in one layer (the gathered
              states, the new ones, the scan output);
      output: logits n_vocab x n_outputs f32 (per token in an embedding context) and the
              output norm.
    Each term is a tensor of the graph or a generous multiple of one; the sum is never below
    a measured buffer (test_bounds: b11434 over every architecture, 1k to 64k cells)."""
    from qmgui.core.footprint import NO_MEMORY_ARCHS, kv_layers  # noqa: PLC0415 - a cycle

    n_seq = max(r.n_seq, 1)
    tokens = min(r.n_ctx, r.n_ubatch)
    tokens = max(-(-tokens // n_seq) * n_seq, n_seq)
    outputs = min(tokens, r.n_batch if embeddings else n_seq)
    n_embd = max(meta.n_embd, 1)
    heads = max(meta.n_head, default=0)
    if meta.architecture in NO_MEMORY_ARCHS:
        cells, attention = tokens, heads > 0  # attends over its own batch, no cache
    else:
        cells, attention = r.n_ctx_seq, bool(kv_layers(meta))
    per_cell = 0  # floats per cell and token
    flash = r.flash_attn and meta.architecture not in _NO_FLASH_ATTN
    if attention:
        per_cell = 2 + (0 if flash else max(heads, 1))
    if meta.indexer_dim:
        per_cell += _INDEXER_FLOATS
    inputs = 3 * n_embd * tokens * _F32 + 4 * tokens * 8
    widths = _layer_widths(meta)
    widest = max(widths.values(), default=4 * n_embd)
    layer = COMPUTE_BOUND_FACTOR * (widest + 2 * n_embd) * tokens * _F32
    attend = per_cell * cells * tokens * _F32
    states = 3 * _recurrent_floats(meta) * n_seq * _F32
    output = ((meta.vocab_size or 0) * outputs + n_embd * tokens) * _F32
    return inputs + layer + attend + states + output


def compute_bound_why(reason: str) -> str:
    return (
        f"{reason}; charged as an upper bound from the graph's largest tensors (a layer's "
        "matmul outputs, the attention over the cache, the logits), at or above every buffer "
        "measured on llama.cpp b11434's architectures"
    )


# --- a vision projector's encoder --------------------------------------------------------------

# A projector without a position embedding takes images of any size (Qwen-VL's and others'
# dynamic resolution): its buffer grows with the largest image it is given. clip.cpp's largest
# default limit is 4096 image tokens of 2x2 merged patches (set_limit_image_tokens(8, 4096)):
# 16384 patches, the bound's image for those.
PROJECTOR_DYNAMIC_PATCHES = 16384
# Without flash attention the encoder holds the scores n_head x P x P; the header's head count
# is not kept, so heads are bounded by a head width of 16 (the narrowest seen; real encoders
# use 64 to 128)
_MIN_HEAD_DIM = 16


@dataclass(frozen=True)
class _Vision:
    patch: int
    n_embd: int
    positions: int | None  # the position embedding's rows: the patches (+1 class token)
    widest: int  # the widest matmul output of one token


def _vision(proj: ModelMeta) -> _Vision | None:
    patch = n_embd = 0
    positions: int | None = None
    widest = 0
    for t in proj.tensors:
        if t.name == "v.patch_embd.weight" and len(t.shape) == 4:
            patch, n_embd = t.shape[0], t.shape[3]
        elif t.name == "v.position_embd.weight" and len(t.shape) >= 2:
            positions = t.shape[1]
        elif len(t.shape) >= 2 and (t.name.startswith(("v.blk.", "mm.", "v.mm"))):
            widest = max(widest, t.shape[1], t.shape[0])
    if patch <= 0 or n_embd <= 0:
        return None
    return _Vision(patch, n_embd, positions, max(widest, n_embd))


def projector_compute_bound(proj: ModelMeta, *, flash_attn: str) -> tuple[int, str]:
    """An upper bound on the projector's compute buffer (clip.cpp's `reserve_compute_meta`,
    reserved by the warm-up and grown by the largest image), and why it is a bound.

    P patches (the position embedding's rows; PROJECTOR_DYNAMIC_PATCHES without one) of the
    patch size make the image: its f32 pixels (3 x P x patch^2), four n_embd-wide and three
    of the widest matmul outputs per patch (one encoder layer's live set and the projection),
    and with flash attention off (`-fa off`) the attention scores, n_head x P x P f32 with
    n_head bounded by a 16-wide head. `-fa auto` counts on the warm-up's flash attention,
    which the engine enabled on every run measured here (CPU backend)."""
    v = _vision(proj)
    if v is None:
        # no vision encoder qmgui can read (an audio projector...): its weights, as f32, are
        # more than any single layer's activations for a short input
        n = 4 * max(proj.weight_bytes, _MIB)
        return n, "no vision encoder read from the projector: bounded by 4x its weights"
    dynamic = v.positions is None
    patches = PROJECTOR_DYNAMIC_PATCHES if dynamic else max(v.positions or 1, 1)
    pixels = 3 * patches * v.patch * v.patch
    acts = patches * (4 * v.n_embd + 3 * v.widest)
    scores = 0
    if flash_attn == "off":
        heads = max(v.n_embd // _MIN_HEAD_DIM, 1)
        scores = heads * patches * patches
    n = (pixels + acts + scores) * _F32 + _MIB // 4
    side = math.isqrt(patches)
    image = f"{patches:,} patches ({side * v.patch}x{side * v.patch} pixels)"
    why = (
        "the projector's encoder graph is not modelled: charged as an upper bound for "
        f"an image of {image}"
    )
    if dynamic:
        why += ", the largest clip.cpp allows by default (dynamic resolution)"
    if flash_attn == "off":
        why += ", with the attention scores flash attention off keeps"
    else:
        why += "; flash attention on (-fa off adds the attention scores)"
    return n, why
