"""Time to the window: whole processes, from start to the main window's first paint.

    .venv/bin/python bench/window_start.py [--exe PATH] [--runs 7]

PATH is the program to time: the PyInstaller bundle (`dist/qmgui/qmgui`, or `/opt/qmgui/qmgui`
once the .deb is installed), by default the first of those that exists, else this checkout's
`qmgui`. Each run starts it with `QMGUI_REPORT_SHOWN=1` (qmgui/ui/startup_probe.py: it prints a line
after the main window's first paint, another once the window is built, then quits) and times
it from the spawn to each line, as this process sees it, with an empty
temporary home (no settings, no models: a first start), on `$DISPLAY` when there is one, else
Qt's offscreen platform. A bare `python -c pass` is timed run by run alongside as the baseline,
so a busy machine shows up there too. Prints the medians, the ratio, and whether the window
appeared within the target (issue 13, "Fast start": 0.7 s from the bundle). Exit status 1 if
the target is missed, 2 if the program fails.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 700.0
BUNDLES = (ROOT / "dist" / "qmgui" / "qmgui", Path("/opt/qmgui/qmgui"))
SHOWN = re.compile(rb"window shown in (\d+) ms")
BUILT = re.compile(rb"window built in (\d+) ms")


def default_exe() -> list[str]:
    for b in BUNDLES:
        if b.is_file() and os.access(b, os.X_OK):
            return [str(b)]
    script = Path(sys.executable).with_name("qmgui")
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-m", "qmgui"]


def environment(home: Path) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_DATA_HOME": str(home / "data"),
        "QMGUI_REPORT_SHOWN": "1",
    }
    if os.environ.get("DISPLAY"):
        env["DISPLAY"] = os.environ["DISPLAY"]
    else:
        env["QT_QPA_PLATFORM"] = "offscreen"
    return env


def shown_ms(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """From the spawn to the line the program prints after its first paint, and to the line it
    prints once the window is built (settings loaded, panels and workers made), as this process
    sees them."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    lines, seen = b"", {}
    for raw in proc.stdout:
        lines += raw
        for key, pattern in (("shown", SHOWN), ("built", BUILT)):
            if pattern.search(raw):
                seen[key] = (time.perf_counter() - t) * 1000
        if "built" in seen:
            break
    out, err = proc.communicate(timeout=60)
    if proc.returncode != 0 or "shown" not in seen or "built" not in seen:
        tail = (lines + out + err).decode(errors="replace")[-2000:]
        sys.exit(f"{' '.join(argv)} did not report its window ({proc.returncode}):\n{tail}")
    return seen["shown"], seen["built"]


def bare_ms() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - t) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", help="the program to time (default: the bundle, else qmgui)")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    argv = [args.exe] if args.exe else default_exe()
    with tempfile.TemporaryDirectory(prefix="qmgui-window-") as tmp:
        env = environment(Path(tmp))
        shown_ms(argv, env)  # warm-up: page cache, font cache, the first settings file
        shown, built, bare = [], [], []
        for _ in range(args.runs):
            bare.append(bare_ms())
            first, whole = shown_ms(argv, env)
            shown.append(first)
            built.append(whole)
    s, b = statistics.median(shown), statistics.median(bare)
    w = statistics.median(built)
    where = "DISPLAY " + env["DISPLAY"] if "DISPLAY" in env else "offscreen"
    print(f"program: {' '.join(argv)} ({where}, {args.runs} runs)")
    print(f"python -c pass          {b:7.0f} ms")
    print(f"window shown            {s:7.0f} ms   {s / b:5.1f}x bare python")
    print(f"window built            {w:7.0f} ms   {w / b:5.1f}x bare python  (settings, panels)")
    ok = s <= TARGET_MS
    print(f"target: shown within {TARGET_MS:.0f} ms: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
