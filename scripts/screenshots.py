"""Make the user guide's screenshots (docs/screenshots/) with `qmgui --screenshot`.

Builds a folder of synthetic models (full-size headers as sparse files, tiny models that the
real llama-server loads, a projector and a truncated download), starts Xvfb when there is no
display, and runs one `qmgui --screenshot` per picture. Every picture is the current code's.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qmgui.engines.llama_run import find_llama_server  # noqa: E402
from tests.synth._mmproj import write_mmproj  # noqa: E402
from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf  # noqa: E402

# (file name, args after --screenshot FILE --models DIR)
SHOTS: dict[str, list[str]] = {
    "main-1280x800.png": ["--what-if", "2× RTX 3090", "--select", "qwen3-30b"],
    "main-1920x1080.png": ["--what-if", "RTX 4090", "--select", "llama3-8b", "--size",
                           "1920x1080"],
    "does-not-fit.png": ["--what-if", "RTX 3060 12 GB", "--select", "gemma3-12b", "--ctx",
                         "131072"],
    "moe-offload.png": ["--what-if", "RTX 3060 12 GB", "--select", "qwen3-30b"],
    "dark.png": ["--what-if", "2× RTX 4090", "--select", "qwen3-4b", "--theme", "dark"],
    "engine-running.png": ["--select", "tiny-llama", "--start", "--size", "1280x800"],
    "backends.png": ["--show", "backends"],
}  # fmt: skip
# the window at the sizes it must stay usable at, in both themes, a model selected
for _size in ("1024x700", "1280x800", "1920x1080"):
    for _theme in ("light", "dark"):
        SHOTS[f"window-{_size}-{_theme}.png"] = [
            "--what-if", "RTX 4090", "--select", "qwen3-30b", "--size", _size, "--theme", _theme,
        ]  # fmt: skip


def build_models(root: Path) -> Path:
    d = root / "models"
    if d.exists():
        return d
    for name in ("qwen3-4b", "llama3-8b", "gemma3-12b", "qwen3-30b-a3b"):
        write_gguf(d / "full" / f"{name}.gguf", FULL_SIZE_PRESETS[name], sparse=True)
    write_gguf(d / "tiny" / "tiny-llama.gguf", PRESETS["llama"])
    write_gguf(d / "tiny" / "tiny-qwen3-embed.gguf", PRESETS["qwen3-embed"])
    write_gguf(d / "vision" / "tiny-gemma3.gguf", PRESETS["gemma3"])
    write_mmproj(d / "vision" / "mmproj-tiny-gemma3.gguf")
    good = (d / "tiny" / "tiny-llama.gguf").read_bytes()
    (d / "downloads").mkdir(parents=True)
    (d / "downloads" / "half-downloaded.gguf").write_bytes(good[: len(good) // 2])
    return d


@contextlib.contextmanager
def display() -> Iterator[dict[str, str]]:
    env = dict(os.environ)
    env.pop("QT_QPA_PLATFORM", None)
    if env.get("DISPLAY"):
        yield env
        return
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        sys.exit("Xvfb is not installed (apt-get install xvfb), and there is no DISPLAY")
    proc = subprocess.Popen([xvfb, ":97", "-screen", "0", "2200x1400x24", "-nolisten", "tcp"])
    try:
        time.sleep(1.0)
        env["DISPLAY"] = ":97"
        yield env
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    ap.add_argument("--only", action="append", help="one picture by file name (repeatable)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    qmgui = [sys.executable, "-m", "qmgui"]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp, display() as env:
        env["QMGUI_CONFIG_DIR"] = str(Path(tmp) / "config")  # nothing of the user's is read
        env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        models = build_models(Path(tmp))
        exe = find_llama_server()
        if exe is not None:  # the registry the pictures show: the test engine, ★ for llm
            add = [*qmgui, "backends", "add", "llama-vulkan", "--kind", "llama", "--exe", exe,
                   "--default", "llm", "embedding"]  # fmt: skip
            subprocess.run(add, env=env, cwd=ROOT, check=True, timeout=120)
        empty = Path(tmp) / "empty"
        empty.mkdir()
        shots = {**SHOTS, "empty.png": []}
        for name, args in shots.items():
            if a.only and name not in a.only:
                continue
            where = empty if name == "empty.png" else models
            cmd = [*qmgui, "--screenshot", str(a.out / name), "--models", str(where), *args]
            r = subprocess.run(cmd, env=env, cwd=ROOT, check=False, timeout=300)
            print(("ok  " if r.returncode == 0 else "FAILED ") + name, flush=True)
            failed += r.returncode != 0
        # the pictures of live work (a router, a remote plan, Get models): driven in-process
        live = [sys.executable, str(ROOT / "scripts" / "guide_shots.py"), "--out", str(a.out)]
        for name in a.only or ():
            stem = name.removesuffix(".png")
            if stem in ("endpoint-and-speed", "open-url", "get-models"):
                live += ["--only", stem]
        if not a.only or "--only" in live:
            env["QMGUI_STATE_DIR"] = str(Path(tmp) / "state")
            env["QMGUI_LOG_DIR"] = str(Path(tmp) / "logs")
            r = subprocess.run(live, env=env, cwd=ROOT, check=False, timeout=900)
            failed += r.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
