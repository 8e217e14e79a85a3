"""qmgui's GGUF type tables (qmgui.core.gguf_tables) equal the `gguf` package's.

qmgui keeps its own copy so that reading a header does not import `gguf` (and with it numpy);
this test is what keeps the copy from drifting when llama.cpp adds a type.
"""

from __future__ import annotations

import gguf

from qmgui.core import gguf_tables


def test_ggml_types_equal_gguf_package() -> None:
    theirs = {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType}
    assert theirs == gguf_tables.GGML_TYPES


def test_ggml_quant_sizes_cover_the_same_types() -> None:
    sizes = {int(t): v for t, v in gguf.GGML_QUANT_SIZES.items()}
    assert sizes == gguf_tables.GGML_TYPE_SIZES
    names = {t.name: v for t, v in gguf.GGML_QUANT_SIZES.items()}
    assert names == gguf_tables.GGML_SIZES_BY_NAME
    assert {int(t): t.name for t in gguf.GGMLQuantizationType} == gguf_tables.GGML_TYPE_NAMES


def test_value_types_equal_gguf_package() -> None:
    ours = {t.name: int(t) for t in gguf_tables.GGUFValueType}
    theirs = {t.name: int(t) for t in gguf.GGUFValueType}
    assert ours == theirs


def test_llama_file_types_equal_gguf_package() -> None:
    assert {int(t): t.name for t in gguf.LlamaFileType} == gguf_tables.LLAMA_FILE_TYPES


def test_gguf_version_constant_matches_reader() -> None:
    # the reader accepts the format versions the package writes
    from qmgui.core.gguf_header import GGUF_MAGIC, SUPPORTED_VERSIONS

    assert gguf.GGUF_VERSION in SUPPORTED_VERSIONS
    assert int.from_bytes(GGUF_MAGIC, "little") == gguf.GGUF_MAGIC
