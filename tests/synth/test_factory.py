"""Tests for the synthetic-model factory (``tests.synth.factory``)."""

from __future__ import annotations

import json
import mmap
import re
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.synth.factory import (
    FULL_SIZE_PRESETS,
    PRESETS,
    SynthSpec,
    data_bytes,
    plan_tensors,
    write_gguf,
    write_hf_folder,
    write_mmproj,
    write_sparse_gguf,
    write_split,
)

MB = 1024 * 1024

# --- helpers -----------------------------------------------------------------------------------


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def _valid_names(arch: gguf.MODEL_ARCH, n_layer: int) -> set[str]:
    names: set[str] = set()
    for t in gguf.MODEL_TENSORS[arch]:
        fmt = gguf.TENSOR_NAMES[t]
        if "{bid}" in fmt:
            names.update(fmt.format(bid=i) for i in range(n_layer))
        else:
            names.add(fmt)
    return names


def _base_name(name: str) -> str:
    return re.sub(r"\.(weight|bias)$", "", name)


def _arch_enum(name: str) -> gguf.MODEL_ARCH:
    return {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[name]


def _shapes(reader: gguf.GGUFReader) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}


# Shapes (ggml order) computed here from the spec formulas in llama.cpp's load_arch_tensors,
# independently of the factory's layout code.
def _expected_spot_shapes(key: str, s: SynthSpec) -> dict[str, tuple[int, ...]]:
    e, v = s.n_embd, s.n_vocab
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (e, v)}
    if key in ("llama", "qwen2"):
        hd = e // s.n_head
        out |= {
            "blk.0.attn_q.weight": (e, hd * s.n_head),
            "blk.0.attn_k.weight": (e, hd * s.n_head_kv),
            "blk.1.ffn_down.weight": (s.n_ff, e),
            "output.weight": (e, v),
        }
    if key == "qwen2":
        out |= {"blk.0.attn_k.bias": (e // s.n_head * s.n_head_kv,)}
    if key == "qwen3moe":
        out |= {
            "blk.0.attn_q.weight": (e, 32 * 4),
            "blk.0.attn_output.weight": (32 * 4, e),
            "blk.0.attn_q_norm.weight": (32,),
            "blk.1.ffn_gate_inp.weight": (e, 8),
            "blk.1.ffn_up_exps.weight": (e, 32, 8),
            "blk.1.ffn_down_exps.weight": (32, e, 8),
        }
    if key == "gemma3":
        out |= {"blk.5.attn_k.weight": (e, 32), "blk.0.post_ffw_norm.weight": (e,)}
    if key == "deepseek2":
        out |= {
            "blk.0.ffn_gate.weight": (e, s.n_ff),  # leading dense layer
            "blk.0.attn_q_a.weight": (e, 32),
            "blk.0.attn_q_b.weight": (32, 4 * (32 + 16)),
            "blk.0.attn_kv_a_mqa.weight": (e, 32 + 16),
            "blk.0.attn_k_b.weight": (32, 32, 4),
            "blk.0.attn_v_b.weight": (32, 32, 4),
            "blk.0.attn_output.weight": (4 * 32, e),
            "blk.1.ffn_gate_exps.weight": (e, 32, 8),
            "blk.1.ffn_up_shexp.weight": (e, 32),
            "blk.2.exp_probs_b.bias": (8,),
        }
    if key == "qwen3next":
        key_dim, value_dim = 16 * 2, 16 * 4
        out |= {
            "blk.0.attn_qkv.weight": (e, 2 * key_dim + value_dim),
            "blk.0.attn_gate.weight": (e, value_dim),
            "blk.0.ssm_conv1d.weight": (4, 2 * key_dim + value_dim),
            "blk.0.ssm_ba.weight": (e, 2 * 4),
            "blk.0.ssm_a": (4,),
            "blk.0.ssm_out.weight": (value_dim, e),
            "blk.3.attn_q.weight": (e, 2 * 32 * 4),
            "blk.3.attn_output.weight": (32 * 4, e),
            "blk.3.ffn_gate_inp_shexp.weight": (e,),
        }
    if key == "granitehybrid":
        d_inner, ds, ng, nh = 2 * e, 16, 1, 8
        out |= {
            "blk.0.ssm_in.weight": (e, 2 * d_inner + 2 * ng * ds + nh),
            "blk.0.ssm_conv1d.weight": (4, d_inner + 2 * ng * ds),
            "blk.0.ssm_a": (1, nh),
            "blk.0.ssm_norm.weight": (d_inner // ng, ng),
            "blk.2.attn_k.weight": (e, 16 * 2),
        }
    if key == "bert":
        out |= {
            "position_embd.weight": (e, s.context_length),
            "token_types.weight": (e, 2),
            "blk.1.layer_output_norm.bias": (e,),
        }
    if key == "gpt-oss":
        out |= {
            "blk.0.attn_sinks.weight": (4,),
            "blk.0.attn_q.weight": (e, 4 * 16),
            "blk.1.ffn_gate_exps.bias": (32, 4),
            "output.weight": (e, v),
        }
    if key == "lfm2":
        out |= {
            "token_embd_norm.weight": (e,),
            "blk.0.shortconv.conv.weight": (3, e),
            "blk.0.shortconv.in_proj.weight": (e, 3 * e),
            "blk.2.attn_k.weight": (e, 16 * 2),
        }
    return out | _expected_spot_shapes_new(key, s)


def _expected_spot_shapes_new(key: str, s: SynthSpec) -> dict[str, tuple[int, ...]]:
    e, v = s.n_embd, s.n_vocab
    out: dict[str, tuple[int, ...]] = {}
    if key in ("qwen3", "qwen3-embed"):
        out |= {
            "blk.0.attn_q.weight": (e, 32 * 4),  # head_dim 32 * 4 heads != n_embd
            "blk.0.attn_k.weight": (e, 32 * 2),
            "blk.0.attn_output.weight": (32 * 4, e),
            "blk.0.attn_q_norm.weight": (32,),
            "blk.1.attn_k_norm.weight": (32,),
            "blk.1.ffn_gate.weight": (e, 192),
            "blk.1.ffn_down.weight": (192, e),
        }
        if key == "qwen3":
            out["output.weight"] = (e, v)
    if key == "gemma2":
        out |= {
            "blk.0.attn_q.weight": (e, 32 * 4),
            "blk.3.attn_v.weight": (e, 32 * 2),
            "blk.0.post_attention_norm.weight": (e,),
            "blk.3.post_ffw_norm.weight": (e,),
        }
    if key in ("mamba2", "nemotron_h"):
        d_inner, ds, ng, nh = 128, 16, (1 if key == "mamba2" else 2), 8
        out |= {
            "blk.0.ssm_in.weight": (e, 2 * d_inner + 2 * ng * ds + nh),
            "blk.0.ssm_conv1d.weight": (4, d_inner + 2 * ng * ds),
            "blk.0.ssm_conv1d.bias": (d_inner + 2 * ng * ds,),
            "blk.0.ssm_dt.bias": (nh,),
            "blk.0.ssm_a": (1, nh),
            "blk.0.ssm_d": (1, nh),
            "blk.0.ssm_norm.weight": (d_inner // ng, ng),
            "blk.0.ssm_out.weight": (d_inner, e),
        }
    if key == "nemotron_h":  # pattern M - * -
        out |= {
            "blk.1.ffn_up.weight": (e, 128),
            "blk.1.ffn_down.weight": (128, e),
            "blk.2.attn_q.weight": (e, 16 * 4),
            "blk.2.attn_k.weight": (e, 16 * 2),
            "blk.3.ffn_up.weight": (e, 128),
        }
    if key == "rwkv7":
        out |= {
            "token_embd_norm.bias": (e,),
            "output_norm.bias": (e,),
            "output.weight": (e, v),
            "blk.0.time_mix_w1.weight": (e, 32),
            "blk.0.time_mix_w2.weight": (32, e),
            "blk.0.time_mix_a1.weight": (e, 32),
            "blk.0.time_mix_v1.weight": (e, 32),  # layer 0: sized by the iclr rank
            "blk.1.time_mix_v1.weight": (e, 16),
            "blk.1.time_mix_v2.weight": (16, e),
            "blk.1.time_mix_g1.weight": (e, 32),
            "blk.1.time_mix_lerp_fused.weight": (e, 1, 1, 6),
            "blk.1.time_mix_key.weight": (e, e),
            "blk.1.time_mix_ln.bias": (e,),
            "blk.1.channel_mix_lerp_k.weight": (e, 1, 1),
            "blk.1.channel_mix_key.weight": (e, 256),
            "blk.1.channel_mix_value.weight": (256, e),
        }
    return out


_REQUIRED_KEYS: dict[str, list[str]] = {
    "llama": [],
    "qwen2": [],
    "qwen3moe": ["expert_count", "expert_used_count", "expert_feed_forward_length"],
    "gemma3": ["attention.sliding_window", "attention.key_length"],
    "deepseek2": [
        "attention.q_lora_rank",
        "attention.kv_lora_rank",
        "attention.key_length_mla",
        "attention.value_length_mla",
        "expert_feed_forward_length",
        "expert_shared_count",
        "leading_dense_block_count",
        "rope.dimension_count",
    ],
    "qwen3next": [
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
        "full_attention_interval",
    ],
    "granitehybrid": [
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
    ],
    "bert": ["attention.layer_norm_epsilon", "pooling_type", "attention.causal"],
    "gpt-oss": ["expert_feed_forward_length", "attention.sliding_window"],
    "lfm2": ["shortconv.l_cache"],
    "qwen3": ["attention.key_length", "attention.value_length"],
    "qwen3-embed": ["attention.key_length", "pooling_type"],
    "gemma2": [
        "attention.sliding_window",
        "attention.key_length",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ],
    "mamba2": [
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
        "attention.layer_norm_rms_epsilon",
    ],
    "rwkv7": [
        "wkv.head_size",
        "attention.decay_lora_rank",
        "attention.iclr_lora_rank",
        "attention.value_residual_mix_lora_rank",
        "attention.gate_lora_rank",
        "attention.layer_norm_epsilon",
        "feed_forward_length",
    ],
    "nemotron_h": [
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
        "attention.layer_norm_epsilon",
        "attention.layer_norm_rms_epsilon",
        "attention.key_length",
    ],
}
_NEW_PRESETS = ("qwen3", "qwen3-embed", "gemma2", "mamba2", "rwkv7", "nemotron_h")
_COMMON_KEYS = ["context_length", "embedding_length", "block_count", "attention.head_count"]


# --- GGUF presets ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_preset_roundtrip(tmp_path: Path, key: str) -> None:
    spec = PRESETS[key]
    path = write_gguf(tmp_path / f"{key}.gguf", spec)
    assert path.stat().st_size < 5 * MB
    r = gguf.GGUFReader(path)

    assert _field(r, "general.architecture") == spec.arch
    assert _field(r, "general.name") == spec.name
    for k in _COMMON_KEYS + _REQUIRED_KEYS[key]:
        assert f"{spec.arch}.{k}" in r.fields, k
    assert _field(r, f"{spec.arch}.block_count") == spec.n_layer
    assert _field(r, f"{spec.arch}.embedding_length") == spec.n_embd

    # vocabulary: exactly n_vocab unique tokens, one type each, embedding rows match
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == spec.n_vocab == len(set(tokens))
    assert len(_field(r, "tokenizer.ggml.token_type")) == spec.n_vocab
    assert _field(r, "tokenizer.ggml.model") == spec.tokenizer

    # tensor names: all valid for the arch, exactly the planned set, planned shapes
    shapes = _shapes(r)
    valid = _valid_names(_arch_enum(spec.arch), spec.n_layer)
    bad = sorted(n for n in shapes if _base_name(n) not in valid)
    assert not bad, f"names not in gguf.MODEL_TENSORS[{spec.arch}]: {bad}"
    plans = plan_tensors(spec, spec.n_vocab)
    assert shapes == {p.name: p.ne for p in plans}
    for name, ne in _expected_spot_shapes(key, spec).items():
        assert shapes[name] == ne, name

    # norms and biases stay F32, weights use the spec's type
    types = {t.name: t.tensor_type for t in r.tensors}
    assert types["token_embd.weight"] == Q.F16
    for name, ttype in types.items():
        if name.endswith("norm.weight") or name.endswith(".bias"):
            assert ttype == Q.F32, name
    has_head = spec.arch != "bert" and (not spec.tied_embeddings or spec.arch == "gpt-oss")
    assert ("output.weight" in shapes) == has_head


def test_new_presets_are_small(tmp_path: Path) -> None:
    for key in _NEW_PRESETS:
        assert write_gguf(tmp_path / f"{key}.gguf", PRESETS[key]).stat().st_size < 1 * MB, key


def test_new_preset_metadata(tmp_path: Path) -> None:
    r = gguf.GGUFReader(write_gguf(tmp_path / "q.gguf", PRESETS["qwen3"]))
    assert _field(r, "qwen3.attention.key_length") == 32
    assert "qwen3.pooling_type" not in r.fields
    r = gguf.GGUFReader(write_gguf(tmp_path / "e.gguf", PRESETS["qwen3-embed"]))
    assert _field(r, "qwen3.pooling_type") == int(gguf.PoolingType.LAST)
    assert "qwen3.attention.causal" not in r.fields  # last-token pooling over causal attention
    r = gguf.GGUFReader(write_gguf(tmp_path / "g.gguf", PRESETS["gemma2"]))
    assert _field(r, "gemma2.attention.sliding_window") == 128
    assert "gemma2.attention.sliding_window_pattern" not in r.fields  # arch default (2)
    assert _field(r, "gemma2.attn_logit_softcapping") == pytest.approx(50.0)
    assert _field(r, "gemma2.final_logit_softcapping") == pytest.approx(30.0)
    for key in ("mamba2", "rwkv7"):  # pure recurrent: no attention heads, like converted files
        r = gguf.GGUFReader(write_gguf(tmp_path / f"{key}.gguf", PRESETS[key]))
        assert _field(r, f"{key}.attention.head_count") == 0
        assert f"{key}.attention.head_count_kv" not in r.fields
        assert f"{key}.rope.freq_base" not in r.fields
    assert _field(r, "rwkv7.wkv.head_size") == 32
    assert "rwkv7.attention.layer_norm_rms_epsilon" not in r.fields
    r = gguf.GGUFReader(write_gguf(tmp_path / "n.gguf", PRESETS["nemotron_h"]))
    assert _field(r, "nemotron_h.attention.head_count_kv") == [0, 0, 2, 0]
    assert _field(r, "nemotron_h.feed_forward_length") == [0, 128, 0, 128]
    assert _field(r, "nemotron_h.attention.head_count") == 4


def test_layer_patterns() -> None:
    qn = PRESETS["qwen3next"]
    assert [qn.is_recurrent(i) for i in range(qn.n_layer)] == [True, True, True, False]
    gh = PRESETS["granitehybrid"]
    assert [gh.is_recurrent(i) for i in range(gh.n_layer)] == [True, True, False, True]
    ds = PRESETS["deepseek2"]
    names = {p.name for p in plan_tensors(ds, ds.n_vocab)}
    assert "blk.0.ffn_gate.weight" in names and "blk.0.ffn_gate_inp.weight" not in names
    assert "blk.1.ffn_gate_inp.weight" in names and "blk.1.ffn_gate.weight" not in names
    nh = PRESETS["nemotron_h"]
    assert [nh.is_recurrent(i) for i in range(nh.n_layer)] == [True, False, False, False]
    names = {p.name for p in plan_tensors(nh, nh.n_vocab)}
    per_layer = [{n.split(".")[2] for n in names if n.startswith(f"blk.{i}.")} for i in range(4)]
    assert per_layer[0] == {"attn_norm", "ssm_in", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_d"} | {
        "ssm_norm",
        "ssm_out",
    }
    assert per_layer[1] == per_layer[3] == {"attn_norm", "ffn_up", "ffn_down"}  # no gate
    assert per_layer[2] == {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output"}
    for key in ("mamba2", "rwkv7"):
        spec = PRESETS[key]
        assert all(spec.is_recurrent(i) for i in range(spec.n_layer))
    g2 = PRESETS["gemma2"]
    names = {p.name for p in plan_tensors(g2, g2.n_vocab)}
    assert "output.weight" not in names  # gemma2 always reuses token_embd


def test_swa_and_embedding_metadata(tmp_path: Path) -> None:
    r = gguf.GGUFReader(write_gguf(tmp_path / "g.gguf", PRESETS["gemma3"]))
    assert _field(r, "gemma3.attention.sliding_window") == 128
    assert "gemma3.attention.sliding_window_pattern" not in r.fields  # arch default (6)
    r = gguf.GGUFReader(write_gguf(tmp_path / "o.gguf", PRESETS["gpt-oss"]))
    assert _field(r, "gpt-oss.attention.sliding_window_pattern") == 2
    r = gguf.GGUFReader(write_gguf(tmp_path / "b.gguf", PRESETS["bert"]))
    assert _field(r, "bert.pooling_type") == int(gguf.PoolingType.MEAN)
    assert _field(r, "bert.attention.causal") is False
    assert _field(r, "tokenizer.ggml.token_type_count") == 2
    r = gguf.GGUFReader(write_gguf(tmp_path / "l.gguf", PRESETS["lfm2"]))
    assert _field(r, "lfm2.attention.head_count_kv") == [0, 0, 2, 0]


@pytest.mark.parametrize(
    ("qtype", "ftype"),
    [
        (Q.F32, gguf.LlamaFileType.ALL_F32),
        (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        (Q.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    ],
)
def test_weight_types(tmp_path: Path, qtype: Q, ftype: gguf.LlamaFileType) -> None:
    spec = replace(PRESETS["llama"], weight_type=qtype)
    r = gguf.GGUFReader(write_gguf(tmp_path / "m.gguf", spec))
    assert _field(r, "general.file_type") == int(ftype)
    types = {t.name: t for t in r.tensors}
    assert types["blk.0.attn_q.weight"].tensor_type == qtype
    assert types["token_embd.weight"].tensor_type == qtype
    assert types["blk.0.attn_norm.weight"].tensor_type == Q.F32
    assert [int(d) for d in types["blk.0.ffn_down.weight"].shape] == [spec.n_ff, spec.n_embd]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    t = types["blk.0.attn_q.weight"]
    assert int(t.n_bytes) == int(t.n_elements) // block * type_size
    if qtype != Q.F32:
        assert _field(r, "general.quantization_version") == gguf.GGML_QUANT_VERSION


def test_vocab_override_and_tokenizer_kinds(tmp_path: Path) -> None:
    r = gguf.GGUFReader(write_gguf(tmp_path / "v.gguf", PRESETS["qwen2"], vocab=1000))
    assert len(_field(r, "tokenizer.ggml.tokens")) == 1000
    assert _shapes(r)["token_embd.weight"] == (64, 1000)
    tokens = _field(r, "tokenizer.ggml.tokens")
    merges = _field(r, "tokenizer.ggml.merges")
    known = set(tokens)
    for m in merges:  # every merge joins two existing tokens into an existing token
        a, b = m.split(" ")
        assert a in known and b in known and a + b in known
    assert _field(r, "tokenizer.ggml.pre") == "qwen2"
    assert "\u010a" in known  # GPT-2 byte token for "\n"

    r = gguf.GGUFReader(write_gguf(tmp_path / "s.gguf", PRESETS["gemma3"]))
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and "<0x0A>" in tokens
    assert len(_field(r, "tokenizer.ggml.scores")) == len(tokens)

    r = gguf.GGUFReader(write_gguf(tmp_path / "w.gguf", PRESETS["bert"]))
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


_TensorRow = tuple[str, tuple[int, ...], int, int]  # name, ne (ggml order), type, offset


def _scan_gguf(buf: Any) -> tuple[dict[str, Any], list[_TensorRow], int]:
    """Minimal GGUF scanner (GGUFReader takes seconds on 450k array entries).

    Returns the KV pairs (numeric arrays as their length), the tensor table
    and the offset of the data region. ``buf`` may be an mmap: only the header is touched.
    """
    magic, _version, n_tensors, n_kv = struct.unpack_from("<IIQQ", buf, 0)
    assert magic == gguf.GGUF_MAGIC
    off = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def read_str(o: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", buf, o)
        return buf[o + 8 : o + 8 + n], o + 8 + n

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
    scalar[12] = "d"
    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key, off = read_str(off)
        (vtype,) = struct.unpack_from("<I", buf, off)
        off += 4
        if vtype == 8:
            val, off = read_str(off)
            out[key.decode()] = val.decode()
        elif vtype == 9:
            etype, count = struct.unpack_from("<IQ", buf, off)
            off += 12
            if etype == 8:
                items = []
                for _ in range(count):
                    s, off = read_str(off)
                    items.append(s)
                out[key.decode()] = items
            else:
                out[key.decode()] = count
                off += sizes[etype] * count
        else:
            (out[key.decode()],) = struct.unpack_from("<" + scalar[vtype], buf, off)
            off += sizes[vtype]
    tensors: list[_TensorRow] = []
    for _ in range(n_tensors):
        name, off = read_str(off)
        (n_dims,) = struct.unpack_from("<I", buf, off)
        ne = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
        ttype, offset = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
        off += 4 + 8 * n_dims + 12
        tensors.append((name.decode(), tuple(ne), ttype, offset))
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    return out, tensors, -(-off // align) * align


def _scan_kv(path: Path) -> dict[str, Any]:
    return _scan_gguf(path.read_bytes())[0]


def test_realistic_tokenizer(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    path = write_gguf(tmp_path / "r.gguf", PRESETS["llama"], realistic_tokenizer=True)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10  # typically ~1.5 s
    assert path.stat().st_size < 20 * MB
    kv = _scan_kv(path)
    tokens, merges = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.merges"]
    assert len(tokens) == 150_000 == len(set(tokens))
    assert kv["tokenizer.ggml.token_type"] == 150_000
    assert len(merges) > 140_000
    lengths = np.array([len(t) for t in tokens[256:-3]])
    assert 4 <= float(np.median(lengths)) <= 12
    assert lengths.max() <= 24
    assert "tokenizer.chat_template" in kv


# --- split sets --------------------------------------------------------------------------------


def test_split_set(tmp_path: Path) -> None:
    spec = PRESETS["qwen3moe"]
    paths = write_split(tmp_path, spec, n_shards=3)
    assert [p.name for p in paths] == [f"{spec.name}-{k:05d}-of-00003.gguf" for k in (1, 2, 3)]
    assert all(p.exists() for p in paths)
    single = {p.name: p.ne for p in plan_tensors(spec, spec.n_vocab)}
    seen: dict[str, tuple[int, ...]] = {}
    for k, p in enumerate(paths):
        r = gguf.GGUFReader(p)
        no, count, total = (r.fields[f"split.{x}"] for x in ("no", "count", "tensors.count"))
        assert (no.contents(), count.contents(), total.contents()) == (k, 3, len(single))
        assert no.types == [gguf.GGUFValueType.UINT16]
        assert count.types == [gguf.GGUFValueType.UINT16]
        assert total.types == [gguf.GGUFValueType.INT32]
        # like gguf-split: only the first shard carries the model metadata
        assert ("general.architecture" in r.fields) == (k == 0)
        assert len(r.tensors) > 0
        seen |= _shapes(r)
    assert seen == single


def test_split_rejects_bad_counts(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_split(tmp_path, PRESETS["llama"], n_shards=1)
    with pytest.raises(ValueError):
        write_split(tmp_path, PRESETS["llama"], n_shards=10_000)
    with pytest.raises(ValueError):
        write_gguf(tmp_path / "x.gguf", replace(PRESETS["llama"], arch="no-such-arch"))


# --- mmproj ------------------------------------------------------------------------------------


@pytest.mark.parametrize("proj", ["gemma3", "mlp"])
def test_mmproj(tmp_path: Path, proj: str) -> None:
    path = write_mmproj(tmp_path / "mmproj.gguf", projector_type=proj, text_n_embd=96)
    assert path.stat().st_size < 1 * MB
    r = gguf.GGUFReader(path)
    assert _field(r, "general.architecture") == "clip"
    assert _field(r, "clip.has_vision_encoder") is True
    assert _field(r, "clip.projector_type") == proj
    for k in ("embedding_length", "block_count", "attention.head_count", "projection_dim"):
        assert f"clip.vision.{k}" in r.fields
    assert _field(r, "clip.vision.image_size") % _field(r, "clip.vision.patch_size") == 0
    shapes = _shapes(r)
    valid = _valid_names(gguf.MODEL_ARCH.MMPROJ, 4)  # mm.0 … mm.2
    assert all(_base_name(n) in valid for n in shapes), sorted(shapes)
    assert shapes["v.patch_embd.weight"] == (8, 8, 3, 64)
    assert shapes["v.blk.1.ffn_down.weight"] == (128, 64)
    if proj == "gemma3":
        assert shapes["mm.input_projection.weight"] == (96, 64)
        assert shapes["v.position_embd.weight"] == (64, 64)
    else:
        assert shapes["mm.2.weight"] == (96, 96)
        assert shapes["v.position_embd.weight"] == (64, 65)


# --- Hugging Face folders ----------------------------------------------------------------------

_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}


def _check_safetensors(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert "__metadata__" in header
    spans = sorted(
        (v["data_offsets"][0], v["data_offsets"][1], k, v)
        for k, v in header.items()
        if k != "__metadata__"
    )
    pos = 0
    for begin, end, name, info in spans:
        assert begin == pos, name  # contiguous, no overlap
        assert end - begin == int(np.prod(info["shape"])) * _ITEMSIZE[info["dtype"]], name
        pos = end
    assert 8 + n + pos == len(raw)
    return {k: v for k, v in header.items() if k != "__metadata__"}


def test_hf_folder_single(tmp_path: Path) -> None:
    d = write_hf_folder(tmp_path / "llama", config={"num_hidden_layers": 3})
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["torch_dtype"] == "bfloat16" and cfg["num_hidden_layers"] == 3
    for k in (
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "max_position_embeddings",
        "vocab_size",
    ):
        assert k in cfg
    tensors = _check_safetensors(d / "model.safetensors")
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    assert tensors["model.embed_tokens.weight"]["shape"] == [v, h]
    assert tensors["model.layers.2.self_attn.q_proj.weight"]["shape"] == [4 * 16, h]
    assert tensors["model.layers.2.self_attn.k_proj.weight"]["shape"] == [2 * 16, h]
    assert tensors["lm_head.weight"]["dtype"] == "BF16"
    assert "model.layers.3.input_layernorm.weight" not in tensors


def test_hf_folder_sharded_moe(tmp_path: Path) -> None:
    d = write_hf_folder(
        tmp_path / "moe", architecture="Qwen3MoeForCausalLM", dtype="F16", n_shards=3
    )
    files = sorted(p.name for p in d.glob("*.safetensors"))
    assert files == [f"model-{k:05d}-of-00003.safetensors" for k in (1, 2, 3)]
    index = json.loads((d / "model.safetensors.index.json").read_text())
    all_tensors: dict[str, Any] = {}
    for f in files:
        part = _check_safetensors(d / f)
        assert all(index["weight_map"][name] == f for name in part)
        all_tensors |= part
    assert set(index["weight_map"]) == set(all_tensors)
    total = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in all_tensors.values())
    assert index["metadata"]["total_size"] == total
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in all_tensors
    assert "model.layers.0.self_attn.q_norm.weight" in all_tensors


@pytest.mark.parametrize(
    ("arch", "nested"),
    [("Gemma3ForConditionalGeneration", False), ("Qwen2ForCausalLM", True)],
)
def test_hf_folder_nested(tmp_path: Path, arch: str, nested: bool) -> None:
    d = write_hf_folder(
        tmp_path / "m", architecture=arch, nested_text_config=nested, n_shards=2, dtype="F32"
    )
    cfg = json.loads((d / "config.json").read_text())
    text = cfg["text_config"]
    assert text["hidden_size"] == 64 and "num_hidden_layers" in text
    names: set[str] = set()
    for f in d.glob("*.safetensors"):
        names |= set(_check_safetensors(f))
    assert "language_model.model.layers.0.self_attn.q_proj.weight" in names
    if arch.endswith("ForConditionalGeneration"):
        assert cfg["vision_config"]["model_type"] == "siglip_vision_model"
        assert text["sliding_window"] == 128 and text["model_type"] == "gemma3_text"
        assert "multi_modal_projector.mm_input_projection_weight" in names
        assert "language_model.lm_head.weight" not in names  # gemma3 ties embeddings
    else:
        assert "vision_config" not in cfg
        assert "language_model.model.layers.0.self_attn.q_proj.bias" in names


# --- sparse files: real dimensions, megabytes on disk ------------------------------------------


def _nbytes(ne: tuple[int, ...], ttype: int) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[Q(ttype)]
    return int(np.prod(ne)) // block * type_size


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_sparse_matches_dense(tmp_path: Path, key: str) -> None:
    spec = PRESETS[key]
    dense = write_gguf(tmp_path / "d.gguf", spec).read_bytes()
    sparse = write_gguf(tmp_path / "s.gguf", spec, sparse=True).read_bytes()
    assert len(sparse) == len(dense)
    _, tensors, start = _scan_gguf(sparse)
    assert sparse[:start] == dense[:start]  # same metadata and tensor table
    kinds = {t.name: t.kind for t in plan_tensors(spec, spec.n_vocab)}
    for name, ne, ttype, offset in tensors:
        lo, hi = start + offset, start + offset + _nbytes(ne, ttype)
        if kinds[name] in ("norm", "neg"):  # constants that matter are real
            assert sparse[lo:hi] == dense[lo:hi], name
        else:
            assert not any(sparse[lo:hi]), name


def test_full_size_parameter_counts() -> None:
    # the model cards' totals: Llama-3-8B 8.03B, Qwen3-30B-A3B 30.5B, Qwen3-4B 4.0B
    def n_params(key: str) -> int:
        spec = FULL_SIZE_PRESETS[key]
        return sum(int(np.prod(t.ne)) for t in plan_tensors(spec, spec.n_vocab))

    assert n_params("llama3-8b") == 8_030_261_248
    assert n_params("qwen3-30b-a3b") == 30_532_122_624
    assert n_params("qwen3-4b") == 4_022_468_096
    assert 11.7e9 < n_params("gemma3-12b") < 11.8e9  # text model only


@pytest.mark.parametrize("key", sorted(FULL_SIZE_PRESETS))
def test_full_size_sparse(tmp_path: Path, key: str) -> None:
    spec = FULL_SIZE_PRESETS[key]
    path = write_sparse_gguf(tmp_path / f"{key}.gguf", spec)
    st = path.stat()
    assert st.st_size > 2 * 1024**3
    # a hole: the header (mostly the vocabulary) and the norm weights are all that is stored
    assert st.st_blocks * 512 < 16 * MB, "file system without sparse files?"
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if hasattr(buf, "madvise"):  # no read-ahead: fault in only the pages looked at
            buf.madvise(mmap.MADV_RANDOM)
        kv, tensors, start = _scan_gguf(buf)
        assert kv["general.architecture"] == spec.arch
        assert kv[f"{spec.arch}.block_count"] == spec.n_layer
        assert kv[f"{spec.arch}.embedding_length"] == spec.n_embd
        assert kv["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_0)
        assert len(kv["tokenizer.ggml.tokens"]) == spec.n_vocab
        valid = _valid_names(_arch_enum(spec.arch), spec.n_layer)
        plans = {p.name: p for p in plan_tensors(spec, spec.n_vocab)}
        assert [t[0] for t in tensors] == list(plans)
        offset = 0
        for name, ne, ttype, toff in tensors:
            assert _base_name(name) in valid, name
            assert ne == plans[name].ne, name
            assert toff == offset, name  # contiguous, aligned like GGUFWriter
            if plans[name].kind == "norm":
                assert ttype == Q.F32, name
                assert struct.unpack_from("<f", buf, start + toff)[0] == 1.0, name
            elif plans[name].kind == "w" or plans[name].kind == "embd":
                assert ttype == Q.Q4_0, name
                assert buf[start + toff : start + toff + 64] == bytes(64), name
            offset += -(-_nbytes(ne, ttype) // 32) * 32
        assert start + offset == st.st_size
        assert offset == data_bytes(spec)


def test_full_size_needs_sparse(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sparse"):
        write_gguf(tmp_path / "big.gguf", FULL_SIZE_PRESETS["llama3-8b"])
    assert not (tmp_path / "big.gguf").exists()
    with pytest.raises(ValueError, match="sparse"):
        write_split(tmp_path, FULL_SIZE_PRESETS["llama3-8b"], n_shards=2)


def test_sparse_split(tmp_path: Path) -> None:
    spec = FULL_SIZE_PRESETS["qwen3-4b"]
    paths = write_split(tmp_path, spec, n_shards=3, sparse=True)
    assert len(paths) == 3
    total, names = 0, []
    for k, p in enumerate(paths):
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            kv, tensors, start = _scan_gguf(buf)
            assert ("general.architecture" in kv) == (k == 0)
            data = p.stat().st_size - start
            assert data == sum(-(-_nbytes(ne, tt) // 32) * 32 for _, ne, tt, _ in tensors)
            total += data
            names += [t[0] for t in tensors]
        assert p.stat().st_blocks * 512 < 16 * MB
    assert total == data_bytes(spec)
    assert names == [t.name for t in plan_tensors(spec, spec.n_vocab)]
