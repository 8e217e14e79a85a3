"""Records what `meta_from_gguf` makes of every GGUF header the tests use, so a refactor of the
metadata reader (issue 17, item 2: core/hparams) can be checked value for value:

    .venv/bin/python bench/meta_identity.py DIR OUT.json [--archs-exe TEST_LLAMA_ARCHS]
    cmp before.json after.json   # or: --compare before.json

DIR keeps the headers between runs (written once): tests.synth PRESETS, FULL_SIZE_PRESETS
(sparse), every model b11434's `test-llama-archs` writes, and test_hostile_meta's cases. Each
header is recorded field by field (`dataclasses.asdict`, or the row error), then again with
the keys the per-family readers use changed one at a time and a few at once (seeded, so two
runs change the same keys the same way): those variants are recorded as a digest of the whole
value. The output is deterministic: two runs over the same code give byte-identical files.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import GGUFHeader, MetaValue, read_gguf_header
from qmgui.core.meta import meta_from_gguf

ARCHS_EXE = Path.home() / ".cache/qmgui-engines/llama-b11434-cpu-all/test-llama-archs"

# the `{arch}.` keys the per-family readers look at
KEYS = (
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.sliding_window", "attention.sliding_window_pattern",
    "attention.recurrent_layers", "full_attention_interval", "attention.kv_lora_rank",
    "attention.q_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
    "rope.dimension_count", "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
    "ssm.group_count", "ssm.time_step_rank", "kda.head_dim", "wkv.head_size",
    "token_shift_count", "attention.indexer.key_length", "attention.indexer.types",
    "attention.indexer.kpool", "attention.indexer.top_k", "attention.compress_ratios",
    "ple.layers", "ple.conv_kernel", "ple.ngram_size", "hyper_connection.count",
    "nextn_predict_layers", "leading_dense_block_count", "shortconv.l_cache",
    "expert_count", "expert_used_count", "attention.shared_kv_layers", "pooling_type",
    "attention.causal", "vocab_size",
)  # fmt: skip
VALUES: tuple[MetaValue | None, ...] = (
    None, 0, 1, 2, 3, 4, 8, 64, 128, -1, 2.5, True, "x",
    (1, 0, 1, 0), (0, 0, 1), (4, 128, 0, 4), (), (3,),
)  # fmt: skip
COMBOS = 12  # random multi-key variants per header


def write_headers(folder: Path, archs_exe: Path) -> None:
    import subprocess

    from tests.core.hostile import gguf_file
    from tests.core.test_hostile_meta import CASES, plausible
    from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf

    for key, spec in PRESETS.items():
        write_gguf(folder / "synth" / f"{key}.gguf", spec)
    for key, spec in FULL_SIZE_PRESETS.items():
        write_gguf(folder / "full" / f"{key}.gguf", spec, sparse=True)
    (folder / "archs").mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(archs_exe), "-o", str(folder / "archs")],
        check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    (folder / "hostile").mkdir(parents=True, exist_ok=True)
    for case, preset, changes, tensors, _ in CASES:
        md, table = plausible(preset, **changes)
        gguf_file(folder / "hostile" / f"{case}.gguf", md, table if tensors else ())
    (folder / "done").write_text("")


def value(header: GGUFHeader, name: str) -> tuple[str, Any]:
    try:
        meta = meta_from_gguf(header, file_name=name)
    except ModelReadError as e:
        return "error", e.reason
    except Exception as e:
        return "crash", f"{type(e).__name__}: {e}"
    return "meta", {k: repr(v) for k, v in dataclasses.asdict(meta).items()}


def digest(header: GGUFHeader, name: str) -> str:
    """A variant's value in short: its repr (every field) or its row error, hashed."""
    try:
        text = repr(meta_from_gguf(header, file_name=name))
    except ModelReadError as e:
        text = f"error: {e.reason}"
    except Exception as e:
        text = f"crash: {type(e).__name__}: {e}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def variants(md: Mapping[str, MetaValue], arch: str, rng: random.Random) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict[str, MetaValue]]] = []

    def changed(pairs: list[tuple[str, MetaValue | None]]) -> dict[str, MetaValue]:
        new = dict(md)
        for key, v in pairs:
            if v is None:
                new.pop(f"{arch}.{key}", None)
            else:
                new[f"{arch}.{key}"] = v
        return new

    for key in KEYS:
        for i, v in enumerate(VALUES):
            out.append((f"{key}={i}", changed([(key, v)])))
    for c in range(COMBOS):
        pairs = [(rng.choice(KEYS), rng.choice(VALUES)) for _ in range(rng.randint(2, 6))]
        out.append((f"combo{c}", changed(pairs)))
    return out


def record(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(folder.glob("*/*.gguf")):
        name = f"{path.parent.name}/{path.name}"
        try:
            header = read_gguf_header(path)
        except ModelReadError as e:
            out[name] = {"base": ("unread", e.reason)}
            continue
        row: dict[str, Any] = {"base": value(header, path.name)}
        arch = header.metadata.get("general.architecture")
        if isinstance(arch, str) and path.parent.name != "hostile":
            rng = random.Random(name)
            for label, md in variants(header.metadata, arch, rng):
                row[label] = digest(dataclasses.replace(header, metadata=md), path.name)
        out[name] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--archs-exe", type=Path, default=ARCHS_EXE)
    ap.add_argument("--compare", type=Path, help="a recording to compare against")
    a = ap.parse_args()
    if not (a.folder / "done").exists():
        write_headers(a.folder, a.archs_exe)
    rec = record(a.folder)
    a.out.write_text(json.dumps(rec, indent=1, sort_keys=True))
    n_var = sum(len(r) - 1 for r in rec.values())
    n_fields = sum(len(r["base"][1]) for r in rec.values() if r["base"][0] == "meta")
    print(f"{len(rec)} headers ({n_fields} fields), {n_var} variants -> {a.out}")
    if a.compare:
        old = json.loads(a.compare.read_text())
        diffs = [
            f"{name} {label}"
            for name in sorted(set(old) | set(rec))
            for label in sorted(set(old.get(name, {})) | set(rec.get(name, {})))
            if json.loads(json.dumps(rec.get(name, {}).get(label))) != old.get(name, {}).get(label)
        ]
        print(f"{len(diffs)} differences" + "".join(f"\n  {d}" for d in diffs[:40]))
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
