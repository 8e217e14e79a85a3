"""Every architecture a llama.cpp build knows: qmgui's prediction against what the build
allocates, over the models its own `test-llama-archs` writes (issue 17, item 3).

    .venv/bin/python bench/archs.py [--build 10435|11434] [--binary LLAMA_SERVER]
                                    [--archs-exe TEST_LLAMA_ARCHS]
                                    [--models DIR] [--only NAME ...] [--jobs N]
                                    [--out-md docs/accuracy-archs-b11434.md]

`test-llama-archs -o DIR` writes ~128 small GGUFs (`<arch>-dense.gguf`, `<arch>-moe.gguf`: 2-4
layers, F32). Each is read by qmgui's scanner (its metadata, or why it cannot be read), started
in the build's llama-server on 127.0.0.1 at each setting below (`-lv 4 -fit off --no-warmup`,
weight repacking left on, as users run it), and its logged buffers compared with
`qmgui.core.footprint.estimate` as in bench/accuracy.py: model/KV/RS/output to the printed
0.01 MiB, compute within [measured, measured x 1.05], or, where the plan charges an upper bound
(a graph without a layout: core.bounds), at or above the measurement (`bound`). Every model and
setting gets one row: the verdicts, or why there is none (qmgui cannot read it, the build
refuses it, no prediction).
The defaults are b11434 from the engine cache (`scripts/build-llama 11434 --all`); `--build
10435` takes the test engine's build (`scripts/build-llama 10435`, test-llama-archs included).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accuracy import (  # noqa: E402
    BUFFERS,
    Case,
    engine_build,
    engine_version,
    error_row,
    run_case,
    setting,
)
from qmgui.core.errors import EngineError, ModelReadError  # noqa: E402
from qmgui.core.gguf_header import read_gguf_header  # noqa: E402
from qmgui.core.meta import ModelMeta, meta_from_gguf  # noqa: E402

CACHE = Path(os.environ.get("QMGUI_ENGINE_CACHE", Path.home() / ".cache" / "qmgui-engines"))
BUILD_DIR = CACHE / "llama-b11434-cpu-all"
SETTINGS = (
    setting("default", repack=True),
    setting("np=4 c=4096 fa=off", c=4096, np=4, fa="off", repack=True),
    setting("q8_0 cache fa=on ub=128", ctk="q8_0", ctv="q8_0", fa="on", ub=128, repack=True),
    # the rest of the accuracy matrix's axes: the smallest context with the largest ubatch,
    # a mixed cache and --swa-full; a long context without flash attention; slots with a
    # KV stream each (no unified cache)
    setting(
        "c=512 ub=2048 q8_0/f16 fa=on swa-full",
        c=512,
        np=1,
        ctk="q8_0",
        fa="on",
        b=2048,
        ub=2048,
        swa_full=True,
        repack=True,
    ),
    setting("c=32768 np=1 fa=off ub=2048", c=32768, np=1, fa="off", b=2048, ub=2048, repack=True),
    setting("c=8192 np=4 no-kvu fa=on", c=8192, np=4, kvu=False, fa="on", repack=True),
)


def build_dir(build: int) -> Path:
    """The engine cache's folder of one build: with llama-bench (--all) where there is one."""
    for name in (f"llama-b{build}-cpu-all", f"llama-b{build}-cpu"):
        if (CACHE / name / "test-llama-archs").is_file():
            return CACHE / name
    return CACHE / f"llama-b{build}-cpu"


