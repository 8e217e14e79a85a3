"""The hyper-parameter readers (qmgui.core.hparams): adding an architecture's rule is its entry
in one reader module and its test. Every reader module is registered in hparams.READERS, and
every architecture a reader names in its ARCHS is checked here: against what b11434's
llama-server allocated for the KV cache and the recurrent state of the model its
`test-llama-archs` writes (fixtures/hparams_b11434.json, bench/hparams_fixture.py; the
headers are fixtures/compute/bounds_b11434.json's), at bench/archs.py's three settings, or,
for an architecture that program writes no model of, by a case in HAND with the values
llama.cpp's loader gives. An architecture with neither fails here."""

from __future__ import annotations

import json
import pkgutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from qmgui.core import hparams
from qmgui.core.gguf_header import GGUFHeader, MetaValue, header_from_data
from qmgui.core.meta import MlaDims, ModelMeta, RwkvDims, meta_from_gguf
from qmgui.core.units import MIB
from tests.core.test_footprint_archs import DEFAULT, NP4_FA_OFF, Q8, kv, rs

FIXTURES = Path(__file__).parent / "fixtures"
SETTINGS = {"default": DEFAULT, "np=4 c=4096 fa=off": NP4_FA_OFF, "q8_0 cache fa=on ub=128": Q8}


@cache
def _measured() -> dict[str, dict[str, Any]]:
    """b11434's KV and RS buffers per test-llama-archs model and setting."""
    data = json.loads((FIXTURES / "hparams_b11434.json").read_text(encoding="utf-8"))
    return dict(data["models"])


@cache
def _metas() -> dict[str, ModelMeta]:
    data = json.loads((FIXTURES / "compute/bounds_b11434.json").read_text(encoding="utf-8"))
    return {
        name: meta_from_gguf(header_from_data(f"{name}.gguf", m["header"]), file_name=name)
        for name, m in data["models"].items()
    }


def _models_of(arch: str) -> list[str]:
    return sorted(n for n, m in _metas().items() if m.architecture == arch and n in _measured())


def _same(predicted: int, measured: dict[str, Any]) -> bool:
    """bench/accuracy.py's verdict: equal as the engine prints it (MiB, two decimals), or
    within the print error of each line where it prints several."""
    lines = measured["lines"]
    if lines == 0:
        return predicted == 0
    if lines == 1:
        return f"{predicted / MIB:.2f}" == f"{measured['mib']:.2f}"
    return abs(predicted - measured["bytes"]) <= lines * (MIB // 200 + 1)


BASE: dict[str, MetaValue] = {
    "embedding_length": 256,
    "feed_forward_length": 512,
    "attention.head_count": 2,
    "attention.head_count_kv": 2,
    "context_length": 4096,
}
# architectures a reader names that test-llama-archs writes no model of: (keys after
# "{arch}.", block_count, the ModelMeta fields llama.cpp's loader gives them)
HAND: dict[str, tuple[dict[str, MetaValue], int, dict[str, Any]]] = {
    # models/gemma3n.cpp: set_swa_pattern(5), the fifth layer attends fully
    "gemma3n": (
        {"attention.sliding_window": 512},
        10,
        {"sliding_window": 512, "swa_layers": (True,) * 4 + (False,) + (True,) * 4 + (False,)},
    ),
    # models/gemma-embedding.cpp: as Gemma 3, set_swa_pattern(6)
    "gemma-embedding": (
        {"attention.sliding_window": 512},
        12,
        {"swa_layers": ((True,) * 5 + (False,)) * 2},
    ),
    # models/modern-bert.cpp: set_swa_pattern(3, true), the first of each three is dense
    "modern-bert": (
        {"attention.sliding_window": 128},
        6,
        {"swa_layers": (False, True, True) * 2},
    ),
    # an old DeepSeek-OCR GGUF (no key_length_mla): llama.cpp caches full K and V
    "deepseek2ocr": (
        {"attention.kv_lora_rank": 512, "attention.q_lora_rank": 0, "rope.dimension_count": 64},
        2,
        {
            "mla": MlaDims(512, 0, 64, None, None),
            "warnings": (
                "old MLA GGUF (no key_length_mla): llama.cpp caches full K and V for it, "
                "far more memory than a re-converted file",
            ),
        },
    ),
    **{
        arch: (
            {"wkv.head_size": 64, "attention.head_count": 0, "attention.head_count_kv": 0},
            3,
            {"recurrent_layers": (True,) * 3, "rwkv": RwkvDims(64, 2), "swa_layers": (False,) * 3},
        )
        for arch in ("rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")
    },
}


def _reader_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(hparams.__path__) if m.name != "keys")


def _named() -> list[tuple[str, str]]:
    return sorted((reader, arch) for reader, archs in hparams.READERS.items() for arch in archs)


def test_every_reader_module_is_registered() -> None:
    assert sorted(hparams.READERS) == _reader_modules()
    for name, archs in hparams.READERS.items():
        module = getattr(hparams, name)
        assert isinstance(module.ARCHS, frozenset), f"{name} declares no ARCHS"
        assert archs is module.ARCHS


@pytest.mark.parametrize(("reader", "arch"), _named())
def test_each_architecture_a_reader_names_is_checked(reader: str, arch: str) -> None:
    models = _models_of(arch)
    assert models or arch in HAND, (
        f"{arch} ({reader}) has no test: no model of it in fixtures/hparams_b11434.json "
        "(bench/hparams_fixture.py) and no case in HAND"
    )
    for model in models:
        _check_model(model)
    if arch in HAND:
        _check_hand(arch)


@pytest.mark.parametrize("model", sorted(_measured()))
def test_each_b11434_model_reads_as_the_engine_allocates(model: str) -> None:
    _check_model(model)


def _check_model(model: str) -> None:
    meta = _metas()[model]
    for setting, measured in _measured()[model].items():
        s = SETTINGS[setting]
        got = {"kv": kv(meta, s), "recurrent": rs(meta, s)}
        for buffer, value in got.items():
            m = measured[buffer]
            assert _same(value, m), (
                f"{model} {setting}: {buffer} {value / MIB:.2f} MiB predicted, {m['mib']:.2f} "
                "MiB measured"
            )


def _check_hand(arch: str) -> None:
    keys, n_layer, want = HAND[arch]
    md: dict[str, MetaValue] = {"general.architecture": arch, f"{arch}.block_count": n_layer}
    md.update({f"{arch}.{k}": v for k, v in {**BASE, **keys}.items()})
    header = GGUFHeader(f"{arch}.gguf", 3, 0, md, (), 32, 0)
    meta = meta_from_gguf(header, file_name=f"{arch}.gguf")
    assert {f: getattr(meta, f) for f in want} == want


@pytest.mark.parametrize("arch", sorted(HAND))
def test_each_hand_case_is_a_named_architecture(arch: str) -> None:
    assert any(arch in archs for archs in hparams.READERS.values())
