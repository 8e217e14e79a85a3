"""`qmgui plan` marks the figures that are upper bounds (issue 17, item 4: never a silent
"fits"): the projector's compute buffer beside a vision model, in the table ("≤ … (bound)"),
the verdict ("fits (bound)"), a `bound:` line per bound, and `--json`'s `bounds` list."""

from __future__ import annotations

import io
import json
from pathlib import Path

from qmgui.cli import main
from qmgui.core.units import MIB
from tests.synth.factory import PRESETS, write_gguf, write_mmproj


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _vision_model(tmp_path: Path) -> Path:
    model = write_gguf(tmp_path / "tiny-gemma3.gguf", PRESETS["gemma3"])
    write_mmproj(tmp_path / "mmproj-tiny-gemma3.gguf")
    return model


def test_plan_json_lists_the_projector_compute_bound(tmp_path: Path) -> None:
    model = _vision_model(tmp_path)
    code, out, _ = run("plan", str(model), "--gpu", "24GiB", "--host-memory", "64GiB", "--json")
    assert code == 0
    plan = json.loads(out)
    (bound,) = plan["bounds"]
    assert bound["part"] == "projector compute" and bound["device"] == "GPU0"
    assert 0 < bound["bytes"] < 64 * MIB and "upper bound" in bound["why"]
    gpu = next(d for d in plan["devices"] if d["name"] == "GPU0")
    assert gpu["compute"] >= bound["bytes"]
    assert plan["fits"] is True and plan["verdict"] == "fits (bound)"
    # without the projector beside it: no bound, a plain "fits"
    (tmp_path / "mmproj-tiny-gemma3.gguf").unlink()
    code, out, _ = run("plan", str(model), "--gpu", "24GiB", "--host-memory", "64GiB", "--json")
    plain = json.loads(out)
    assert code == 0 and plain["bounds"] == [] and plain["verdict"] == "fits"
    plain_gpu = next(d for d in plain["devices"] if d["name"] == "GPU0")
    assert gpu["compute"] == plain_gpu["compute"] + bound["bytes"]


def test_plan_text_marks_bound_figures(tmp_path: Path) -> None:
    model = _vision_model(tmp_path)
    code, out, _ = run("plan", str(model), "--gpu", "24GiB", "--host-memory", "64GiB")
    assert code == 0
    lines = out.splitlines()
    gpu = next(line for line in lines if line.startswith("GPU0"))
    cpu = next(line for line in lines if line.startswith("CPU"))
    assert gpu.count("≤") == 2 and gpu.count("(bound)") == 2  # compute and total
    assert "≤" not in cpu and "(bound)" not in cpu
    assert "fits (bound)" in lines
    (line,) = [x for x in lines if x.startswith("bound: ")]
    assert line.startswith("bound: GPU0 projector compute ≤ ") and "(bound): " in line
    # on the CPU (--no-mmproj-offload is the window's; here: no GPU), the host is bounded
    code, out, _ = run("plan", str(model), "--host-memory", "64GiB")
    cpu = next(line for line in out.splitlines() if line.startswith("CPU"))
    assert code == 0 and cpu.count("(bound)") == 2


def test_a_plan_over_its_limit_says_how_much_is_a_bound(tmp_path: Path) -> None:
    model = _vision_model(tmp_path)
    code, out, _ = run("plan", str(model), "--host-memory", "64GiB", "--json")
    need = next(d for d in json.loads(out)["devices"] if d["name"] == "CPU")
    resident = need["total"] - need["weights"]
    tight = f"{resident - 1}"
    code, out, _ = run("plan", str(model), "--host-memory", tight, "--json")
    plan = json.loads(out)
    assert code == 1 and plan["verdict"] == "does not fit"
    assert "is an upper bound" in plan["reason"]
