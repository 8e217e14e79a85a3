"""KV cache and recurrent-state sizes of the hybrid, MLA, sparse-indexer and sliding-window
architectures whose hyper-parameters llama.cpp reads its own way, against what b11434's
llama-server allocated for the models its `test-llama-archs` writes (2-4 layers, F32; the
GGUFs here carry the same hyper-parameters; `bench/archs.py` measures the real files).

Each expected figure is the engine's exact byte count; the comment beside it is what
`llama_kv_cache: ... KV buffer size` / `llama_memory_recurrent: ... RS buffer size` printed
(MiB, two decimals) at that setting.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from qmgui.core.footprint import kv_bytes_per_layer, recurrent_bytes_per_layer
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings, resolve
from qmgui.core.meta import ModelMeta, meta_from_gguf

# bench/archs.py's settings: `-c 1024` (4 auto slots, one unified cache, flash attention on
# the CPU), `-c 4096 -np 4 -fa off` (4 streams of 1024 cells, V transposed) and a q8_0 cache
DEFAULT = LaunchSettings(ctx_size=1024)
NP4_FA_OFF = LaunchSettings(ctx_size=4096, parallel=4, flash_attn="off")
Q8 = LaunchSettings(
    ctx_size=1024, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on", ubatch_size=128
)

Value = int | float | bool | str | list[int]


def write_model(path: Path, arch: str, n_layer: int, keys: dict[str, Value]) -> ModelMeta:
    """A GGUF with `keys` (after `{arch}.`) and one small tensor per block, read back."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", n_layer)
    w.add_uint32(f"{arch}.vocab_size", 128)
    w.add_uint32(f"{arch}.context_length", 256)
    for key, v in keys.items():
        name = f"{arch}.{key}"
        if isinstance(v, bool):
            w.add_bool(name, v)
        elif isinstance(v, int):
            w.add_uint32(name, v)
        elif isinstance(v, float):
            w.add_float32(name, v)
        elif isinstance(v, str):
            w.add_string(name, v)
        else:
            w.add_array(name, v)
    w.add_tensor("token_embd.weight", np.zeros((128, 4), dtype=np.float32))
    w.add_tensor("output.weight", np.zeros((128, 4), dtype=np.float32))
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta_from_gguf(read_gguf_header(path), file_name=path.name)


def kv(meta: ModelMeta, s: LaunchSettings = DEFAULT) -> int:
    return sum(kv_bytes_per_layer(meta, resolve(meta, s)).values())


def rs(meta: ModelMeta, s: LaunchSettings = DEFAULT) -> int:
    return sum(recurrent_bytes_per_layer(meta, resolve(meta, s)).values())


ATTN = {
    "embedding_length": 256,
    "feed_forward_length": 384,
    "attention.head_count": 2,
    "attention.head_count_kv": 2,
    "attention.key_length": 128,
    "attention.value_length": 128,
}
GDN = {  # gated delta net / Mamba-2 state keys of the qwen3next-family files
    "ssm.inner_size": 256,
    "ssm.conv_kernel": 4,
    "ssm.state_size": 128,
    "ssm.time_step_rank": 2,
    "ssm.group_count": 2,
}
MLA = {  # the MLA keys of the DeepSeek-family files (one head, re-converted: *_mla set)
    "embedding_length": 128,
    "feed_forward_length": 192,
    "leading_dense_block_count": 1,
    "attention.key_length": 576,
    "attention.value_length": 512,
    "attention.q_lora_rank": 512,
    "attention.kv_lora_rank": 512,
    "attention.key_length_mla": 192,
    "attention.value_length_mla": 128,
    "rope.dimension_count": 64,
}
KDA = {"ssm.conv_kernel": 4, "kda.head_dim": 128}


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35", "qwen35moe"])
def test_qwen_hybrids_read_attention_recurrent_layers(tmp_path: Path, arch: str) -> None:
    # models/qwen35.cpp: get_key_or_arr(LLM_KV_ATTENTION_RECURRENT_LAYERS, is_recr_impl) -
    # the key is {arch}.attention.recurrent_layers; layer 0 is a delta net, layer 1 attends
    m = write_model(
        tmp_path / "m.gguf", arch, 2, {**ATTN, **GDN, "attention.recurrent_layers": [1, 0]}
    )
    assert m.recurrent_layers == (True, False)
    assert kv(m) == 1_048_576  # KV 1.00 MiB: one layer, 1024 cells x (256 K + 256 V) x f16
    assert kv(m, NP4_FA_OFF) == 4_194_304  # 4.00 MiB
    assert kv(m, Q8) == 557_056  # 0.53 MiB
    # RS 0.54 MiB: 4 seqs x (3 x (256 + 2 x 2 x 128) conv + 128 x 256 state) x 4 bytes
    assert rs(m) == 561_152


