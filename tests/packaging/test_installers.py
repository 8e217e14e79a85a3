"""The installers' scripts, checked without building the 160 MB bundle: the NSIS script's
references and a compile over a tiny stand-in payload, the per-user Linux installer's round
trip in a throwaway home, the package scripts' syntax. The full artefacts are checked by
packaging/smoke (.deb) and packaging/test-nsis-wine (Windows installer under wine)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from qmgui.__main__ import wants_window

ROOT = Path(__file__).resolve().parents[2]
NSI = ROOT / "installer" / "windows" / "qmgui.nsi"
RUN = ROOT / "packaging" / "run"


# --- Windows --------------------------------------------------------------------------------
def test_nsis_script_files_exist() -> None:
    text = NSI.read_text(encoding="utf-8")
    refs = set(re.findall(r'"(\.\.\\\.\.\\[^"$]+)"', text))
    assert refs, "the script names its icon and bundle relative to installer/windows"
    for ref in refs - {r"..\..\dist\qmgui"}:  # the bundle is built, not committed
        assert (NSI.parent / ref.replace("\\", "/")).resolve().is_file(), ref


def test_nsis_installs_per_user_and_keeps_settings() -> None:
    text = NSI.read_text(encoding="utf-8")
    assert "RequestExecutionLevel user" in text
    assert "HKLM" not in text  # no administrator rights anywhere
    assert 'InstallDir "$LOCALAPPDATA\\Programs\\${APP}"' in text
    # settings live in %LOCALAPPDATA%\qmgui (platformdirs); nothing removes that folder
    assert not re.search(r"RMDir /r \"\$LOCALAPPDATA\\qmgui", text)
    assert 'RMDir /r "$INSTDIR"' not in text  # only the files it installed


def test_start_with_windows_uses_a_flag_the_app_has() -> None:
    text = NSI.read_text(encoding="utf-8")
    assert "--minimized'" in text
    assert wants_window(["--minimized"], display=True)
    from qmgui.app import build_parser

    assert build_parser().parse_args(["--minimized"]).minimized


@pytest.mark.skipif(not shutil.which("makensis"), reason="nsis (makensis) is not installed")
def test_nsis_script_compiles(tmp_path: Path) -> None:
    payload = tmp_path / "bundle"
    (payload / "_internal").mkdir(parents=True)
    (payload / "qmgui.exe").write_bytes(b"MZ stand-in")
    out = tmp_path / "qmgui-0.1.0-setup.exe"  # (a bare "setup.exe" draws a warning)
    res = subprocess.run(
        ["makensis", "-V2", "-WX", "-DVERSION=0.1.0", f"-DBUNDLE={payload}", f"-DOUTFILE={out}",
         str(NSI)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert out.read_bytes()[:2] == b"MZ"


# --- Linux: the per-user installer inside the .run ------------------------------------------
def _payload(tmp: Path) -> Path:
    """What packaging/build run puts in the archive, with a shell script as the app."""
    p = tmp / "payload"
    (p / "qmgui" / "_internal").mkdir(parents=True)
    app = p / "qmgui" / "qmgui"
    app.write_text("#!/bin/sh\necho qmgui 0.1.0\n")
    app.chmod(0o755)
    for name in ("install.sh", "uninstall.sh"):
        shutil.copy2(RUN / name, p / name)
    share = p / "share"
    (share / "applications").mkdir(parents=True)
    (share / "metainfo").mkdir()
    shutil.copy(ROOT / "resources" / "linux" / "qmgui.desktop", share / "applications")
    shutil.copy(ROOT / "resources" / "linux" / "qmgui.metainfo.xml", share / "metainfo")
    for size in (16, 48):
        d = share / "icons" / "hicolor" / f"{size}x{size}" / "apps"
        d.mkdir(parents=True)
        shutil.copy(ROOT / "qmgui" / "resources" / "icons" / f"qmgui-{size}.png", d / "qmgui.png")
    return p


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_run_installer_round_trip(tmp_path: Path) -> None:
    payload = _payload(tmp_path)
    home = tmp_path / "home"
    (home / ".config" / "qmgui").mkdir(parents=True)
    (home / ".config" / "qmgui" / "settings.json").write_text("{}")
    before = _files(home)
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}

    def sh(*args: str) -> str:
        res = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    sh(str(payload / "install.sh"))
    local = home / ".local"
    assert sh(str(local / "bin" / "qmgui")).strip() == "qmgui 0.1.0"
    entry = (local / "share" / "applications" / "qmgui.desktop").read_text()
    app = local / "opt" / "qmgui" / "qmgui"
    assert f'Exec="{app}"' in entry and "Icon=qmgui" in entry
    assert (local / "share" / "icons" / "hicolor" / "48x48" / "apps" / "qmgui.png").is_file()
    if shutil.which("desktop-file-validate"):
        sh("desktop-file-validate", str(local / "share" / "applications" / "qmgui.desktop"))

    (local / "opt" / "qmgui" / "_internal" / "from-the-old-version").write_text("x")
    sh(str(payload / "install.sh"))  # an upgrade: the new files, nothing of the old version
    assert not (local / "opt" / "qmgui" / "_internal" / "from-the-old-version").exists()
    assert (local / "bin" / "qmgui").exists()

    out = sh(str(local / "opt" / "qmgui" / "uninstall.sh"))
    assert "settings kept" in out
    assert _files(home) - before <= {".local"}  # only the (empty) prefix folder remains
    assert (home / ".config" / "qmgui" / "settings.json").is_file()


def test_run_installer_with_a_prefix_uses_absolute_icon(tmp_path: Path) -> None:
    payload = _payload(tmp_path)
    env = {"HOME": str(tmp_path / "home"), "PATH": os.environ["PATH"]}
    prefix = tmp_path / "apps"
    subprocess.run([str(payload / "install.sh"), "--prefix", str(prefix)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    entry = (prefix / "share" / "applications" / "qmgui.desktop").read_text()
    assert f"Icon={prefix}/share/icons/hicolor/256x256/apps/qmgui.png" in entry
    subprocess.run([str(prefix / "opt" / "qmgui" / "uninstall.sh"), "--purge"], env=env,
                   check=True, capture_output=True)  # fmt: skip
    assert not prefix.exists() or not any(prefix.rglob("*"))


@pytest.mark.parametrize(
    ("shell", "script"),
    [("sh", "packaging/deb/postinst"), ("sh", "packaging/deb/postrm"),
     ("sh", "packaging/run/install.sh"), ("sh", "packaging/run/uninstall.sh"),
     ("bash", "packaging/build"), ("bash", "packaging/smoke"),
     ("bash", "packaging/test-nsis-wine")],
)  # fmt: skip
def test_scripts_parse(shell: str, script: str) -> None:
    assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"
    subprocess.run([shell, "-n", str(ROOT / script)], check=True)
