"""The header-only GGUF reader: agreement with gguf.GGUFReader, and robustness."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import (
    KEEP_ARRAY_MAX,
    MAX_ARRAY_LEN,
    MAX_STRING_LEN,
    MAX_TENSOR_COUNT,
    ArrayInfo,
    header_from_data,
    header_to_data,
    read_gguf_header,
)
from tests.core import gguf_bytes as gb

MEMORY_LIMIT = 64 * 1024 * 1024  # the bound for reading any one file


def write_small(path: Path, *, vocab: int = 300, per_layer_kv: bool = False) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(2048)
    w.add_embedding_length(32)
    w.add_block_count(2)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv([2, 1] if per_layer_kv else 2)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool("tiny.flag", True)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges([f"t o{i}" for i in range(vocab)])
    w.add_array("tiny.small_strings", ["a", "bb", "ccc"])
    w.add_tensor("token_embd.weight", np.zeros((vocab, 32), dtype=np.float16))
    for il in range(2):
        w.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((32, 32), dtype=np.float16))
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.zeros(32, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small(tmp_path_factory.mktemp("gguf") / "tiny.gguf", per_layer_kv=True)


def test_agrees_with_gguf_reader(small: Path) -> None:
    ours = read_gguf_header(small)
    ref = gguf.GGUFReader(str(small))
    assert ours.version == 3
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
        assert mine.nbytes == int(theirs.n_bytes)
        assert ours.data_offset + mine.offset == theirs.data_offset
    md = ours.metadata
    assert md["general.architecture"] == "llama"
    assert md["llama.context_length"] == 2048
    assert md["llama.attention.head_count_kv"] == (2, 1)
    assert md["tiny.flag"] is True
    assert md["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert md["tiny.small_strings"] == ("a", "bb", "ccc")


def test_tokenizer_arrays_are_kept_as_lengths_only(small: Path) -> None:
    md = read_gguf_header(small).metadata
    assert md["tokenizer.ggml.tokens"] == ArrayInfo(gguf.GGUFValueType.STRING, 300)
    assert md["tokenizer.ggml.merges"] == ArrayInfo(gguf.GGUFValueType.STRING, 300)
    assert md["tokenizer.ggml.token_type"] == ArrayInfo(gguf.GGUFValueType.INT32, 300)


def test_cache_form_round_trips(small: Path) -> None:
    h = read_gguf_header(small)
    assert header_from_data(h.path, header_to_data(h)) == h


def test_every_truncation_raises_model_read_error(small: Path, tmp_path: Path) -> None:
    """Cutting the file at any byte of its header (or inside its data) is reported, never
    crashed on, and the message says the file is truncated."""
    data = small.read_bytes()
    header_end = read_gguf_header(small).data_offset
    cut_path = tmp_path / "cut.gguf"
    cuts = [*range(header_end + 1), *range(header_end + 1, len(data), 97)]
    for cut in cuts:
        cut_path.write_bytes(data[:cut])
        with pytest.raises(ModelReadError) as info:
            read_gguf_header(cut_path)
        assert str(cut_path) in str(info.value)
        if cut >= 24:
            assert "truncated" in info.value.reason, (cut, info.value.reason)


def _write(tmp_path: Path, content: bytes, name: str = "bad.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(content)
    return p


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "only 0 bytes"),
        (b"\0" * 4096, "not a GGUF file"),
        (b"GGML" + b"\0" * 60, "not a GGUF file"),
        (b"GGUF" + struct.pack("<I", 1) + b"\0" * 40, "version 1 is not supported"),
        (b"GGUF" + struct.pack(">I", 3) + b"\0" * 40, "big-endian"),
        (gb.header(1 << 32, 0) + b"\0" * 64, "limit"),
        (gb.header(0, 1 << 40) + b"\0" * 64, "limit"),
    ],
)
def test_malformed_headers(tmp_path: Path, content: bytes, words: str) -> None:
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content))
    assert words in str(info.value)


def test_absurd_string_length(tmp_path: Path) -> None:
    content = gb.header(0, 1) + gb.gstr("general.name")[:0] + struct.pack("<Q", 1 << 63)
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content + b"x" * 100))
    assert "over the limit" in info.value.reason
    assert info.value.offset == 24


def test_absurd_value_string_length(tmp_path: Path) -> None:
    content = gb.header(0, 1) + gb.gstr("general.name") + struct.pack("<IQ", gb.STRING, 1 << 63)
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content + b"x" * 100))
    assert f"limit of {MAX_STRING_LEN}" in info.value.reason


def test_absurd_array_length(tmp_path: Path) -> None:
    content = gb.header(0, 1) + gb.kv_array_header("tokenizer.ggml.tokens", gb.STRING, 1 << 40)
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content + b"\0" * 100))
    assert f"limit of {MAX_ARRAY_LEN}" in info.value.reason


def test_array_longer_than_the_file(tmp_path: Path) -> None:
    content = gb.header(0, 1) + gb.kv_array_header("tokenizer.ggml.tokens", gb.STRING, 1 << 20)
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content + b"\0" * 100))
    assert "truncated" in info.value.reason


def test_string_in_skipped_array_over_limit(tmp_path: Path) -> None:
    body = gb.kv_array_header("tokenizer.ggml.tokens", gb.STRING, 3)
    body += gb.gstr("a") + struct.pack("<Q", 1 << 62) + b"\0" * 64
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, gb.header(0, 1) + body))
    assert "over the limit" in info.value.reason


def test_many_tensors_claimed(tmp_path: Path) -> None:
    content = gb.header(MAX_TENSOR_COUNT, 0) + gb.tensor_info("a", (32,)) + b"\0" * 64
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content))
    assert "truncated" in info.value.reason


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        (gb.tensor_info("t", (32, 2), ggml_type=999), "unknown type 999"),
        (gb.tensor_info("t", (1, 2, 3, 4, 5)), "5 dimensions"),
        (gb.tensor_info("t", (1 << 40, 1 << 40)), "overflows"),
        (gb.tensor_info("t", (33,), ggml_type=int(gguf.GGMLQuantizationType.Q4_0)), "block size"),
        (gb.tensor_info("t", (32,), offset=3), "alignment"),
        (gb.tensor_info("t", (32,), offset=4096), "truncated"),
    ],
)
def test_bad_tensor_infos(tmp_path: Path, tensor: bytes, words: str) -> None:
    content = gb.header(1, 0) + tensor
    content += b"\0" * (-len(content) % 32) + b"\0" * 128
    with pytest.raises(ModelReadError) as info:
        read_gguf_header(_write(tmp_path, content))
    assert words in info.value.reason


def test_duplicate_keys_and_tensors(tmp_path: Path) -> None:
    dup_kv = gb.header(0, 2) + gb.kv_u32("a.b", 1) + gb.kv_u32("a.b", 2)
    with pytest.raises(ModelReadError, match="duplicate metadata key"):
        read_gguf_header(_write(tmp_path, dup_kv, "k.gguf"))
    dup_t = gb.header(2, 0) + gb.tensor_info("t", (8,)) + gb.tensor_info("t", (8,), offset=32)
    dup_t += b"\0" * 256
    with pytest.raises(ModelReadError, match="duplicate tensor name"):
        read_gguf_header(_write(tmp_path, dup_t, "t.gguf"))


def test_bad_alignment(tmp_path: Path) -> None:
    content = gb.header(0, 1) + gb.kv_u32("general.alignment", 3) + b"\0" * 64
    with pytest.raises(ModelReadError, match="power of two"):
        read_gguf_header(_write(tmp_path, content))


def test_os_errors_become_model_read_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelReadError, match="vanished"):
        read_gguf_header(tmp_path / "missing.gguf")
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ModelReadError, match="folder"):
        read_gguf_header(tmp_path / "dir.gguf")


def test_long_non_tokenizer_arrays_are_summarised(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_array("llama.long", list(range(KEEP_ARRAY_MAX + 1)))
    w.add_array("llama.short", list(range(KEEP_ARRAY_MAX)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    md = read_gguf_header(tmp_path / "a.gguf").metadata
    assert isinstance(md["llama.long"], ArrayInfo)
    assert md["llama.long"].count == KEEP_ARRAY_MAX + 1
    assert md["llama.short"] == tuple(range(KEEP_ARRAY_MAX))


def test_hostile_files_stay_within_memory(tmp_path: Path) -> None:
    """Claims of huge strings, arrays and tensor tables allocate nothing big."""
    hostile = [
        gb.header(0, 1) + struct.pack("<Q", 1 << 63) + b"x" * 64,
        gb.header(0, 1) + gb.kv_array_header("x.y", gb.STRING, 1 << 40) + b"\0" * 64,
        gb.header(0, 1) + gb.kv_array_header("x.y", gb.U64, (1 << 26)) + b"\0" * 64,
        gb.header(1 << 32, 0) + b"\0" * 64,
        gb.header(0, 1) + gb.gstr("k") + struct.pack("<IQ", gb.STRING, MAX_STRING_LEN) + b"x" * 8,
    ]
    tracemalloc.start()
    try:
        for i, content in enumerate(hostile):
            with pytest.raises(ModelReadError):
                read_gguf_header(_write(tmp_path, content, f"h{i}.gguf"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT


def test_realistic_vocabulary_stays_within_memory(tmp_path: Path) -> None:
    path = write_small(tmp_path / "big.gguf", vocab=150_000)
    tracemalloc.start()
    try:
        h = read_gguf_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert h.metadata["tokenizer.ggml.tokens"] == ArrayInfo(gguf.GGUFValueType.STRING, 150_000)
    assert peak < MEMORY_LIMIT


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=2048))
def test_random_bytes_raise_only_model_read_error(tmp_path: Path, blob: bytes) -> None:
    p = tmp_path / "random.gguf"
    for content in (blob, gb.header(2, 3) + blob):
        p.write_bytes(content)
        try:
            read_gguf_header(p)
        except ModelReadError as e:
            assert not e.reason.startswith("malformed header ("), e.reason  # the safety net


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_mutated_real_file_raises_only_model_read_error(
    small: Path, tmp_path: Path, data: st.DataObject
) -> None:
    content = bytearray(small.read_bytes())
    header_end = read_gguf_header(small).data_offset
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, header_end - 1))
        content[pos] = data.draw(st.integers(0, 255))
    p = tmp_path / "mutated.gguf"
    p.write_bytes(bytes(content))
    try:
        read_gguf_header(p)
    except ModelReadError as e:
        assert not e.reason.startswith("malformed header ("), e.reason  # the safety net