def test_qwen4exp_indexer_and_ple_history(tmp_path: Path) -> None:
    # llama-memory-hybrid-idx.cpp: a k-pool indexer caches raw | pooled keys (kpool_row 2,
    # models/qwen4exp.cpp) on the attention layers; llama-memory-recurrent.cpp keeps the PLE
    # layer's conv history beside its states: (conv_kernel - 1) x ngram x hc x n_embd floats
    keys: dict[str, Value] = {
        **ATTN,
        **GDN,
        "attention.recurrent_layers": [1, 0],
        "attention.indexer.head_count": 64,
        "attention.indexer.key_length": 128,
        "attention.indexer.top_k": 131072,
        "attention.indexer.kpool": 4,
        "attention.compress_ratios": [4, 4],
        "hyper_connection.count": 4,
        "ple.layers": [0],
        "ple.ngram_size": 3,
        "ple.heads_per_ngram": 2,
        "ple.conv_kernel": 4,
    }
    m = write_model(tmp_path / "m.gguf", "qwen4exp", 2, keys)
    assert kv(m) == 1_572_864  # 1.00 MiB attention + 0.50 MiB indexer (256 keys x f16)
    assert kv(m, NP4_FA_OFF) == 6_291_456  # 6.00 MiB
    assert kv(m, Q8) == 835_584  # 0.53 + 0.27 MiB
    assert rs(m) == 708_608  # RS 0.68 MiB: 0.54 MiB states + 0.14 MiB PLE history


@pytest.mark.parametrize("arch", ["nemotron_h", "nemotron_h_moe"])
def test_nemotron_h_attends_only_where_no_feed_forward(tmp_path: Path, arch: str) -> None:
    # llama-model.cpp create_memory: filter_attn = !is_recr(il) && n_ff(il) == 0 - layer 2
    # has KV heads and a feed-forward, and keeps no KV
    keys: dict[str, Value] = {
        **ATTN,
        **GDN,
        "ssm.inner_size": 512,
        "feed_forward_length": [0, 0, 384],
        "attention.head_count": [2, 0, 2],
        "attention.head_count_kv": [2, 0, 2],
    }
    m = write_model(tmp_path / "m.gguf", arch, 3, keys)
    assert kv(m) == 1_048_576  # KV 1.00 MiB: layer 0 only
    assert kv(m, NP4_FA_OFF) == 4_194_304  # 4.00 MiB
    assert rs(m) == 1_097_728  # RS 1.05 MiB: layer 1


def test_falcon_h1_keeps_kv_and_state_in_every_layer(tmp_path: Path) -> None:
    # create_memory: falcon-h1's filter_attn and filter_recr both return true
    keys: dict[str, Value] = {**ATTN, **GDN, "ssm.inner_size": 512, "attention.recurrent_layers": 1}
    m = write_model(tmp_path / "m.gguf", "falcon-h1", 2, keys)
    assert kv(m) == 2_097_152  # KV 2.00 MiB
    assert kv(m, Q8) == 1_114_112  # 1.06 MiB
    assert rs(m) == 2_195_456  # RS 2.09 MiB


def test_exaone4_slides_only_in_the_32b(tmp_path: Path) -> None:
    # models/exaone4.cpp: swa_type and the pattern are set only when n_layer == 64; a
    # sliding_window key alone leaves every layer full
    m = write_model(tmp_path / "m.gguf", "exaone4", 2, {**ATTN, "attention.sliding_window": 32})
    assert m.swa_layers == (False, False)
    assert kv(m) == 2_097_152  # KV 2.00 MiB
    assert kv(m, NP4_FA_OFF) == 8_388_608  # 8.00 MiB
    assert kv(m, Q8) == 1_114_112  # 1.06 MiB
    big = write_model(tmp_path / "b.gguf", "exaone4", 64, {**ATTN, "attention.sliding_window": 32})
    assert big.swa_layers == tuple(il % 4 < 3 for il in range(64))


