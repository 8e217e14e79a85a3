"""Hostile Hugging Face folders: config.json, a safetensors header and
model.safetensors.index.json with deep nesting, Infinity / NaN, 5,000-digit numbers, floods of
values and implausible counts are that model's row error, never a traceback that stops the
scan; the whole path (folder -> ModelMeta -> vLLM plan -> argv) raises nothing but a
QmguiError, within 64 MiB of traced memory and well under a second per folder."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qmgui.cli import main
from qmgui.core import meta as meta_mod
from qmgui.core.safeio import MAX_JSON_ITEMS
from tests.core.hostile import Worst, through_qmgui
from tests.synth.factory import write_hf_folder

WORST = Worst()
MAX_MS = 1000.0
MAX_FULL_MS = 10_000.0
MAX_MIB = 64.0

DEEP = b"[" * 100_000 + b"]" * 100_000
DIGITS = b"1" + b"0" * 5000


def folder(root: Path, name: str = "m") -> Path:
    return write_hf_folder(root / name)


def config_bytes(path: Path, **changes: Any) -> bytes:
    cfg = json.loads((path / "config.json").read_bytes())
    cfg.update(changes)
    return json.dumps(cfg).encode()


def with_raw(cfg: bytes, key: str, raw: bytes) -> bytes:
    """`cfg` with `"key": <raw>` spliced in (for bytes json.dumps will not write)."""
    return cfg[:-1] + b', "' + key.encode() + b'": ' + raw + b"}"


def safetensors_with(path: Path, header: bytes, data: int = 64) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data)


def tensor_header(**entry: bytes) -> bytes:
    """One tensor's header with raw JSON for each field (dtype, shape, data_offsets)."""
    fields = {"dtype": b'"F32"', "shape": b"[4, 4]", "data_offsets": b"[0, 64]"} | entry
    body = b", ".join(b'"' + k.encode() + b'": ' + v for k, v in fields.items())
    return b'{"model.layers.0.mlp.up_proj.weight": {' + body + b"}}"


def measured_row(path: Path, what: str) -> str | None:
    m = through_qmgui(path)
    WORST.add(m, what)
    assert m.ms < MAX_MS, f"{what}: {m.ms:.0f} ms"
    assert m.full_ms < MAX_FULL_MS, f"{what}: {m.full_ms:.0f} ms with every plan"
    assert m.mib < MAX_MIB, f"{what}: {m.mib:.1f} MiB"
    return m.entry.error


def experts(cfg: bytes, n: int, used: int) -> bytes:
    with_n = with_raw(cfg, "num_local_experts", str(n).encode())
    return with_raw(with_n, "num_experts_per_tok", str(used).encode())


CONFIG_CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("deep", lambda c: with_raw(c, "x", DEEP), ("nested too deeply",)),
    ("infinity", lambda c: with_raw(c, "hidden_size", b"Infinity"), ("Infinity",)),
    ("nan", lambda c: with_raw(c, "rope_theta", b"NaN"), ("NaN",)),
    ("minus-infinity", lambda c: with_raw(c, "x", b"-Infinity"), ("-Infinity",)),
    ("1e999", lambda c: with_raw(c, "hidden_size", b"1e999"), ("out of range",)),
    ("5000-digits", lambda c: with_raw(c, "num_hidden_layers", DIGITS), ("5001 digits",)),
    ("5000-digit-float", lambda c: with_raw(c, "x", b"0." + b"1" * 5000), ("characters",)),
    ("flood", lambda c: with_raw(c, "x", b"[" + b"0," * MAX_JSON_ITEMS + b"0]"), ("values",)),
    ("layers-1e9", lambda c: with_raw(c, "num_hidden_layers", b"1000000000"), ("1000000000",)),
    ("layers-2^63", lambda c: with_raw(c, "num_hidden_layers", str(1 << 63).encode()), ("922",)),
    ("layers-negative", lambda c: with_raw(c, "num_hidden_layers", b"-1"), ("is -1",)),
    ("layers-fraction", lambda c: with_raw(c, "num_hidden_layers", b"2.5"), ("whole number",)),
    ("kv-over-heads", lambda c: with_raw(c, "num_key_value_heads", b"64"), ("more KV heads",)),
    ("width-2^62", lambda c: with_raw(c, "hidden_size", str(1 << 62).encode()), ("hidden_size",)),
    ("experts-used-over", lambda c: experts(c, 2, 8), ("num_experts_per_tok is 8",)),
    ("ctx-negative", lambda c: with_raw(c, "max_position_embeddings", b"-4096"), ("-4096",)),
]


