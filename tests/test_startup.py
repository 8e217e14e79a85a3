"""What a start of qmgui imports: no numpy (nor the `gguf` package, which imports it) on the
command line's `plan` path or the window's, so `qmgui plan MODEL --json` starts fast
(issue 13, "Fast start"; bench/startup.py measures it).

Each check runs in a fresh interpreter: this test process has imported numpy already (the
synthetic model writers use the `gguf` package).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synth.factory import PRESETS, write_gguf

# what plan needs neither of: numpy (the gguf package's enums), and what only other commands
# use (settings and pydantic, engines, the llama-swap exporter's yaml)
NUMPY = ("numpy", "gguf")
OTHER_COMMANDS = ("pydantic", "yaml", "qmgui.settings", "qmgui.engines", "qmgui.cli.preview")

PLAN_CHECK = """
import io, json, sys
from qmgui.cli import main
out = io.StringIO()
rc = main(["plan", sys.argv[1], "--gpu", "24G", "--json"], out=out)
assert rc == 0, rc
json.loads(out.getvalue())
print(json.dumps(sorted(sys.modules)))
"""

WINDOW_CHECK = """
import importlib, json, pkgutil, sys
import qmgui.app
import qmgui.ui
for m in pkgutil.walk_packages(qmgui.ui.__path__, "qmgui.ui."):
    importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str, *args: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code`."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


def _among(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.fixture(scope="module")
def plan_modules(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    model = tmp_path_factory.mktemp("startup") / "m.gguf"
    write_gguf(str(model), PRESETS["llama"])
    return _loaded(PLAN_CHECK, str(model))


def test_plan_json_imports_no_numpy(plan_modules: list[str]) -> None:
    assert _among(plan_modules, NUMPY) == []


def test_plan_json_imports_no_other_commands_dependencies(plan_modules: list[str]) -> None:
    assert _among(plan_modules, OTHER_COMMANDS) == []


def test_window_modules_import_no_numpy() -> None:
    assert _among(_loaded(WINDOW_CHECK), NUMPY) == []