def test_minicpm3_zero_mla_lengths_cache_full_k_and_v(tmp_path: Path) -> None:
    # llama_hparams::is_mla(): key_length_mla and value_length_mla both non-zero; written
    # as 0, the cache holds full K and V
    keys: dict[str, Value] = {
        **ATTN,
        "attention.q_lora_rank": 512,
        "attention.kv_lora_rank": 512,
        "attention.key_length_mla": 0,
        "attention.value_length_mla": 0,
        "rope.dimension_count": 128,
    }
    m = write_model(tmp_path / "m.gguf", "minicpm3", 2, keys)
    assert m.mla is not None and m.mla.key_length_mla is None
    assert kv(m) == 2_097_152  # KV 2.00 MiB
    assert kv(m, NP4_FA_OFF) == 8_388_608  # 8.00 MiB


@pytest.mark.parametrize("arch", ["kimi-linear", "kimi-k3", "bailingmoe3"])
def test_kda_state(tmp_path: Path, arch: str) -> None:
    # llama_hparams::n_embd_r / n_embd_s with n_embd_head_kda (models/kimi-linear.cpp):
    # 3 x (d_conv - 1) x n_head() x head_dim conv floats and head_dim^2 x n_head() state
    # floats; KDA layers are those with no KV heads
    keys: dict[str, Value] = {
        **MLA,
        **KDA,
        "attention.head_count": [1, 0],
        "attention.head_count_kv": [1, 0],
        "attention.recurrent_layers": [0, 1],
    }
    m = write_model(tmp_path / "m.gguf", arch, 2, keys)
    assert m.recurrent_layers == (False, True)
    assert kv(m) == 1_179_648  # KV 1.12 MiB: one MLA latent of 576
    assert rs(m) == 280_576  # RS 0.27 MiB: 4 seqs x (1,152 + 16,384) x 4 bytes


def test_glm5_next_kda_and_kpool_indexer(tmp_path: Path) -> None:
    # create_memory GLM5_NEXT: llama_memory_hybrid_idx, the indexer (key | gate | pooled,
    # indexer_kpool_row 3) on the attention layers that are indexer-full (types 1: all)
    keys: dict[str, Value] = {
        **MLA,
        **KDA,
        "attention.key_length": 512,
        "attention.value_length": 512,
        "attention.head_count": 1,
        "attention.head_count_kv": [1, 0],
        "attention.indexer.head_count": 64,
        "attention.indexer.key_length": 128,
        "attention.indexer.top_k": 131072,
        "attention.indexer.kpool": 4,
        "attention.indexer.types": 1,
        "attention.recurrent_layers": [0, 1],
    }
    m = write_model(tmp_path / "m.gguf", "glm5-next", 2, keys)
    assert kv(m) == 1_835_008  # 1.00 MiB MLA + 0.75 MiB indexer
    assert kv(m, NP4_FA_OFF) == 7_340_032  # 7.00 MiB
    assert rs(m) == 280_576  # RS 0.27 MiB


def test_minimax_01_lightning_state(tmp_path: Path) -> None:
    # models/minimax-01.cpp: n_embd_head_la = the key length; n_embd_s = head^2 x n_head()
    m = write_model(
        tmp_path / "m.gguf", "minimax-01", 2, {**ATTN, "attention.recurrent_layers": [1, 0]}
    )
    assert kv(m) == 1_048_576  # KV 1.00 MiB
    assert kv(m, Q8) == 557_056  # 0.53 MiB
    assert rs(m) == 524_288  # RS 0.50 MiB


INDEXER = {
    "attention.head_count": 1,
    "attention.head_count_kv": 1,
    "attention.indexer.head_count": 64,
    "attention.indexer.key_length": 128,
    "attention.indexer.top_k": 131072,
}


