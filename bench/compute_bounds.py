"""Measured compute buffers of every architecture a llama.cpp build knows, for the compute
bound's test (issue 17, item 4: never a silent "fits").

    .venv/bin/python bench/compute_bounds.py [--binary LLAMA_SERVER]
        [--archs-exe TEST_LLAMA_ARCHS] [--jobs N]
        [--out tests/core/fixtures/compute/bounds_b11434.json]

Runs bench/archs.py's matrix (every model the build's `test-llama-archs` writes, loaded by its
llama-server at three settings, repacking on) and keeps, per loaded run, the measured
`sched_reserve: CPU compute buffer size` (MiB, two decimals) and, per model, its GGUF header
(`header_to_data`, tokenizer arrays dropped: no graph reads them). tests/core/test_bounds.py
checks `qmgui.core.footprint.compute_bound` against every row without running an engine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accuracy import engine_build, engine_version  # noqa: E402
from bench.archs import BUILD_DIR, SETTINGS, run  # noqa: E402
from qmgui.core.gguf_header import header_to_data, read_gguf_header  # noqa: E402

# bench/archs.py's labels -> the keys tests/core/test_compute.py's archs fixture uses
KEYS = {
    "default": "default",
    "np=4 c=4096 fa=off": "fa_off",
    "q8_0 cache fa=on ub=128": "q8",
}
_DROPPED = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges")  # fmt: skip
# per-layer lists no graph reads (xIELU's activation parameters, deepstack's layer mapping)
_DROPPED_SUFFIXES = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps",
                     ".deepstack_mapping")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(BUILD_DIR / "llama-server"))
    ap.add_argument("--archs-exe", default=str(BUILD_DIR / "test-llama-archs"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qmgui-bounds-") as tmp:
        folder = Path(tmp)
        subprocess.run([a.archs_exe, "-o", str(folder)], check=True, timeout=600,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        models = {p.stem: p for p in sorted(folder.glob("*.gguf"))}
        rows = run(models, a.binary, a.jobs, a.timeout, engine_build(a.binary))
        headers = {}
        for name, path in models.items():
            data = header_to_data(read_gguf_header(path))
            md = data["md"]
            assert isinstance(md, dict)
            for k in [k for k in md if k in _DROPPED or k.endswith(_DROPPED_SUFFIXES)]:
                del md[k]
            headers[name] = {"header": data}
    cases = []
    for r in rows:
        cpu = ((r.get("measured") or {}).get("devices") or {}).get("CPU") or {}
        compute = cpu.get("compute")
        if not r["loaded"] or not compute or not compute["lines"]:
            continue
        cases.append([r["arch"], KEYS[r["setting"]], compute["mib"]])
    used = {c[0] for c in cases}
    out = {
        "engine": f"{engine_version(a.binary)}, CPU backend, weight repacking on, "
        "-lv 4 -fit off --no-warmup",
        "settings": {KEYS[s.label]: " ".join(s.args) for s in SETTINGS},
        "cases": cases,
        "models": {n: h for n, h in headers.items() if n in used},
    }
    a.out.write_text(json.dumps(out, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{len(cases)} measured runs of {len(used)} models -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
