"""Measured compute buffers of every architecture a llama.cpp build knows, for the compute
bound's test (issue 17, item 4: never a silent "fits").

    .venv/bin/python bench/compute_bounds.py [--binary LLAMA_SERVER]
        [--archs-exe TEST_LLAMA_ARCHS] [--jobs N]
        [--out tests/core/fixtures/compute/bounds_b11434.json]

Runs bench/archs.py's matrix (every model the build's `test-llama-archs` writes, loaded by its
llama-server at three settings, repacking on) and four long contexts (16384 and 65536 tokens in
one slot, flash attention on and off: how the buffer grows with the cache), and keeps, per
loaded run, the measured
`sched_reserve: CPU compute buffer size` (MiB, two decimals) and, per model, its GGUF header
(`header_to_data`, tokenizer arrays dropped: no graph reads them). tests/core/test_bounds.py
checks `qmgui.core.footprint.compute_bound` against every row without running an engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accuracy import Case, Setting, engine_build, engine_version, run_case, setting  # noqa: E402
from bench.archs import BUILD_DIR, SETTINGS, read_meta, write_models  # noqa: E402
from qmgui.core.errors import EngineError  # noqa: E402
from qmgui.core.gguf_header import header_to_data, read_gguf_header  # noqa: E402

# bench/archs.py's labels -> the keys tests/core/test_compute.py's archs fixture uses
KEYS = {
    "default": "default",
    "np=4 c=4096 fa=off": "fa_off",
    "q8_0 cache fa=on ub=128": "q8",
    "c=16384 fa=on": "c16k_fa_on",
    "c=16384 fa=off": "c16k_fa_off",
    "c=65536 fa=on": "c64k_fa_on",
    "c=65536 fa=off": "c64k_fa_off",
}
LONG = tuple(
    setting(f"c={c} fa={fa}", c=c, np=1, fa=fa, repack=True)
    for c in (16384, 65536)
    for fa in ("on", "off")
)


def run(models: dict[str, Path], binary: str, settings: Sequence[Setting], *, jobs: int,
        timeout_s: float, build: int | None) -> list[dict[str, Any]]:  # fmt: skip
    """Every readable model at every setting, measured (bench.accuracy.run_case)."""
    metas = {n: read_meta(p)[0] for n, p in models.items()}
    cases = [(n, s) for n in models for s in settings if metas[n] is not None]

    def one(item: tuple[str, Setting]) -> dict[str, Any]:
        name, s = item
        meta = metas[name]
        assert meta is not None
        try:
            row = run_case(Case(name, s), binary, models[name], meta, timeout_s=timeout_s,
                           build=build)  # fmt: skip
        except EngineError as e:
            return {"arch": name, "setting": s.label, "loaded": False, "error": str(e)}
        print(f"{name:28s} {s.label:26s} loaded={row['loaded']}", flush=True)
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, cases))


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
        models = write_models(a.archs_exe, Path(tmp))
        rows = run(models, a.binary, (*SETTINGS, *LONG), jobs=a.jobs, timeout_s=a.timeout,
                   build=engine_build(a.binary))  # fmt: skip
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
        "settings": {KEYS[s.label]: " ".join(s.args) for s in (*SETTINGS, *LONG)},
        "cases": cases,
        "models": {n: h for n, h in headers.items() if n in used},
    }
    a.out.write_text(json.dumps(out, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{len(cases)} measured runs of {len(used)} models -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
