"""core.meta.name_parts and tensor_places: every tensor name taken apart as llama.cpp's loader
reads a block index ("blk.<ASCII digits, at most 9>."), crafted names included; the names are
read all at once, and a name with a line break in it must not shift the others."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.meta import (
    INPUT_TENSORS,
    ModelMeta,
    TensorEntry,
    meta_from_gguf,
    name_parts,
    tensor_places,
)
from tests.synth.factory import PRESETS, write_gguf

_BLK = re.compile(r"^blk\.([0-9]{1,9})\.")  # the loader's rule, one name at a time
_EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch)?exps")


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> ModelMeta:
    path = write_gguf(tmp_path_factory.mktemp("names") / "llama.gguf", PRESETS["llama"])
    return meta_from_gguf(read_gguf_header(path), file_name=path.name)


def _with_names(meta: ModelMeta, names: list[str]) -> ModelMeta:
    return replace(meta, tensors=tuple(TensorEntry(n, "F16", (8, 8), 128) for n in names))


def _expected(name: str, n_layer: int) -> tuple[tuple[str, str], tuple[int, bool]]:
    m = _BLK.match(name)
    if m is None:
        layer = -1 if name in INPUT_TENSORS else n_layer
        parts = ("", name)
    else:
        layer = min(int(m.group(1)), n_layer)
        parts = (m.group(1), name[m.end() :])
    return parts, (layer, _EXPERTS.search(name) is not None)


_PIECES = st.sampled_from(
    ["blk.", "blk", ".", "0", "7", "12", "123456789", "1234567890", "٣", "²", "\n", "\r",
     "\x85", "\u2028", "ffn_up_exps", "ffn_gate_chexps", "attn_q", ".weight", "token_embd",
     "token_embd.weight", "output.weight", "", " "]
)  # fmt: skip
_NAMES = st.lists(st.lists(_PIECES, max_size=6).map("".join), max_size=12)


@settings(max_examples=300, deadline=None)
@given(names=_NAMES)
def test_names_are_taken_apart_one_by_one_as_the_loader_reads_them(
    meta: ModelMeta, names: list[str]
) -> None:
    crafted = _with_names(meta, names)
    want = [_expected(n, crafted.n_layer) for n in names]
    assert [tuple(p) for p in name_parts(crafted)] == [w[0] for w in want]
    assert list(tensor_places(crafted)) == [w[1] for w in want]


def test_a_line_break_in_one_name_leaves_the_others_in_place(meta: ModelMeta) -> None:
    names = ["blk.0.attn_q.weight", "blk.1.x\nblk.2.y", "blk.3.ffn_up_exps.weight", "output"]
    crafted = _with_names(meta, names)
    assert [tuple(p) for p in name_parts(crafted)] == [
        ("0", "attn_q.weight"),
        ("1", "x\nblk.2.y"),
        ("3", "ffn_up_exps.weight"),
        ("", "output"),
    ]
    n = crafted.n_layer
    assert list(tensor_places(crafted)) == [(0, False), (1, False), (min(3, n), True), (n, False)]


def test_the_places_of_a_real_header(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "moe.gguf", PRESETS["qwen3moe"])
    meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    assert list(tensor_places(meta)) == [_expected(t.name, meta.n_layer)[1] for t in meta.tensors]
    assert any(expert for _, expert in tensor_places(meta))
