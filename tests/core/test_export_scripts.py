"""Launch scripts: golden bash and PowerShell; the bash one run for real against a stand-in
engine that prints the argv and environment it received."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from qmgui.core.discovery import entry_for_path
from qmgui.core.emit import PORT_MACRO, Command, DevicePin
from qmgui.core.emit.llama import emit_llama
from qmgui.core.export.scripts import BOM, render_bash_script, render_powershell_script
from qmgui.core.launch import LaunchSettings
from tests.core.test_emit_llama import assert_golden
from tests.core.test_shell import TRICKY, _ps_parse_word
from tests.synth.factory import PRESETS, write_gguf

ECHO_ENGINE = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get('CUDA_VISIBLE_DEVICES')}))\n"
)


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    """An executable that prints its arguments and CUDA_VISIBLE_DEVICES as JSON."""
    path = tmp_path / "fake engine" / "llama-server"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n{ECHO_ENGINE}", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def tricky_command(engine: Path) -> Command:
    words = [w for w in TRICKY if w not in ("", "\x7f")]
    argv = (str(engine), *words, "--port", PORT_MACRO, "--listen=0.0.0.0:" + PORT_MACRO)
    return Command(argv=argv, env={"CUDA_VISIBLE_DEVICES": "0,1"})


def run_script(path: Path, *args: str, port: str | None = None) -> dict[str, object]:
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8"}
    if port is not None:
        env["PORT"] = port
    out = subprocess.run([str(path), *args], capture_output=True, check=True, timeout=30, env=env)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_bash_script_runs_the_argv(engine: Path, tmp_path: Path) -> None:
    cmd = tricky_command(engine)
    result = render_bash_script(cmd, title="Launch tricky", script_name="tricky.sh")
    assert result.text.startswith("#!/usr/bin/env bash\n")
    script = tmp_path / "tricky.sh"
    script.write_text(result.text, encoding="utf-8")
    script.chmod(0o755)
    got = run_script(script)
    expected = [a.replace(PORT_MACRO, "8080") for a in cmd.argv[1:]]
    assert got == {"argv": expected, "env": "0,1"}
    got = run_script(script, "--extra", "two words", port="9123")
    expected = [a.replace(PORT_MACRO, "9123") for a in cmd.argv[1:]] + ["--extra", "two words"]
    assert got["argv"] == expected


def test_golden_scripts(tmp_path: Path) -> None:
    models = tmp_path / "My Models"
    e = entry_for_path(write_gguf(models / "qwen3 moe.gguf", PRESETS["qwen3moe"]))
    cmd = emit_llama(
        e,
        LaunchSettings(ctx_size=8192, n_cpu_moe=2),
        executable="/opt/llama.cpp/bin/llama-server",
        port=PORT_MACRO,
        devices=DevicePin("rocm", (1,)),
        supported_flags=frozenset({"-m", "-c", "--n-cpu-moe", "-fa", "--host", "--port", "-lv"}),
    )
    title, comments = "Launch qwen3 moe", ("estimated VRAM: 1 GiB",)
    bash = render_bash_script(
        cmd, title=title, comments=comments, script_name="qwen3.sh", default_port=8081
    )
    ps = render_powershell_script(
        cmd, title=title, comments=comments, script_name="qwen3.ps1", default_port=8081
    )
    assert_golden("script_bash.sh", bash.text, models)
    assert_golden("script_powershell.ps1", ps.text, models)
    assert "export HIP_VISIBLE_DEVICES=1" in bash.text
    assert "$env:HIP_VISIBLE_DEVICES = '1'" in ps.text


def ps_command(text: str, port: str) -> tuple[dict[str, str], list[str]]:
    """The environment and argv a generated PowerShell script runs, read by PowerShell's rules
    (strings as test_shell parses them, $Port and ('…' + $Port) expressions)."""
    env = dict(re.findall(r"^\$env:(\w+) = '([^']*)'$", text, flags=re.M))
    call = text[text.index("\n& ") + 3 : text.index("\nexit $LASTEXITCODE")]
    line = call.replace(" `\n  ", " ")
    argv, i = [], 0
    while i < len(line):
        if line.startswith("$Port", i):
            argv.append(port)
            i += 5
        elif line.startswith("@args", i):
            i += 5
        elif line[i] == "(":
            end = line.index(")", i)
            parts = []
            for term in line[i + 1 : end].split(" + "):
                parts.append(port if term == "$Port" else _ps_parse_word(term, 0)[0])
            argv.append("".join(parts))
            i = end + 1
        else:
            word, i = _ps_parse_word(line, i)
            argv.append(word)
        assert i >= len(line) or line[i] == " "
        i += 1
    return env, argv


def test_powershell_script_reads_back_by_its_rules(engine: Path) -> None:
    cmd = tricky_command(engine)
    result = render_powershell_script(cmd, title="Launch tricky")
    text = result.text
    assert text.startswith(BOM)  # non-ASCII: Windows PowerShell 5.1 needs the BOM…
    assert "#!" not in text.splitlines()[0]  # …and a BOM before #! would break the shebang
    assert "param([int]$Port = 8080)" in text
    assert "$ErrorActionPreference = 'Stop'" in text
    env, argv = ps_command(text.lstrip(BOM), "8080")
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert argv == [a.replace(PORT_MACRO, "8080") for a in cmd.argv]
    ascii_only = render_powershell_script(Command(argv=("srv", "--port", PORT_MACRO)), title="x")
    assert ascii_only.text.startswith("#!/usr/bin/env pwsh\n")


def test_powershell_script_warns_about_old_versions() -> None:
    result = render_powershell_script(Command(argv=("srv", "", 'a"b')), title="x")
    assert any("before 7.3" in w for w in result.warnings)
    assert "# warning: PowerShell before 7.3 drops empty arguments" in result.text


def test_no_command_no_script() -> None:
    cmd = Command(argv=(), warnings=("cannot serve it",))
    assert render_bash_script(cmd, title="x").text == ""
    assert render_powershell_script(cmd, title="x").warnings == ("cannot serve it",)
