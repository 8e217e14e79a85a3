"""Per-architecture tensor layouts, transcribed from llama.cpp's ``load_arch_tensors``.

Shapes are written in ggml order (``ne0`` first), exactly as in llama.cpp's
``create_tensor(tn(...), {ne0, ne1, ...})`` calls; the writer reverses them for numpy.
Every name is checked against ``gguf.MODEL_TENSORS[arch]`` as it is added.

Tensor kinds decide the stored type and the values:
``w`` weight (the spec's type), ``embd`` token embedding / output head, ``norm`` F32 ones,
``bias`` F32 zeros, ``f32`` small F32 values (router, conv kernels, sinks), ``neg`` F32 −1
(SSM ``A``, stored as −exp(A_log)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gguf
from gguf import MODEL_TENSOR as T

if TYPE_CHECKING:
    from tests.synth.factory import SynthSpec


@dataclass(frozen=True)
class TensorPlan:
    name: str
    ne: tuple[int, ...]
    kind: str


_ARCH_BY_NAME = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


def arch_enum(arch: str) -> gguf.MODEL_ARCH:
    try:
        return _ARCH_BY_NAME[arch]
    except KeyError:
        raise ValueError(f"unknown llama.cpp architecture {arch!r}") from None


class _Plan:
    def __init__(self, spec: SynthSpec, n_vocab: int) -> None:
        self.spec = spec
        self.n_vocab = n_vocab
        self.allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_enum(spec.arch)]}
        self.items: list[TensorPlan] = []

    def add(
        self,
        t: T,
        ne: tuple[int, ...],
        bid: int | None = None,
        *,
        suffix: str | None = "weight",
        kind: str = "w",
    ) -> None:
        if gguf.TENSOR_NAMES[t] not in self.allowed:
            raise ValueError(f"{t.name} is not a {self.spec.arch} tensor in gguf.MODEL_TENSORS")
        if any(d <= 0 for d in ne):
            raise ValueError(f"{t.name}: bad shape {ne}")
        base = gguf.TENSOR_NAMES[t].format(bid=bid)
        name = f"{base}.{suffix}" if suffix else base
        self.items.append(TensorPlan(name, tuple(int(d) for d in ne), kind))

    # --- shared building blocks -------------------------------------------------------------

    def io(self, *, output_norm: T = T.OUTPUT_NORM, output_required: bool = False) -> None:
        s, e = self.spec, self.spec.n_embd
        self.add(T.TOKEN_EMBD, (e, self.n_vocab), kind="embd")
        self.add(output_norm, (e,), kind="norm")
        if output_required or not s.tied_embeddings:
            self.add(T.OUTPUT, (e, self.n_vocab), kind="embd")

    def attn(
        self,
        i: int,
        *,
        n_q: int | None = None,
        n_out: int | None = None,
        bias: bool = False,
        qk_norm: bool = False,
    ) -> None:
        s, e = self.spec, self.spec.n_embd
        hk, hv, nkv = s.head_k, s.head_v, s.kv_heads(i)
        n_q = n_q or hk * s.n_head
        self.add(T.ATTN_Q, (e, n_q), i)
        self.add(T.ATTN_K, (e, hk * nkv), i)
        self.add(T.ATTN_V, (e, hv * nkv), i)
        if bias:
            self.add(T.ATTN_Q, (n_q,), i, suffix="bias", kind="bias")
            self.add(T.ATTN_K, (hk * nkv,), i, suffix="bias", kind="bias")
            self.add(T.ATTN_V, (hv * nkv,), i, suffix="bias", kind="bias")
        self.add(T.ATTN_OUT, (n_out or hk * s.n_head, e), i)
        if qk_norm:
            self.add(T.ATTN_Q_NORM, (hk,), i, kind="norm")
            self.add(T.ATTN_K_NORM, (hk,), i, kind="norm")

    def ffn(self, i: int, n_ff: int, *, gate: bool = True, bias: bool = False) -> None:
        e = self.spec.n_embd
        if gate:
            self.add(T.FFN_GATE, (e, n_ff), i)
        self.add(T.FFN_UP, (e, n_ff), i)
        self.add(T.FFN_DOWN, (n_ff, e), i)
        if bias:
            self.add(T.FFN_UP, (n_ff,), i, suffix="bias", kind="bias")
            self.add(T.FFN_DOWN, (e,), i, suffix="bias", kind="bias")

    def moe(self, i: int, n_ff_exp: int) -> None:
        e, n_exp = self.spec.n_embd, self.spec.n_expert
        self.add(T.FFN_GATE_INP, (e, n_exp), i, kind="f32")
        self.add(T.FFN_GATE_EXP, (e, n_ff_exp, n_exp), i)
        self.add(T.FFN_UP_EXP, (e, n_ff_exp, n_exp), i)
        self.add(T.FFN_DOWN_EXP, (n_ff_exp, e, n_exp), i)

    def shared_expert(self, i: int, n_ff_sh: int) -> None:
        e = self.spec.n_embd
        self.add(T.FFN_GATE_SHEXP, (e, n_ff_sh), i)
        self.add(T.FFN_UP_SHEXP, (e, n_ff_sh), i)
        self.add(T.FFN_DOWN_SHEXP, (n_ff_sh, e), i)

    def mamba2(self, i: int) -> None:
        """A mamba2 mixer (src/models/mamba2.cpp; shared by granite-hybrid and nemotron-h)."""
        s, e = self.spec, self.spec.n_embd
        d_inner, d_state, n_group, n_ssm_head = (
            s.ssm_d_inner,
            s.ssm_d_state,
            s.ssm_n_group,
            s.ssm_dt_rank,
        )
        if d_inner % n_ssm_head or d_inner % n_group:
            raise ValueError("mamba2: ssm_d_inner must divide by ssm_dt_rank and ssm_n_group")
        d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_ssm_head
        d_conv_ch = d_inner + 2 * n_group * d_state
        self.add(T.SSM_IN, (e, d_in_proj), i)
        self.add(T.SSM_CONV1D, (s.ssm_d_conv, d_conv_ch), i, kind="f32")
        self.add(T.SSM_CONV1D, (d_conv_ch,), i, suffix="bias", kind="bias")
        self.add(T.SSM_DT, (n_ssm_head,), i, suffix="bias", kind="bias")
        self.add(T.SSM_A, (1, n_ssm_head), i, suffix=None, kind="neg")
        self.add(T.SSM_D, (1, n_ssm_head), i, suffix=None, kind="norm")
        self.add(T.SSM_NORM, (d_inner // n_group, n_group), i, kind="norm")
        self.add(T.SSM_OUT, (d_inner, e), i)


# --- architectures ----------------------------------------------------------------------------


def _llama(p: _Plan) -> None:  # src/models/llama.cpp
    s = p.spec
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.attn(i)
        p.add(T.FFN_NORM, (s.n_embd,), i, kind="norm")
        if s.n_expert:
            p.moe(i, s.n_ff_exp or s.n_ff)
        else:
            p.ffn(i, s.n_ff)


def _qwen2(p: _Plan) -> None:  # src/models/qwen2.cpp: q/k/v biases, n_head * head_dim == n_embd
    s = p.spec
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.attn(i, bias=True)
        p.add(T.FFN_NORM, (s.n_embd,), i, kind="norm")
        p.ffn(i, s.n_ff)


def _qwen3moe(p: _Plan) -> None:  # src/models/qwen3moe.cpp
    s = p.spec
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.attn(i, qk_norm=True)
        p.add(T.FFN_NORM, (s.n_embd,), i, kind="norm")
        p.moe(i, s.n_ff_exp or s.n_ff // s.n_expert_used)


def _gemma3(p: _Plan) -> None:  # src/models/gemma3.cpp
    s = p.spec
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.attn(i, qk_norm=True)
        p.add(T.ATTN_POST_NORM, (s.n_embd,), i, kind="norm")
        p.add(T.FFN_NORM, (s.n_embd,), i, kind="norm")
        p.ffn(i, s.n_ff)
        p.add(T.FFN_POST_NORM, (s.n_embd,), i, kind="norm")


def _deepseek2(p: _Plan) -> None:  # src/models/deepseek2.cpp (MLA, split k_b / v_b)
    s, e = p.spec, p.spec.n_embd
    rope, nope, v_dim = s.qk_rope_head_dim, s.qk_nope_head_dim, s.v_head_dim
    kv_rank, q_rank, nh = s.kv_lora_rank, s.q_lora_rank, s.n_head
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        if q_rank:
            p.add(T.ATTN_Q_A_NORM, (q_rank,), i, kind="norm")
        p.add(T.ATTN_KV_A_NORM, (kv_rank,), i, kind="norm")
        if q_rank:
            p.add(T.ATTN_Q_A, (e, q_rank), i)
            p.add(T.ATTN_Q_B, (q_rank, nh * (nope + rope)), i)
        else:
            p.add(T.ATTN_Q, (e, nh * (nope + rope)), i)
        p.add(T.ATTN_KV_A_MQA, (e, kv_rank + rope), i)
        # llama-quantize never quantizes k_b / v_b; F32 also keeps them out of the CPU AMX
        # buffer, where this llama.cpp build aborts on F16 ones (sched: cur_backend_id != -1)
        p.add(T.ATTN_K_B, (nope, kv_rank, nh), i, kind="f32")
        p.add(T.ATTN_V_B, (kv_rank, v_dim, nh), i, kind="f32")
        p.add(T.ATTN_OUT, (nh * v_dim, e), i)
        p.add(T.FFN_NORM, (e,), i, kind="norm")
        if i < s.n_layer_dense_lead:
            p.ffn(i, s.n_ff)
        else:
            p.moe(i, s.n_ff_exp)
            if s.expert_gating_func == int(gguf.ExpertGatingFuncType.SIGMOID):
                p.add(T.FFN_EXP_PROBS_B, (s.n_expert,), i, suffix="bias", kind="bias")
            p.shared_expert(i, s.n_ff_exp * s.n_expert_shared)


def _qwen3next(p: _Plan) -> None:  # src/models/qwen3next.cpp (gated delta net + gated attention)
    s, e = p.spec, p.spec.n_embd
    head_kd = head_vd = s.ssm_d_state
    n_k_heads, n_v_heads = s.ssm_n_group, s.ssm_dt_rank
    key_dim, value_dim = head_kd * n_k_heads, head_vd * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        p.add(T.ATTN_POST_NORM, (e,), i, kind="norm")
        if s.is_recurrent(i):
            p.add(T.ATTN_QKV, (e, conv_dim), i)
            p.add(T.ATTN_GATE, (e, value_dim), i)
            p.add(T.SSM_CONV1D, (s.ssm_d_conv, conv_dim), i, kind="f32")
            p.add(T.SSM_DT, (n_v_heads,), i, suffix="bias", kind="bias")
            p.add(T.SSM_A, (n_v_heads,), i, suffix=None, kind="neg")
            p.add(T.SSM_BETA_ALPHA, (e, 2 * n_v_heads), i)
            p.add(T.SSM_NORM, (head_vd,), i, kind="norm")
            p.add(T.SSM_OUT, (value_dim, e), i)
        else:
            # the query projection carries the output gate: 2 × head_dim × n_head
            p.attn(i, n_q=2 * s.head_k * s.n_head, qk_norm=True)
        p.moe(i, s.n_ff_exp)
        p.add(T.FFN_GATE_INP_SHEXP, (e,), i, kind="f32")
        p.shared_expert(i, s.n_ff_shexp or s.n_ff)


def _granitehybrid(p: _Plan) -> None:  # src/models/granite-hybrid.cpp (mamba2 + attention)
    s, e = p.spec, p.spec.n_embd
    if s.ssm_d_inner != 2 * e:
        raise ValueError("granitehybrid: llama.cpp only supports ssm_d_inner == 2 * n_embd")
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        if s.is_recurrent(i):
            p.mamba2(i)
        else:
            p.attn(i)
        p.add(T.FFN_NORM, (e,), i, kind="norm")
        if s.n_expert:
            p.moe(i, s.n_ff)
            if s.n_ff_shexp:
                p.shared_expert(i, s.n_ff_shexp)
        else:
            p.ffn(i, s.n_ff)


def _bert(p: _Plan) -> None:  # src/models/bert.cpp
    s, e = p.spec, p.spec.n_embd
    p.add(T.TOKEN_EMBD, (e, p.n_vocab), kind="embd")
    p.add(T.TOKEN_TYPES, (e, 2), kind="f32")
    p.add(T.POS_EMBD, (e, s.context_length), kind="f32")
    p.add(T.TOKEN_EMBD_NORM, (e,), kind="norm")
    p.add(T.TOKEN_EMBD_NORM, (e,), suffix="bias", kind="bias")
    for i in range(s.n_layer):
        p.attn(i, bias=True)
        p.add(T.ATTN_OUT, (e,), i, suffix="bias", kind="bias")
        p.add(T.ATTN_OUT_NORM, (e,), i, kind="norm")
        p.add(T.ATTN_OUT_NORM, (e,), i, suffix="bias", kind="bias")
        p.ffn(i, s.n_ff, gate=False, bias=True)
        p.add(T.LAYER_OUT_NORM, (e,), i, kind="norm")
        p.add(T.LAYER_OUT_NORM, (e,), i, suffix="bias", kind="bias")


def _gpt_oss(p: _Plan) -> None:  # src/models/openai-moe.cpp
    s, e, n_exp, n_ff_exp = p.spec, p.spec.n_embd, p.spec.n_expert, p.spec.n_ff_exp
    p.io(output_required=True)
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        p.add(T.ATTN_POST_NORM, (e,), i, kind="norm")
        p.attn(i, bias=True)
        p.add(T.ATTN_SINKS, (s.n_head,), i, kind="f32")
        p.moe(i, n_ff_exp)
        p.add(T.ATTN_OUT, (e,), i, suffix="bias", kind="bias")
        p.add(T.FFN_GATE_INP, (n_exp,), i, suffix="bias", kind="bias")
        p.add(T.FFN_GATE_EXP, (n_ff_exp, n_exp), i, suffix="bias", kind="bias")
        p.add(T.FFN_DOWN_EXP, (e, n_exp), i, suffix="bias", kind="bias")
        p.add(T.FFN_UP_EXP, (n_ff_exp, n_exp), i, suffix="bias", kind="bias")


def _lfm2(p: _Plan) -> None:  # src/models/lfm2.cpp (short convolutions + attention)
    s, e = p.spec, p.spec.n_embd
    p.io(output_norm=T.TOKEN_EMBD_NORM)
    for i in range(s.n_layer):
        p.add(T.FFN_NORM, (e,), i, kind="norm")
        p.ffn(i, s.n_ff)
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        if s.is_recurrent(i):
            p.add(T.SHORTCONV_CONV, (s.shortconv_l_cache, e), i, kind="f32")
            p.add(T.SHORTCONV_INPROJ, (e, 3 * e), i)
            p.add(T.SHORTCONV_OUTPROJ, (e, e), i)
        else:
            p.add(T.ATTN_Q_NORM, (s.head_k,), i, kind="norm")
            p.add(T.ATTN_K_NORM, (s.head_k,), i, kind="norm")
            p.attn(i)


def _qwen3(p: _Plan) -> None:  # src/models/qwen3.cpp: q/k norms, head_dim * n_head may != n_embd
    s = p.spec
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.attn(i, qk_norm=True)
        p.add(T.FFN_NORM, (s.n_embd,), i, kind="norm")
        p.ffn(i, s.n_ff)


def _gemma2(p: _Plan) -> None:  # src/models/gemma2.cpp: output is always token_embd
    s = p.spec
    p.add(T.TOKEN_EMBD, (s.n_embd, p.n_vocab), kind="embd")
    p.add(T.OUTPUT_NORM, (s.n_embd,), kind="norm")
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.attn(i)
        p.add(T.ATTN_POST_NORM, (s.n_embd,), i, kind="norm")
        p.add(T.FFN_NORM, (s.n_embd,), i, kind="norm")
        p.ffn(i, s.n_ff)
        p.add(T.FFN_POST_NORM, (s.n_embd,), i, kind="norm")


def _mamba2(p: _Plan) -> None:  # src/models/mamba2.cpp (every layer a mamba2 mixer)
    s = p.spec
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (s.n_embd,), i, kind="norm")
        p.mamba2(i)


def _rwkv7(p: _Plan) -> None:  # src/models/rwkv7.cpp
    s, e, n_ff = p.spec, p.spec.n_embd, p.spec.n_ff
    decay, iclr, v_mix, gate = s.rwkv_lora_ranks
    p.add(T.TOKEN_EMBD, (e, p.n_vocab), kind="embd")
    p.add(T.TOKEN_EMBD_NORM, (e,), kind="norm")
    p.add(T.TOKEN_EMBD_NORM, (e,), suffix="bias", kind="bias")
    p.add(T.OUTPUT_NORM, (e,), kind="norm")
    p.add(T.OUTPUT_NORM, (e,), suffix="bias", kind="bias")
    p.add(T.OUTPUT, (e, p.n_vocab), kind="embd")
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        p.add(T.ATTN_NORM, (e,), i, suffix="bias", kind="bias")
        p.add(T.ATTN_NORM_2, (e,), i, kind="norm")
        p.add(T.ATTN_NORM_2, (e,), i, suffix="bias", kind="bias")
        p.add(T.TIME_MIX_W0, (e,), i, kind="f32")
        p.add(T.TIME_MIX_W1, (e, decay), i)
        p.add(T.TIME_MIX_W2, (decay, e), i)
        p.add(T.TIME_MIX_A0, (e,), i, kind="f32")
        p.add(T.TIME_MIX_A1, (e, iclr), i)
        p.add(T.TIME_MIX_A2, (iclr, e), i)
        v_rank = iclr if i == 0 else v_mix  # llama.cpp sizes layer 0's (unused) v1/v2 by iclr
        p.add(T.TIME_MIX_V0, (e,), i, kind="f32")
        p.add(T.TIME_MIX_V1, (e, v_rank), i)
        p.add(T.TIME_MIX_V2, (v_rank, e), i)
        p.add(T.TIME_MIX_G1, (e, gate), i)
        p.add(T.TIME_MIX_G2, (gate, e), i)
        p.add(T.TIME_MIX_LERP_FUSED, (e, 1, 1, 6), i, kind="f32")
        p.add(T.TIME_MIX_K_K, (e,), i, kind="f32")
        p.add(T.TIME_MIX_K_A, (e,), i, kind="f32")
        p.add(T.TIME_MIX_R_K, (e,), i, kind="f32")
        p.add(T.TIME_MIX_KEY, (e, e), i)
        p.add(T.TIME_MIX_VALUE, (e, e), i)
        p.add(T.TIME_MIX_RECEPTANCE, (e, e), i)
        p.add(T.TIME_MIX_LN, (e,), i, kind="norm")
        p.add(T.TIME_MIX_LN, (e,), i, suffix="bias", kind="bias")
        p.add(T.TIME_MIX_OUTPUT, (e, e), i)
        p.add(T.CHANNEL_MIX_LERP_K, (e, 1, 1), i, kind="f32")
        p.add(T.CHANNEL_MIX_KEY, (e, n_ff), i)
        p.add(T.CHANNEL_MIX_VALUE, (n_ff, e), i)


def _nemotron_h(p: _Plan) -> None:  # src/models/nemotron-h.cpp (mamba2 / attention / MLP layers)
    s, e = p.spec, p.spec.n_embd
    p.io()
    for i in range(s.n_layer):
        p.add(T.ATTN_NORM, (e,), i, kind="norm")
        if s.is_recurrent(i):
            p.mamba2(i)
        elif s.ff(i) == 0:
            p.attn(i)
        else:  # squared-ReLU MLP: up / down only
            p.ffn(i, s.ff(i), gate=False)


LAYOUTS: dict[str, Callable[[_Plan], None]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3moe": _qwen3moe,
    "gemma3": _gemma3,
    "deepseek2": _deepseek2,
    "qwen3next": _qwen3next,
    "granitehybrid": _granitehybrid,
    "bert": _bert,
    "gpt-oss": _gpt_oss,
    "lfm2": _lfm2,
    "qwen3": _qwen3,
    "gemma2": _gemma2,
    "mamba2": _mamba2,
    "rwkv7": _rwkv7,
    "nemotron_h": _nemotron_h,
}


def plan_tensors(spec: SynthSpec, n_vocab: int) -> list[TensorPlan]:
    """The tensors llama.cpp creates for ``spec``, in llama.cpp's order."""
    try:
        layout = LAYOUTS[spec.arch]
    except KeyError:
        raise ValueError(f"no synthetic layout for arch {spec.arch!r}") from None
    p = _Plan(spec, n_vocab)
    layout(p)
    return p.items
