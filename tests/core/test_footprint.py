"""Footprint rules, one by one, on hand-made metadata (the real engine checks them in
bench/accuracy.py and tests/engines)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui.core.errors import SizingError
from qmgui.core.footprint import (
    CPU,
    Gpu,
    estimate,
    kv_bytes_per_layer,
    layer_device_map,
    output_bytes,
    recurrent_bytes_per_layer,
)
from qmgui.core.launch import LaunchSettings, resolve, row_bytes
from qmgui.core.meta import MlaDims, ModelClass, ModelMeta, SsmDims, TensorEntry
from qmgui.core.sched import Offload, sched_compute_bytes
from qmgui.core.units import GIB

N_LAYER = 4


def tensors(
    n_layer: int = N_LAYER, *, tied: bool = False, moe: bool = False
) -> tuple[TensorEntry, ...]:
    out = [TensorEntry("token_embd.weight", "F16", (64, 1000), 128_000, 0)]
    off = 128_000
    for il in range(n_layer):
        names = ["attn_q", "attn_k", "ffn_up"] + (["ffn_up_exps", "ffn_down_exps"] if moe else [])
        for n in names:
            out.append(TensorEntry(f"blk.{il}.{n}.weight", "F16", (64, 64), 8192, off))
            off += 8192
    out.append(TensorEntry("output_norm.weight", "F32", (64,), 256, off))
    off += 256
    if not tied:
        out.append(TensorEntry("output.weight", "F16", (64, 1000), 128_000, off))
    return tuple(out)


def make_meta(**kw: object) -> ModelMeta:
    n_layer = int(kw.pop("n_layer", N_LAYER))  # type: ignore[call-overload]
    base = ModelMeta(
        format="gguf",
        architecture="llama",
        name="t",
        model_class=ModelClass.LLM,
        quant="F16",
        param_count=1,
        weight_bytes=1,
        context_length=8192,
        n_layer=n_layer,
        n_embd=64,
        n_head=(4,) * n_layer,
        n_head_kv=(2,) * n_layer,
        head_dim_k=16,
        head_dim_v=16,
        vocab_size=1000,
        swa_layers=(False,) * n_layer,
        recurrent_layers=(False,) * n_layer,
        tensors=tensors(n_layer),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_layer_map_counts_the_output_layer() -> None:
    m = make_meta()
    gpu = (Gpu("GPU0", 24 * GIB),)
    assert layer_device_map(m, gpu, 5) == ("GPU0",) * 5
    assert layer_device_map(m, gpu, 1) == (CPU, CPU, CPU, CPU, "GPU0")  # only the output
    assert layer_device_map(m, gpu, 2) == (CPU, CPU, CPU, "GPU0", "GPU0")
    assert layer_device_map(m, gpu, 0) == (CPU,) * 5
    assert layer_device_map(m, (), 5) == (CPU,) * 5


def test_layer_map_splits_by_free_memory_or_tensor_split() -> None:
    m = make_meta()
    two = (Gpu("GPU0", 24 * GIB), Gpu("GPU1", 24 * GIB, free_bytes=8 * GIB))
    # free 24 : 8 -> split points 0.75, 1.0 over 5 layers: x = 0, .2, .4, .6 -> GPU0, .8 -> GPU1
    assert layer_device_map(m, two, 5) == ("GPU0",) * 4 + ("GPU1",)
    assert layer_device_map(m, two, 5, (1, 1)) == ("GPU0",) * 3 + ("GPU1",) * 2
    with pytest.raises(SizingError):
        layer_device_map(m, two, 5, (1, 1, 1))


def test_input_layer_stays_on_the_cpu_and_tied_output_is_copied() -> None:
    gpu = (Gpu("GPU0", 24 * GIB),)
    untied = estimate(make_meta(), LaunchSettings(ctx_size=256), gpu)
    assert untied.host.weights == 128_000  # token_embd only
    tied = estimate(
        make_meta(tensors=tensors(tied=True), tied_embeddings=True),
        LaunchSettings(ctx_size=256),
        gpu,
    )
    assert tied.host.weights == 128_000
    # the GPU holds the layers, the output norm and a copy of token_embd as the output matrix
    assert tied.device("GPU0").weights == N_LAYER * 3 * 8192 + 256 + 128_000


def test_cpu_only_mapped_weights_are_the_file_span() -> None:
    m = make_meta()
    fp = estimate(m, LaunchSettings(ctx_size=256))
    last = m.tensors[-1]
    assert fp.host.weights == last.offset + last.nbytes - m.tensors[0].offset
    no_mmap = estimate(m, LaunchSettings(ctx_size=256, mmap=False))
    assert no_mmap.host.weights == sum(-(-t.nbytes // 32) * 32 for t in m.tensors)


def test_n_cpu_moe_keeps_the_first_layers_experts_on_the_cpu() -> None:
    m = make_meta(tensors=tensors(moe=True), n_expert=8, n_expert_used=2)
    gpu = (Gpu("GPU0", 24 * GIB),)
    all_gpu = estimate(m, LaunchSettings(ctx_size=256), gpu)
    two = estimate(m, LaunchSettings(ctx_size=256, n_cpu_moe=2), gpu)
    moved = 2 * 2 * 8192  # two layers, two expert tensors each
    assert two.device("GPU0").weights == all_gpu.device("GPU0").weights - moved
    every = estimate(m, LaunchSettings(ctx_size=256, cpu_moe=True), gpu)
    assert every.device("GPU0").weights == all_gpu.device("GPU0").weights - N_LAYER * 2 * 8192


def test_kv_cache_exact_rows() -> None:
    m = make_meta()
    r = resolve(m, LaunchSettings(ctx_size=1000, parallel=1))
    assert r.n_ctx == 1024
    per = kv_bytes_per_layer(m, r)
    assert per[0] == 2 * 1024 * 32 * 2  # K and V: 1024 cells x 2 heads x 16 x f16
    wide = make_meta(head_dim_k=32, head_dim_v=32)
    q8 = resolve(
        wide,
        LaunchSettings(
            ctx_size=1024, parallel=1, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on"
        ),
    )
    assert kv_bytes_per_layer(wide, q8)[0] == 2 * 1024 * row_bytes("q8_0", 64)
    assert row_bytes("q8_0", 64) == 68  # 34 bytes per 32 values, not 32


def test_cache_types_the_engine_refuses() -> None:
    m = make_meta()  # K and V heads of 16 values
    with pytest.raises(SizingError, match="do not divide"):
        resolve(m, LaunchSettings(cache_type_k="q8_0"))  # auto -> flash attention
    assert resolve(m, LaunchSettings(cache_type_k="q8_0", flash_attn="off")).flash_attn is False
    mla = make_meta(mla=MlaDims(512, 1536, 64, 192, 128), head_dim_k=576, head_dim_v=512)
    with pytest.raises(SizingError, match="same --cache-type-k"):
        resolve(mla, LaunchSettings(cache_type_k="q8_0", flash_attn="off"))
    # a latent decompressed per head (MiniCPM3, GGUFs converted before wkv_b was split: no
    # key_length_mla) is an ordinary cache: b11434 loads minicpm3 with q8_0 K and f16 V
    per_head = make_meta(mla=MlaDims(256, 768, 32, None, None), head_dim_k=96, head_dim_v=64)
    mixed = LaunchSettings(cache_type_k="q8_0", flash_attn="on")
    assert resolve(per_head, mixed).cache_type_k == "q8_0"
    # Grok: llama.cpp forces flash attention off, so a quantized V cache cannot load
    grok = replace(make_meta(), architecture="grok")
    assert resolve(grok, LaunchSettings(flash_attn="on")).flash_attn is False
    with pytest.raises(SizingError, match="quantized V cache"):
        resolve(grok, LaunchSettings(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on"))


def test_batch_follows_the_requested_context_and_embedding_mode() -> None:
    m = make_meta()
    r = resolve(m, LaunchSettings(ctx_size=1000))
    assert (r.n_ctx, r.n_batch, r.n_ubatch) == (1024, 1000, 512)
    r = resolve(m, LaunchSettings(ctx_size=300))
    assert (r.n_ctx, r.n_batch, r.n_ubatch) == (512, 300, 300)
    emb = resolve(m, LaunchSettings(ctx_size=1024), embeddings=True)
    assert (emb.n_batch, emb.n_ubatch) == (512, 512)
    enc = make_meta(causal=False)
    r = resolve(
        enc, LaunchSettings(ctx_size=256, batch_size=4096, ubatch_size=1024), embeddings=True
    )
    assert (r.n_batch, r.n_ubatch) == (1024, 1024)


def test_auto_slots_ignore_no_kv_unified() -> None:
    r = resolve(make_meta(), LaunchSettings(ctx_size=1024, kv_unified=False))
    assert (r.n_seq, r.kv_unified, r.n_ctx_seq) == (4, True, 1024)


def test_quantized_v_needs_flash_attention() -> None:
    with pytest.raises(SizingError, match="flash attention"):
        resolve(make_meta(), LaunchSettings(cache_type_v="q8_0", flash_attn="off"))


def test_v_rows_padded_to_the_widest_layer_without_flash_attention() -> None:
    m = make_meta(n_head_kv=(2, 4, 2, 4))
    fa = kv_bytes_per_layer(m, resolve(m, LaunchSettings(ctx_size=256, flash_attn="on")))
    no_fa = kv_bytes_per_layer(m, resolve(m, LaunchSettings(ctx_size=256, flash_attn="off")))
    assert fa[0] == 256 * (32 + 32) * 2
    assert no_fa[0] == 256 * (32 + 64) * 2  # V as wide as layer 1's


def test_separate_streams_and_slots() -> None:
    m = make_meta()
    r = resolve(m, LaunchSettings(ctx_size=4096, parallel=4))
    assert (r.n_seq, r.n_ctx_seq, r.n_stream, r.kv_unified) == (4, 1024, 4, False)
    unified = resolve(m, LaunchSettings(ctx_size=4096, parallel=4, kv_unified=True))
    assert (unified.n_ctx_seq, unified.n_stream) == (4096, 1)
    assert sum(kv_bytes_per_layer(m, r).values()) == sum(kv_bytes_per_layer(m, unified).values())
    auto = resolve(m, LaunchSettings(ctx_size=4096))
    assert (auto.n_seq, auto.kv_unified) == (4, True)


def test_sliding_window_cells() -> None:
    m = make_meta(sliding_window=128, swa_layers=(True, True, True, False))
    r = resolve(m, LaunchSettings(ctx_size=8192, parallel=1))
    per = kv_bytes_per_layer(m, r)
    swa_cells = 128 + 512  # window x 1 seq + ubatch, padded to 256 -> 768
    assert per[0] == 768 * 64 * 2
    assert per[3] == 8192 * 64 * 2
    full = kv_bytes_per_layer(
        m, resolve(m, LaunchSettings(ctx_size=8192, parallel=1, swa_full=True))
    )
    assert full[0] == per[3]
    assert swa_cells <= 768


def test_mla_keeps_one_latent_and_no_v() -> None:
    m = make_meta(
        n_head_kv=(1,) * N_LAYER,
        head_dim_k=576,
        head_dim_v=512,
        mla=MlaDims(512, 1536, 64, 192, 128),
    )
    r = resolve(m, LaunchSettings(ctx_size=1024, parallel=1))
    assert kv_bytes_per_layer(m, r)[0] == 1024 * 576 * 2


def test_recurrent_state_grows_with_slots_not_context() -> None:
    ssm = SsmDims(conv_kernel=4, inner_size=128, state_size=16, group_count=1, time_step_rank=8)
    m = make_meta(n_head_kv=(0, 0, 2, 0), recurrent_layers=(True, True, False, True), ssm=ssm)
    small = recurrent_bytes_per_layer(m, resolve(m, LaunchSettings(ctx_size=256, parallel=1)))
    big = recurrent_bytes_per_layer(m, resolve(m, LaunchSettings(ctx_size=8192, parallel=1)))
    assert small == big
    per_seq = (3 * (128 + 2 * 16) + 16 * 128) * 4
    assert small == {0: per_seq, 1: per_seq, 3: per_seq}
    four = recurrent_bytes_per_layer(m, resolve(m, LaunchSettings(ctx_size=8192, parallel=4)))
    assert four[0] == 4 * per_seq
    assert set(kv_bytes_per_layer(m, resolve(m, LaunchSettings(ctx_size=256)))) == {2}


def test_encoders_keep_no_kv_and_output_counts_embeddings() -> None:
    m = make_meta(architecture="bert", causal=False, model_class=ModelClass.EMBEDDING)
    fp = estimate(m, LaunchSettings(ctx_size=512))
    assert fp.host.kv == 0
    r = fp.settings
    assert output_bytes(m, r, embeddings=True) == (1000 + 64) * r.n_seq * 4


@settings(max_examples=60, deadline=None)
@given(
    a=st.integers(1, 64),
    b=st.integers(1, 64),
    np_=st.sampled_from([None, 1, 2, 4]),
    swa=st.booleans(),
)
def test_more_context_never_costs_less(a: int, b: int, np_: int | None, swa: bool) -> None:
    m = make_meta(sliding_window=128 if swa else None, swa_layers=(swa, swa, swa, False))
    lo, hi = sorted((a * 256, b * 256))
    small = estimate(m, LaunchSettings(ctx_size=lo, parallel=np_))
    large = estimate(m, LaunchSettings(ctx_size=hi, parallel=np_))
    assert large.host.total >= small.host.total


def test_old_builds_keep_a_v_cache_for_mla() -> None:
    from qmgui.core.footprint import EngineRules

    m = make_meta(
        n_head_kv=(1,) * N_LAYER,
        head_dim_k=576,
        head_dim_v=512,
        mla=MlaDims(512, 1536, 64, 192, 128),
    )
    r = resolve(m, LaunchSettings(ctx_size=1024, parallel=1, flash_attn="on"))
    assert kv_bytes_per_layer(m, r, EngineRules(build=7000))[0] == 1024 * (576 + 512) * 2
    assert kv_bytes_per_layer(m, r, EngineRules(build=9000))[0] == 1024 * 576 * 2


def test_builds_from_b11434_keep_the_mixed_batch_inputs() -> None:
    """EngineRules(build) from MIXED_BATCH_BUILD on predicts the graph with build_inp_embd's
    mixed token/embedding branch (core.compute); None and older builds keep the test
    engine's graph. The kept copy alone is n_embd x n_ubatch f32."""
    from qmgui.core.compute import MIXED_BATCH_BUILD
    from qmgui.core.footprint import EngineRules

    assert MIXED_BATCH_BUILD == 11434
    assert not EngineRules().mixed_batch
    assert not EngineRules(build=10435).mixed_batch
    assert EngineRules(build=11434).mixed_batch and EngineRules(build=12000).mixed_batch
    m = make_meta()
    s = LaunchSettings(ctx_size=1024, parallel=1)
    older = estimate(m, s).host.compute
    assert estimate(m, s, rules=EngineRules(build=10435)).host.compute == older
    newer = estimate(m, s, rules=EngineRules(build=11434)).host.compute
    assert newer >= older + m.n_embd * 512 * 4
    gpu = (Gpu("GPU0", 24 * GIB, backend="vulkan"),)
    part = LaunchSettings(ctx_size=1024, parallel=1, n_gpu_layers=2)
    old_fp = estimate(m, part, gpu)
    new_fp = estimate(m, part, gpu, rules=EngineRules(build=11434))
    assert new_fp.host.compute >= old_fp.host.compute


