"""Synthetic-model factory: tiny but *real* model files for tests and benchmarks.

Every GGUF written here is meant to load in llama.cpp (``llama-server``): tensor names, shapes
and required metadata keys follow llama.cpp's ``src/models/<arch>.cpp`` (``load_arch_hparams`` /
``load_arch_tensors``), the tokenizer is one ``llama-vocab.cpp`` accepts, and the CLIP projector
follows ``tools/mtmd/clip.cpp``. Weights are small deterministic random values.

Public API:

* :class:`SynthSpec`, :data:`PRESETS` (tiny), :data:`FULL_SIZE_PRESETS` (real dimensions)
* :func:`write_gguf`, :func:`write_split`, :func:`write_mmproj` (``sparse=True`` and
  :func:`write_sparse_gguf` for full-size specs), :func:`data_bytes`
* :func:`write_hf_folder`
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from tests.synth._hf import write_hf_folder
from tests.synth._layouts import TensorPlan, arch_enum, plan_tensors
from tests.synth._mmproj import write_mmproj
from tests.synth._tokenizer import Vocab, build_vocab
from tests.synth._writer import FastGGUFWriter

__all__ = [
    "FULL_SIZE_PRESETS",
    "PRESETS",
    "SynthSpec",
    "data_bytes",
    "plan_tensors",
    "write_gguf",
    "write_hf_folder",
    "write_mmproj",
    "write_sparse_gguf",
    "write_split",
]

REALISTIC_VOCAB = 150_000

_FILE_TYPES: dict[Q, gguf.LlamaFileType] = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
}


_PURE_RECURRENT = frozenset({"mamba2", "rwkv7"})
_LAYER_NORM_ARCHS = frozenset({"bert", "rwkv7"})  # LayerNorm eps instead of RMS eps


@dataclass(frozen=True)
class SynthSpec:
    """Hyper-parameters of one synthetic model (llama.cpp's names and meanings).

    ``n_head_kv`` may be a per-layer tuple (0 marks a recurrent layer for granitehybrid and
    lfm2, exactly as their GGUFs do). ``head_dim`` sets both key and value length;
    ``key_length``/``value_length`` override it separately. Fields left at 0/None are not
    written. ``ff_layers`` writes ``feed_forward_length`` per layer (nemotron_h: a layer with
    neither KV heads nor FFN width is a mamba2 layer, one with FFN width an MLP layer).
    Pure recurrent archs (mamba2, rwkv7) use ``n_head=0`` as their GGUFs do.
    """

    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int | tuple[int, ...]
    n_vocab: int = 512
    context_length: int = 4096
    head_dim: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    rope_dim: int | None = None
    rope_freq_base: float = 10_000.0
    norm_eps: float = 1e-5
    weight_type: Q = Q.F16
    embd_type: Q | None = None  # token_embd / output; None: same as weight_type
    tied_embeddings: bool = False
    tokenizer: str = "gpt2"  # "gpt2" (BPE) | "llama" (SPM) | "bert" (WPM)
    tokenizer_pre: str | None = "default"
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_expert_shared: int = 0  # deepseek2: number of shared experts (each n_ff_exp wide)
    n_ff_shexp: int = 0  # qwen3next / granite: shared-expert FFN width
    n_layer_dense_lead: int = 0
    expert_gating_func: int | None = None  # 1 softmax, 2 sigmoid
    # sliding-window attention
    sliding_window: int = 0
    swa_pattern: int | None = None  # written only when set; arch default otherwise
    # multi-head latent attention (deepseek2)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # recurrent layers (SSM / gated delta net / short conv)
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    full_attention_interval: int = 0
    shortconv_l_cache: int = 0
    ff_layers: tuple[int, ...] = ()  # per-layer feed_forward_length (nemotron_h)
    # rwkv7 time mix
    wkv_head_size: int = 0
    rwkv_lora_ranks: tuple[int, int, int, int] = (0, 0, 0, 0)  # decay, iclr, v-mix, gate
    # embedding models
    pooling_type: int | None = None  # gguf.PoolingType value
    causal_attn: bool = True
    file_type: int | None = None  # general.file_type; None: derived from weight_type
    # "q4_k_m": the weights typed as llama-quantize's Q4_K_M (Q4_K, with Q6_K for ffn_down
    # and attn_v in its use_more_bits layers), weight_type ignored
    type_mix: str = ""
    extra_kv: tuple[tuple[str, Any], ...] = ()  # ("{arch}.logit_scale", 8.0), ...

    # --- derived values ---------------------------------------------------------------------

    @property
    def head_k(self) -> int:
        return self.key_length or self.head_dim or self.n_embd // max(self.n_head, 1)

    @property
    def head_v(self) -> int:
        return self.value_length or self.head_dim or self.n_embd // max(self.n_head, 1)

    def kv_heads(self, il: int) -> int:
        if isinstance(self.n_head_kv, tuple):
            return self.n_head_kv[il]
        return self.n_head_kv

    def ff(self, il: int) -> int:
        return self.ff_layers[il] if self.ff_layers else self.n_ff

    def is_recurrent(self, il: int) -> bool:
        if self.arch == "qwen3next":
            return (il + 1) % (self.full_attention_interval or 4) != 0
        if self.arch in ("granitehybrid", "lfm2"):
            return self.kv_heads(il) == 0
        if self.arch == "nemotron_h":
            return self.kv_heads(il) == 0 and self.ff(il) == 0
        return self.arch in _PURE_RECURRENT

    @property
    def embedding_type(self) -> Q:
        return self.embd_type if self.embd_type is not None else self.weight_type


# --- presets -----------------------------------------------------------------------------------

PRESETS: dict[str, SynthSpec] = {
    # Llama-3 style: GQA, untied output head, llama-bpe tokenizer.
    "llama": SynthSpec(
        arch="llama", name="synth-llama", n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2,
        rope_freq_base=500_000.0, tokenizer_pre="llama-bpe",
    ),
    # Qwen2 style: q/k/v biases, n_head * head_dim == n_embd.
    "qwen2": SynthSpec(
        arch="qwen2", name="synth-qwen2", n_layer=2, n_embd=64, n_ff=160, n_head=4, n_head_kv=2,
        rope_freq_base=1_000_000.0, norm_eps=1e-6, context_length=32768, tokenizer_pre="qwen2",
    ),
    # Qwen3-MoE style: head_dim * n_head != n_embd, q/k norms, 8 experts top-2.
    "qwen3moe": SynthSpec(
        arch="qwen3moe", name="synth-qwen3moe", n_layer=2, n_embd=64, n_ff=192, n_head=4,
        n_head_kv=2, head_dim=32, n_expert=8, n_expert_used=2, n_ff_exp=32,
        rope_freq_base=1_000_000.0, norm_eps=1e-6, context_length=40960, tokenizer_pre="qwen2",
    ),
    # Gemma-3 style: 5 sliding-window layers then 1 global (pattern 6), tied, SPM vocab.
    "gemma3": SynthSpec(
        arch="gemma3", name="synth-gemma3", n_layer=6, n_embd=64, n_ff=128, n_head=4,
        n_head_kv=1, head_dim=32, sliding_window=128, rope_freq_base=1_000_000.0,
        norm_eps=1e-6, context_length=32768, tied_embeddings=True, tokenizer="llama",
        tokenizer_pre=None, n_vocab=640,
    ),
    # DeepSeek-V3 style: MLA (q/kv LoRA, split k_b/v_b), 1 leading dense layer,
    # 8 routed experts top-2 + 1 shared, sigmoid gating with exp_probs_b.
    "deepseek2": SynthSpec(
        arch="deepseek2", name="synth-deepseek2", n_layer=3, n_embd=64, n_ff=128, n_head=4,
        n_head_kv=1, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
        qk_nope_head_dim=32, v_head_dim=32, n_expert=8, n_expert_used=2, n_ff_exp=32,
        n_expert_shared=1, n_layer_dense_lead=1, expert_gating_func=2, norm_eps=1e-6,
        context_length=16384, tokenizer_pre="deepseek-v3",
        extra_kv=(("{arch}.expert_weights_scale", 2.5), ("{arch}.expert_weights_norm", True)),
    ),
    # Qwen3-Next style: 3 gated-delta-net layers per full-attention layer, gated attention
    # (q carries the gate), MoE with a gated shared expert, partial rotary (1/4).
    "qwen3next": SynthSpec(
        arch="qwen3next", name="synth-qwen3next", n_layer=4, n_embd=64, n_ff=128, n_head=4,
        n_head_kv=2, head_dim=32, rope_dim=8, n_expert=8, n_expert_used=2, n_ff_exp=32,
        n_ff_shexp=32, ssm_d_conv=4, ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=4,
        ssm_d_inner=64, full_attention_interval=4, norm_eps=1e-6, context_length=65536,
        rope_freq_base=10_000_000.0, tokenizer_pre="qwen2",
    ),
    # Granite-4.0-H style: mamba2 layers with one attention layer (n_head_kv == 0 marks SSM).
    "granitehybrid": SynthSpec(
        arch="granitehybrid", name="synth-granitehybrid", n_layer=4, n_embd=64, n_ff=128,
        n_head=4, n_head_kv=(0, 0, 2, 0), ssm_d_conv=4, ssm_d_inner=128, ssm_d_state=16,
        ssm_n_group=1, ssm_dt_rank=8, context_length=131072, tied_embeddings=True,
        tokenizer_pre="refact",
        extra_kv=(
            ("{arch}.attention.scale", 0.0078125),
            ("{arch}.embedding_scale", 12.0),
            ("{arch}.residual_scale", 0.22),
            ("{arch}.logit_scale", 8.0),
            ("{arch}.rope.scaling.finetuned", False),
        ),
    ),
    # BERT/bge style embedding model: non-causal, mean pooling, WordPiece vocab.
    "bert": SynthSpec(
        arch="bert", name="synth-bert", n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=4,
        context_length=512, norm_eps=1e-12, tokenizer="bert", tokenizer_pre=None,
        pooling_type=int(gguf.PoolingType.MEAN), causal_attn=False,
    ),
    # gpt-oss style: attention sinks, alternating sliding-window layers, biased experts.
    "gpt-oss": SynthSpec(
        arch="gpt-oss", name="synth-gpt-oss", n_layer=2, n_embd=64, n_ff=32, n_head=4,
        n_head_kv=2, head_dim=16, n_expert=4, n_expert_used=2, n_ff_exp=32,
        sliding_window=128, swa_pattern=2, rope_freq_base=150_000.0,
        context_length=131072, tokenizer_pre="gpt-4o",
    ),
    # LFM2 style: short-conv layers + attention layers (n_head_kv == 0 marks conv), tied.
    "lfm2": SynthSpec(
        arch="lfm2", name="synth-lfm2", n_layer=4, n_embd=64, n_ff=128, n_head=4,
        n_head_kv=(0, 0, 2, 0), shortconv_l_cache=3, context_length=128000,
        rope_freq_base=1_000_000.0, tied_embeddings=True, tokenizer_pre="lfm2",
    ),
    # Qwen3 dense: q/k norms, head_dim 32 so n_head * head_dim (128) != n_embd (64).
    "qwen3": SynthSpec(
        arch="qwen3", name="synth-qwen3", n_layer=2, n_embd=64, n_ff=192, n_head=4,
        n_head_kv=2, head_dim=32, rope_freq_base=1_000_000.0, norm_eps=1e-6,
        context_length=40960, tokenizer_pre="qwen2",
    ),
    # Qwen3-Embedding style: the qwen3 arch with last-token pooling and tied embeddings.
    "qwen3-embed": SynthSpec(
        arch="qwen3", name="synth-qwen3-embed", n_layer=2, n_embd=64, n_ff=192, n_head=4,
        n_head_kv=2, head_dim=32, rope_freq_base=1_000_000.0, norm_eps=1e-6,
        context_length=32768, tied_embeddings=True, tokenizer_pre="qwen2",
        pooling_type=int(gguf.PoolingType.LAST),
    ),
    # Gemma-2 style: sliding window on every other layer (arch default pattern 2),
    # attention and final logit soft-capping, head_dim * n_head != n_embd, always tied.
    "gemma2": SynthSpec(
        arch="gemma2", name="synth-gemma2", n_layer=4, n_embd=64, n_ff=128, n_head=4,
        n_head_kv=2, head_dim=32, sliding_window=128, norm_eps=1e-6, context_length=8192,
        tied_embeddings=True, tokenizer="llama", tokenizer_pre=None, n_vocab=640,
        extra_kv=(
            ("{arch}.attn_logit_softcapping", 50.0),
            ("{arch}.final_logit_softcapping", 30.0),
        ),
    ),
    # Mamba-2 (Codestral-Mamba style): every layer a mamba2 mixer, no attention at all
    # (head_count 0, feed_forward_length 0, as the converter writes them).
    "mamba2": SynthSpec(
        arch="mamba2", name="synth-mamba2", n_layer=2, n_embd=64, n_ff=0, n_head=0,
        n_head_kv=0, ssm_d_conv=4, ssm_d_inner=128, ssm_d_state=16, ssm_n_group=1,
        ssm_dt_rank=8, context_length=1_048_576,
    ),
    # RWKV-7 style: time mix with LoRA'd decay / in-context LR / value mix / gate, head 32.
    "rwkv7": SynthSpec(
        arch="rwkv7", name="synth-rwkv7", n_layer=2, n_embd=64, n_ff=256, n_head=0,
        n_head_kv=0, wkv_head_size=32, rwkv_lora_ranks=(32, 32, 16, 32),
        context_length=1_048_576,
    ),
    # Nemotron-H style: pattern "M-*-" (mamba2, MLP, attention, MLP); a layer's kind comes
    # from head_count_kv and feed_forward_length, both per-layer arrays.
    "nemotron_h": SynthSpec(
        arch="nemotron_h", name="synth-nemotron-h", n_layer=4, n_embd=64, n_ff=128,
        n_head=4, n_head_kv=(0, 0, 2, 0), ff_layers=(0, 128, 0, 128), head_dim=16,
        ssm_d_conv=4, ssm_d_inner=128, ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=8,
        context_length=8192,
        extra_kv=(("{arch}.attention.layer_norm_epsilon", 1e-5),),
    ),
}  # fmt: skip


# Real models' dimensions, 4-bit weights (Q4_0; norms F32): gigabytes of tensor data, so
# write them only with ``write_gguf(..., sparse=True)`` (or :func:`write_sparse_gguf`).
FULL_SIZE_PRESETS: dict[str, SynthSpec] = {
    # Qwen3-4B: 36 dense layers, GQA 32/8, head_dim 128 (n_head * head_dim 4096 != n_embd
    # 2560), tied embeddings. ~2.1 GiB: small enough to load completely on a small machine.
    "qwen3-4b": SynthSpec(
        arch="qwen3", name="synth-qwen3-4b", n_layer=36, n_embd=2560, n_ff=9728, n_head=32,
        n_head_kv=8, head_dim=128, n_vocab=151_936, context_length=40960,
        rope_freq_base=1_000_000.0, norm_eps=1e-6, tied_embeddings=True,
        tokenizer_pre="qwen2", weight_type=Q.Q4_0,
    ),
    # Meta-Llama-3-8B: 32 layers, GQA 32/8, 128k vocabulary, untied head. ~4.2 GiB.
    "llama3-8b": SynthSpec(
        arch="llama", name="synth-llama3-8b", n_layer=32, n_embd=4096, n_ff=14336,
        n_head=32, n_head_kv=8, n_vocab=128_256, context_length=8192,
        rope_freq_base=500_000.0, tokenizer_pre="llama-bpe", weight_type=Q.Q4_0,
    ),
    # Qwen3-30B-A3B: 48 MoE layers, 128 experts (768 wide) top-8, GQA 32/4, head_dim 128.
    # ~16 GiB.
    "qwen3-30b-a3b": SynthSpec(
        arch="qwen3moe", name="synth-qwen3-30b-a3b", n_layer=48, n_embd=2048, n_ff=6144,
        n_head=32, n_head_kv=4, head_dim=128, n_expert=128, n_expert_used=8, n_ff_exp=768,
        n_vocab=151_936, context_length=40960, rope_freq_base=1_000_000.0, norm_eps=1e-6,
        tokenizer_pre="qwen2", weight_type=Q.Q4_0,
    ),
    # Gemma-3-12B: 48 layers (5 sliding-window : 1 global, window 1024), GQA 16/8,
    # head_dim 256, 262k SentencePiece vocabulary, tied embeddings (text model). ~6.2 GiB.
    "gemma3-12b": SynthSpec(
        arch="gemma3", name="synth-gemma3-12b", n_layer=48, n_embd=3840, n_ff=15360,
        n_head=16, n_head_kv=8, head_dim=256, sliding_window=1024, n_vocab=262_208,
        context_length=131072, rope_freq_base=1_000_000.0, norm_eps=1e-6,
        tied_embeddings=True, tokenizer="llama", tokenizer_pre=None, weight_type=Q.Q4_0,
        extra_kv=(("{arch}.rope.scaling.type", "linear"), ("{arch}.rope.scaling.factor", 8.0)),
    ),
}  # fmt: skip


# --- metadata ----------------------------------------------------------------------------------


def _add_kv(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, Sequence):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"unsupported metadata value for {key}: {value!r}")


def _add_general(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    w.add_type("model")
    w.add_name(spec.name)
    ftype = spec.file_type if spec.file_type is not None else int(_FILE_TYPES[spec.weight_type])
    w.add_file_type(ftype)
    if spec.weight_type not in (Q.F32, Q.F16, Q.BF16) or spec.embedding_type not in (
        Q.F32,
        Q.F16,
        Q.BF16,
    ):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_attention_kv(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    w.add_head_count(spec.n_head)
    kv = spec.n_head_kv
    if spec.n_head or kv:  # pure recurrent GGUFs carry head_count = 0 and no head_count_kv
        w.add_head_count_kv(list(kv) if isinstance(kv, tuple) else kv)
    if spec.arch == "deepseek2":  # MLA is stored as MQA over the compressed latent
        w.add_q_lora_rank(spec.q_lora_rank)
        w.add_kv_lora_rank(spec.kv_lora_rank)
        w.add_key_length(spec.kv_lora_rank + spec.qk_rope_head_dim)
        w.add_value_length(spec.kv_lora_rank)
        w.add_key_length_mla(spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        w.add_value_length_mla(spec.v_head_dim)
        w.add_rope_dimension_count(spec.qk_rope_head_dim)
    else:
        if spec.head_dim or spec.key_length:
            w.add_key_length(spec.head_k)
        if spec.head_dim or spec.value_length:
            w.add_value_length(spec.head_v)
        if spec.rope_dim:
            w.add_rope_dimension_count(spec.rope_dim)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    if spec.swa_pattern is not None:
        w.add_sliding_window_pattern(spec.swa_pattern)
    if not spec.causal_attn:
        w.add_causal_attention(False)


def _add_moe_kv(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    if not spec.n_expert:
        return
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    if spec.n_ff_exp:
        w.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.arch == "deepseek2":
        w.add_expert_shared_count(spec.n_expert_shared)
    if spec.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(spec.n_ff_shexp)
    if spec.n_layer_dense_lead:
        w.add_leading_dense_block_count(spec.n_layer_dense_lead)
    if spec.expert_gating_func is not None:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(spec.expert_gating_func))


def _add_recurrent_kv(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    if spec.ssm_d_inner:
        w.add_ssm_conv_kernel(spec.ssm_d_conv)
        w.add_ssm_inner_size(spec.ssm_d_inner)
        w.add_ssm_state_size(spec.ssm_d_state)
        w.add_ssm_time_step_rank(spec.ssm_dt_rank)
        w.add_ssm_group_count(spec.ssm_n_group)
    if spec.full_attention_interval:
        w.add_full_attention_interval(spec.full_attention_interval)
    if spec.shortconv_l_cache:
        w.add_shortconv_l_cache(spec.shortconv_l_cache)
    if spec.wkv_head_size:
        decay, iclr, v_mix, gate = spec.rwkv_lora_ranks
        w.add_wkv_head_size(spec.wkv_head_size)
        w.add_decay_lora_rank(decay)
        w.add_iclr_lora_rank(iclr)
        w.add_value_residual_mix_lora_rank(v_mix)
        w.add_gate_lora_rank(gate)


def _add_hparams(w: gguf.GGUFWriter, spec: SynthSpec, n_vocab: int) -> None:
    w.add_vocab_size(n_vocab)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(list(spec.ff_layers) if spec.ff_layers else spec.n_ff)
    if spec.n_head:
        w.add_rope_freq_base(spec.rope_freq_base)
    if spec.arch in _LAYER_NORM_ARCHS:
        w.add_layer_norm_eps(spec.norm_eps)
    else:
        w.add_layer_norm_rms_eps(spec.norm_eps)
    _add_attention_kv(w, spec)
    _add_moe_kv(w, spec)
    _add_recurrent_kv(w, spec)
    if spec.pooling_type is not None:
        w.add_pooling_type(gguf.PoolingType(spec.pooling_type))
    for key, value in spec.extra_kv:
        _add_kv(w, key.format(arch=spec.arch), value)


_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _add_tokenizer(w: gguf.GGUFWriter, vocab: Vocab, *, realistic: bool) -> None:
    w.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    if vocab.scores is not None:
        w.add_token_scores(vocab.scores)
    if vocab.merges is not None:
        w.add_token_merges(vocab.merges)
    if vocab.token_type_count is not None:
        w.add_token_type_count(vocab.token_type_count)
    adders = {
        "bos": w.add_bos_token_id,
        "eos": w.add_eos_token_id,
        "unk": w.add_unk_token_id,
        "sep": w.add_sep_token_id,
        "pad": w.add_pad_token_id,
        "mask": w.add_mask_token_id,
    }
    for kind, tid in vocab.special_ids:
        adders[kind](tid)
    if vocab.add_bos is not None:
        w.add_add_bos_token(vocab.add_bos)
    if vocab.add_eos is not None:
        w.add_add_eos_token(vocab.add_eos)
    if realistic and vocab.model == "gpt2":
        w.add_chat_template(_CHAT_TEMPLATE)


# --- tensor data -------------------------------------------------------------------------------

_F32_KINDS = ("norm", "bias", "f32", "neg")


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _q4_k_m(name: str, n_layer: int) -> Q:
    """llama-quantize's Q4_K_M choice for a layer weight (llama-quant.cpp: use_more_bits)."""
    parts = name.split(".", 2)
    if parts[0] == "blk" and parts[2].startswith(("ffn_down", "attn_v")):
        il = int(parts[1])
        n8 = n_layer // 8
        if il < n8 or il >= 7 * n_layer // 8 or (il - n8) % 3 == 2:
            return Q.Q6_K
    return Q.Q4_K


def _tensor_type(t: TensorPlan, spec: SynthSpec) -> Q:
    if t.kind in _F32_KINDS:
        return Q.F32
    qtype = spec.embedding_type if t.kind == "embd" else spec.weight_type
    if spec.type_mix == "q4_k_m" and t.kind != "embd":
        qtype = _q4_k_m(t.name, spec.n_layer)
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if t.ne[0] % block != 0:  # llama-quantize falls back the same way for odd rows
        return Q.F16
    return qtype


def _tensor_data(t: TensorPlan, spec: SynthSpec) -> tuple[np.ndarray, Q]:
    shape = tuple(reversed(t.ne))  # numpy order: outermost first
    if t.kind == "norm":
        return np.ones(shape, dtype=np.float32), Q.F32
    if t.kind == "bias":
        return np.zeros(shape, dtype=np.float32), Q.F32
    if t.kind == "neg":
        return np.full(shape, -1.0, dtype=np.float32), Q.F32
    rng = np.random.default_rng(_seed(t.name))
    data = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    qtype = _tensor_type(t, spec)
    if qtype == Q.F32:
        return data, qtype
    if qtype == Q.F16:
        return data.astype(np.float16), qtype
    return gguf.quants.quantize(data, qtype), qtype


def _n_tokens(spec: SynthSpec, vocab: int | None, realistic: bool) -> int:
    if vocab is not None:
        return vocab
    return REALISTIC_VOCAB if realistic else spec.n_vocab


def _effective_spec(spec: SynthSpec, realistic: bool) -> SynthSpec:
    # A realistic vocabulary makes the embedding matrices dominate; store them 4-bit as
    # quantized releases do, which keeps the file around ten megabytes.
    if realistic and spec.embd_type is None and spec.n_embd % 32 == 0:
        return replace(spec, embd_type=Q.Q4_0)
    return spec


def _tensor_nbytes(ne: Sequence[int], qtype: Q) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n = 1
    for d in ne:
        n *= d
    return n // block * type_size


def data_bytes(spec: SynthSpec, *, vocab: int | None = None) -> int:
    """Bytes of tensor data a GGUF of ``spec`` holds (each tensor padded to 32 bytes)."""
    plans = plan_tensors(spec, vocab if vocab is not None else spec.n_vocab)
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    return sum(-(-_tensor_nbytes(t.ne, _tensor_type(t, spec)) // align) * align for t in plans)


# constant tensors whose value matters (norm weights 1, SSM A -1) are written even in a
# sparse file; everything else there is a hole that reads as zeros
_SPARSE_WRITTEN_KINDS = ("norm", "neg")


def _fill_writer(
    w: FastGGUFWriter,
    spec: SynthSpec,
    *,
    vocab: int | None,
    realistic: bool,
    shard_sizes: Sequence[int] | None = None,
    sparse: bool = False,
) -> list[tuple[TensorPlan, Q]]:
    arch_enum(spec.arch)  # validates the arch string
    n_tokens = _n_tokens(spec, vocab, realistic)
    spec = _effective_spec(spec, realistic)
    _add_general(w, spec)
    _add_hparams(w, spec, n_tokens)
    _add_tokenizer(
        w,
        build_vocab(spec.tokenizer, n_tokens, pre=spec.tokenizer_pre, seed=_seed(spec.name)),
        realistic=realistic,
    )
    plans = plan_tensors(spec, n_tokens)
    boundaries: set[int] = set()
    if shard_sizes is not None:
        acc = 0
        for size in shard_sizes[:-1]:
            acc += size
            boundaries.add(acc)
    typed: list[tuple[TensorPlan, Q]] = []
    for idx, t in enumerate(plans):
        if shard_sizes is not None:
            # GGUFWriter starts a new shard when the current one holds split_max_tensors
            w.split_max_tensors = 1 if idx in boundaries else len(plans) + 1
        if sparse:
            qtype = _tensor_type(t, spec)
            # numpy order, element shape: a non-uint8 dtype keeps the shape as given
            shape = tuple(reversed(t.ne))
            w.add_tensor_info(
                t.name, shape, np.dtype(np.float32), _tensor_nbytes(t.ne, qtype), raw_dtype=qtype
            )
            typed.append((t, qtype))
            continue
        data, qtype = _tensor_data(t, spec)
        raw = qtype if qtype not in (Q.F32, Q.F16) else None
        w.add_tensor(t.name, data, raw_dtype=raw)
    return typed


def _finish(w: FastGGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _finish_sparse(w: FastGGUFWriter, typed: list[tuple[TensorPlan, Q]], spec: SynthSpec) -> None:
    """Write header, metadata and tensor table; size each file to its full length with a hole.

    ``truncate`` past the end leaves the data region unallocated on file systems with sparse
    files (ext4, xfs, btrfs, tmpfs, APFS): the logical size is the real model's, the blocks on
    disk are only the header's plus the few constant tensors written into the hole.
    """
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    align = w.data_alignment
    it = iter(typed)
    for fout, tensors in zip(w.fout, w.tensors, strict=True):
        start = gguf.GGUFWriter.ggml_pad(fout.tell(), align)
        offset = start
        for ti in tensors.values():
            t, qtype = next(it)
            if t.kind in _SPARSE_WRITTEN_KINDS:
                data, dtype = _tensor_data(t, spec)
                assert dtype == qtype == Q.F32 and data.nbytes == ti.nbytes
                fout.seek(offset)
                fout.write(data.tobytes())
            offset += gguf.GGUFWriter.ggml_pad(ti.nbytes, align)
        fout.truncate(offset)
    w.close()


_MAX_DENSE_BYTES = 2 * 1024**3


def _check_dense_size(spec: SynthSpec, vocab: int | None, sparse: bool) -> None:
    if not sparse and data_bytes(spec, vocab=vocab) > _MAX_DENSE_BYTES:
        raise ValueError(
            f"{spec.name}: {data_bytes(spec, vocab=vocab) / 1024**3:.1f} GiB of weights; "
            "write it with sparse=True"
        )


# --- public writers ----------------------------------------------------------------------------


def write_gguf(
    path: str | Path,
    spec: SynthSpec,
    *,
    vocab: int | None = None,
    realistic_tokenizer: bool = False,
    sparse: bool = False,
) -> Path:
    """Write one GGUF for ``spec`` and return its path.

    ``vocab`` overrides the number of tokens (and so the embedding rows).
    ``realistic_tokenizer`` writes a large vocabulary (``vocab`` or 150,000 tokens of ~4–12
    bytes, with as many merges) plus a chat template, the way real releases look to a header
    reader; the embedding matrices are then stored Q4_0 unless ``spec.embd_type`` says otherwise.
    ``sparse`` writes the header and tensor table only and extends the file to its full size
    with a hole (norm weights excepted), so full-size specs (:data:`FULL_SIZE_PRESETS`) cost
    gigabytes of logical size but megabytes on disk; their weights read as zeros. Without it,
    specs with more than 2 GiB of weights are refused.
    """
    path = Path(path)
    _check_dense_size(spec, _n_tokens(spec, vocab, realistic_tokenizer), sparse)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = FastGGUFWriter(path, spec.arch)
    typed = _fill_writer(w, spec, vocab=vocab, realistic=realistic_tokenizer, sparse=sparse)
    if sparse:
        _finish_sparse(w, typed, _effective_spec(spec, realistic_tokenizer))
    else:
        _finish(w)
    return path


def write_sparse_gguf(path: str | Path, spec: SynthSpec, *, vocab: int | None = None) -> Path:
    """``write_gguf(path, spec, vocab=vocab, sparse=True)``."""
    return write_gguf(path, spec, vocab=vocab, sparse=True)


def write_split(
    dir: str | Path, spec: SynthSpec, *, n_shards: int, sparse: bool = False
) -> list[Path]:
    """Write ``spec`` as a split set ``<name>-0000K-of-0000N.gguf`` in ``dir``.

    Like llama.cpp's ``gguf-split``: the first shard holds all metadata, every shard holds
    ``split.no`` (u16), ``split.count`` (u16) and ``split.tensors.count`` (i32), and tensors
    are divided in order, as evenly as possible. ``sparse`` as for :func:`write_gguf`.
    """
    if n_shards < 2:
        raise ValueError("a split set needs at least 2 shards")
    n_tensors = len(plan_tensors(spec, spec.n_vocab))
    if n_shards > n_tensors:
        raise ValueError(f"{spec.name} has only {n_tensors} tensors")
    _check_dense_size(spec, None, sparse)
    base, extra = divmod(n_tensors, n_shards)
    sizes = [base + (1 if k < extra else 0) for k in range(n_shards)]
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    w = FastGGUFWriter(out / f"{spec.name}.gguf", spec.arch, split_max_tensors=n_tensors + 1)
    typed = _fill_writer(w, spec, vocab=None, realistic=False, shard_sizes=sizes, sparse=sparse)
    paths = w.format_shard_names(out / f"{spec.name}.gguf")
    if len(paths) != n_shards:
        raise AssertionError(f"expected {n_shards} shards, writer planned {len(paths)}")
    if sparse:
        _finish_sparse(w, typed, spec)
    else:
        _finish(w)
    return paths
