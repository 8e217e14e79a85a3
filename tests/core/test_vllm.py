"""vLLM sizing: each rule pinned against a worked example computed by hand from the rules.

Units: KIB/MIB/GIB are binary. The "Llama-8B-like" model used throughout has 32 layers,
8 KV heads of 128 dims, 16-bit KV: per token 32 × 2 × 8 × 128 × 2 B = 131072 B = 128 KiB.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui.core.errors import SizingError
from qmgui.core.meta import MlaDims, ModelClass, ModelMeta, RwkvDims, SsmDims
from qmgui.core.units import GIB, KIB, MIB
from qmgui.core.vllm import (
    CTX_ROUND,
    FALLBACK_MAX_MODEL_LEN,
    FP8_DS_MLA_TOKEN_BYTES,
    KV_MARGIN_BYTES,
    MIN_MAX_MODEL_LEN,
    OVERHEAD_BYTES,
    VllmPins,
    VllmPlan,
    budget_per_gpu,
    plan_vllm,
    tool_call_parser,
    vllm_preferred,
    with_kv_margin,
)


def meta(
    *,
    fmt: str = "hf",
    arch: str = "LlamaForCausalLM",
    name: str = "Llama-3.1-8B-Instruct",
    n_layer: int = 32,
    n_head: int = 32,
    n_kv: int | tuple[int, ...] = 8,
    head_dim: int | None = 128,
    weights: int = 15 * GIB,
    ctx: int | None = 131072,
    **kw: object,
) -> ModelMeta:
    kv = n_kv if isinstance(n_kv, tuple) else (n_kv,) * n_layer
    return ModelMeta(
        format=fmt,
        architecture=arch,
        name=name,
        model_class=ModelClass.LLM,
        quant="BF16",
        param_count=None,
        weight_bytes=weights,
        context_length=ctx,
        n_layer=n_layer,
        n_embd=4096,
        n_head=(n_head,) * n_layer,
        n_head_kv=kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        **kw,  # type: ignore[arg-type]
    )


def arg(plan: VllmPlan, flag: str) -> str | None:
    """The value after `flag` in the argument list, None when the flag is absent."""
    if flag not in plan.args:
        return None
    return plan.args[plan.args.index(flag) + 1]


def plan(m: ModelMeta, **kw: object) -> VllmPlan:
    kw.setdefault("gpu_total_bytes", 24 * GIB)
    kw.setdefault("budget_bytes", 20 * GIB)
    return plan_vllm(m, **kw)  # type: ignore[arg-type]


# --- the full worked example ------------------------------------------------------------------


def test_budget_derived_launch_worked_example() -> None:
    # 24 GiB card, 20 GiB budget: share = min(20, 0.95 × 24 = 22.8) = 20 GiB.
    # KV left = 20 − 15 (weights) − 1.5 (reserve) = 3.5 GiB.
    # The pool is pinned, so KV + margin must fit: KV ≤ (3.5 − 0.25) GiB × 10/11.
    # In tokens: 3.25 GiB / 128 KiB = 26624; × 10/11 = 24203.6 → 24203 → multiple of 4096: 20480.
    p = plan(meta())
    assert p.fits and p.reason is None
    assert p.max_model_len == 20480
    # KV = 20480 × 128 KiB = 2.5 GiB; pool = 2.5 × 1.10 + 0.25 = 3.0 GiB exactly
    assert p.breakdown is not None
    assert p.breakdown.kv.nbytes == 5 * GIB // 2
    assert p.kv_cache_memory_bytes == 3 * GIB
    # footprint = 15 + 3 + 1.5 = 19.5 GiB (inside the 20 GiB budget)
    assert p.breakdown.footprint.nbytes == 39 * GIB // 2
    # utilization = 19.5 / 24 = 81.25 % → rounded UP to 0.82
    assert p.gpu_memory_utilization == 0.82
    # router charge = 0.82 × 24 GiB = 21131239096.32 B → 21131239097
    assert p.charge_bytes == 21131239097 == math.ceil(24 * GIB * 82 / 100)
    assert p.charge_total_bytes == p.charge_bytes
    assert p.args == (
        "--max-model-len",
        "20480",
        "--gpu-memory-utilization",
        "0.82",
        "--kv-cache-memory-bytes",
        str(3 * GIB),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "llama3_json",
    )
    assert p.breakdown.overhead.nbytes == OVERHEAD_BYTES == 3 * GIB // 2
    assert p.breakdown.budget is not None and p.breakdown.budget.nbytes == 20 * GIB
    assert all(t.source for t in (p.breakdown.weights, p.breakdown.kv_per_token))


# --- per-token KV ------------------------------------------------------------------------------


def _per_token(p: VllmPlan) -> int:
    assert p.breakdown is not None
    return p.breakdown.kv_per_token.nbytes


def test_kv_per_token_dense() -> None:
    # 32 layers × 2 (K, V) × 8 heads × 128 × 2 B = 131072
    assert _per_token(plan(meta())) == 131072 == 128 * KIB


def test_kv_heads_split_over_tensor_parallel_ranks() -> None:
    # 70B-like: 80 layers, 8 KV heads, 140 GiB of weights.
    m = meta(n_layer=80, n_head=64, weights=140 * GIB)
    # tp 2: 4 heads per rank → 80 × 2 × 4 × 128 × 2 = 163840 B; weights 70 GiB per GPU
    p = plan(m, tensor_parallel=2, budget_bytes=None, gpu_total_bytes=80 * GIB)
    assert _per_token(p) == 163840
    assert p.breakdown is not None and p.breakdown.weights.nbytes == 70 * GIB
    assert arg(p, "--tensor-parallel-size") == "2"
    # tp 16 > 8 heads: vLLM replicates, max(1, 8 // 16) = 1 head → 80 × 2 × 1 × 128 × 2 = 40960
    m16 = meta(n_layer=80, n_head=64, weights=140 * GIB)
    assert _per_token(plan(m16, tensor_parallel=16)) == 40960
    # the router charges each of the GPUs
    assert p.charge_total_bytes == 2 * p.charge_bytes


def test_mla_caches_one_latent_not_split_by_tp() -> None:
    # DeepSeek-V3-like: 61 layers, latent 512 + rope 64 = 576 elements × 2 B = 1152 B per layer
    # → 61 × 1152 = 70272 B per token; ×1 (no separate V) and the same on every rank.
    mla = MlaDims(
        kv_lora_rank=512, q_lora_rank=1536, rope_dim=64, key_length_mla=192, value_length_mla=128
    )
    m = meta(arch="DeepseekV3ForCausalLM", n_layer=61, n_head=128, n_kv=128, mla=mla)
    assert _per_token(plan(m)) == 70272
    assert _per_token(plan(m, tensor_parallel=8)) == 70272
    # fp8_ds_mla stores 656 B per token and layer: 61 × 656 = 40016
    p = plan(m, pins=VllmPins(kv_cache_dtype="fp8_ds_mla"))
    assert _per_token(p) == 61 * FP8_DS_MLA_TOKEN_BYTES == 40016


def test_kv_cache_dtype() -> None:
    # fp8: 1 byte → half of 128 KiB; --dtype float32 with kv auto → 4 bytes → 256 KiB
    assert _per_token(plan(meta(), pins=VllmPins(kv_cache_dtype="fp8"))) == 64 * KIB
    assert _per_token(plan(meta(), pins=VllmPins(dtype="float32"))) == 256 * KIB
    assert _per_token(plan(meta(), pins=VllmPins(dtype="float32", kv_cache_dtype="fp8_e5m2"))) == (
        64 * KIB
    )
    p = plan(meta(), pins=VllmPins(kv_cache_dtype="fp8", dtype="bfloat16"))
    assert arg(p, "--kv-cache-dtype") == "fp8"
    assert arg(p, "--dtype") == "bfloat16"
    # "auto" is vLLM's default: not repeated on the command line
    p = plan(meta(), pins=VllmPins(kv_cache_dtype="auto", dtype="auto"))
    assert "--kv-cache-dtype" not in p.args and "--dtype" not in p.args


def _gemma_like(fmt: str) -> ModelMeta:
    # 6 layers, 4 KV heads of 256: per layer 4 × (256 + 256) × 2 B = 4096 B per token;
    # layers 0-4 slide over 1024 tokens, layer 5 is global.
    return meta(
        fmt=fmt,
        arch="gemma3" if fmt == "gguf" else "Gemma3ForCausalLM",
        n_layer=6,
        n_head=8,
        n_kv=4,
        head_dim=256,
        weights=2 * GIB,
        ctx=32768,
        sliding_window=1024,
        swa_layers=(True, True, True, True, True, False),
    )


def test_sliding_window_layers_gguf_capped_at_the_window() -> None:
    # GGUF: full 1 × 4096 B/token; sliding 5 × 4096 = 20480 B/token up to 1024 tokens.
    # At 8192 tokens: 4096 × 8192 + 20480 × 1024 = 32 MiB + 20 MiB = 52 MiB.
    p = plan(_gemma_like("gguf"), pins=VllmPins(max_model_len=8192))
    assert p.breakdown is not None
    assert p.breakdown.kv_per_token.nbytes == 4096
    assert p.breakdown.swa_per_token.nbytes == 20480
    assert p.breakdown.swa_window == 1024
    assert p.breakdown.kv.nbytes == 52 * MIB
    # under the window every layer costs per token: 512 tokens × 6 × 4096 = 12 MiB
    p = plan(_gemma_like("gguf"), pins=VllmPins(max_model_len=512))
    assert p.breakdown is not None and p.breakdown.kv.nbytes == 12 * MIB


def test_sliding_window_layers_hf_charged_as_full_attention() -> None:
    # config.json is ambiguous: all 6 layers charged per token, 6 × 4096 × 8192 = 192 MiB
    p = plan(_gemma_like("hf"), pins=VllmPins(max_model_len=8192))
    assert p.breakdown is not None
    assert p.breakdown.kv_per_token.nbytes == 24576
    assert p.breakdown.swa_per_token.nbytes == 0
    assert p.breakdown.kv.nbytes == 192 * MIB
    assert any("sliding-window layers charged as full attention" in n for n in p.notes)


def test_pinned_pool_sizes_the_context_through_the_window() -> None:
    # pool 52 MiB: (52 − 20 MiB of window) / 4096 B = 8192 tokens (a multiple of 4096)
    p = plan(_gemma_like("gguf"), pins=VllmPins(kv_cache_memory_bytes=52 * MIB))
    assert p.max_model_len == 8192
    assert p.kv_cache_memory_bytes == 52 * MIB
    assert p.fits


def test_hybrid_recurrent_layers_cost_no_kv_and_a_fixed_state() -> None:
    # Qwen3-Next-like GGUF: 8 layers, attention on layers 3 and 7 (2 KV heads of 256), the rest
    # gated-delta-net with conv 4, inner 4096, state 128, groups 16.
    # per token: 2 layers × 2 heads × 512 × 2 B = 4096 B
    # state per layer: 3 × (4096 + 2 × 16 × 128) + 128 × 4096 = 24576 + 524288 = 548864 elements
    # × 4 B (f32) = 2195456 B; × 6 recurrent layers = 13172736 B per sequence
    ssm = SsmDims(conv_kernel=4, inner_size=4096, state_size=128, group_count=16, time_step_rank=32)
    m = meta(
        fmt="gguf",
        arch="qwen3next",
        n_layer=8,
        n_head=16,
        n_kv=(0, 0, 0, 2, 0, 0, 0, 2),
        head_dim=256,
        ssm=ssm,
        recurrent_layers=(True, True, True, False, True, True, True, False),
    )
    p = plan(m, pins=VllmPins(max_model_len=4096))
    assert p.breakdown is not None
    assert p.breakdown.kv_per_token.nbytes == 4096
    assert p.breakdown.state.nbytes == 13172736
    assert p.breakdown.attention_layers == 2
    assert p.breakdown.recurrent_layers == 6
    # one 4096-token sequence: 4096 × 4096 + 13172736 = 29949952
    assert p.breakdown.kv.nbytes == 29949952
    assert arg(p, "--tool-call-parser") == "hermes"


def test_recurrent_state_shapes_rwkv_and_shortconv() -> None:
    # RWKV: n_embd × (token_shift 2 + head_size 64) = 4096 × 66 elements × 4 B × 4 layers
    rwkv = meta(
        fmt="gguf",
        arch="rwkv7",
        n_layer=4,
        n_kv=0,
        rwkv=RwkvDims(head_size=64, token_shift_count=2),
        recurrent_layers=(True,) * 4,
    )
    p = plan(rwkv, pins=VllmPins(max_model_len=4096))
    assert p.breakdown is not None
    assert p.breakdown.state.nbytes == 4096 * 66 * 4 * 4
    assert p.breakdown.kv_per_token.nbytes == 0
    # LFM2 short conv: n_embd × (l_cache 3 − 1) elements × 4 B, one layer
    lfm = meta(
        fmt="gguf",
        arch="lfm2",
        n_layer=2,
        n_kv=(0, 8),
        shortconv_l_cache=3,
        recurrent_layers=(True, False),
    )
    p = plan(lfm, pins=VllmPins(max_model_len=4096))
    assert p.breakdown is not None and p.breakdown.state.nbytes == 4096 * 2 * 4


def test_recurrent_layers_without_dimensions_are_noted() -> None:
    m = meta(n_layer=4, n_kv=(0, 0, 0, 8), recurrent_layers=(True, True, True, False))
    p = plan(m)
    assert p.breakdown is not None and p.breakdown.state.nbytes == 0
    assert any("state not counted" in n for n in p.notes)


def test_pure_recurrent_model_context_costs_nothing() -> None:
    # no attention KV at all: memory does not bound the context → trained context
    m = meta(
        fmt="gguf",
        arch="rwkv7",
        n_layer=4,
        n_kv=0,
        ctx=1_000_000,
        rwkv=RwkvDims(head_size=64, token_shift_count=2),
        recurrent_layers=(True,) * 4,
    )
    assert plan(m).max_model_len == 1_000_000
    assert plan(replace(m, context_length=None)).max_model_len == FALLBACK_MAX_MODEL_LEN


def test_shared_kv_layers_cost_nothing() -> None:
    # Gemma 3n-like: the last 2 of 4 layers reuse earlier KV → 2 × 2 × 8 × 128 × 2 = 8192 B
    m = meta(n_layer=4, shared_kv_layers=2)
    assert _per_token(plan(m)) == 8192


# --- max-model-len -----------------------------------------------------------------------------


def test_context_capped_at_trained_length_without_rounding() -> None:
    # trained 40000 (not a multiple of 4096): an 80 GiB card leaves room for far more, so the
    # trained context wins, unrounded
    p = plan(meta(ctx=40000), gpu_total_bytes=80 * GIB, budget_bytes=80 * GIB)
    assert p.max_model_len == 40000
    assert any("trained context" in n for n in p.notes)


def test_derived_context_is_a_multiple_of_4096() -> None:
    for budget in range(18, 24):
        p = plan(meta(), budget_bytes=budget * GIB)
        if p.fits and p.max_model_len < 131072:
            assert p.max_model_len % CTX_ROUND == 0


def test_short_trained_context_fits_below_4096() -> None:
    # trained 2048: the floor is the whole trained context. Budget 17.1 GiB leaves 0.6 GiB;
    # (0.6 − 0.25) × 10/11 GiB / 128 KiB = 2606 tokens ≥ 2048, so the trained context fits
    p = plan(meta(ctx=2048), budget_bytes=int(17.1 * GIB))
    assert p.fits and p.max_model_len == 2048


def test_no_kv_cost_model_uses_the_conservative_default() -> None:
    p = plan(meta(head_dim=None, ctx=131072))
    assert p.max_model_len == FALLBACK_MAX_MODEL_LEN == 32768
    assert p.kv_cache_memory_bytes is None  # nothing to size a pool from
    assert "--kv-cache-memory-bytes" not in p.args
    # footprint = the share (20 GiB) → 20 / 24 = 83.3 % → 0.84
    assert p.gpu_memory_utilization == 0.84
    assert plan(meta(head_dim=None, ctx=8192)).max_model_len == 8192


def test_no_budget_and_no_card() -> None:
    # nothing to size against: trained context capped at 32768, utilization the flat 0.90,
    # and the router charged the footprint: 15 GiB + pool + 1.5 GiB
    # pool = 32768 × 128 KiB = 4 GiB → 4.4 + 0.25 = 4.65 GiB
    p = plan(meta(), gpu_total_bytes=None, budget_bytes=None)
    assert p.max_model_len == 32768
    assert p.gpu_memory_utilization == 0.9
    assert p.kv_cache_memory_bytes == with_kv_margin(4 * GIB) == math.ceil(4.4 * GIB) + GIB // 4
    assert p.charge_bytes == 15 * GIB + p.kv_cache_memory_bytes + OVERHEAD_BYTES
    assert p.fits


def test_budget_without_card_reading() -> None:
    # same budget arithmetic as the worked example, but the utilization falls back to 0.90
    p = plan(meta(), gpu_total_bytes=None)
    assert p.max_model_len == 20480
    assert p.gpu_memory_utilization == 0.9
    assert arg(p, "--gpu-memory-utilization") == "0.9"
    assert p.charge_bytes == 39 * GIB // 2  # the footprint, with no card to take 0.90 of


def test_no_budget_uses_the_cards_ceiling() -> None:
    # budget None on a 24 GiB card: share = 0.95 × 24 GiB = 24481313587 B
    p = plan(meta(), budget_bytes=None)
    assert p.breakdown is not None and p.breakdown.budget is not None
    assert p.breakdown.budget.nbytes == 24 * GIB * 95 // 100
    # KV allowance = (22.8 − 15 − 1.5 − 0.25) GiB × 10/11 → 6.05 × 8192 × 10/11 = 45056 tokens
    # (just under: 45055) → 40960
    assert p.max_model_len == 40960


# --- utilization -------------------------------------------------------------------------------


def test_utilization_floor_and_its_charge() -> None:
    # 1 GiB model, trained 4096, 80 GiB card: KV 0.5 GiB → pool 0.8 GiB; footprint 3.3 GiB
    # → 4.125 % → 5 % → clamped up to 0.10; the router charges 0.10 × 80 GiB = 8 GiB
    m = meta(weights=GIB, ctx=4096)
    p = plan(m, gpu_total_bytes=80 * GIB, budget_bytes=80 * GIB)
    assert p.gpu_memory_utilization == 0.1
    assert arg(p, "--gpu-memory-utilization") == "0.1"
    assert p.charge_bytes == 8 * GIB


def test_utilization_ceiling_and_not_fitting() -> None:
    # pinned 3 GiB pool, 20 GiB weights, 24 GiB card, no budget: need 20 + 3 + 1.5 = 24.5 GiB
    # > share 22.8 GiB → does not fit; 24.5 / 24 = 102.1 % → clamped to 0.95
    m = meta(weights=20 * GIB)
    p = plan(m, budget_bytes=None, pins=VllmPins(kv_cache_memory_bytes=3 * GIB))
    assert p.gpu_memory_utilization == 0.95
    assert not p.fits and p.reason is not None and "budget allows" in p.reason


# --- pins --------------------------------------------------------------------------------------


def test_pins_win_over_every_derived_value() -> None:
    pins = VllmPins(
        max_model_len=8192,
        gpu_memory_utilization=0.5,
        kv_cache_memory_bytes=2 * GIB,
        tensor_parallel_size=2,
        dtype="float16",
    )
    p = plan(meta(), tensor_parallel=4, pins=pins)
    assert p.max_model_len == 8192
    assert p.gpu_memory_utilization == 0.5
    assert p.kv_cache_memory_bytes == 2 * GIB
    assert p.tensor_parallel == 2
    assert arg(p, "--max-model-len") == "8192"
    assert arg(p, "--gpu-memory-utilization") == "0.5"
    assert arg(p, "--kv-cache-memory-bytes") == str(2 * GIB)
    assert arg(p, "--tensor-parallel-size") == "2"
    assert arg(p, "--dtype") == "float16"
    # charged what vLLM takes: 0.5 × 24 GiB
    assert p.charge_bytes == 12 * GIB


def test_pinned_utilization_drops_the_pool_pin() -> None:
    # fill-the-share semantics: no --kv-cache-memory-bytes; the context is sized on the pinned
    # share 0.8 × 24 = 19.2 GiB with no margin: (19.2 − 15 − 1.5) GiB / 128 KiB = 2.7 × 8192
    # = 22118.4 → 22118 → 20480
    p = plan(meta(), budget_bytes=None, pins=VllmPins(gpu_memory_utilization=0.8))
    assert p.kv_cache_memory_bytes is None
    assert "--kv-cache-memory-bytes" not in p.args
    assert p.max_model_len == 20480
    assert p.charge_bytes == -(-24 * GIB * 8 // 10)  # ceil(0.8 × 24 GiB)


def test_pinned_context_too_long_does_not_fit() -> None:
    # 65536 × 128 KiB = 8 GiB KV → pool 9.05 GiB; 15 + 9.05 + 1.5 = 25.55 GiB > 20 GiB budget
    p = plan(meta(), pins=VllmPins(max_model_len=65536))
    assert p.max_model_len == 65536  # the pin stands
    assert not p.fits
    assert p.reason is not None and "max-model-len 65536 needs" in p.reason


def test_pinned_pool_too_small_for_the_pinned_context() -> None:
    # 8192 tokens need 1 GiB of KV; a 0.5 GiB pool is refused by vLLM at start-up
    p = plan(meta(), pins=VllmPins(max_model_len=8192, kv_cache_memory_bytes=GIB // 2))
    assert not p.fits
    assert p.reason is not None and "refuses to start" in p.reason


def test_pinned_pool_too_small_for_any_context() -> None:
    # 0.25 GiB = 2048 tokens of KV < the 4096 floor
    p = plan(meta(), pins=VllmPins(kv_cache_memory_bytes=GIB // 4))
    assert not p.fits and p.max_model_len == MIN_MAX_MODEL_LEN
    assert p.reason is not None and "2048 tokens" in p.reason


def test_pinned_context_beyond_training_is_noted() -> None:
    p = plan(meta(ctx=8192), pins=VllmPins(max_model_len=16384))
    assert p.max_model_len == 16384
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in n for n in p.notes)


def test_extra_args_that_size_memory_stand() -> None:
    extra = ("--gpu-memory-utilization=0.7", "--enforce-eager")
    p = plan(meta(), pins=VllmPins(extra_args=extra))
    assert p.args.count("--gpu-memory-utilization") == 0
    assert "--kv-cache-memory-bytes" not in p.args
    assert p.kv_cache_memory_bytes is None
    assert p.args[-2:] == extra
    p = plan(meta(), pins=VllmPins(extra_args=("--kv-cache-memory-bytes", "1000000000")))
    assert p.args.count("--kv-cache-memory-bytes") == 1


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"gpu_total_bytes": 0}, "GPU total"),
        ({"budget_bytes": -1}, "budget"),
        ({"tensor_parallel": 0}, "tensor-parallel"),
        ({"pins": VllmPins(tensor_parallel_size=0)}, "tensor-parallel"),
        ({"pins": VllmPins(gpu_memory_utilization=1.2)}, "(0, 1]"),
        ({"pins": VllmPins(gpu_memory_utilization=0.0)}, "(0, 1]"),
        ({"pins": VllmPins(max_model_len=0)}, "--max-model-len"),
        ({"pins": VllmPins(kv_cache_memory_bytes=0)}, "--kv-cache-memory-bytes"),
        ({"pins": VllmPins(dtype="fp4")}, "--dtype"),
        ({"pins": VllmPins(kv_cache_dtype="q8_0")}, "--kv-cache-dtype"),
    ],
)
def test_inconsistent_inputs_raise_sizing_error(kw: dict[str, object], words: str) -> None:
    with pytest.raises(SizingError) as e:
        plan(meta(), **kw)
    assert words in str(e.value)


# --- does not fit ------------------------------------------------------------------------------


def test_weights_over_budget_is_a_result_not_an_exception() -> None:
    # 15 GiB weights + 1.5 GiB reserve > 16 GiB budget
    p = plan(meta(), budget_bytes=16 * GIB)
    assert not p.fits and not p.skipped
    assert p.reason is not None and "exceed the 16.0 GiB budget" in p.reason
    assert p.max_model_len == MIN_MAX_MODEL_LEN  # the floor, as the reference emits
    assert p.args  # the command is still rendered for the user to judge


def test_kv_below_the_floor_does_not_fit() -> None:
    # budget 17 GiB: KV left 0.5 GiB; with the margin (0.5 − 0.25) × 10/11 GiB
    # = 2048 × 10/11 = 1861.8 → 1861 tokens < 4096
    p = plan(meta(), budget_bytes=17 * GIB)
    assert not p.fits
    assert p.reason is not None and "1861 tokens" in p.reason
    assert p.max_model_len == MIN_MAX_MODEL_LEN


def test_heads_must_divide_over_tensor_parallel() -> None:
    p = plan(meta(), tensor_parallel=3, budget_bytes=None)
    assert not p.fits
    assert p.reason is not None and "32 attention heads do not divide over 3 GPUs" in p.reason


def test_split_gguf_is_skipped() -> None:
    p = plan(meta(fmt="gguf", arch="llama"), is_split_gguf=True)
    assert p.skipped and not p.fits and p.args == ()
    assert p.reason is not None and "split GGUF" in p.reason and "--merge" in p.reason
    # the flag concerns GGUF shards only; an HF folder of several safetensors is one model
    assert not plan(meta(), is_split_gguf=True).skipped


def test_non_chat_models_are_skipped() -> None:
    p = plan(replace(meta(), model_class=ModelClass.EMBEDDING))
    assert p.skipped and p.reason is not None and "embedding" in p.reason


# --- formats and families ----------------------------------------------------------------------


def test_gguf_gets_quantization_and_a_tokenizer_note() -> None:
    p = plan(meta(fmt="gguf", arch="llama"))
    assert arg(p, "--quantization") == "gguf"
    assert "--tokenizer" not in p.args  # never guessed
    assert any("tokenizer" in n for n in p.notes)
    p = plan(meta(fmt="gguf", arch="llama"), pins=VllmPins(tokenizer="meta-llama/Llama-3.1-8B"))
    assert arg(p, "--tokenizer") == "meta-llama/Llama-3.1-8B"


def test_hf_folder_has_no_quantization_flag_and_is_preferred() -> None:
    assert "--quantization" not in plan(meta()).args
    assert vllm_preferred(meta())
    assert not vllm_preferred(meta(fmt="gguf", arch="llama"))


@pytest.mark.parametrize(
    ("arch", "name", "parser"),
    [
        ("Qwen2ForCausalLM", "Qwen2.5-7B-Instruct", "hermes"),
        ("qwen2moe", "x", "hermes"),
        ("Qwen3MoeForCausalLM", "Qwen3-30B-A3B", "hermes"),
        ("Qwen3MoeForCausalLM", "Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
        ("qwen3", "qwen3-coder-mini", "qwen3_coder"),
        ("Qwen3_5MoeForConditionalGeneration", "Qwen3.5-35B", "qwen3_coder"),
        ("qwen35moe", "x", "qwen3_coder"),
        ("qwen3_next", "x", "hermes"),
        ("llama", "Meta-Llama-3.1-8B", "llama3_json"),
        ("Mistral3ForConditionalGeneration", "x", "mistral"),
        ("gemma4", "x", "gemma4"),
        ("Glm4MoeForCausalLM", "GLM-4.5-Air", "glm45"),
        ("DeepseekV3ForCausalLM", "x", "deepseek_v3"),
        ("granitemoe", "x", "granite"),
        ("MiniMaxM2ForCausalLM", "x", "minimax_m2"),
        ("Olmo3ForCausalLM", "x", "olmo3"),
    ],
)
def test_tool_call_parser_per_family(arch: str, name: str, parser: str) -> None:
    m = meta(arch=arch, name=name)
    assert tool_call_parser(m) == (parser, "from the architecture")
    p = plan(m)
    assert p.tool_calling and p.tool_call_parser == parser
    i = p.args.index("--tool-call-parser")
    assert p.args[i - 1] == "--enable-auto-tool-choice" and p.args[i + 1] == parser


def test_tool_call_parser_unknown_pinned_and_off() -> None:
    m = meta(arch="Phi3ForCausalLM")
    p = plan(m)
    assert p.tool_call_parser is None and not p.tool_calling
    assert "--enable-auto-tool-choice" not in p.args
    assert any("no tool-call parser known for 'Phi3ForCausalLM'" in n for n in p.notes)
    p = plan(m, pins=VllmPins(tool_call_parser="phi4_mini_json"))
    assert arg(p, "--tool-call-parser") == "phi4_mini_json"
    p = plan(meta(), pins=VllmPins(tool_call_parser="none"))
    assert p.tool_call_parser is None and "--tool-call-parser" not in p.args
    # a parser in the extra arguments stands, and the model still takes tools
    p = plan(meta(), pins=VllmPins(extra_args=("--tool-call-parser", "pythonic")))
    assert p.args.count("--tool-call-parser") == 1 and p.tool_calling


# --- properties --------------------------------------------------------------------------------

_models = st.builds(
    lambda layers, kv, hd, wgib, trained, fmt: meta(
        fmt=fmt,
        n_layer=layers,
        n_head=kv * 4,
        n_kv=kv,
        head_dim=hd,
        weights=wgib * GIB // 4,
        ctx=trained,
        sliding_window=512,
        swa_layers=tuple(il % 2 == 0 for il in range(layers)),
    ),
    st.integers(1, 96),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([64, 128, 256]),
    st.integers(1, 400),
    st.one_of(st.none(), st.integers(512, 1 << 20)),
    st.sampled_from(["gguf", "hf"]),
)


@settings(max_examples=150, deadline=None)
@given(
    m=_models,
    card=st.one_of(st.none(), st.integers(4, 192).map(lambda g: g * GIB)),
    b1=st.integers(1, 200 * 1024).map(lambda x: x * MIB),
    extra=st.integers(0, 64 * 1024).map(lambda x: x * MIB),
)
def test_more_budget_never_shortens_the_context(
    m: ModelMeta, card: int | None, b1: int, extra: int
) -> None:
    small = plan_vllm(m, gpu_total_bytes=card, budget_bytes=b1)
    big = plan_vllm(m, gpu_total_bytes=card, budget_bytes=b1 + extra)
    assert big.max_model_len >= small.max_model_len
    assert big.fits or not small.fits
    for p in (small, big):
        assert p.breakdown is not None
        if p.fits and p.breakdown.budget is not None:
            # a fitting derived plan stays inside the share it was sized against
            assert p.breakdown.footprint.nbytes <= p.breakdown.budget.nbytes
        if card is not None:
            assert 0.10 <= p.gpu_memory_utilization <= 0.95
            # rounded up: the granted share covers the footprint unless clamped at the ceiling
            if p.gpu_memory_utilization < 0.95:
                assert p.charge_bytes >= p.breakdown.footprint.nbytes
        if p.kv_cache_memory_bytes is not None:
            assert p.kv_cache_memory_bytes >= p.breakdown.kv.nbytes + KV_MARGIN_BYTES


_pins = st.builds(
    VllmPins,
    max_model_len=st.one_of(st.none(), st.integers(1, 1 << 20)),
    gpu_memory_utilization=st.one_of(st.none(), st.integers(1, 100).map(lambda p: p / 100)),
    kv_cache_memory_bytes=st.one_of(st.none(), st.integers(1, 1 << 40)),
    tensor_parallel_size=st.one_of(st.none(), st.sampled_from([1, 2, 4, 8])),
)


@settings(max_examples=150, deadline=None)
@given(
    m=_models,
    card=st.one_of(st.none(), st.integers(4, 192).map(lambda g: g * GIB)),
    budget=st.one_of(st.none(), st.integers(1, 200).map(lambda g: g * GIB)),
    pins=_pins,
)
def test_pins_always_win(
    m: ModelMeta, card: int | None, budget: int | None, pins: VllmPins
) -> None:
    p = plan_vllm(m, gpu_total_bytes=card, budget_bytes=budget, pins=pins)
    ctx, util = pins.max_model_len, pins.gpu_memory_utilization
    pool, tp = pins.kv_cache_memory_bytes, pins.tensor_parallel_size
    if ctx is not None:
        assert p.max_model_len == ctx and arg(p, "--max-model-len") == str(ctx)
    if util is not None:
        assert p.gpu_memory_utilization == util
        assert arg(p, "--gpu-memory-utilization") == format(util, "g")
    if pool is not None:
        assert p.kv_cache_memory_bytes == pool
        assert arg(p, "--kv-cache-memory-bytes") == str(pool)
    if tp is not None:
        assert p.tensor_parallel == tp
        assert arg(p, "--tensor-parallel-size") == (str(tp) if tp > 1 else None)
    assert (p.fits and p.reason is None) or (not p.fits and p.reason)


def test_budget_per_gpu_is_the_pinned_budget_else_free_memory_less_the_reserve() -> None:
    assert budget_per_gpu(7 * GIB, available=8 * GIB, reserve=2 * GIB) == 7 * GIB
    assert budget_per_gpu(None, available=8 * GIB, reserve=2 * GIB) == 6 * GIB
    assert budget_per_gpu(None, available=8 * GIB, reserve=0) == 8 * GIB
    assert budget_per_gpu(None, available=GIB, reserve=2 * GIB) == 1  # never zero or less
    assert budget_per_gpu(None, available=None, reserve=2 * GIB) is None  # no card reading
    # what is not a budget (a hand-edited profile) reads as none
    for junk in (0, -1, True, "7GiB", 7.5):
        assert budget_per_gpu(junk, available=8 * GIB, reserve=0) == 8 * GIB


def test_a_budget_above_the_card_is_capped_at_95_percent() -> None:
    # a 40 GiB budget on a 24 GiB card: the share is 0.95 × 24 GiB, as with no budget at all
    capped = plan(meta(), budget_bytes=40 * GIB)
    assert capped.breakdown is not None and capped.breakdown.budget is not None
    assert capped.breakdown.budget.nbytes == 24 * GIB * 95 // 100
    assert capped.breakdown.budget.source == "budget, capped at 0.95 × card"
    assert capped.max_model_len == plan(meta(), budget_bytes=None).max_model_len
    assert capped.gpu_memory_utilization <= 0.95
    # a pinned window past the cap does not fit, and says so, rather than asking for more
    over = plan(meta(), budget_bytes=40 * GIB, pins=VllmPins(max_model_len=131072))
    assert not over.fits
    assert over.reason is not None and "the budget allows 22.8 GiB" in over.reason
    assert over.gpu_memory_utilization == 0.95  # the flag never passes the ceiling
