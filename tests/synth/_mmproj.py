"""A tiny CLIP vision projector (``mmproj``) GGUF as llama.cpp's ``tools/mtmd/clip.cpp`` loads it.

Two projector types:

* ``gemma3`` – SigLIP encoder, average-pool by ``scale_factor``, RMS-norm
  (``mm.soft_emb_norm``) and ``mm.input_projection`` into the text model's width;
* ``mlp`` – LLaVA-1.5: CLIP encoder with class embedding and pre-norm, then the
  two-layer ``mm.0`` / ``mm.2`` projector.

``text_n_embd`` must equal the text model's ``n_embd`` (llama-server checks it).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import gguf
import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import GGMLQuantizationType as Q

from tests.synth._writer import FastGGUFWriter

_ALLOWED = set(gguf.MODEL_TENSORS[gguf.MODEL_ARCH.MMPROJ])


def _name(t: T, bid: int | None = None, suffix: str | None = "weight") -> str:
    if t not in _ALLOWED:
        raise ValueError(f"{t.name} is not a clip tensor")
    base = gguf.TENSOR_NAMES[t].format(bid=bid)
    return f"{base}.{suffix}" if suffix else base


class _Tensors:
    def __init__(self, w: gguf.GGUFWriter, weight_type: Q) -> None:
        self.w = w
        self.weight_type = weight_type

    def add(self, name: str, ne: tuple[int, ...], kind: str = "w") -> None:
        shape = tuple(reversed(ne))
        if kind == "norm":
            self.w.add_tensor(name, np.ones(shape, dtype=np.float32))
            return
        if kind == "bias":
            self.w.add_tensor(name, np.zeros(shape, dtype=np.float32))
            return
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        data = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        if kind == "f32" or self.weight_type == Q.F32:
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data.astype(np.float16))

    def linear(self, t: T, n_in: int, n_out: int, bid: int | None = None) -> None:
        self.add(_name(t, bid), (n_in, n_out))
        self.add(_name(t, bid, "bias"), (n_out,), "bias")

    def layer_norm(self, t: T, n: int, bid: int | None = None) -> None:
        self.add(_name(t, bid), (n,), "norm")
        self.add(_name(t, bid, "bias"), (n,), "bias")


def _encoder(t: _Tensors, *, n_embd: int, n_ff: int, n_layer: int, patch: int) -> None:
    t.add(_name(T.V_ENC_EMBD_PATCH), (patch, patch, 3, n_embd))
    t.add(_name(T.V_ENC_EMBD_PATCH, suffix="bias"), (n_embd,), "bias")
    for i in range(n_layer):
        t.linear(T.V_ENC_ATTN_Q, n_embd, n_embd, i)
        t.linear(T.V_ENC_ATTN_K, n_embd, n_embd, i)
        t.linear(T.V_ENC_ATTN_V, n_embd, n_embd, i)
        t.linear(T.V_ENC_ATTN_O, n_embd, n_embd, i)
        t.layer_norm(T.V_ENC_INPUT_NORM, n_embd, i)
        t.layer_norm(T.V_ENC_POST_ATTN_NORM, n_embd, i)
        t.linear(T.V_ENC_FFN_UP, n_embd, n_ff, i)
        t.linear(T.V_ENC_FFN_DOWN, n_ff, n_embd, i)


def write_mmproj(
    path: str | Path,
    *,
    projector_type: str = "gemma3",
    text_n_embd: int = 64,
    n_embd: int = 64,
    n_ff: int = 128,
    n_layer: int = 2,
    n_head: int = 4,
    image_size: int = 64,
    patch_size: int = 8,
    scale_factor: int = 4,
    weight_type: Q = Q.F16,
    name: str = "synth-mmproj",
) -> Path:
    """Write a small vision projector GGUF (``general.architecture = "clip"``)."""
    if projector_type not in ("gemma3", "mlp"):
        raise ValueError(f"unsupported projector type {projector_type!r}")
    n_side = image_size // patch_size
    if image_size % patch_size or (projector_type == "gemma3" and n_side % scale_factor):
        raise ValueError("image_size must be a multiple of patch_size (× scale_factor for gemma3)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = FastGGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    w.add_type("mmproj")
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if weight_type != Q.F32 else 0))
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(projector_type)
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch_size)
    w.add_vision_embedding_length(n_embd)
    w.add_vision_feed_forward_length(n_ff)
    w.add_vision_block_count(n_layer)
    w.add_vision_head_count(n_head)
    w.add_vision_projection_dim(text_n_embd)
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    w.add_vision_use_gelu(True)

    t = _Tensors(w, weight_type)
    _encoder(t, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer, patch=patch_size)
    if projector_type == "gemma3":
        w.add_vision_projector_scale_factor(scale_factor)
        t.add(_name(T.V_ENC_EMBD_POS), (n_embd, n_side * n_side), "f32")
        t.layer_norm(T.V_POST_NORM, n_embd)
        # mm.input_projection is stored transposed: ne0 is the text width
        t.add(_name(T.V_MM_INP_PROJ), (text_n_embd, n_embd))
        t.add(_name(T.V_MM_SOFT_EMB_NORM), (n_embd,), "norm")
    else:
        t.add(_name(T.V_ENC_EMBD_CLS, suffix=None), (n_embd,), "f32")
        t.add(_name(T.V_ENC_EMBD_POS), (n_embd, n_side * n_side + 1), "f32")
        t.layer_norm(T.V_PRE_NORM, n_embd)
        t.linear(T.V_MMPROJ, n_embd, text_n_embd, 0)
        t.linear(T.V_MMPROJ, text_n_embd, text_n_embd, 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
