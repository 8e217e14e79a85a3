"""Records what b11434's llama-server allocates for the KV cache and the recurrent state of
every model its `test-llama-archs` writes, at bench/archs.py's three settings, into
tests/core/fixtures/hparams_b11434.json: the measurements tests/core/test_hparams.py holds
each hyper-parameter reader to (the sizes follow from the sliding-window, recurrent, MLA,
SSM, linear-attention, RWKV and indexer values core/hparams reads).

    .venv/bin/python bench/hparams_fixture.py [--binary LLAMA_SERVER] [--models DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.accuracy import engine_build, engine_version
from bench.archs import run

ROOT = Path(__file__).resolve().parent.parent
ENGINE = Path.home() / ".cache/qmgui-engines/llama-b11434-cpu-all/llama-server"
OUT = ROOT / "tests/core/fixtures/hparams_b11434.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(ENGINE))
    ap.add_argument("--models", type=Path, help="test-llama-archs' GGUFs, if already written")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qmgui-hparams-") as tmp:
        folder = a.models or Path(tmp)
        if a.models is None:
            exe = Path(a.binary).with_name("test-llama-archs")
            subprocess.run([str(exe), "-o", str(folder)], check=True, timeout=600,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        models = {p.stem: p for p in sorted(folder.glob("*.gguf"))}
        rows = run(models, a.binary, a.jobs, 120.0, engine_build(a.binary))
    out: dict[str, dict[str, dict[str, object]]] = {}
    for r in rows:
        cpu = (r.get("measured") or {}).get("devices", {}).get("CPU")
        if not r["loaded"] or cpu is None:
            continue  # refused at this setting
        out.setdefault(r["arch"], {})[r["setting"]] = {b: cpu[b] for b in ("kv", "recurrent")}
    data = {"engine": engine_version(a.binary), "models": out}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{sum(len(v) for v in out.values())} launches of {len(out)} models -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
