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
OTHER_COMMANDS = (
    "pydantic", "yaml", "qmgui.settings", "qmgui.engines", "qmgui.cli.preview",
    "qmgui.core.command_import", "qmgui.core.emit",  # `qmgui import` reads commands, not plan
    "qmgui.core.vllm", "psutil",  # vLLM plans only; RAM comes from /proc/meminfo on Linux
    "qmgui.download", "huggingface_hub",  # `qmgui get` and `qmgui search` (issue 16)
)  # fmt: skip

# what only `qmgui plan URL` needs: the HTTP client (issue 16)
NETWORK = ("qmgui.remote", "urllib.request", "http.client", "ssl")

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


def test_a_first_plan_for_this_machine_loads_no_settings_layer(tmp_path: Path) -> None:
    """`qmgui plan MODEL --json` for this machine (no --gpu) on a first start: no settings
    file means no registry, so neither the settings loader (pydantic) nor the engines, the
    device cache or the backend registry is imported to find the build to ask."""
    model = write_gguf(str(tmp_path / "m.gguf"), PRESETS["llama"])
    code = (
        f"import os; os.environ['QMGUI_CONFIG_DIR'] = {str(tmp_path / 'config')!r}; "
        f"os.environ['QMGUI_CACHE_DIR'] = {str(tmp_path / 'cache')!r}\n"
        + PLAN_CHECK.replace('"--gpu", "24G", ', "")
    )
    assert '"--gpu"' not in code
    loaded = _loaded(code, str(model))
    later = ("qmgui.service.device_cache", "qmgui.core.backends", "qmgui.service.launch")
    assert _among(loaded, (*OTHER_COMMANDS, *later)) == []


def test_plan_of_a_local_file_imports_no_network_code(plan_modules: list[str]) -> None:
    """`qmgui plan URL` reads headers over HTTP (qmgui.remote); a local plan loads none of it."""
    assert _among(plan_modules, NETWORK) == []


def test_window_modules_import_no_numpy() -> None:
    assert _among(_loaded(WINDOW_CHECK), NUMPY) == []


# what the window needs only after its first paint: the header cache's sqlite3 (the first
# scan), HTTP (health checks, routers, bench), file locks (the first save, the registry)
LATER = ("sqlite3", "http.client", "ssl", "urllib.request", "filelock")

START_CHECK = """
import json, sys
import qmgui.app
from qmgui.settings import load_settings
load_settings()
print(json.dumps(sorted(sys.modules)))
"""


# what `qmgui` (the window) imports before its first paint: Qt, and only what paints a window
# saying "Starting qmgui…"; the settings layer, the engines and the sizing core come after
FIRST_PAINT_CHECK = """
import json, os, sys
import qmgui.ui.startup_probe as probe
seen = []
report = probe._FirstPaint._report
def at_first_paint(self):
    seen.append(sorted(sys.modules))
    report(self)
probe._FirstPaint._report = at_first_paint
os.environ["QMGUI_REPORT_SHOWN"] = "1"
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from qmgui.app import run
assert run([]) == 0
print(json.dumps(seen[0]))
"""
AFTER_FIRST_PAINT = (
    "pydantic", "qmgui.settings", "qmgui.engines", "qmgui.service", "qmgui.core.fit",
    "qmgui.core.footprint", "qmgui.core.compute", "qmgui.core.meta", "qmgui.hw", "psutil",
    "qmgui.ui.planning", "qmgui.ui.tray", "qmgui.ui.engine_runner",
)  # fmt: skip


def test_the_window_paints_before_it_imports_the_rest(tmp_path: Path) -> None:
    """Issue 13, "the window mapped in < 0.7 s": the window is shown ("Starting qmgui…", its
    saved size) with Qt alone, and built right after its first paint."""
    code = f"import os; os.environ['QMGUI_CONFIG_DIR'] = {str(tmp_path)!r}\n" + FIRST_PAINT_CHECK
    before = _loaded(code)
    assert "PySide6.QtWidgets" in before  # the check did see the window's start
    assert _among(before, (*AFTER_FIRST_PAINT, *LATER, *NUMPY)) == []


def test_the_window_start_path_leaves_later_work_for_later(tmp_path: Path) -> None:
    code = f"import os; os.environ['QMGUI_CONFIG_DIR'] = {str(tmp_path)!r}\n" + START_CHECK
    assert _among(_loaded(code), (*LATER, *NUMPY)) == []


def _qmgui(args: list[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """`python -m qmgui ARGS` as a user starts it: a fresh home, no settings, offscreen."""
    home = tmp_path / "home"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_STATE_HOME": str(home / "state"),
        "QT_QPA_PLATFORM": "offscreen",
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "qmgui", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )


def test_the_window_reports_its_first_paint_and_quits(tmp_path: Path) -> None:
    """bench/window_start.py times the bundle with QMGUI_REPORT_SHOWN: the window must print
    how long after its process started it was painted, then exit by itself."""
    proc = _qmgui([], tmp_path, QMGUI_REPORT_SHOWN="1")
    assert proc.returncode == 0, proc.stderr
    shown = [ln for ln in proc.stdout.splitlines() if ln.startswith("qmgui: window shown in ")]
    built = [ln for ln in proc.stdout.splitlines() if ln.startswith("qmgui: window built in ")]
    assert len(shown) == 1, proc.stdout
    assert len(built) == 1, proc.stdout  # then the whole window: settings, panels, workers
    ms, whole_ms = int(shown[0].split()[-2]), int(built[0].split()[-2])
    assert 0 < ms <= whole_ms < 120_000


def test_a_minimized_start_builds_the_whole_window_at_once(tmp_path: Path) -> None:
    """`--minimized` (start with the session) paints nothing first: the window is built whole
    before the event loop runs, then the start goes on as after a first paint."""
    proc = _qmgui(["--minimized"], tmp_path, QMGUI_REPORT_SHOWN="1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("qmgui: window built in ")], proc.stdout
    assert not [ln for ln in lines if ln.startswith("qmgui: window shown in ")]


GC_CHECK = """
import gc, io, sys
from qmgui.__main__ import main
seen = []
import qmgui.cli.plan as plan
run = plan.cmd_plan
def spy(args, out):
    seen.append(gc.isenabled())
    return run(args, out)
plan.cmd_plan = spy
rc = main(["plan", sys.argv[1], "--gpu", "24G", "--json"])
print(seen, gc.isenabled())
"""


def test_collection_is_off_only_while_starting(tmp_path: Path) -> None:
    """qmgui.__main__ turns cyclic collection off for the start-up imports; the command itself
    (a `serve` runs for days) and whatever follows run with it on."""
    model = tmp_path / "m.gguf"
    write_gguf(model, PRESETS["llama"])
    proc = subprocess.run(
        [sys.executable, "-c", GC_CHECK, str(model)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[True] True"
