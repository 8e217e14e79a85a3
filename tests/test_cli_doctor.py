"""`qmgui doctor`: works on a bare machine, says what is missing with a fix, and exits 1 only
when something set up does not work. The harness points the config, cache and home folders
at temp folders."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from qmgui.cli import doctor, main
from qmgui.engines.llama_run import find_llama_server
from qmgui.hw.nvml import read_nvml
from qmgui.settings import BackendEntry, Settings, save_settings
from tests.hw.fake_nvml import FakeNvml

SECTIONS = {
    "qmgui",
    "qt",
    "nvidia",
    "host",
    "settings",
    "backends",
    "llama_server",
    "folders",
    "model_roots",
    "residuals",
    "findings",
    "exit_status",
}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["doctor", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def doctor_json(*argv: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = run("--json", *argv)
    return code, json.loads(out)


def fake_exe(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def with_backends(*entries: BackendEntry, roots: list[str] | None = None) -> None:
    save_settings(Settings(backends=list(entries), model_roots=roots or []))


def test_a_bare_machine_is_not_broken() -> None:
    """No GPU, no models, no backends (this machine): everything missing is fine."""
    code, out, err = run()
    assert code == doctor.EXIT_OK, out
    for title in (
        "qmgui",
        "Qt",
        "NVIDIA",
        "Host",
        "Settings",
        "Backends",
        "llama-server",
        "Folders",
        "Model roots",
        "Memory residuals",
    ):
        assert f"\n{title}\n" in f"\n{out}"
    assert "no backends configured" in out
    assert "fix: add one: qmgui backends add" in out
    assert "no model roots configured" in out
    assert "broken" not in out.replace("Nothing is broken", "")
    assert out.rstrip().endswith("which is fine).") or out.rstrip().endswith("Nothing is broken.")
    assert err == ""


def test_json_has_every_section() -> None:
    code, data = doctor_json()
    assert code == 0 and data["exit_status"] == 0
    assert set(data) == SECTIONS
    assert data["qmgui"]["version"]
    assert data["nvidia"]["status"] in {"ok", "no-driver", "no-gpu", "no-library"}
    assert data["host"]["ram_total_bytes"] > 0
    assert data["backends"] == []
    assert data["folders"]["config"]["path"] == os.environ["QMGUI_CONFIG_DIR"]
    assert data["folders"]["cache"]["writable"] is True
    statuses = {f["status"] for f in data["findings"]}
    assert statuses <= {"ok", "missing", "warning"}
    assert all(f["fix"] for f in data["findings"] if f["status"] == "missing")


def test_help_says_what_exit_codes_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 nothing is broken, 1 something is broken" in text
    assert "2 a usage error" in text


def test_bad_timeout_is_a_usage_error() -> None:
    code, _, _ = run("--timeout", "0")
    assert code == doctor.EXIT_USAGE


def test_no_display_is_missing_with_a_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    _, data = doctor_json()
    qt = [f for f in data["findings"] if f["section"] == "qt"]
    assert qt[0]["message"].startswith("PySide6 ") and qt[0]["status"] == "ok"
    if sys.platform.startswith("linux"):
        assert qt[1]["status"] == "missing"
        assert "QT_QPA_PLATFORM=offscreen" in qt[1]["fix"]
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    _, data = doctor_json()
    assert data["qt"]["qt_qpa_platform"] == "offscreen"
    assert [f["status"] for f in data["findings"] if f["section"] == "qt"] == ["ok", "ok"]


def test_pyside_that_does_not_import_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "PySide6", None)
        code, data = doctor_json()
    assert code == doctor.EXIT_BROKEN
    (finding,) = [f for f in data["findings"] if f["section"] == "qt" and f["status"] == "broken"]
    assert "PySide6 does not import" in finding["message"]


def test_gpus_and_their_processes_from_a_recorded_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        doctor, "read_nvml", lambda nvml=None: read_nvml(FakeNvml("two-gpus-with-processes.json"))
    )
    code, out, _ = run()
    assert code == 0
    assert "NVIDIA driver 550.54.14, 2 GPUs" in out
    assert "GPU 0 NVIDIA GeForce RTX 4090: 24.0 GiB total, 4.3 GiB free; in use by" in out
    assert "/opt/llama.cpp/build/bin/llama-server 40211 18.0 GiB" in out
    assert "warning  GPU 1: graphics processes could not be read" in out


def test_a_broken_driver_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        doctor, "read_nvml", lambda nvml=None: read_nvml(FakeNvml("driver-mismatch.json"))
    )
    code, out, _ = run()
    assert code == doctor.EXIT_BROKEN
    assert "broken   the NVIDIA driver did not answer" in out
    assert "fix: the NVIDIA driver was updated without a reboot" in out
    assert "1 broken: nvidia" in out


@pytest.mark.skipif(find_llama_server() is None, reason="no llama-server: pip install '.[test]'")
def test_a_working_backend_is_probed() -> None:
    exe = find_llama_server()
    assert exe is not None
    with_backends(BackendEntry(id="llama", kind="llama", executable=exe, default_for=["llm"]))
    code, data = doctor_json()
    assert code == 0
    (backend,) = data["backends"]
    assert backend["status"] == "ok"
    assert backend["probe"]["ok"] and backend["probe"]["version"]
    assert data["llama_server"]["probe"]["ok"]


def test_broken_backends_exit_1_and_say_how_to_fix(tmp_path: Path) -> None:
    crash = fake_exe(tmp_path, "crashy", "import sys; print('CUDA error: no device'); sys.exit(1)")
    script = fake_exe(tmp_path, "custom-server", "print('hi')")
    with_backends(
        BackendEntry(id="gone", kind="llama", executable=str(tmp_path / "llama-server")),
        BackendEntry(id="crashy", kind="llama", executable=crash),
        BackendEntry(id="mine", kind="custom", executable=script, classes=["tts"]),
        BackendEntry(id="mine-gone", kind="custom", executable=str(tmp_path / "nothing")),
    )
    code, out, _ = run()
    assert code == doctor.EXIT_BROKEN
    assert f"broken   gone (llama): {tmp_path / 'llama-server'} was not found" in out
    assert "broken   crashy (llama): `" in out and "exited with status 1" in out
    assert "CUDA error: no device" in out
    assert f"ok       mine (custom): {script} is runnable (not probed)" in out
    assert "broken   mine-gone (custom):" in out
    assert "fix: fix the executable's path (qmgui backends), or install the engine" in out
    assert "fix: run it by hand to see the whole error" in out
    assert "3 broken: backends (3)" in out
    _, data = doctor_json()
    assert [b["status"] for b in data["backends"]] == ["broken", "broken", "ok", "broken"]
    assert data["backends"][0]["probe"]["failure"]["kind"] == "missing"


def test_model_roots_offline_are_missing_not_broken(tmp_path: Path) -> None:
    present = tmp_path / "models"
    present.mkdir()
    with_backends(roots=[str(present), str(tmp_path / "usb-drive" / "models")])
    code, data = doctor_json()
    assert code == 0
    assert [(r["path"], r["status"]) for r in data["model_roots"]] == [
        (str(present), "ok"),
        (str(tmp_path / "usb-drive" / "models"), "missing"),
    ]
    (missing,) = [
        f for f in data["findings"] if f["section"] == "model_roots" and f["status"] == "missing"
    ]
    assert "not found (an offline drive, or moved)" in missing["message"]
    assert "reconnect the drive" in missing["fix"]


def test_stores_of_other_tools_are_listed() -> None:
    store = Path(os.environ["HOME"]) / ".lmstudio" / "models"
    store.mkdir(parents=True)
    _, data = doctor_json()
    assert {"path": str(store), "source": "store", "status": "ok", "state": "found"} in data[
        "model_roots"
    ]


def test_a_corrupt_settings_file_is_reported() -> None:
    path = Path(os.environ["QMGUI_CONFIG_DIR"]) / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    code, out, _ = run()
    assert code == doctor.EXIT_BROKEN
    assert "is not valid JSON" in out
    assert "1 broken: settings" in out


def test_an_unwritable_cache_folder_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("QMGUI_CACHE_DIR", str(blocker / "cache"))  # under a file: never a folder
    code, data = doctor_json()
    assert code == doctor.EXIT_BROKEN
    assert data["folders"]["cache"] == {
        "path": str(blocker / "cache"),
        "exists": False,
        "writable": False,
    }
    (finding,) = [f for f in data["findings"] if f["status"] == "broken"]
    assert "set QMGUI_CACHE_DIR to a folder you can write to" in finding["fix"]


def test_no_llama_server_anywhere_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.llama_run, "find_llama_server", lambda env=None: None)
    monkeypatch.setenv("PATH", "")
    _, data = doctor_json()
    assert data["llama_server"] == {"path": None, "source": None, "probe": None}
    (finding,) = [f for f in data["findings"] if f["section"] == "llama_server"]
    assert finding["status"] == "missing" and "llama.cpp" in finding["fix"]


def test_llama_server_on_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_exe(tmp_path, "llama-server", "print('version: 9 (abcdef9)')")
    monkeypatch.setenv("PATH", str(tmp_path))
    _, data = doctor_json()
    assert data["llama_server"]["source"] == "PATH"
    assert data["llama_server"]["path"] == str(tmp_path / "llama-server")
    assert data["llama_server"]["probe"]["version"] == "b9"


def test_residuals_list_launches_and_engine_checks_apart() -> None:
    """A launch beyond the plan is a warning; an engine check is a projection, said as one
    and never counted with the launches."""
    from qmgui.engines.residuals import ResidualStore, machine_name

    code, data = doctor_json()
    assert [f["status"] for f in data["findings"] if f["section"] == "residuals"] == ["missing"]
    store = ResidualStore()
    machine = machine_name()
    launch = {"source": "launch", "machine": machine, "build": "b1-x", "architecture": "llama",
              "samples": 2, "overruns": 1, "updated": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    check = {"source": "check", "machine": machine, "build": "b1-x", "architecture": "llama",
             "samples": 3, "agreed": 2, "mean_mib": {"weights": 0, "context": 0,
             "compute": -1.5}, "updated": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    with store._file.changing() as entries:
        entries[f"{machine}|b1-x|llama"] = launch
        entries[f"check|{machine}|b1-x|llama"] = check
    code, data = doctor_json()
    assert code == doctor.EXIT_OK
    found = [(f["status"], f["message"]) for f in data["findings"] if f["section"] == "residuals"]
    assert found[0][0] == "warning" and found[0][1].startswith("2 launch readback(s) of 1 ")
    assert "beyond the plan in 1: llama on b1-x" in found[0][1]
    assert found[1][0] == "ok" and "engine check (a projection, not an allocation)" in found[1][1]
    assert "2 of 3 agreed" in found[1][1] and "+0.00/+0.00/-1.50 MiB" in found[1][1]
    assert [e["samples"] for e in data["residuals"]["checks"]] == [3]
    assert [e["samples"] for e in data["residuals"]["launches"]] == [2]