def write_models(archs_exe: str | Path, folder: Path, timeout_s: float = 600) -> dict[str, Path]:
    """The models a build's `test-llama-archs` writes into `folder`, by file stem."""
    import subprocess

    subprocess.run([str(archs_exe), "-o", str(folder)], check=True, timeout=timeout_s,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return read_folder(folder)


def read_folder(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.gguf"))}


def read_meta(path: Path) -> tuple[ModelMeta | None, str]:
    try:
        return meta_from_gguf(read_gguf_header(path), file_name=path.name), ""
    except ModelReadError as e:
        return None, e.reason
    except Exception as e:  # a reader bug is a row, not a dead run
        return None, f"{type(e).__name__}: {e}"


def unread_row(name: str, label: str, why: str) -> dict[str, Any]:
    return {
        "arch": name,
        "setting": label,
        "loaded": None,
        "outcome": f"qmgui cannot read it: {why}",
        "failures": [],
        "predicted": None,
        "prediction_note": why,
        "verdicts": dict.fromkeys(BUFFERS, "n/a"),
    }


def run(models: dict[str, Path], binary: str, jobs: int, timeout_s: float,
        build: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Every model at every setting; predictions use the rules of `build` (engine_build)."""
    metas = {n: read_meta(p) for n, p in models.items()}
    cases = [(n, s) for n in models for s in SETTINGS]

    def one(item: tuple[str, Any]) -> dict[str, Any]:
        name, s = item
        meta, why = metas[name]
        if meta is None:
            return unread_row(name, s.label, why)
        case = Case(name, s)
        try:
            row = run_case(case, binary, models[name], meta, timeout_s=timeout_s, build=build)
        except EngineError as e:
            row = error_row(case, str(e))
        mark = " ".join(f"{b}={v}" for b, v in row["verdicts"].items())
        print(f"{name:28s} {s.label:26s} loaded={row['loaded']} {mark}", flush=True)
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, cases))


def status(row: dict[str, Any]) -> str:
    """One word for a row: ok, fail, refused (the build would not load it), unread (qmgui
    cannot read it), unpredicted (read, loaded, no prediction)."""
    if row["loaded"] is None:
        return "unread"
    if not row["loaded"]:
        return "refused"
    v = row["verdicts"]
    if not row.get("predicted"):
        return "unpredicted"
    return "fail" if any(x == "fail" for x in v.values()) else "ok"


def render(rows: Sequence[dict[str, Any]], *, binary: str, version: str | None, wall_s: float,
           command: str, build: int | None = None) -> str:  # fmt: skip
    counts = Counter(status(r) for r in rows)
    per_buffer = {b: Counter(r["verdicts"][b] for r in rows if status(r) in ("ok", "fail"))
                  for b in BUFFERS}  # fmt: skip
    lines = [
        "# Every architecture: predicted vs measured buffers",
        "",
        f"Generated by `{command}` - do not edit by hand.",
        "",
        f"- engine: `{binary}` ({version or 'version unknown'}), CPU backend, weight "
        "repacking on (the default); predicted with the rules of "
        f"{'b' + str(build) if build else 'the default build'}",
        f"- models: what this build's `test-llama-archs` writes ({len({r['arch'] for r in rows})} "
        f"files, F32, 2-4 layers); {len(rows)} runs in {wall_s:.0f} s",
        "- a run is **ok** when every buffer passes (model/KV/RS/output to 0.01 MiB, compute in "
        "[measured, measured x 1.05], or at or above it where the plan charges an upper bound: "
        "**bound**, a graph without a layout); **refused**: the build would not load it at that "
        "setting; **unread**: qmgui cannot read the file (the reason is given); "
        "**unpredicted**: read and loaded, but no prediction",
        "",
        "| runs | ok | fail | refused | unread | unpredicted |",
        "|---|---|---|---|---|---|",
        f"| {len(rows)} | {counts['ok']} | {counts['fail']} | {counts['refused']} | "
        f"{counts['unread']} | {counts['unpredicted']} |",
        "",
        "| buffer | pass | upper bound | fail | not compared |",
        "|---|---|---|---|---|",
    ]
    for b, c in per_buffer.items():
        lines.append(f"| {b} | {c['pass']} | {c['bound']} | {c['fail']} | {c['n/a']} |")
    lines += ["", "## Every run", "", "| model | setting | status | " + " | ".join(BUFFERS)
              + " | note |", "|---|---|---|" + "---|" * len(BUFFERS) + "---|"]  # fmt: skip
    for r in rows:
        cells = []
        meas = (r.get("measured") or {}).get("devices", {}).get("CPU", {})
        pred = r.get("predicted") or {}
        for b in BUFFERS:
            m = meas.get(b)
            p = pred.get(b)
            if m is None or p is None:
                cells.append("")
                continue
            cells.append(f"{p / 2**20:.2f} / {m['mib']:.2f} {r['verdicts'][b]}")
        note = ""
        st = status(r)
        if st == "unread":
            note = r["prediction_note"] or ""
        elif st == "refused":
            note = "; ".join(f["message"] for f in r["failures"])[:160] or r["outcome"][:160]
        elif st == "unpredicted":
            note = r.get("prediction_note") or ""
        note = note.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['arch']} | {r['setting']} | {st} | " + " | ".join(cells)
                     + f" | {note} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=int, default=None,
                    help="take llama-server and test-llama-archs of this build from the engine "
                    "cache (scripts/build-llama N): 10435 or 11434")  # fmt: skip
    ap.add_argument("--binary", default=None)
    ap.add_argument("--archs-exe", default=None)
    ap.add_argument("--models", type=Path, help="use these GGUFs instead of writing them")
    ap.add_argument("--only", action="append", help="a model's file stem (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out-md", type=Path, default=None)
    a = ap.parse_args(argv)
    folder_of_build = build_dir(a.build) if a.build else BUILD_DIR
    a.binary = a.binary or str(folder_of_build / "llama-server")
    a.archs_exe = a.archs_exe or str(folder_of_build / "test-llama-archs")
    for exe in (a.binary, *(() if a.models else (a.archs_exe,))):
        if not os.access(exe, os.X_OK):
            build_no = a.build or 11434
            sys.exit(f"{exe} not found: run scripts/build-llama {build_no}, or give its path")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="qmgui-archs-") as tmp:
        models = read_folder(a.models) if a.models else write_models(a.archs_exe, Path(tmp))
        if a.only:
            models = {n: p for n, p in models.items() if n in a.only}
        build = engine_build(a.binary)
        rows = run(models, a.binary, a.jobs, a.timeout, build)
    wall = time.monotonic() - start
    counts = Counter(status(r) for r in rows)
    print(f"{len(rows)} runs in {wall:.0f} s: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if a.out_md is not None:
        command = "bench/archs.py " + " ".join(argv if argv is not None else sys.argv[1:])
        a.out_md.write_text(
            render(rows, binary=a.binary, version=engine_version(a.binary), wall_s=wall,
                   command=command.strip(), build=build),
            encoding="utf-8",
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
