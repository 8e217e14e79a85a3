"""Normalised metadata from GGUF headers of every synthetic architecture."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.meta import ModelClass, ModelMeta, Pooling, meta_from_gguf
from tests.synth.factory import PRESETS, SynthSpec, write_gguf


@pytest.fixture(scope="module")
def metas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelMeta]:
    root = tmp_path_factory.mktemp("meta")
    out = {}
    for key, spec in PRESETS.items():
        path = write_gguf(root / f"{key}.gguf", spec)
        out[key] = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    return out


def _kv(spec: SynthSpec) -> tuple[int, ...]:
    if isinstance(spec.n_head_kv, tuple):
        return spec.n_head_kv
    return (spec.n_head_kv,) * spec.n_layer


@pytest.mark.parametrize("key", list(PRESETS))
def test_common_fields(metas: dict[str, ModelMeta], key: str) -> None:
    spec, m = PRESETS[key], metas[key]
    assert m.format == "gguf"
    assert m.architecture == spec.arch
    assert m.name == spec.name
    assert m.n_layer == spec.n_layer
    assert m.n_embd == spec.n_embd
    assert m.context_length == spec.context_length
    assert m.n_head_kv == _kv(spec)
    assert m.vocab_size == spec.n_vocab
    assert m.tied_embeddings == spec.tied_embeddings
    # the byte accounting is complete: per layer + the rest == all weights
    assert sum(m.bytes_per_layer) + m.non_layer_bytes == m.weight_bytes
    assert sum(m.dtypes.values()) == m.weight_bytes
    assert m.param_count == sum(_n(t.shape) for t in m.tensors)
    assert all(b > 0 for b in m.bytes_per_layer)


def _n(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_classes(metas: dict[str, ModelMeta]) -> None:
    assert metas["bert"].model_class == ModelClass.EMBEDDING
    assert metas["bert"].pooling == Pooling.MEAN
    assert metas["bert"].causal is False
    for key in ("llama", "qwen2", "qwen3moe", "gemma3", "deepseek2", "qwen3next", "gpt-oss"):
        assert metas[key].model_class == ModelClass.LLM
        assert metas[key].causal is True


def test_head_sizes(metas: dict[str, ModelMeta]) -> None:
    assert (metas["llama"].head_dim_k, metas["llama"].head_dim_v) == (16, 16)  # 64 / 4
    assert metas["qwen3moe"].head_dim_k == 32  # explicit key_length, != n_embd / n_head


def test_sliding_window_layouts(metas: dict[str, ModelMeta]) -> None:
    g = metas["gemma3"]
    assert g.sliding_window == 128
    assert g.swa_layers == (True, True, True, True, True, False)  # period 6
    o = metas["gpt-oss"]
    assert o.swa_layers == (True, False)  # period 2
    assert metas["llama"].swa_layers == (False, False)


def test_mla(metas: dict[str, ModelMeta]) -> None:
    m = metas["deepseek2"]
    assert m.mla is not None
    assert m.mla.kv_lora_rank == 32
    assert m.mla.q_lora_rank == 32
    assert m.mla.rope_dim == 16
    assert m.n_expert == 8
    assert m.n_expert_used == 2
    assert m.n_expert_shared == 1
    assert m.leading_dense_layers == 1
    assert m.is_moe


def test_recurrent_layouts(metas: dict[str, ModelMeta]) -> None:
    assert metas["qwen3next"].recurrent_layers == (True, True, True, False)
    assert metas["qwen3next"].ssm is not None
    assert metas["qwen3next"].ssm.state_size == 16
    assert metas["granitehybrid"].recurrent_layers == (True, True, False, True)
    assert metas["lfm2"].recurrent_layers == (True, True, False, True)
    assert metas["lfm2"].shortconv_l_cache == 3
    assert not metas["llama"].is_recurrent


def test_quant_label(tmp_path: Path, metas: dict[str, ModelMeta]) -> None:
    assert metas["llama"].quant == "F16"
    assert metas["llama"].dtypes["F16"] > 0


def _tiny(path: Path, arch: str, **kv: object) -> ModelMeta:
    """A header-only model of `arch` with a few keys (not loadable; enough to classify)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    for key, value in kv.items():
        if isinstance(value, str):
            w.add_string(key.format(arch=arch), value)
        else:
            w.add_uint32(key.format(arch=arch), int(value))  # type: ignore[call-overload]
    w.add_tensor("blk.0.w.weight", np.zeros((8, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta_from_gguf(read_gguf_header(path), file_name=path.name)


@pytest.mark.parametrize(
    ("arch", "kv", "expected"),
    [
        ("qwen3", {"{arch}.pooling_type": 3}, ModelClass.EMBEDDING),  # Qwen3-Embedding
        ("qwen3", {"{arch}.pooling_type": 4}, ModelClass.RERANK),  # Qwen3-Reranker
        ("bert", {"{arch}.pooling_type": 4}, ModelClass.RERANK),  # bge-reranker
        ("flux", {}, ModelClass.IMAGE),
        ("wavtokenizer-dec", {}, ModelClass.TTS),
        ("llama", {"general.name": "OuteTTS 1.0 1B"}, ModelClass.TTS),
        ("clip", {}, ModelClass.PROJECTOR),
        ("llama", {}, ModelClass.LLM),
    ],
)
def test_classification(
    tmp_path: Path, arch: str, kv: dict[str, object], expected: ModelClass
) -> None:
    assert _tiny(tmp_path / "m.gguf", arch, **kv).model_class == expected


def test_gguf_version_2_reads_like_3(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "v3.gguf", PRESETS["llama"])
    data = bytearray(path.read_bytes())
    data[4] = 2  # the version field; v2 and v3 share the layout
    (tmp_path / "v2.gguf").write_bytes(bytes(data))
    v2 = read_gguf_header(tmp_path / "v2.gguf")
    assert v2.version == 2
    assert v2.tensors == read_gguf_header(path).tensors


def test_old_mla_gguf_is_flagged(tmp_path: Path) -> None:
    m = _tiny(tmp_path / "ds.gguf", "deepseek2", **{"{arch}.attention.kv_lora_rank": 512})
    assert m.mla is not None
    assert any("old MLA" in w for w in m.warnings)
