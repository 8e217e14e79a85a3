"""The run-set script (`core.export.run_set_script`): every engine started at once on its own
port, names and values passed as data, secrets read from the environment, run by bash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qmgui.core.emit import Command
from qmgui.core.export import PORT_MARK
from qmgui.core.export.run_set_script import render_run_set_script

pytestmark = pytest.mark.skipif(
    sys.platform == "win32" or not shutil.which("bash"), reason="bash scripts"
)
HOSTILE = "$(touch PWNED) `id` 'q\" \n${PORT} \\x"


def engine(tmp_path: Path) -> str:
    """Writes its argv and $PIN to OUT_DIR/<port>.json; the first port's ends at once."""
    path = tmp_path / "engine"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        "a = sys.argv[1:]\n"
        "port = a[a.index('--port') + 1]\n"
        "with open(os.path.join(os.environ['OUT_DIR'], port + '.json'), 'w') as f:\n"
        "    json.dump({'argv': a, 'pin': os.environ.get('PIN'),\n"
        "               'key': os.environ.get('QMGUI_API_KEY')}, f)\n"
        "time.sleep(0.5 if port == os.environ['BASE_PORT'] else 30)\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return str(path)


def test_every_engine_starts_on_its_own_port_with_its_exact_argv(tmp_path: Path) -> None:
    exe = engine(tmp_path)
    first = Command((exe, "-m", HOSTILE, "--port", PORT_MARK), env={"PIN": HOSTILE})
    second = Command((exe, "-m", "b.gguf", "--api-key", "s3cret", "--port", PORT_MARK))
    broken = Command((), warnings=("cannot serve this",))
    result = render_run_set_script(
        [(f"one{HOSTILE}", first), ("two", second), ("three", broken)],
        title="test",
        base_port=9400,
    )
    text = result.text
    assert "s3cret" not in text and "PWNED" not in text.replace("touch PWNED", "")
    assert any("three: no command" in w for w in result.warnings)
    assert any("cannot serve this" in w for w in result.warnings)
    assert any("QMGUI_API_KEY" in w for w in result.warnings)
    assert all("\n" not in line for line in text.splitlines())
    script = tmp_path / "run.sh"
    script.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT_DIR": str(out), "BASE_PORT": "9500", "QMGUI_API_KEY": "k"}
    done = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, timeout=20, check=False)
    assert done.returncode == 0
    got = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert got == {
        "9500": {"argv": ["-m", HOSTILE, "--port", "9500"], "pin": HOSTILE, "key": "k"},
        "9501": {"argv": ["-m", "b.gguf", "--api-key", "k", "--port", "9501"], "pin": None,
                 "key": "k"},
    }  # fmt: skip
    assert not (tmp_path / "PWNED").exists()


def test_a_missing_secret_stops_the_script_with_a_sentence(tmp_path: Path) -> None:
    cmd = Command(("/bin/true", "--api-key", "x", "--port", PORT_MARK))
    script = tmp_path / "run.sh"
    script.write_text(render_run_set_script([("a", cmd)], title="t").text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "QMGUI_API_KEY"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=20, check=False)  # fmt: skip
    assert done.returncode != 0 and "set QMGUI_API_KEY" in done.stderr


def test_nothing_to_run_is_no_script() -> None:
    result = render_run_set_script([("a", Command((), warnings=("no engine",)))], title="t")
    assert result.text == ""
    assert result.warnings == ("a: no engine", "a: no command, left out")