@pytest.mark.parametrize(
    ("arch", "extra", "default", "np4"),
    [
        # llama-kv-cache-dsa.cpp: one indexer key head of 128 per layer beside the MLA latent
        ("deepseek32", {}, 2_883_584, 11_534_336),  # 2.75 / 11.00 MiB
        ("glm-dsa", {"attention.indexer.types": 1}, 2_883_584, 11_534_336),
        # only the layers that own an indexer (indexer.types) keep its cache
        ("hy_v4", {"attention.indexer.types": [1, 0]}, 2_621_440, 10_485_760),  # 2.50 / 10.00
        # dots3note: layer 1 slides (768 cells), the indexer is on layer 0
        (
            "dots3note",
            {
                "attention.indexer.types": [1, 0],
                "attention.sliding_window": 32,
                "attention.sliding_window_pattern": [0, 1],
            },
            2_326_528,  # 1.12 + 0.25 + 0.84 MiB
            9_306_112,  # 8.88 MiB
        ),
    ],
)
def test_dsa_indexer_cache(
    tmp_path: Path, arch: str, extra: dict[str, Value], default: int, np4: int
) -> None:
    m = write_model(tmp_path / "m.gguf", arch, 2, {**MLA, **INDEXER, **extra})
    assert kv(m) == default
    assert kv(m, NP4_FA_OFF) == np4


def test_minimax_m3_msa_indexer_keeps_k_and_v(tmp_path: Path) -> None:
    # llama-kv-cache-msa.cpp: one indexer head (K and V) on the layers after the dense lead
    keys: dict[str, Value] = {
        **ATTN,
        "leading_dense_block_count": 1,
        "attention.indexer.head_count": 2,
        "attention.indexer.key_length": 128,
        "attention.indexer.top_k": 131072,
        "attention.indexer.block_size": 4,
        "attention.indexer.local_blocks": 1,
    }
    m = write_model(tmp_path / "m.gguf", "minimax-m3", 2, keys)
    assert kv(m) == 2_621_440  # 2.00 + 0.50 MiB
    assert kv(m, NP4_FA_OFF) == 10_485_760  # 10.00 MiB
    assert kv(m, Q8) == 1_392_640  # 1.06 + 0.27 MiB


def test_deepseek4_compressed_caches(tmp_path: Path) -> None:
    # llama-kv-cache-dsv4.cpp: K only, one stream per sequence even when unified; every layer
    # keeps a raw sliding-window cache (pad(32 + n_ubatch, 256) cells); compress_ratios 4
    # (CSA) and 128 (HCA) add a cache of pad(ceil(cells / ratio), 256) entries, and the CSA
    # layers an indexer key cache of 128 values per entry
    keys: dict[str, Value] = {
        "embedding_length": 512,
        "attention.head_count": 8,
        "attention.head_count_kv": 1,
        "attention.key_length": 64,
        "attention.value_length": 64,
        "attention.q_lora_rank": 64,
        "attention.sliding_window": 32,
        "attention.sliding_window_pattern": [1, 1, 1, 1],
        "attention.indexer.head_count": 64,
        "attention.indexer.key_length": 128,
        "attention.indexer.top_k": 131072,
        "attention.compress_ratios": [0, 0, 4, 128],
        "hyper_connection.count": 4,
    }
    m = write_model(tmp_path / "m.gguf", "deepseek4", 4, keys)
    # KV 1.50 (raw, 768 cells x 4 streams) + 0.12 (CSA) + 0.12 (HCA) + 0.25 (indexer) MiB
    assert kv(m) == 2_097_152
    assert kv(m, NP4_FA_OFF) == 2_097_152
    assert kv(m, Q8) == 557_056  # 0.27 + 0.07 + 0.07 + 0.13 MiB


def test_interval_hybrids_without_a_layer_list(tmp_path: Path) -> None:
    # no attention.recurrent_layers: every full_attention_interval-th layer attends, 4 by
    # default (models/qwen3next.cpp), 8 for minimax-01 (models/minimax-01.cpp)
    q = write_model(tmp_path / "q.gguf", "qwen3next", 8, {**ATTN, **GDN})
    assert q.recurrent_layers == (True, True, True, False) * 2
    m = write_model(tmp_path / "m.gguf", "minimax-01", 8, dict(ATTN))
    assert m.recurrent_layers == (True,) * 7 + (False,)
