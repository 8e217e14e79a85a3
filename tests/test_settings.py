"""Settings: round trips, every way a file can be unusable, migration and atomic saves."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import platformdirs
import pytest
from pydantic import ValidationError

from qmgui import settings as settings_mod
from qmgui.core.errors import QmguiError, SettingsError
from qmgui.settings import (
    SCHEMA_VERSION,
    BackendEntry,
    LoadResult,
    ModelOverride,
    Settings,
    UiState,
    config_dir,
    load_settings,
    save_settings,
    settings_path,
)

ASIDE_NAME = re.compile(r"^settings\.json\.bad-\d{8}T\d{6}(-\d+)?$")
FIXED_TIME = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)


def _permission_bits_are_enforced() -> bool:
    """False as root (euid 0 with CAP_DAC_OVERRIDE reads everything) and on Windows."""
    if os.name == "nt" or not hasattr(os, "geteuid"):
        return False
    if os.geteuid() != 0:
        return True
    # Root without CAP_DAC_OVERRIDE (a restricted container) does obey the bits: probe.
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe"
        probe.write_bytes(b"")
        probe.chmod(0)
        try:
            probe.read_bytes()
        except PermissionError:
            return True
        return False


needs_posix_permissions = pytest.mark.skipif(
    not _permission_bits_are_enforced(), reason="root (or Windows) ignores POSIX permission bits"
)


def files(folder: Path) -> list[str]:
    """The names in `folder` but the advisory lock file, which stays beside the settings."""
    return sorted(p.name for p in folder.iterdir() if p.name != "settings.json.lock")


def fixed_clock() -> datetime:
    return FIXED_TIME


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private config folder, so no test touches the developer's own settings."""
    folder = tmp_path / "config"
    monkeypatch.setenv("QMGUI_CONFIG_DIR", str(folder))
    return folder


def full_settings() -> Settings:
    return Settings(
        model_roots=["/models/gguf", "/data/hf"],
        model_overrides={
            "/models/gguf/qwen.gguf": ModelOverride(
                backend_id="llama-cuda",
                ctx_size=32768,
                parallel=2,
                cache_type_k="q8_0",
                cache_type_v="q8_0",
                n_gpu_layers=-1,
                n_cpu_moe=4,
                flash_attn="on",
                extra_args=["--jinja"],
                mmproj="/models/gguf/mmproj-qwen.gguf",
            )
        },
        backends=[
            BackendEntry(
                id="llama-cuda",
                kind="llama",
                executable="/opt/llama/llama-server",
                default_for=["llm", "embedding"],
                managed=True,
                version="b6000",
                variant="cuda",
                capabilities={"fit_params": True, "devices": ["CUDA0"]},
            ),
            BackendEntry(
                id="my-tts", kind="custom", executable="/bin/tts", classes=["tts"], default_for=[]
            ),
        ],
        ui=UiState(
            window_geometry="AdnQywADAAA=",
            splitter_sizes={"main": [600, 400]},
            last_model_id="/models/gguf/qwen.gguf",
            sort_column="size",
            sort_order="descending",
            column_widths={"name": 240},
            theme="dark",
            gpu_reserve_mib=768,
        ),
    )


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def assert_moved_aside(result: LoadResult, original: Path, content: bytes) -> Path:
    """The file went aside under the pattern, bytes intact, and the one message names both."""
    aside = result.moved_aside
    assert aside is not None
    assert ASIDE_NAME.match(aside.name), aside.name
    assert aside.parent == original.parent
    assert not original.exists()
    assert aside.read_bytes() == content
    assert result.settings == Settings()
    assert not result.read_only
    assert len(result.messages) == 1
    message = result.messages[0]
    assert str(original) in message
    assert str(aside) in message
    assert "default settings" in message
    assert "rename it to settings.json" in message
    return aside


# --- paths ------------------------------------------------------------------------------------


def test_config_dir_follows_the_environment(cfg: Path) -> None:
    assert config_dir() == cfg
    assert settings_path() == cfg / "settings.json"


