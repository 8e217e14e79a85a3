"""`qmgui roots` against the per-test config folder: list, add (nested, missing, not a folder),
remove (by any spelling), JSON, and two processes adding at once."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qmgui.cli import build_parser, main
from qmgui.roots import plan_add
from qmgui.settings import Settings, load_settings, save_settings


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["roots", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def stored() -> list[str]:
    return load_settings().settings.model_roots


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for d in ("a/inner/deeper", "b", "c"):
        (tmp_path / d).mkdir(parents=True)
    return tmp_path


def test_list_empty_and_roots_alone_lists() -> None:
    code, out, _ = run()
    assert code == 0 and "No model folders configured" in out
    assert run("list") == (code, out, "")
    code, out, _ = run("list", "--json")
    assert code == 0 and json.loads(out) == []


def test_roots_is_listed_after_scan_in_help() -> None:
    text = build_parser().format_help()
    assert text.index("scan") < text.index("roots") < text.index("plan")


def test_add_resolves_lists_and_json(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    code, out, err = run("add", "a", str(tree / "b" / ".." / "c"))
    assert code == 0, err
    assert out.splitlines() == [f"added {tree / 'a'}", f"added {tree / 'c'}"]
    assert stored() == [str(tree / "a"), str(tree / "c")]
    (tree / "c").rmdir()
    code, out, _ = run("list")
    assert out.splitlines() == [str(tree / "a"), f"{tree / 'c'}  (not found)"]
    code, out, _ = run("list", "--json")
    assert json.loads(out) == [
        {"path": str(tree / "a"), "exists": True},
        {"path": str(tree / "c"), "exists": False},
    ]


def test_add_inside_a_root_or_twice_adds_nothing_and_says_so(tree: Path) -> None:
    assert run("add", str(tree / "a"))[0] == 0
    code, out, err = run("add", str(tree / "a" / "inner"), str(tree / "a") + os.sep)
    assert code == 0 and out == ""
    assert f"{tree / 'a' / 'inner'} is inside the model folder {tree / 'a'}" in err
    assert f"{tree / 'a'} is already a model folder" in err
    assert stored() == [str(tree / "a")]


def test_adding_a_parent_replaces_the_roots_inside_it(tree: Path) -> None:
    assert run("add", str(tree / "b"), str(tree / "a" / "inner" / "deeper"))[0] == 0
    assert run("add", str(tree / "a" / "inner"))[0] == 0
    assert stored() == [str(tree / "b"), str(tree / "a" / "inner")]
    code, out, err = run("add", str(tree))
    assert code == 0 and out == f"added {tree}\n"
    assert f"{tree / 'b'} is inside {tree}: {tree} replaces it" in err
    assert stored() == [str(tree)]


def test_add_refuses_missing_paths_and_files_and_changes_nothing(tree: Path) -> None:
    notes = tree / "notes.txt"
    notes.write_text("not a model")
    code, out, err = run("add", str(tree / "b"), str(tree / "nope"), str(notes))
    assert code == 2 and out == ""
    assert f"{tree / 'nope'}: not found" in err
    assert f"{notes} is a file, not a folder of models" in err
    assert stored() == []
    model = tree / "one.gguf"
    model.write_bytes(b"GGUF")
    assert run("add", str(model))[0] == 0  # a single model file is a root, as a drop is
    assert stored() == [str(model)]


def test_remove_by_any_spelling_and_unknown_lists_the_roots(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_settings(Settings(model_roots=["~/models", str(tree / "a"), str(tree / "b")]))
    monkeypatch.chdir(tree)
    code, out, err = run("remove", "a/inner")
    assert code == 2 and out == ""
    assert "not a model folder, so nothing was removed" in err
    assert f"inside {tree / 'a'}" in err and f"{tree / 'b'}" in err
    code, out, _ = run("remove", "./a", str(tree / "b") + os.sep)
    assert code == 0
    assert out.splitlines() == [f"removed {tree / 'a'}", f"removed {tree / 'b'}"]
    # as stored (a folder that does not exist any more), or resolved
    home = Path(os.environ["HOME"])
    assert run("remove", str(home / "models"))[0] == 0
    assert stored() == []
    code, _, err = run("remove", "x")
    assert code == 2 and "none are configured" in err


def test_settings_of_another_kind_survive_a_change(tree: Path) -> None:
    save_settings(Settings(favourites=["m1"]))
    assert run("add", str(tree / "a"))[0] == 0
    assert run("remove", str(tree / "a"))[0] == 0
    assert load_settings().settings.favourites == ["m1"]


def test_plan_add_keeps_the_order() -> None:
    a = plan_add(["/m/x", "/n", "/m/y"], ["/m"])
    assert a.roots == ["/m", "/n"] and a.added == ["/m"]
    assert a.replaced == [("/m/x", "/m"), ("/m/y", "/m")]
    assert plan_add(["/m"], ["/mm"]).roots == ["/m", "/mm"]  # a prefix is not a parent


ADDER = """
import io, sys
from qmgui.cli import main
for d in sys.argv[1:]:
    assert main(["roots", "add", d], out=io.StringIO(), err=sys.stderr) == 0
"""


def test_two_processes_adding_at_once_keep_both(tmp_path: Path) -> None:
    n = 12
    dirs = {side: [tmp_path / f"{side}{i}" for i in range(n)] for side in "pq"}
    for d in (*dirs["p"], *dirs["q"]):
        d.mkdir()
    procs = [
        subprocess.Popen([sys.executable, "-c", ADDER, *map(str, ds)], stderr=subprocess.PIPE)
        for ds in dirs.values()
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    assert sorted(stored()) == sorted(str(d) for ds in dirs.values() for d in ds)
