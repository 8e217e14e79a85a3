"""Instructions of one first call of bench/plan.py, counted by valgrind (deterministic, where
times swing with a shared machine's load).

    .venv/bin/python bench/plan_instructions.py [--model KEY ...] [--call NAME ...]

For each model and call: a process opens the model (a new ModelMeta read from its header,
every sizing cache emptied, as bench/plan.py's first calls do) and makes the call, N times,
under `valgrind --tool=callgrind`; the instructions of N = 3 less those of N = 1, halved,
are one first call's, the opening included, and a call that does nothing gives the opening
alone, which is taken off. Needs valgrind (`apt-get install valgrind`); ~2 minutes a figure.
The models' sparse headers are written once into a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import plan  # bench/plan.py, beside this file

NOTHING = "nothing"


def child(path: Path, name: str, n: int) -> None:
    """Open the model and make the call, n times (run under valgrind)."""
    call = (lambda m, i: None) if name == NOTHING else plan.calls()[name][1]
    for i in range(n):
        meta = plan.load(path)
        plan.forget()
        call(meta, i)


def count(path: Path, name: str, n: int) -> int:
    """Instructions of a process making `name` n times on the model at `path`."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--child", str(path), name, str(n)],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    found = re.search(r"refs:\s*([0-9,]+)", out.stderr)
    if found is None:
        raise SystemExit(f"bench/plan_instructions.py: no count from valgrind:\n{out.stderr}")
    return int(found.group(1).replace(",", ""))


def first_call(path: Path, name: str) -> int:
    return (count(path, name, 3) - count(path, name, 1)) // 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(Path(argv[1]), argv[2], int(argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", choices=list(plan.MODELS), help="default: all")
    ap.add_argument("--call", action="append", choices=list(plan.calls()), help="default: all")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench/plan_instructions.py: needs valgrind (apt-get install valgrind)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.model or list(plan.MODELS):
            path = plan.write_sparse_gguf(Path(tmp) / f"{key}.gguf", plan.MODELS[key][1])
            opening = first_call(path, NOTHING)
            print(f"{key}: opening the model {opening / 1e6:.0f} M instructions")
            for name in args.call or list(plan.calls()):
                n = first_call(path, name) - opening
                print(f"  {name:24s} first call {n / 1e6:6.0f} M instructions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