def test_config_dir_defaults_to_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QMGUI_CONFIG_DIR", raising=False)
    assert config_dir() == Path(platformdirs.user_config_dir("qmgui", appauthor=False))


# --- round trips ------------------------------------------------------------------------------


def test_missing_file_gives_defaults_without_a_message(cfg: Path) -> None:
    result = load_settings()
    assert result.settings == Settings()
    assert result.messages == ()
    assert result.moved_aside is None
    assert not result.read_only
    assert result.path == cfg / "settings.json"
    assert not cfg.exists()  # loading writes nothing


def test_defaults() -> None:
    settings = Settings()
    assert settings.schema_version == SCHEMA_VERSION == 1
    assert settings.model_roots == []
    assert settings.ui.gpu_reserve_mib == 512
    assert settings.ui.theme == "system"


def test_round_trip(cfg: Path) -> None:
    original = full_settings()
    written = save_settings(original)
    assert written == cfg / "settings.json"  # the folder was created
    result = load_settings()
    assert result.messages == ()
    assert result.settings == original
    assert result.settings.backends[0].capabilities == {"fit_params": True, "devices": ["CUDA0"]}


def test_saved_json_is_pretty_sorted_and_stable(cfg: Path) -> None:
    path = save_settings(full_settings())
    first = path.read_bytes()
    text = first.decode("utf-8")
    assert text.endswith("}\n")
    assert '\n  "backends": [' in text  # indented by two
    assert list(json.loads(text)) == sorted(json.loads(text))
    save_settings(load_settings().settings)
    assert path.read_bytes() == first


def test_unknown_keys_survive_a_round_trip(cfg: Path) -> None:
    data = {
        "schema_version": 1,
        "future_top": {"a": [1, 2]},
        "backends": [{"id": "b", "kind": "llama", "executable": "x", "future_backend": "keep me"}],
        "model_overrides": {"/m.gguf": {"ctx_size": 4096, "future_override": 3}},
        "ui": {"future_ui": True},
    }
    write(cfg / "settings.json", json.dumps(data).encode())
    result = load_settings()
    assert result.messages == ()
    save_settings(result)
    saved = json.loads((cfg / "settings.json").read_text("utf-8"))
    assert saved["future_top"] == {"a": [1, 2]}
    assert saved["backends"][0]["future_backend"] == "keep me"
    assert saved["model_overrides"]["/m.gguf"]["future_override"] == 3
    assert saved["ui"]["future_ui"] is True