def test_projector_weights_go_to_the_first_gpu() -> None:
    proj = make_meta(architecture="clip", model_class=ModelClass.PROJECTOR, weight_bytes=5000)
    gpus = (Gpu("GPU0", 24 * GIB), Gpu("GPU1", 24 * GIB))
    with_proj = estimate(make_meta(), LaunchSettings(ctx_size=256), gpus, mmproj=proj)
    without = estimate(make_meta(), LaunchSettings(ctx_size=256), gpus)
    assert with_proj.device("GPU0").weights == without.device("GPU0").weights + 5000
    on_cpu = estimate(
        make_meta(), LaunchSettings(ctx_size=256), gpus, mmproj=proj, mmproj_offload=False
    )
    assert on_cpu.host.weights == without.host.weights + 5000


def test_cuda_pads_quantized_rows() -> None:
    t = TensorEntry("blk.0.ffn_up.weight", "Q4_0", (100, 10), 10 * 4 * 18, 0)
    m = make_meta(tensors=(make_meta().tensors[0], t), n_layer=1)
    fp = estimate(m, LaunchSettings(ctx_size=256), (Gpu("GPU0", 24 * GIB),))
    # one extra row's worth: (512 - 100) / 32 blocks of 18 bytes, then 128-byte alignment
    assert fp.device("GPU0").weights == -(-(720 + 412 // 32 * 18) // 128) * 128
    vk = estimate(m, LaunchSettings(ctx_size=256), (Gpu("GPU0", 24 * GIB, backend="vulkan"),))
    assert vk.device("GPU0").weights == 720


def test_rpc_devices_get_no_partial_offload_copy_and_host_inputs_on_the_cpu() -> None:
    """An RPC device's compute buffer is the graph alone (llama.cpp copies CPU weights only
    into local GPU backends); with every layer on GPUs, local or remote, the host keeps the
    graph's inputs (tests/engines/test_rpc.py and the H200 run in docs/gpu measured them)."""
    m = make_meta()
    s = LaunchSettings(ctx_size=1024, ubatch_size=512, flash_attn="on", n_gpu_layers=3)
    local = estimate(m, s, (Gpu("GPU0", 24 * GIB, backend="vulkan"),))
    rpc = Gpu("RPC0[h:1]", 24 * GIB, backend="cpu", endpoint="h:1")
    remote = estimate(m, s, (rpc,))
    graph = remote.host.compute  # the CPU runs its layers: the whole graph
    # a local GPU: llama.cpp's scheduler replayed, with the CPU layers' weights copied in
    offload = Offload("vulkan", host_layers=frozenset(range(N_LAYER + 1 - 3)))
    offload = replace(offload, host_caches=offload.host_layers)
    walk = sched_compute_bytes(m, local.settings, offload, embeddings=False)
    assert local.device("GPU0").compute == walk.gpu
    assert local.host.compute == walk.host
    assert remote.device(rpc.name).compute == graph
    full = estimate(m, replace(s, n_gpu_layers=None), (rpc,))
    # 2 activations of 64 x 512 F32, an F16 mask of 1024 x 512, positions and 8 KiB
    assert full.host.compute == 2 * 64 * 512 * 4 + 1024 * 512 * 2 + 512 * 4 + 8192
    on_gpu = estimate(m, replace(s, n_gpu_layers=None), (Gpu("GPU0", 24 * GIB),))
    # one local GPU: the scheduler's walk (core.sched) counts the same inputs byte by byte
    # (the formula rounds the small ones; both are exact to the printed 0.01 MiB on the H200)
    assert abs(on_gpu.host.compute - full.host.compute) <= 16 * 1024
    no_fa = estimate(m, replace(s, n_gpu_layers=None, flash_attn="off"), (rpc,))
    assert no_fa.host.compute == 3 * 64 * 512 * 4 + 1024 * 512 * 4 + 512 * 4 + 8192


def test_a_sliding_window_model_keeps_a_second_mask_on_the_host() -> None:
    """iSWA: the sliding layers' cache is smaller (window x slots + ubatch, padded to 256),
    and its mask is the second one the host holds (H200 run: gemma3, gpt-oss)."""
    n = N_LAYER
    m = make_meta(swa_layers=(True, False) * (n // 2) + (True,) * (n % 2), sliding_window=128)
    s = LaunchSettings(ctx_size=8192, ubatch_size=512, flash_attn="on")
    fp = estimate(m, s, (Gpu("GPU0", 24 * GIB),))
    swa_cells = 1024  # pad(min(8192, 128 x 4 slots + 512), 256)
    masks = (8192 + swa_cells) * 512 * 2
    formula = 2 * 64 * 512 * 4 + masks + 512 * 4 + 2 * 8192
    assert abs(fp.host.compute - formula) <= 16 * 1024  # the walk (see above)


def test_a_non_causal_llm_is_planned_without_embedding_mode() -> None:
    """Diffusion LLMs (Dream, LLaDA) attend non-causally but are LLMs to llama-server, which
    starts them without --embedding: one output row per slot, logits only, as b10435 and
    b11434 reserve (docs/accuracy-archs-*); a pooled encoder is planned in embedding mode."""
    from qmgui.core.compute import is_embedding
    from qmgui.core.meta import ModelClass, Pooling

    diffusion = replace(make_meta(), causal=False, model_class=ModelClass.LLM)
    assert not is_embedding(diffusion)
    fp = estimate(diffusion, LaunchSettings(ctx_size=1024, parallel=2))
    cpu = next(d for d in fp.devices if d.name == "CPU")
    assert cpu.output == (diffusion.vocab_size or 0) * 2 * 4
    encoder = replace(diffusion, pooling=Pooling.MEAN, model_class=ModelClass.EMBEDDING)
    assert is_embedding(encoder)
