"""The CPU repacking rule table (qmgui.core.repack) against ggml's rules as read from source."""

from __future__ import annotations

import pytest

from qmgui.core.repack import (
    AMX_BUFFER,
    MUL_MAT,
    MUL_MAT_ID,
    OTHER,
    REPACK_BUFFER,
    REPACK_RULES,
    TENSOR_ALIGNMENT,
    CpuTarget,
    Weight,
    parse_system_info,
    place,
    repack_rule,
    rules_table,
    target_from_cpuinfo,
    weight_op,
)

# the line both test builds print on the AVX2 machine the accuracy matrix runs on
LINE = (
    "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | "
    "AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
    "REPACK = 1 | "
)
AVX2 = parse_system_info(LINE)
NEON_I8MM = CpuTarget(frozenset({"NEON", "DOTPROD", "MATMUL_INT8", "REPACK"}))
NEON_DOT = CpuTarget(frozenset({"NEON", "DOTPROD", "REPACK"}))
AMX = CpuTarget(frozenset({"AVX2", "AVX512", "AVX512_VNNI", "AMX_INT8", "REPACK"}))


def _w(dtype: str, k: int, n: int, *, block: tuple[int, int] = (32, 18), op: str = MUL_MAT,
       name: str = "blk.0.attn_q.weight") -> Weight:  # fmt: skip
    return Weight(name, dtype, (k, n), k // block[0] * block[1] * n, op)


def test_system_info_line_is_parsed() -> None:
    assert AVX2 is not None
    assert {"AVX2", "FMA", "REPACK"} <= AVX2.features
    assert "AVX512" not in AVX2.features and "n_threads" not in AVX2.features
    assert AVX2.source == "system_info"
    assert parse_system_info("no such line") is None
    sve = parse_system_info("system_info: CPU : NEON = 1 | SVE = 1 | SVE_CNT = 32 | REPACK = 1 |")
    assert sve is not None and sve.sve_cnt == 32 and "SVE_CNT" not in sve.features


def test_q4_0_repacks_on_avx2_when_rows_divide_by_8() -> None:
    assert AVX2 is not None
    w = _w("Q4_0", 64, 128)
    rule = repack_rule(w, AVX2)
    assert rule is not None and rule.layout == "q4_0_8x8_q8_0" and "repack.cpp" in rule.source
    assert repack_rule(_w("Q4_0", 64, 124), AVX2) is None  # 124 % 8 != 0
    got = place([w], AVX2)
    assert got.buffers == {REPACK_BUFFER: w.nbytes + (-w.nbytes) % TENSOR_ALIGNMENT}


def test_types_without_an_avx2_layout_stay_in_the_mapped_file() -> None:
    assert AVX2 is not None
    for dtype in ("Q8_0", "Q6_K", "Q5_K", "F16", "F32"):
        assert place([_w(dtype, 256, 256)], AVX2).total == 0, dtype
    for dtype in ("Q4_K", "IQ4_NL", "MXFP4"):
        assert place([_w(dtype, 256, 256)], AVX2).total > 0, dtype
    q2 = _w("Q2_K", 256, 256)
    assert place([q2], AVX2).total == 0
    assert place([q2], CpuTarget(AVX2.features | {"AVX512"})).total > 0


def test_neon_layouts_follow_dotprod_and_i8mm() -> None:
    w = _w("Q4_0", 64, 12)  # 12 rows: the 4-row layouts only
    assert (r := repack_rule(w, NEON_I8MM)) is not None and r.layout == "q4_0_4x8_q8_0"
    assert (r := repack_rule(w, NEON_DOT)) is not None and r.layout == "q4_0_4x4_q8_0"
    q8 = _w("Q8_0", 64, 16, block=(32, 34))
    assert place([q8], NEON_DOT).total > 0
    sve = CpuTarget(frozenset({"SVE", "MATMUL_INT8", "NEON", "REPACK"}), sve_cnt=32)
    assert (r := repack_rule(_w("Q4_0", 64, 16), sve)) is not None and r.layout.endswith("8x8_q8_0")


def test_only_2d_matmuls_and_3d_expert_stacks_repack() -> None:
    assert AVX2 is not None
    embd = Weight(
        "token_embd.weight", "Q4_0", (64, 128), 4608, weight_op("token_embd.weight", (64, 128))
    )
    assert embd.op == OTHER and place([embd], AVX2).total == 0
    exps = Weight("blk.0.ffn_up_exps.weight", "Q4_0", (64, 32, 8), 36864, MUL_MAT_ID)
    assert weight_op(exps.name, exps.shape) == MUL_MAT_ID
    assert place([exps], AVX2).total == exps.nbytes
    assert weight_op("blk.0.attn_norm.weight", (64,)) == OTHER
    assert weight_op("blk.0.ssm_conv1d.weight", (4, 64)) == OTHER
    assert weight_op("output.weight", (64, 128)) == MUL_MAT


def test_no_repack_compiled_in_means_no_copies() -> None:
    assert AVX2 is not None
    bare = CpuTarget(AVX2.features - {"REPACK"})
    assert place([_w("Q4_0", 64, 128)], bare).total == 0


def test_amx_packs_before_cpu_repack_and_its_sizes() -> None:
    q4 = _w("Q4_0", 64, 64)
    got = place([q4], AMX)
    assert got.buffers == {AMX_BUFFER: 64 * 2 * 18}  # plain block bytes for Q4_0
    q8 = _w("Q8_0", 64, 64, block=(32, 34))
    assert place([q8], AMX).buffers[AMX_BUFFER] == 64 * 2 * (34 + 4)  # + int32 compensation
    # 24 rows: not a multiple of AMX's 32, so CPU_REPACK's 8-row layout takes it
    assert place([_w("Q4_0", 64, 24)], AMX).buffers.keys() == {REPACK_BUFFER}
    # AMX takes no MUL_MAT_ID
    exps = Weight("blk.0.ffn_up_exps.weight", "Q4_0", (64, 32, 8), 36864, MUL_MAT_ID)
    assert place([exps], AMX).buffers.keys() == {REPACK_BUFFER}


def test_cpuinfo_flags_map_to_system_info_names() -> None:
    t = target_from_cpuinfo(["fpu", "avx", "avx2", "fma", "f16c", "bmi2", "pni"])
    assert {"AVX2", "SSE3", "REPACK"} <= t.features and t.source == "host"
    assert not t.amx
    assert target_from_cpuinfo(["avx512f", "avx512_vnni", "amx_int8", "amx_tile"]).amx


def test_builds_before_a_rule_skip_it() -> None:
    vxe = CpuTarget(frozenset({"VXE", "REPACK"}), build=10435)
    assert place([_w("Q4_0", 64, 16)], vxe).total == 0
    assert place([_w("Q4_0", 64, 16)], CpuTarget(vxe.features, build=11434)).total > 0
    assert not CpuTarget(frozenset(), build=9000).known


@pytest.mark.parametrize("row", rules_table())
def test_every_rule_cites_its_source(row: dict[str, object]) -> None:
    assert "ggml/src/ggml-cpu/" in str(row["source"])
    assert row["buffer"] in (REPACK_BUFFER, AMX_BUFFER)


def test_rule_order_is_ggml_order() -> None:
    # the first Q4_0 rule is the x86 one: an AVX2 CPU never gets an ARM layout
    q4 = [r for r in REPACK_RULES if r.dtype == "Q4_0"]
    assert q4[0].needs == frozenset({"AVX2"})


def test_stored_capabilities_give_the_probed_features() -> None:
    from qmgui.core.repack import target_from_capabilities

    t = target_from_capabilities({"cpu_features": ["AVX2", "REPACK"], "sve_cnt": 0}, 11434)
    assert t is not None and t.features == {"AVX2", "REPACK"} and t.build == 11434
    assert t.source == "system_info"
    assert target_from_capabilities({"flags": []}) is None  # probed before the line was read
    assert target_from_capabilities({"cpu_features": "AVX2"}) is None  # not a list