def test_explicit_path_ignores_the_environment(cfg: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "s.json"
    save_settings(Settings(model_roots=["/x"]), other)
    assert not (cfg / "settings.json").exists()
    assert load_settings(other).settings.model_roots == ["/x"]


def test_a_utf8_byte_order_mark_is_accepted(cfg: Path) -> None:
    write(cfg / "settings.json", b'\xef\xbb\xbf{"schema_version": 1, "model_roots": ["/m"]}')
    result = load_settings()
    assert result.messages == ()
    assert result.settings.model_roots == ["/m"]


# --- validation -------------------------------------------------------------------------------


def test_model_roots_keep_order_and_drop_duplicates() -> None:
    home_models = str(Path("~/models").expanduser())
    settings = Settings(model_roots=["/b", "~/models", "/a/", "/b", home_models, "  ", "/a"])
    assert settings.model_roots == [os.path.normpath("/b"), "~/models", os.path.normpath("/a")]


def test_duplicate_backend_ids_are_rejected() -> None:
    with pytest.raises(ValidationError, match="used by more than one backend"):
        Settings(
            backends=[
                BackendEntry(id="a", kind="llama", executable="x"),
                BackendEntry(id="a", kind="vllm", executable="y"),
            ]
        )


def test_two_defaults_for_one_class_are_rejected() -> None:
    with pytest.raises(ValidationError, match="both the default for 'llm'"):
        Settings(
            backends=[
                BackendEntry(id="a", kind="llama", executable="x", default_for=["llm"]),
                BackendEntry(id="b", kind="vllm", executable="y", default_for=["llm"]),
            ]
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"ctx_size": 0},
        {"parallel": 0},
        {"n_gpu_layers": -2},
        {"n_cpu_moe": -1},
        {"flash_attn": "yes"},
        {"extra_args": "--jinja"},
    ],
)
def test_model_override_bounds(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ModelOverride.model_validate(fields)


def test_backend_fields_are_checked() -> None:
    with pytest.raises(ValidationError):
        BackendEntry(id=" ", kind="llama", executable="x")
    with pytest.raises(ValidationError):
        BackendEntry.model_validate({"id": "a", "kind": "ollama", "executable": "x"})
    with pytest.raises(ValidationError):
        BackendEntry.model_validate(
            {"id": "a", "kind": "llama", "executable": "x", "default_for": ["video"]}
        )


def test_assignment_is_validated() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.ui.theme = "purple"  # type: ignore[assignment]


# --- unusable files ---------------------------------------------------------------------------

DUPLICATE_IDS = json.dumps(
    {
        "schema_version": 1,
        "backends": [
            {"id": "a", "kind": "llama", "executable": "x"},
            {"id": "a", "kind": "llama", "executable": "y"},
        ],
    }
).encode()


@pytest.mark.parametrize(
    ("content", "key_words"),
    [
        pytest.param(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01", ["not UTF-8 text"], id="garbage"),
        pytest.param(b'{"schema_version": 1, "model_roots": ["/a"', ["not valid JSON"], id="cut"),
        pytest.param(b"", ["not valid JSON"], id="empty"),
        pytest.param(b"[1, 2]", ["holds a JSON array, not an object"], id="array"),
        pytest.param(b"null", ["holds a JSON null, not an object"], id="null"),
        pytest.param(
            b'{"schema_version": 1, "model_roots": "/a"}',
            ["has invalid values", "model_roots", "valid list"],
            id="wrong-type",
        ),
        pytest.param(
            b'{"schema_version": 1, "ui": {"gpu_reserve_mib": "lots"}}',
            ["has invalid values", "ui.gpu_reserve_mib"],
            id="nested-wrong-type",
        ),
        pytest.param(
            DUPLICATE_IDS,
            ["has invalid values", "backend id 'a' is used by more than one backend"],
            id="duplicate-ids",
        ),
        pytest.param(
            b'{"schema_version": 2, "model_roots": ["/a"]}',
            [
                "was written by a newer qmgui (schema 2); this build reads up to schema 1",
                "rename it to settings.json when you use that newer qmgui again",
            ],
            id="newer-schema",
        ),
        pytest.param(
            b'{"schema_version": "1"}', ["schema_version that is not a whole number"], id="ver"
        ),
        pytest.param(b'{"schema_version": -1}', ["impossible schema_version"], id="neg-ver"),
        # hostile values: each was a traceback on main, or loaded and broke a scan later
        pytest.param(
            b'{"schema_version": 1, "model_roots": ["/m\\u0000/x"]}',
            ["holds a NUL character (\\u0000) in model_roots[0]"],
            id="nul-in-a-root",
        ),
        pytest.param(
            b'{"backends": [{"id": "a\\u0000", "kind": "llama", "executable": "/x"}]}',
            ["holds a NUL character (\\u0000) in backends[0].id"],
            id="nul-in-an-id",
        ),
        pytest.param(
            b'{"mine": {"k\\u0000": 1}}', ["holds a NUL character", "mine (a key)"], id="nul-key"
        ),
        pytest.param(
            b'{"schema_version": 1' + b"1" * 4999 + b"}",
            ["holds a number with 5,000 digits (a setting has at most 20)"],
            id="5000-digit-version",
        ),
        pytest.param(
            b'{"ui": {"gpu_reserve_mib": -' + b"9" * 5000 + b"}}",
            ["holds a number with 5,000 digits"],
            id="5000-digit-value",
        ),
        pytest.param(b'{"mine": Infinity}', ["holds Infinity"], id="infinity"),
        pytest.param(b'{"mine": [NaN]}', ["holds NaN"], id="nan"),
        pytest.param(b'{"mine": 1e999}', ["holds a number too large"], id="huge-float"),
        pytest.param(
            b'{"mine": ' + b"[" * 100 + b"]" * 100 + b"}",
            ["is nested more than 64 levels deep"],
            id="deep",
        ),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000, ["is nested too deeply"], id="deeper-than-python"
        ),
    ],
)
def test_unusable_file_is_moved_aside(cfg: Path, content: bytes, key_words: list[str]) -> None:
    path = write(cfg / "settings.json", content)
    result = load_settings()
    assert_moved_aside(result, path, content)
    for words in key_words:
        assert words in result.messages[0]


def test_aside_name_uses_the_utc_time_and_a_counter(cfg: Path) -> None:
    path = cfg / "settings.json"
    first = load_settings(write(path, b"nope 1"), clock=fixed_clock)
    second = load_settings(write(path, b"nope 2"), clock=fixed_clock)
    third = load_settings(write(path, b"nope 3"), clock=fixed_clock)
    assert first.moved_aside == cfg / "settings.json.bad-20240506T070809"
    assert second.moved_aside == cfg / "settings.json.bad-20240506T070809-1"
    assert third.moved_aside == cfg / "settings.json.bad-20240506T070809-2"
    assert [p.read_bytes() for p in (first.moved_aside, second.moved_aside)] == [
        b"nope 1",
        b"nope 2",
    ]


def test_old_copies_are_pruned_to_the_newest_five(cfg: Path) -> None:
    """Each new copy deletes the oldest ones beyond five; the new one always stays (even when
    the clock is behind the names), and a folder that was moved aside is left alone."""
    path = cfg / "settings.json"
    cfg.mkdir()
    (cfg / "settings.json.bad-20190101T000000").mkdir()  # a folder: never pruned
    olds = [write(cfg / f"settings.json.bad-2025010{i}T000000", b"old") for i in range(1, 8)]
    write(cfg / "settings.json.bad-notes.txt", b"not a copy")  # not the pattern: kept
    result = load_settings(write(path, b"{broken"), clock=fixed_clock)
    aside = result.moved_aside
    assert aside == cfg / "settings.json.bad-20240506T070809"
    assert aside.read_bytes() == b"{broken"
    left = files(cfg)
    assert left == sorted(
        [
            "settings.json.bad-20190101T000000",
            aside.name,
            *(p.name for p in olds[3:]),
            "settings.json.bad-notes.txt",
        ]
    )
    # the shared helper, as the cache and the run registry use it
    from qmgui.keep_aside import aside_copies, move_aside

    other = write(cfg / "engines.json", b"x")
    for _ in range(7):
        moved = move_aside(other, when=FIXED_TIME, keep=3)
        assert moved.read_bytes() == b"x"
        write(other, b"x")
    copies = aside_copies(other)
    assert [p.name for p in copies] == [
        "engines.json.bad-20240506T070809-4",
        "engines.json.bad-20240506T070809-5",
        "engines.json.bad-20240506T070809-6",
    ]


def test_a_folder_in_place_of_the_file_is_moved_aside(cfg: Path) -> None:
    path = cfg / "settings.json"
    path.mkdir(parents=True)
    (path / "inside.txt").write_text("keep", "utf-8")
    result = load_settings()
    aside = result.moved_aside
    assert aside is not None
    assert ASIDE_NAME.match(aside.name)
    assert (aside / "inside.txt").read_text("utf-8") == "keep"
    assert not path.exists()
    (message,) = result.messages
    assert f"Settings file {path} is a folder, not a file" in message
    assert str(aside) in message
    assert result.settings == Settings()


@needs_posix_permissions
def test_an_unreadable_file_is_moved_aside(cfg: Path) -> None:
    path = write(cfg / "settings.json", b'{"schema_version": 1}')
    path.chmod(0)
    try:
        result = load_settings()
    finally:
        for candidate in cfg.iterdir():
            candidate.chmod(0o600)
    assert_moved_aside(result, path, b'{"schema_version": 1}')
    assert "could not be read (Permission denied)" in result.messages[0]
    assert "fix its permissions and rename it to settings.json" in result.messages[0]


def test_a_read_error_is_moved_aside(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same case as above, injected, so it also runs as root."""
    path = write(cfg / "settings.json", b'{"schema_version": 1}')
    real_read = Path.read_bytes

    def refuse(self: Path) -> bytes:
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    result = load_settings()
    monkeypatch.undo()
    assert_moved_aside(result, path, b'{"schema_version": 1}')
    assert "could not be read (Permission denied)" in result.messages[0]


def assert_kept_read_only(
    result: LoadResult,
    path: Path,
    content: bytes,
    refused: str = r"is not valid JSON \(.*\), and saving would overwrite it",
) -> None:
    assert result.read_only
    assert result.moved_aside is None
    assert result.settings == Settings()
    (message,) = result.messages
    assert f"Settings file {path} is not valid JSON" in message
    assert "could not be moved aside to" in message
    assert re.search(r"settings\.json\.bad-\d{8}T\d{6} \(", message)
    assert "will not save over that file until you fix, move or delete it" in message
    assert path.read_bytes() == content
    # Neither the flagged result nor its settings may be written over the file.
    with pytest.raises(SettingsError, match="could not be moved aside when it was loaded"):
        save_settings(result)
    with pytest.raises(SettingsError, match=refused):
        save_settings(result.settings, path)
    assert path.read_bytes() == content


@needs_posix_permissions
def test_read_only_folder_keeps_the_file_and_blocks_saving(cfg: Path) -> None:
    path = write(cfg / "settings.json", b"{broken")
    cfg.chmod(0o555)
    try:
        result = load_settings()
        assert "Permission denied" in result.messages[0]
        # saving fails first on the lock file, which the read-only folder cannot hold either
        assert_kept_read_only(
            result, path, b"{broken", refused=r"Permission denied; check that .* you can write"
        )
    finally:
        cfg.chmod(0o755)
    assert files(cfg) == ["settings.json"]


def test_failed_move_aside_keeps_the_file_and_blocks_saving(
    cfg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-only folder, injected, so it also runs as root."""
    path = write(cfg / "settings.json", b"{broken")

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "rename", refuse)
    result = load_settings()
    assert "(Permission denied)" in result.messages[0]
    assert_kept_read_only(result, path, b"{broken")


def test_defaults_after_moving_aside_can_be_saved(cfg: Path) -> None:
    path = write(cfg / "settings.json", b"{broken")
    result = load_settings()
    assert save_settings(result) == path
    assert load_settings().messages == ()
    assert result.moved_aside is not None
    assert result.moved_aside.read_bytes() == b"{broken"


# --- migration --------------------------------------------------------------------------------


def test_a_file_without_schema_version_is_migrated(cfg: Path) -> None:
    write(cfg / "settings.json", json.dumps({"roots": ["/old", "/older"]}).encode())
    result = load_settings()
    assert result.messages == ()
    assert result.moved_aside is None
    assert result.settings.schema_version == 1
    assert result.settings.model_roots == ["/old", "/older"]
    assert "roots" not in result.settings.model_dump()
    save_settings(result)
    saved = json.loads((cfg / "settings.json").read_text("utf-8"))
    assert saved["schema_version"] == 1
    assert saved["model_roots"] == ["/old", "/older"]
    assert "roots" not in saved


def test_migration_merges_roots_into_model_roots(cfg: Path) -> None:
    data = {"schema_version": 0, "model_roots": ["/a"], "roots": ["/b", "/a"]}
    result = load_settings(write(cfg / "settings.json", json.dumps(data).encode()))
    assert result.settings.model_roots == ["/a", "/b"]


def test_migration_chain_runs_each_step(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-step chain to a hypothetical schema 2: each step sees the previous one's output."""
    seen: list[int] = []

    def one_to_two(data: dict[str, object]) -> dict[str, object]:
        seen.append(int(str(data["schema_version"])))
        data["ui"] = {"theme": "dark"}
        return data

    monkeypatch.setattr(settings_mod, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(settings_mod.MIGRATIONS, 1, one_to_two)
    result = load_settings(write(cfg / "settings.json", b'{"roots": ["/r"]}'))
    assert result.messages == ()
    assert seen == [1]
    assert result.settings.schema_version == 2
    assert result.settings.model_roots == ["/r"]
    assert result.settings.ui.theme == "dark"


def test_a_missing_migration_is_reported(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(settings_mod.MIGRATIONS, 0)
    path = write(cfg / "settings.json", b'{"roots": []}')
    result = load_settings()
    assert_moved_aside(result, path, b'{"roots": []}')
    assert "uses schema 0, which this build cannot upgrade" in result.messages[0]


# --- saving -----------------------------------------------------------------------------------


def test_save_leaves_no_temp_files(cfg: Path) -> None:
    save_settings(full_settings())
    save_settings(Settings())
    assert files(cfg) == ["settings.json"]


def test_save_into_a_file_instead_of_a_folder_fails(tmp_path: Path) -> None:
    blocker = write(tmp_path / "config", b"I am a file")
    target = blocker / "settings.json"
    with pytest.raises(SettingsError) as caught:
        save_settings(Settings(), target)
    message = str(caught.value)
    assert message.startswith(f"Could not save settings to {target}: ")
    assert f"check that {blocker} is a folder you can write to" in message
    assert isinstance(caught.value, QmguiError)
    assert blocker.read_bytes() == b"I am a file"


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_save_keeps_the_previous_file(
    cfg: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = save_settings(full_settings())
    before = path.read_bytes()

    def no_space(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "fsync":
        monkeypatch.setattr(os, "fsync", no_space)
    else:
        monkeypatch.setattr(Path, "replace", no_space)
    with pytest.raises(SettingsError, match="No space left on device") as caught:
        save_settings(Settings())
    assert str(path) in str(caught.value)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert files(cfg) == ["settings.json"]


def test_save_refuses_to_overwrite_a_file_it_cannot_load(cfg: Path) -> None:
    path = write(cfg / "settings.json", b'{"schema_version": 7}')
    with pytest.raises(SettingsError) as caught:
        save_settings(Settings())
    message = str(caught.value)
    assert f"Settings were not saved: {path} was written by a newer qmgui (schema 7)" in message
    assert "saving would overwrite it; fix, move or delete that file first" in message
    assert path.read_bytes() == b'{"schema_version": 7}'


def test_save_revalidates_in_place_changes(cfg: Path) -> None:
    settings = Settings(backends=[BackendEntry(id="a", kind="llama", executable="x")])
    settings.backends.append(BackendEntry(id="a", kind="vllm", executable="y"))
    with pytest.raises(SettingsError, match=r"because they are invalid .*used by more than one"):
        save_settings(settings)
    assert not (cfg / "settings.json").exists()


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes and symlinks")
def test_save_keeps_the_file_mode(cfg: Path) -> None:
    path = save_settings(Settings())
    path.chmod(0o640)
    save_settings(full_settings())
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes and symlinks")
def test_save_writes_through_a_symlink(cfg: Path, tmp_path: Path) -> None:
    real = write(tmp_path / "dotfiles" / "qmgui.json", b'{"schema_version": 1}')
    cfg.mkdir()
    (cfg / "settings.json").symlink_to(real)
    save_settings(Settings(model_roots=["/m"]))
    assert (cfg / "settings.json").is_symlink()
    assert json.loads(real.read_text("utf-8"))["model_roots"] == ["/m"]
    assert sorted(p.name for p in real.parent.iterdir()) == ["qmgui.json"]


# --- read-modify-write ------------------------------------------------------------------------


def test_update_applies_the_change_to_the_file_as_it_is_now(cfg: Path) -> None:
    from qmgui.settings import update_settings

    stale = load_settings()  # before anyone wrote
    save_settings(Settings(model_roots=["/by-another-process"]))

    def add_root(current: Settings) -> Settings:
        current.model_roots.append("/mine")  # in place is fine too
        return current

    saved = update_settings(add_root)
    assert saved.settings.model_roots == ["/by-another-process", "/mine"]
    assert load_settings().settings.model_roots == ["/by-another-process", "/mine"]
    assert stale.settings.model_roots == []


def test_update_that_changes_nothing_does_not_write(cfg: Path) -> None:
    from qmgui.settings import update_settings

    path = save_settings(full_settings())
    before = path.stat()
    update_settings(lambda s: s.model_copy())
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_update_that_raises_writes_nothing(cfg: Path) -> None:
    from qmgui.settings import update_settings

    path = save_settings(full_settings())
    before = path.read_bytes()

    def refuse(current: Settings) -> Settings:
        current.model_roots.append("/half-done")
        raise LookupError("changed my mind")

    with pytest.raises(LookupError):
        update_settings(refuse)
    assert path.read_bytes() == before
    # the lock was let go: the next update goes through at once
    update_settings(lambda s: s.model_copy(update={"model_roots": ["/x"]}), timeout_s=0.5)
    assert load_settings().settings.model_roots == ["/x"]


def test_update_of_an_unusable_file_moves_it_aside_and_says_so(cfg: Path) -> None:
    from qmgui.settings import update_settings

    path = write(cfg / "settings.json", b'{"model_roots": ["/a\\u0000"]}')
    saved = update_settings(lambda s: s.model_copy(update={"model_roots": ["/new"]}))
    (message,) = saved.messages
    assert saved.moved_aside is not None
    assert str(path) in message and str(saved.moved_aside) in message
    assert saved.moved_aside.read_bytes() == b'{"model_roots": ["/a\\u0000"]}'
    assert load_settings().settings.model_roots == ["/new"]


def test_update_refuses_a_file_it_could_not_move_aside(
    cfg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qmgui.settings import update_settings

    path = write(cfg / "settings.json", b"{broken")

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "rename", refuse)
    with pytest.raises(
        SettingsError, match=r"^Settings were not saved: Settings file .* not valid"
    ):
        update_settings(lambda s: s.model_copy(update={"model_roots": ["/new"]}))
    assert path.read_bytes() == b"{broken"


def test_merge_keeps_both_sides_changes() -> None:
    from qmgui.settings import merge_settings

    a = BackendEntry(id="a", kind="llama", executable="/a")
    base = Settings(model_roots=["/r1", "/r2"], backends=[a], favourites=["m1"])
    # the window: a root added, one removed, a ★ given to "a", the sort changed
    ours = base.model_copy(deep=True)
    ours.model_roots = ["/r1", "/win"]
    ours.backends[0].default_for = ["llm"]
    ours.ui.sort_column = "size"
    # the CLI meanwhile: a root and a backend added, a favourite removed, the reserve changed
    theirs = base.model_copy(deep=True)
    theirs.model_roots = ["/r1", "/r2", "/cli"]
    theirs.backends.append(BackendEntry(id="b", kind="vllm", executable="/b"))
    theirs.favourites = []
    theirs.ui.gpu_reserve_mib = 1024
    merged = merge_settings(base, ours, theirs)
    assert merged.model_roots == ["/r1", "/cli", "/win"]
    assert [(b.id, b.default_for) for b in merged.backends] == [("a", ["llm"]), ("b", [])]
    assert merged.favourites == []
    assert merged.ui.sort_column == "size"
    assert merged.ui.gpu_reserve_mib == 1024
    # nothing changed here: theirs as it is
    assert merge_settings(base, base.model_copy(deep=True), theirs) == theirs


def test_merge_of_a_conflict_takes_our_field_whole() -> None:
    from qmgui.settings import merge_settings

    base = Settings(
        backends=[
            BackendEntry(id="a", kind="llama", executable="/a"),
            BackendEntry(id="b", kind="llama", executable="/b"),
        ]
    )
    ours = base.model_copy(deep=True)
    ours.backends[0].default_for = ["llm"]
    theirs = base.model_copy(deep=True)
    theirs.backends[1].default_for = ["llm"]  # both gave llm its ★: one must win
    theirs.model_roots = ["/cli"]
    merged = merge_settings(base, ours, theirs)
    assert [(b.id, b.default_for) for b in merged.backends] == [("a", ["llm"]), ("b", [])]
    assert merged.model_roots == ["/cli"]


def test_save_changes_without_a_file_writes_ours_whole(cfg: Path) -> None:
    from qmgui.settings import save_changes

    base = Settings(model_roots=["/given-at-start"])
    ours = base.model_copy(update={"favourites": ["m"]})
    saved = save_changes(base, ours)
    assert saved.settings.model_roots == ["/given-at-start"]
    assert load_settings().settings.favourites == ["m"]
    assert load_settings().settings.model_roots == ["/given-at-start"]


def test_save_changes_merges_into_the_file(cfg: Path) -> None:
    from qmgui.settings import save_changes, update_settings

    base = load_settings(save_settings(Settings(model_roots=["/a"]))).settings
    update_settings(lambda s: s.model_copy(update={"model_roots": [*s.model_roots, "/cli"]}))
    saved = save_changes(base, base.model_copy(update={"pinned": ["m"]}))
    assert saved.settings.model_roots == ["/a", "/cli"]
    assert saved.settings.pinned == ["m"]
    assert load_settings().settings == saved.settings


def test_merge_takes_an_argument_list_whole() -> None:
    """Extra arguments are a sequence, not a set: mixing both sides' would make an argv neither
    side wrote (["--ctx", "--jinja", "8192"])."""
    from qmgui.settings import merge_settings

    base = Settings(model_overrides={"m": ModelOverride(extra_args=["--ctx", "4096"])})
    ours = base.model_copy(deep=True)
    ours.model_overrides["m"].extra_args = ["--ctx", "8192"]
    theirs = base.model_copy(deep=True)
    theirs.model_overrides["m"].extra_args = ["--ctx", "4096", "--jinja"]
    theirs.model_overrides["m"].parallel = 2
    merged = merge_settings(base, ours, theirs)
    assert merged.model_overrides["m"].extra_args == ["--ctx", "8192"]
    assert merged.model_overrides["m"].parallel == 2


def test_a_role_set_round_trips_and_an_old_run_set_loads_unchanged(cfg: Path) -> None:
    """`RunSet.roles` (a role set's `ROLE=MODEL[:k=v]` lines) is saved and read back; a run
    set written before the field existed loads as it was, without roles (no schema bump)."""
    from qmgui.settings import RunSet

    old = {
        "schema_version": SCHEMA_VERSION,
        "run_sets": [{"name": "Old", "model_ids": ["/m/a.gguf"], "future_key": 1}],
    }
    write(cfg / "settings.json", json.dumps(old).encode())
    result = load_settings()
    assert result.messages == ()
    (legacy,) = result.settings.run_sets
    assert (legacy.name, legacy.model_ids, legacy.roles) == ("Old", ["/m/a.gguf"], [])
    assert not legacy.is_role_set
    roles = ["chat=/m/a.gguf:ctx=8192,slots=2", "embed=hf:bge-small"]
    stack = RunSet(name="Stack", model_ids=["/m/a.gguf", "hf:bge-small"], roles=roles)
    save_settings(result.settings.model_copy(update={"run_sets": [legacy, stack]}))
    saved = json.loads((cfg / "settings.json").read_text("utf-8"))
    assert saved["run_sets"][0]["future_key"] == 1  # extra keys kept
    assert saved["run_sets"][1]["roles"] == roles
    again = load_settings().settings.run_sets
    assert again[1] == stack and again[1].is_role_set and again[0].roles == []
