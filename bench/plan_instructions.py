"""Instructions of one first call of bench/plan.py, counted by valgrind (deterministic, where
times swing with a shared machine's load).

    .venv/bin/python bench/plan_instructions.py [--model KEY ...] [--call NAME ...]

For each model and call, a process under valgrind's callgrind opens the model and makes the
call once (the modules a first call imports, imported), opens it again (a new ModelMeta read
from its header, every sizing cache emptied, as bench/plan.py's first calls do) and makes
the call: callgrind counts the instructions within that call alone (collection is toggled on
for the extent of the `functools.reduce` that wraps it). Needs valgrind (`apt-get install
valgrind`); about a minute a figure. The models' sparse headers are written once into a
temporary folder.
"""

from __future__ import annotations

import argparse
import functools
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

# the C function whose extent callgrind counts (functools.reduce, in CPython's _functools)
COUNTED = "functools_reduce"


def child(path: Path, name: str) -> None:
    """The call on a model opened before (run under valgrind, counted inside reduce)."""
    call = plan.calls()[name][1]
    meta = plan.load(path)
    plan.forget()
    call(meta, 1)  # the first call in a process imports the modules it needs: not counted
    meta = plan.load(path)
    plan.forget()
    functools.reduce(lambda _a, _b: call(meta, 0), [0, 1])


def count(path: Path, name: str) -> int:
    """Instructions of one first call of `name` on the model at `path`."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         "--collect-atstart=no", f"--toggle-collect={COUNTED}", sys.executable, __file__,
         "--child", str(path), name],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    found = re.search(r"Collected\s*:\s*([0-9,]+)", out.stderr)
    if found is None or not int(found.group(1).replace(",", "")):
        raise SystemExit(f"bench/plan_instructions.py: no count from valgrind:\n{out.stderr}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(Path(argv[1]), argv[2])
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
            print(f"{key}:")
            for name in args.call or list(plan.calls()):
                n = count(path, name)
                print(f"  {name:24s} first call {n / 1e6:6.1f} M instructions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
