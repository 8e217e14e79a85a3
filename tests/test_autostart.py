"""The XDG autostart entry: written, found, removed, and its Exec line is the argv exactly,
whatever the path holds (read back by the Desktop Entry Specification's rules)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui import autostart
from qmgui.core.errors import SettingsError
from qmgui.core.textsafe import has_control

_STRING_ESCAPES = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _unescape_string(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            out.append(_STRING_ESCAPES.get(value[i + 1], "\\" + value[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_exec(value: str) -> list[str]:
    """The spec's reading of an Exec value: string escapes, then quoted arguments whose
    backslash escapes ", `, $ and \\; %% is a literal %."""
    text = _unescape_string(value)
    args: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        assert text[i] == '"', f"unquoted argument at {i}: {text!r}"
        i += 1
        word = []
        while text[i] != '"':
            if text[i] == "\\":
                assert text[i + 1] in '"`$\\', text
                i += 1
            elif text[i] == "%":
                assert text[i + 1] == "%", "a field code in a path"
                i += 1
            word.append(text[i])
            i += 1
        args.append("".join(word))
        i += 1
    return args


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def test_enable_disable_round_trip(config_home: Path) -> None:
    assert not autostart.is_enabled()
    path = autostart.enable()
    assert path == config_home / "autostart" / "qmgui.desktop"
    assert autostart.is_enabled()
    exec_value = next(
        line[5:] for line in path.read_text().splitlines() if line.startswith("Exec=")
    )
    assert split_exec(exec_value) == list(autostart.command())
    assert split_exec(exec_value)[-1] == "--minimized"
    autostart.disable()
    assert not path.exists()
    assert not autostart.is_enabled()
    autostart.disable()  # twice is fine


def test_a_hidden_entry_is_not_enabled(config_home: Path) -> None:
    path = autostart.enable()
    path.write_text(path.read_text() + "Hidden=true\n")
    assert not autostart.is_enabled()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1),
        min_size=1,
        max_size=4,
    )
)
def test_exec_line_reads_back_as_the_argv(argv: list[str]) -> None:
    if any(has_control(a) for a in argv):
        return
    assert split_exec(autostart.exec_line(argv)) == argv


@pytest.mark.parametrize("bad", ["/opt/q\nHidden=true", "/opt/q\rx", "/opt/\x1b[31m"])
def test_control_characters_are_refused(bad: str) -> None:
    with pytest.raises(SettingsError):
        autostart.exec_line([bad, "--minimized"])


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils")
def test_entry_validates_with_a_hostile_path(config_home: Path) -> None:
    argv = ['/home/a "b" $(rm -rf ~) `x` 100% \\ c/qmgui', "--minimized"]
    path = autostart.enable(argv)
    r = subprocess.run(
        ["desktop-file-validate", str(path)], check=False, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    exec_value = next(
        line[5:] for line in path.read_text().splitlines() if line.startswith("Exec=")
    )
    assert split_exec(exec_value) == argv
