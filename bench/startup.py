"""Start-up speed of the command line: whole processes, measured against a bare Python start.

    .venv/bin/python bench/startup.py [--runs 7] [--importtime]

Times, as whole processes, `python -c pass`, `qmgui --version` and `qmgui plan MODEL --json`
(MODEL: a small synthetic GGUF written by the test factory) and prints the median of each and
its ratio to the bare start. The commands take turns run by run, so a busy machine slows all
of them alike and shows up in the bare figure rather than as a regression. Target (issue 13,
"Fast start"): plan at most 6x the bare start. `--importtime` adds the modules that cost
`plan` most to import (`python -X importtime`). Exit status 1 if the target is missed.

The runs use a temporary config and cache folder, so neither the developer's settings nor
header cache are read or written, and write bytecode (to a temporary PYTHONPYCACHEPREFIX,
filled by a warm-up run) even where PYTHONDONTWRITEBYTECODE is set: an installed qmgui or the
bundle starts from compiled bytecode, and compiling qmgui's sources on every start would
dominate the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.synth.factory import PRESETS, write_gguf

ROOT = Path(__file__).resolve().parent.parent

TARGET_PLAN_RATIO = 6.0


def qmgui_command() -> list[str]:
    """The installed `qmgui` script beside this Python, as a user runs it; else `-m qmgui`."""
    script = Path(sys.executable).with_name("qmgui")
    if script.is_file():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "qmgui"]


def run_once(argv: list[str], env: dict[str, str]) -> float:
    """Milliseconds of one whole process; a failing command stops the benchmark."""
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=ROOT, check=False)
    ms = (time.perf_counter() - t) * 1000
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return ms


def import_costs(argv: list[str], env: dict[str, str], top: int) -> list[tuple[float, str]]:
    """The `top` modules with the largest cumulative import time in one run of `argv`,
    among those imported at the first two levels of nesting."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        if depth <= 1:
            rows.append((int(cumulative) / 1000, name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    ap.add_argument("--importtime", action="store_true", help="list plan's costliest imports")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="qmgui-startup-"))
    try:
        model = work / "model.gguf"
        write_gguf(str(model), PRESETS["llama"])
        env = {
            **os.environ,
            "QMGUI_CONFIG_DIR": str(work / "config"),
            "QMGUI_CACHE_DIR": str(work / "cache"),
            "PYTHONPYCACHEPREFIX": str(work / "pycache"),
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        qmgui = qmgui_command()
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "qmgui --version": [*qmgui, "--version"],
            "qmgui plan MODEL --json": [*qmgui, "plan", str(model), "--json"],
        }
        for argv in commands.values():  # warm-up: bytecode caches, the OS's file cache
            run_once(argv, env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(run_once(argv, env))

        bare = statistics.median(times["python -c pass"])
        print(f"median of {args.runs} runs each, whole processes ({' '.join(qmgui)}):")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:<26} {med:7.1f} ms  {med / bare:5.1f}x bare")
        ratio = statistics.median(times["qmgui plan MODEL --json"]) / bare
        ok = ratio <= TARGET_PLAN_RATIO
        verdict = "ok" if ok else "MISSED"
        print(f"plan / bare: {ratio:.1f}x (target <= {TARGET_PLAN_RATIO:.0f}x) {verdict}")

        if args.importtime:
            print("plan's costliest imports (cumulative ms, one run):")
            for ms, name in import_costs(commands["qmgui plan MODEL --json"], env, 15):
                print(f"  {ms:7.1f}  {name}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
