"""Hostile file names through `qmgui export` and `qmgui scan` end to end (issue 12): each file
is read back by the rules of the program that reads it, scripts are run, and the terminal gets
no control character from a name."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qmgui.cli import main
from tests.core.test_export_hostile import SECRET, parse_preset, swap_load
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder
from tests.test_cli_export import run

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file names, bash")

INJECTION = (
    "x\n  evil:\n    cmd: touch PWNED --port ${PORT}\nhooks:\n  on_startup:\n    preload: [evil]\n#"
)
NAMES = {
    "port": "${PORT}",
    "env": "${env.HOME}",
    "subst": "$(touch pwned) `id`",
    "section": "[section] [evil]",
    "esc": "a\x1b[31mred\x1b]0;title\x07",
    "inject": INJECTION,
    "bytes": "bytes\udcff",
}


@pytest.fixture
def echo_engine(tmp_path: Path) -> Path:
    """An engine that prints its argv as JSON (file-name bytes as surrogates)."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def hostile_models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in NAMES.values():
        write_gguf(root / f"{name}.gguf", PRESETS["llama"])
    write_gguf(root / "plain.gguf", PRESETS["llama"])
    return root


def files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.gguf"))


def test_llama_swap_from_hostile_file_names(hostile_models: Path, echo_engine: Path) -> None:
    code, out, err = run(
        "llama-swap", *files(hostile_models), "--backend", str(echo_engine), "--no-probe",
        "--engine", "llama", f'--extra=--api-key "{SECRET}"',
    )  # fmt: skip
    assert code == 0, err
    assert SECRET not in out and SECRET not in err
    loaded = swap_load(out, {"QMGUI_API_KEY": SECRET}, windows=False)
    assert set(loaded["doc"]) == {"healthCheckTimeout", "models"}  # no hooks added
    models = loaded["models"]
    # names with control characters or bytes that are not UTF-8: their paths cannot be in a
    # cmd; the others are exported under their own names ($_{env…} renamed)
    assert set(models) == {
        "${PORT}",
        "$_{env.HOME}",
        "$(touch pwned) `id`",
        "[section] [evil]",
        "plain",
    }
    for mid, file in [("${PORT}", "${PORT}"), ("$_{env.HOME}", "${env.HOME}")]:
        argv = models[mid]["argv"]
        assert argv[argv.index("-m") + 1] == str(hostile_models / f"{file}.gguf")
        assert argv[argv.index("--port") + 1] == str(models[mid]["port"])
        assert argv[argv.index("--api-key") + 1] == SECRET
    assert "evil" not in models and "\x1b" not in out and "\x1b" not in err
    assert "QMGUI_API_KEY" in err


def test_scripts_run_hostile_paths_byte_for_byte(hostile_models: Path, echo_engine: Path) -> None:
    for key in ("port", "subst", "inject", "bytes", "esc"):
        path = hostile_models / f"{NAMES[key]}.gguf"
        script = hostile_models.parent / f"{key}.sh"
        code, _, err = run(
            "script", str(path), "--backend", str(echo_engine), "--no-probe", "--engine",
            "llama", "--out", str(script), "--port", "9123",
        )  # fmt: skip
        assert code == 0, err
        assert "\x1b" not in err
        ran = subprocess.run(
            [str(script)], capture_output=True, check=True, timeout=30,
            env={"PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8"},
        )  # fmt: skip
        argv = json.loads(ran.stdout)
        assert argv[argv.index("-m") + 1] == str(path), key
        assert argv[argv.index("--port") + 1] == "9123"
        for line in script.read_text(encoding="utf-8").splitlines():
            assert "\x1b" not in line and not line.startswith(("  evil:", "hooks:", "    cmd:"))


def test_models_ini_from_hostile_file_names(hostile_models: Path, echo_engine: Path) -> None:
    code, out, err = run(
        "models-ini", *files(hostile_models), "--backend", str(echo_engine), "--no-probe",
        "--engine", "llama", f'--extra=--hf-token "{SECRET}"',
    )  # fmt: skip
    assert code == 0, err
    assert SECRET not in out and SECRET not in err
    sections = dict(parse_preset(out))
    assert "evil" not in sections and "[evil]" not in sections
    # a name with a line break or brackets is made safe, the others are their own section
    assert sections["${PORT}"]["model"] == str(hostile_models / "${PORT}.gguf")
    assert sections["$(touch pwned) `id`"]["model"] == str(
        hostile_models / "$(touch pwned) `id`.gguf"
    )
    assert sections["(section) (evil)"]["model"] == str(hostile_models / f"{NAMES['section']}.gguf")
    assert all("hf-token" not in keys for keys in sections.values())
    assert "HF_TOKEN" in err


def test_vllm_cluster_refuses_a_hostile_node_address(tmp_path: Path) -> None:
    model = write_hf_folder(tmp_path / "hf-llama")
    pwned = tmp_path / "pwned"
    for node in (f"$(touch {pwned})=1x24GiB", "10.0.0.1 ; touch x=1x24GiB", "-x=1x24GiB"):
        code, out, err = run(
            "vllm-cluster", str(model), "--node", "10.0.0.1=1x24GiB", f"--node={node}",
            "--no-probe",
        )  # fmt: skip
        assert code == 2 and not out
        assert "not a node address: '" + node.split("=")[0] in err
    assert not pwned.exists()


def test_vllm_cluster_script_keeps_the_api_key_out(tmp_path: Path) -> None:
    model = write_hf_folder(tmp_path / "hf-llama")
    code, out, err = run(
        "vllm-cluster", str(model), "--node", "10.0.0.1:6380=1x24GiB", "--node",
        "gpu-2.lan=1x24GiB", "--no-probe", f'--extra=--api-key "{SECRET}"',
    )  # fmt: skip
    assert code == 0, err
    assert SECRET not in out
    assert '--api-key "$QMGUI_API_KEY"' in out and "--address=10.0.0.1:6380" in out
    syntax = subprocess.run(
        ["bash", "-n"], check=False, input=out.encode(), capture_output=True, timeout=30
    )
    assert syntax.returncode == 0, syntax.stderr


def test_scan_prints_hostile_names_escaped(hostile_models: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["scan", str(hostile_models), "--no-cache"], out=out, err=err) == 0
    table = out.getvalue()
    assert "\x1b" not in table and "\x07" not in table
    lines = table.splitlines()
    assert len(lines) == 1 + len(NAMES) + 1 + 1  # header, a row a model, plain, the summary
    assert any("a\\x1b[31mred" in line for line in lines)
    assert any("bytes\\xff" in line for line in lines)
    table.encode("utf-8")  # printable on any terminal
    out = io.StringIO()
    assert main(["scan", str(hostile_models), "--json", "--no-cache"], out=out, err=err) == 0
    names = {row["name"] for row in json.loads(out.getvalue())}
    assert names == {*NAMES.values(), "plain"}