@pytest.mark.parametrize(("make", "words"), [pytest.param(*c[1:], id=c[0]) for c in CONFIG_CASES])
def test_a_hostile_config_is_the_folders_row_error(
    tmp_path: Path, make: Any, words: tuple[str, ...]
) -> None:
    m = folder(tmp_path)
    (m / "config.json").write_bytes(make(config_bytes(m)))
    error = measured_row(m, f"config {words}")
    assert error is not None
    assert error.startswith("config.json: ")
    for w in words:
        assert w in error


HEADER_CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    ("deep", b'{"x": ' + DEEP + b"}", ("nested too deeply",)),
    ("shape-infinity", tensor_header(shape=b"[Infinity, 4]"), ("Infinity",)),
    ("shape-nan", tensor_header(shape=b"[NaN]"), ("NaN",)),
    ("shape-negative", tensor_header(shape=b"[-4, 4]"), ("shape",)),
    ("shape-float", tensor_header(shape=b"[4.0, 4]"), ("shape",)),
    ("shape-huge", tensor_header(shape=b"[1099511627776, 1099511627776, 1099511627776]"), ("63",)),
    ("shape-dims", tensor_header(shape=b"[" + b"1, " * 9 + b"1]"), ("shape",)),
    ("shape-text", tensor_header(shape=b'"4x4"'), ("shape",)),
    ("offset-1e999", tensor_header(data_offsets=b"[0, 1e999]"), ("out of range",)),
    ("offset-digits", tensor_header(data_offsets=b"[0, " + DIGITS + b"]"), ("digits",)),
    ("offsets-three", tensor_header(data_offsets=b"[0, 1, 2]"), ("data offsets",)),
    ("dtype-long", tensor_header(dtype=b'"' + b"F" * 100 + b'"'), ("dtype",)),
    ("dtype-number", tensor_header(dtype=b"7"), ("dtype",)),
    ("flood", b'{"x": [' + b"0," * MAX_JSON_ITEMS + b"0]}", ("values",)),
]


@pytest.mark.parametrize(("header", "words"), [pytest.param(*c[1:], id=c[0]) for c in HEADER_CASES])
def test_a_hostile_safetensors_header_is_the_folders_row_error(
    tmp_path: Path, header: bytes, words: tuple[str, ...]
) -> None:
    m = folder(tmp_path)
    safetensors_with(m / "model.safetensors", header)
    error = measured_row(m, f"header {words}")
    assert error is not None
    assert error.startswith("model.safetensors: ")
    for w in words:
        assert w in error


INDEX_CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    ("deep", b'{"weight_map": ' + DEEP + b"}", ("nested too deeply",)),
    ("digits", b'{"metadata": {"total_size": ' + DIGITS + b'}, "weight_map": {}}', ("digits",)),
    ("infinity", b'{"metadata": {"total_size": Infinity}, "weight_map": {}}', ("Infinity",)),
    ("not-json", b"{nope", ("not valid JSON",)),
]


@pytest.mark.parametrize(("index", "words"), [pytest.param(*c[1:], id=c[0]) for c in INDEX_CASES])
def test_a_hostile_weight_index_is_the_folders_row_error(
    tmp_path: Path, index: bytes, words: tuple[str, ...]
) -> None:
    m = folder(tmp_path)
    (m / "model.safetensors.index.json").write_bytes(index)
    error = measured_row(m, f"index {words}")
    assert error is not None
    assert error.startswith("model.safetensors.index.json: ")
    for w in words:
        assert w in error


