"""The command line against hostile files and values: `scan`, `plan` and `preview` on FIFOs
finish (run as real processes with a timeout, so this test cannot hang), and launch flags out
of range (a negative or zero context, slots, batches, -ngl below -1) are refused with a
sentence giving the range and exit code 2."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qmgui.cli import main
from tests.core.hostile import gguf_file
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder

TIMEOUT_S = 60  # a hang, not a slow start on a loaded machine
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def qmgui(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m qmgui ARGV` as its own process; TimeoutExpired (a failure) if it hangs."""
    return subprocess.run(
        [sys.executable, "-m", "qmgui", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_gguf(root / "good.gguf", PRESETS["llama"])
    # block_count 2^63: an OverflowError on main, and `scan --json` printed nothing
    gguf_file(
        root / "hostile.gguf", {"general.architecture": "llama", "llama.block_count": 1 << 63}
    )
    return root


@needs_fifo
def test_scan_plan_and_preview_finish_on_fifos(tree: Path) -> None:
    os.mkfifo(tree / "pipe.gguf")
    hf = write_hf_folder(tree / "hf")
    (hf / "config.json").unlink()
    os.mkfifo(hf / "config.json")
    os.mkfifo(tree.parent / "root-pipe")

    scanned = qmgui("scan", "--json", "--no-cache", str(tree), str(tree.parent / "root-pipe"))
    assert scanned.returncode == 0, scanned.stderr
    rows = {r["name"]: r for r in json.loads(scanned.stdout)}
    assert rows["good"]["error"] is None and rows["good"]["class"] == "llm"
    assert "named pipe" in rows["pipe"]["error"]
    assert "named pipe" in rows["hf"]["error"]
    assert "block_count" in rows["hostile"]["error"]
    assert "root-pipe: is a named pipe (FIFO), not a folder" in scanned.stderr

    for argv in (
        ("plan", str(tree / "pipe.gguf")),
        ("preview", "--no-probe", str(tree / "pipe.gguf")),
        ("plan", str(hf)),
        ("preview", "--no-probe", str(hf)),
    ):
        done = qmgui(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert "named pipe" in done.stderr, argv


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("flags", "words", "edge"),
    [
        (("-c", "-5"), "-c/--ctx-size -5: give a context of 1 to 268,435,456 tokens", ("-c", "1")),
        (("-c", "0"), "-c/--ctx-size 0: give a context of 1 to", ("-c", "1")),
        (("--ctx-size", "999999999999"), "give a context of 1 to", ("-c", "268435456")),
        (("-np", "0"), "-np/--parallel 0: give 1 to 256 slots, or -1 (auto)", ("-np", "-1")),
        (("-np", "-2"), "-np/--parallel -2: give 1 to 256 slots", ("-np", "1")),
        (("-np", "257"), "-np/--parallel 257", ("-np", "256")),
        (("-b", "0"), "-b/--batch-size 0: give 1 to", ("-b", "1")),
        (("-ub", "-1"), "-ub/--ubatch-size -1: give 1 to", ("-ub", "1")),
        (("-ngl", "-2"), "-ngl/--n-gpu-layers -2: give the number of layers", ("-ngl", "-1")),
        (("-ncmoe", "-1"), "-ncmoe/--n-cpu-moe -1: give 0 or more layers", ("-ncmoe", "0")),
        (("-ts", "nan,1"), "-ts/--tensor-split nan,1: give a share per GPU", ("-ts", "0,1")),
        (("-ts=-1,2",), "-ts/--tensor-split -1,2", ("-ts", "1,2")),
        (("-ts", "0,0"), "-ts/--tensor-split 0,0", ("-ts", "0,1")),
        (("-ts", "inf"), "-ts/--tensor-split inf", ("-ts", "1")),
    ],
)
@pytest.mark.parametrize("command", ["plan", "preview"])
def test_out_of_range_flags_are_refused_with_the_range(
    tree: Path, command: str, flags: tuple[str, ...], words: str, edge: tuple[str, ...]
) -> None:
    code, out, err = run(command, str(tree / "good.gguf"), *flags)
    assert code == 2
    assert words in err
    assert out == ""
    # the edge of the range is taken (`plan`: a context of 1 plans 256 cells, never 0)
    code, out, err = run("plan", str(tree / "good.gguf"), "--json", *edge)
    assert code in (0, 1), (edge, err)  # taken: it fits, or not on this machine (exit 1)
    assert json.loads(out)["settings"]["n_ctx"] >= 256
