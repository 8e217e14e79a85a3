"""The plan's repacked copies (Footprint `repack`, `mapped`) from qmgui.core.repack's rules."""

from __future__ import annotations

from dataclasses import replace

from qmgui.core.footprint import CPU, Gpu, estimate
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import TensorEntry
from qmgui.core.repack import FIRST_KNOWN_BUILD, TENSOR_ALIGNMENT, CpuTarget
from qmgui.core.units import GIB
from tests.core.test_footprint import make_meta

AVX2 = CpuTarget(frozenset({"AVX2", "FMA", "REPACK"}), source="system_info")
Q4_0_ROW = 64 // 32 * 18  # one 64-wide Q4_0 row


def q4_tensors(*, tied: bool = False, vocab: int = 1000) -> tuple[TensorEntry, ...]:
    out = [TensorEntry("token_embd.weight", "Q4_0", (64, vocab), vocab * Q4_0_ROW, 0)]
    off = vocab * Q4_0_ROW
    for il in range(4):
        for n in ("attn_q", "attn_k", "ffn_up"):
            out.append(TensorEntry(f"blk.{il}.{n}.weight", "Q4_0", (64, 64), 64 * Q4_0_ROW, off))
            off += 64 * Q4_0_ROW
        out.append(TensorEntry(f"blk.{il}.attn_norm.weight", "F32", (64,), 256, off))
        off += 256
    if not tied:
        out.append(TensorEntry("output.weight", "Q4_0", (64, vocab), vocab * Q4_0_ROW, off))
    return tuple(out)


def _pad(n: int) -> int:
    return -(-n // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT


def test_q4_0_matmuls_are_copied_and_leave_the_span() -> None:
    meta = make_meta(tensors=q4_tensors(), quant="Q4_0")
    fp = estimate(meta, LaunchSettings(ctx_size=512), cpu=AVX2)
    matmuls = [t for t in meta.tensors if t.name != "token_embd.weight" and len(t.shape) == 2]
    assert fp.host.repack == sum(_pad(t.nbytes) for t in matmuls)
    assert fp.host.repack_bound == fp.host.repack  # exact: the bound is the copies
    # the span left: token_embd .. the last norm (output.weight went to CPU_REPACK)
    last = meta.tensors[-2]
    assert fp.host.weights == last.offset + last.nbytes
    assert fp.host.mapped == fp.host.weights
    assert fp.host.total - fp.host.resident == fp.host.mapped
    assert any("CPU_REPACK q4_0_8x8_q8_0" in n for n in fp.notes)


def test_the_copies_count_in_the_host_total() -> None:
    meta = make_meta(tensors=q4_tensors(), quant="Q4_0")
    on = estimate(meta, LaunchSettings(ctx_size=512), cpu=AVX2).host
    off = estimate(meta, LaunchSettings(ctx_size=512, repack=False), cpu=AVX2).host
    assert off.repack == 0 and on.repack > 0
    assert on.total == off.total - (off.weights - on.weights) + on.repack


def test_a_tied_output_gets_a_copy_of_its_own() -> None:
    tied = make_meta(tensors=q4_tensors(tied=True), quant="Q4_0", tied_embeddings=True)
    fp = estimate(tied, LaunchSettings(ctx_size=512), cpu=AVX2)
    embd = tied.tensors[0]
    layers = sum(_pad(t.nbytes) for t in tied.tensors[1:] if len(t.shape) == 2)
    assert fp.host.repack == layers + _pad(embd.nbytes)
    # 1004 rows: not a multiple of 8, the duplicate stays in the mapped file
    odd = replace(tied, tensors=q4_tensors(tied=True, vocab=1004))
    assert estimate(odd, LaunchSettings(ctx_size=512), cpu=AVX2).host.repack == layers


def test_without_the_cpus_features_only_a_bound() -> None:
    meta = make_meta(tensors=q4_tensors(), quant="Q4_0")
    fp = estimate(meta, LaunchSettings(ctx_size=512))
    assert fp.host.repack == 0 and fp.host.repack_bound > 0
    old = estimate(meta, LaunchSettings(ctx_size=512), cpu=replace(AVX2, build=9000))
    assert old.host.repack == 0 and any(f"b{FIRST_KNOWN_BUILD}" in n for n in old.notes)
    assert old.host.repack_bound == fp.host.repack_bound > 0


def test_a_gpu_host_buffer_comes_before_repacking() -> None:
    meta = make_meta(tensors=q4_tensors(), quant="Q4_0")
    s = LaunchSettings(ctx_size=512, n_gpu_layers=2)
    cuda = estimate(meta, s, (Gpu("CUDA0", 24 * GIB),), cpu=AVX2)
    assert cuda.host.repack == 0 and any("host buffer type" in n for n in cuda.notes)
    metal = estimate(meta, s, (Gpu("MTL0", 24 * GIB, backend="metal"),), cpu=AVX2)
    cpu_layers = [i for i, d in enumerate(metal.layer_devices[:-1]) if d == CPU]
    assert metal.host.repack == 3 * len(cpu_layers) * _pad(64 * Q4_0_ROW)


def test_json_names_the_parts() -> None:
    meta = make_meta(tensors=q4_tensors(), quant="Q4_0")
    j = estimate(meta, LaunchSettings(ctx_size=512), cpu=AVX2).host.to_json()
    assert j["repack"] and j["mapped"] and j["resident"] == j["total"] - j["mapped"]  # type: ignore[operator]