def test_scan_json_lists_the_good_beside_the_hostile(tmp_path: Path) -> None:
    root = tmp_path / "models"
    good = folder(root, "Good")
    for i, (_, make, _) in enumerate(CONFIG_CASES):
        m = folder(root, f"bad-config-{i:02d}")
        (m / "config.json").write_bytes(make(config_bytes(m)))
    for i, (_, header, _) in enumerate(HEADER_CASES):
        safetensors_with(folder(root, f"bad-header-{i:02d}") / "model.safetensors", header)
    for i, (_, index, _) in enumerate(INDEX_CASES):
        (folder(root, f"bad-index-{i:02d}") / "model.safetensors.index.json").write_bytes(index)
    out, err = io.StringIO(), io.StringIO()
    code = main(["scan", str(root), "--json", "--no-cache"], out=out, err=err)
    assert code == 0, err.getvalue()
    rows = {r["name"]: r for r in json.loads(out.getvalue())}
    assert rows[good.name]["error"] is None and rows[good.name]["class"] == "llm"
    bad = [r for name, r in rows.items() if name.startswith("bad-")]
    assert len(bad) == len(CONFIG_CASES) + len(HEADER_CASES) + len(INDEX_CASES)
    assert all(r["error"] for r in bad)


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        pytest.param(DEEP, "unreadable", id="deep"),
        pytest.param(b'{"layers": [{"size": ' + DIGITS + b"}]}", "unreadable", id="digits"),
        pytest.param(
            b'{"layers": [{"mediaType": "application/vnd.ollama.image.model", '
            b'"digest": "sha256:a\\u0000b"}]}',
            "no file name",
            id="nul-digest",
        ),
    ],
)
def test_a_hostile_ollama_manifest_is_its_rows_error(
    tmp_path: Path, manifest: bytes, words: str
) -> None:
    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    path = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    path.parent.mkdir(parents=True)
    path.write_bytes(manifest)
    out, err = io.StringIO(), io.StringIO()
    assert main(["scan", str(store), "--json", "--no-cache"], out=out, err=err) == 0
    (row,) = json.loads(out.getvalue())
    assert words in row["error"]


# --- generated config values ------------------------------------------------------------------

HF_KEYS = sorted(
    {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "v_head_dim",
        "intermediate_size",
        "max_position_embeddings",
        "vocab_size",
        "sliding_window",
        "attention_chunk_size",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "n_shared_experts",
        "first_k_dense_replace",
        "num_nextn_predict_layers",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "mamba_d_state",
        "mamba_d_conv",
        "mamba_expand",
        "mamba_n_groups",
        "mamba_d_inner",
        "time_step_rank",
        "full_attention_interval",
        "layer_types",
        "tie_word_embeddings",
        "torch_dtype",
        "quantization_config",
        "architectures",
        "model_type",
        "text_config",
    }
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 2, 8, 512, 513, 1 << 20, 1 << 31, 1 << 62, 1 << 64, 10**30]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),  # json.dumps writes Infinity and NaN
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(changes=st.dictionaries(st.sampled_from(HF_KEYS), json_values, min_size=1, max_size=4))
@example(changes={"num_hidden_layers": -3})  # a negative layer count planned on main
def test_generated_config_values_never_escape_as_anything_but_a_row_error(
    tmp_path_factory: pytest.TempPathFactory, changes: dict[str, Any]
) -> None:
    m = write_hf_folder(tmp_path_factory.mktemp("gen") / "m")
    cfg = json.loads((m / "config.json").read_bytes())
    cfg.update(changes)
    cfg["architectures"] = cfg.get("architectures") or ["LlamaForCausalLM"]
    (m / "config.json").write_text(json.dumps(cfg))
    error = measured_row(m, f"{changes!r:.200}")
    meta = through_qmgui(m).entry.meta
    if error is None and meta is not None:
        assert 0 <= meta.n_layer <= meta_mod.MAX_LAYERS
        assert all(0 <= kv <= h for h, kv in zip(meta.n_head, meta.n_head_kv, strict=True))


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    dtype=st.one_of(json_values, st.just("F32")),
    shape=st.one_of(json_values, st.lists(json_scalars, max_size=5)),
    offsets=st.one_of(json_values, st.lists(json_scalars, min_size=2, max_size=2)),
)
@example(dtype="F32", shape=[float("inf"), 4], offsets=[0, 64])  # OverflowError on main
@example(dtype="F32", shape=[4, 4], offsets=[0, float("inf")])  # OverflowError on main
def test_generated_header_entries_never_escape_as_anything_but_a_row_error(
    tmp_path_factory: pytest.TempPathFactory, dtype: Any, shape: Any, offsets: Any
) -> None:
    m = write_hf_folder(tmp_path_factory.mktemp("gen") / "m")
    entry = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
    safetensors_with(m / "model.safetensors", json.dumps({"model.norm.weight": entry}).encode())
    measured_row(m, f"{entry!r:.200}")


def test_zz_worst_folder_measured(capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n" + WORST.line("hostile Hugging Face folders"))
    assert WORST.ms < MAX_MS
    assert WORST.mib < MAX_MIB
