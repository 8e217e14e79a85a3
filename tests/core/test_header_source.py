"""The header reader's byte-source seam (`read_gguf_header_from`) and `entry_from_headers`,
which `qmgui plan URL` builds on (issue 16): the same header as from the file, the same
errors, and the entry a local split set gets."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from qmgui.core.discovery import entry_for_path, entry_from_headers
from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import header_to_data, read_gguf_header, read_gguf_header_from
from tests.synth.factory import PRESETS, write_gguf, write_split


def test_a_byte_source_gives_the_header_the_file_gives(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", PRESETS["llama"], realistic_tokenizer=True)
    data = path.read_bytes()
    got = read_gguf_header_from(io.BytesIO(data), "http://h/m.gguf", len(data))
    assert got.path == "http://h/m.gguf"
    assert header_to_data(got) == header_to_data(read_gguf_header(path))


def test_a_source_shorter_than_its_stated_size_is_a_read_error(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", PRESETS["llama"], realistic_tokenizer=True)
    data = path.read_bytes()
    cut = data[: len(data) // 50]  # inside the tokenizer
    with pytest.raises(ModelReadError) as e:
        read_gguf_header_from(io.BytesIO(cut), "u", len(data))
    assert e.value.path == "u"
    assert "truncated" in e.value.reason


def test_garbage_from_a_source_is_a_read_error() -> None:
    with pytest.raises(ModelReadError, match="not a GGUF file"):
        read_gguf_header_from(io.BytesIO(b"<html>" * 100), "u", 600)


def test_entry_from_headers_matches_the_local_split_entry(tmp_path: Path) -> None:
    shards = write_split(tmp_path, PRESETS["llama"], n_shards=3)
    local = entry_for_path(shards[0])
    urls = [f"https://h/{p.name}" for p in shards]
    entry = entry_from_headers(urls[0], shards[0].name, urls, [read_gguf_header(p) for p in shards])
    assert entry.error is None
    assert (entry.name, entry.size_bytes, entry.path, entry.shards, entry.source) == (
        local.name,
        local.size_bytes,
        urls[0],
        tuple(urls),
        "url",
    )
    assert entry.meta == local.meta


def test_entry_from_headers_without_headers_is_an_error_entry() -> None:
    entry = entry_from_headers("u", "m.gguf", [], [])
    assert entry.meta is None
    assert entry.error
