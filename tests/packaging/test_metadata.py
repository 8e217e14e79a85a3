"""The freedesktop metadata the Linux packages install: the .desktop entry and AppStream."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import qmgui

ROOT = Path(__file__).resolve().parents[2]
DESKTOP = ROOT / "resources" / "linux" / "qmgui.desktop"
METAINFO = ROOT / "resources" / "linux" / "qmgui.metainfo.xml"


def desktop_entry() -> configparser.SectionProxy:
    cp = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    cp.read(DESKTOP, encoding="utf-8")
    return cp["Desktop Entry"]


def test_desktop_entry_launches_qmgui_with_its_icon() -> None:
    e = desktop_entry()
    assert e["Type"] == "Application"
    assert e["Exec"] == "qmgui"  # the window; the installers rewrite it to an absolute path
    assert e["Icon"] == "qmgui"  # hicolor/<size>/apps/qmgui.png from the package
    assert e["Terminal"] == "false"
    # Wayland matches windows to entries by app id: QApplication.setDesktopFileName("qmgui")
    assert DESKTOP.stem == "qmgui" and e["StartupWMClass"] == "qmgui"
    assert "Science" in e["Categories"].split(";")


@pytest.mark.skipif(not shutil.which("desktop-file-validate"), reason="desktop-file-utils")
def test_desktop_entry_validates() -> None:
    res = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout


def test_appstream_names_the_desktop_entry_and_this_version() -> None:
    root = ET.parse(METAINFO).getroot()
    assert root.tag == "component" and root.get("type") == "desktop-application"
    assert root.findtext("id") == "qmgui"
    assert root.findtext("launchable") == DESKTOP.name
    assert root.findtext("metadata_license") == "CC0-1.0"
    assert root.findtext("project_license") == "MIT"
    assert root.findtext("provides/binary") == "qmgui"
    releases = [r.get("version") for r in root.iter("release")]
    assert qmgui.__version__ in releases
    assert root.findtext("name") and root.findtext("summary")
    assert len(root.findall("description/p")) >= 1


@pytest.mark.skipif(not shutil.which("appstreamcli"), reason="appstream")
def test_appstream_validates() -> None:
    res = subprocess.run(["appstreamcli", "validate", "--no-net", "--no-color", str(METAINFO)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    # the one accepted remark: the id is "qmgui", not reverse-DNS, to match the .desktop name
    issues = [ln for ln in res.stdout.splitlines() if ln[:2] in ("E:", "W:", "I:")]
    assert all("cid-desktopapp-is-not-rdns" in ln for ln in issues), res.stdout
