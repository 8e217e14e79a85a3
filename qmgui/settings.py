"""User settings: versioned pydantic models stored as one JSON file, read and written safely.

The file lives at ``settings_path()`` (``$QMGUI_CONFIG_DIR/settings.json`` when that variable is
set, else under platformdirs' user config folder). Two promises shape this module:

- A settings file is never silently dropped. A file this build cannot use (not JSON, invalid
  values, unreadable, written by a newer qmgui) is renamed to ``settings.json.bad-<UTC time>``
  and reported in ``LoadResult.messages``; if even that rename fails, the result is flagged
  ``read_only`` and ``save_settings`` refuses to write over the file. As a second line of
  defence, ``save_settings`` never replaces an existing file it could not load itself.
- A save is atomic: a temp file in the same folder, fsync, ``os.replace``, fsync of the folder.
  A crash leaves either the old file or the new one, never half of one.

Unknown keys are kept (``extra="allow"``) so a file edited by hand or by a later build of the
same schema survives a load/save round trip. Older schemas are upgraded by ``MIGRATIONS``.
Nothing here imports Qt; callers forward ``LoadResult.messages`` to the notifier.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qmgui.core.backends import Backend, sort_classes
from qmgui.core.errors import SettingsError

__all__ = [
    "ENV_CONFIG_DIR",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SETTINGS_FILENAME",
    "BackendEntry",
    "BackendKind",
    "LoadResult",
    "ModelClass",
    "ModelOverride",
    "Settings",
    "UiState",
    "config_dir",
    "load_settings",
    "save_settings",
    "settings_path",
]

SCHEMA_VERSION = 1
"""The schema this build writes and the newest one it reads."""

SETTINGS_FILENAME = "settings.json"
ENV_CONFIG_DIR = "QMGUI_CONFIG_DIR"
_APP_NAME = "qmgui"
_ASIDE_STAMP = "%Y%m%dT%H%M%S"
_MAX_REPORTED_ERRORS = 3  # a message names the first few invalid values, not all of them

ModelClass = Literal["llm", "embedding", "rerank", "image", "tts", "asr"]
"""The classes a backend can serve (a vision projector is served with its llm)."""

BackendKind = Literal[
    "llama", "vllm", "sd", "whisper", "parakeet", "tts", "kokoro", "audiocpp", "custom"
]
FlashAttn = Literal["on", "off", "auto"]
Theme = Literal["system", "light", "dark"]
SortOrder = Literal["ascending", "descending"]


class _Stored(BaseModel):
    """Base of the stored models: keep unknown keys, validate assignments too."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)


class ModelOverride(_Stored):
    """Launch settings the user pinned for one model; ``None`` means "let the planner choose"."""

    backend_id: str | None = None
    ctx_size: int | None = Field(default=None, gt=0)
    parallel: int | None = Field(default=None, ge=1)
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    n_gpu_layers: int | None = Field(default=None, ge=-1)  # -1: all layers, as llama.cpp reads it
    n_cpu_moe: int | None = Field(default=None, ge=0)
    flash_attn: FlashAttn | None = None
    extra_args: list[str] = Field(default_factory=list)
    mmproj: str | None = None


class BackendEntry(_Stored):
    """One engine in the registry: what it is, where its executable is, what it is ★ for."""

    id: str = Field(min_length=1)
    kind: BackendKind
    executable: str
    default_for: list[ModelClass] = Field(default_factory=list)
    managed: bool = False  # True: qmgui installed it and may update or remove it
    version: str | None = None
    variant: str | None = None  # cuda, rocm, vulkan, sycl, cpu…
    capabilities: dict[str, Any] = Field(default_factory=dict)  # probed flags, devices…
    classes: list[ModelClass] = Field(default_factory=list)  # declared by "custom" kinds

    @field_validator("id")
    @classmethod
    def _id_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a backend id must not be blank")
        return value

    # Core fields this schema has no declared field for: kept as extra keys of the entry
    # (``extra="allow"``), so adding them needs no schema bump and older builds keep them.
    _EXTRA_CORE_FIELDS: ClassVar[tuple[str, ...]] = ("build", "family")

    def to_core(self) -> Backend:
        """This entry as the core's frozen `Backend` (capabilities deep-copied). ``build`` and
        ``family`` come from the extra keys of those names; a value of the wrong type there
        (a hand edit) reads as unset."""
        build = getattr(self, "build", None)
        family = getattr(self, "family", None)
        return Backend(
            id=self.id,
            kind=self.kind,
            executable=self.executable,
            default_for=frozenset(self.default_for),
            managed=self.managed,
            version=self.version,
            variant=self.variant,
            build=build if isinstance(build, int) and not isinstance(build, bool) else None,
            capabilities=copy.deepcopy(self.capabilities),
            classes=frozenset(self.classes),
            family=family if isinstance(family, str) and family.strip() else None,
        )

    @classmethod
    def from_core(cls, backend: Backend, *, base: BackendEntry | None = None) -> BackendEntry:
        """The stored form of `backend`. With `base` (the entry it was made from), the unknown
        keys of `base` are kept and its class lists keep their order when their contents did
        not change, so ``from_core(e.to_core(), base=e) == e``; without it the lists are in
        the UI's class order. Capabilities become plain JSON (sets turn into sorted lists).
        Raises pydantic's ValidationError (a ValueError) for values this schema refuses,
        such as an unknown kind or class."""
        extra = {
            k: copy.deepcopy(v)
            for k, v in ((base.model_extra or {}) if base is not None else {}).items()
            if k not in cls._EXTRA_CORE_FIELDS
        }
        for name in cls._EXTRA_CORE_FIELDS:
            value = getattr(backend, name)
            if value is not None:
                extra[name] = value

        def ordered(new: frozenset[str], old: list[ModelClass] | None) -> list[str]:
            if old is not None and frozenset(old) == new:
                return list(old)
            return sort_classes(new)

        return cls.model_validate(
            {
                **extra,
                "id": backend.id,
                "kind": backend.kind,
                "executable": backend.executable,
                "default_for": ordered(
                    backend.default_for, base.default_for if base is not None else None
                ),
                "managed": backend.managed,
                "version": backend.version,
                "variant": backend.variant,
                "capabilities": backend.capabilities_json(),
                "classes": ordered(backend.classes, base.classes if base is not None else None),
            }
        )


class UiState(_Stored):
    """Window and view state restored at start-up, plus display preferences."""

    window_geometry: str | None = None  # base64 of QMainWindow.saveGeometry()
    splitter_sizes: dict[str, list[int]] = Field(default_factory=dict)  # by splitter name
    last_model_id: str | None = None
    sort_column: str | None = None  # a column key, so reordering columns keeps the sort
    sort_order: SortOrder = "ascending"
    column_widths: dict[str, int] = Field(default_factory=dict)  # by column key
    theme: Theme = "system"
    # MiB the planner leaves free on every GPU. The card that drives a display also holds the
    # desktop compositor and browser/other apps, which grow after we plan, and each process
    # that opens the GPU pays a driver context; half a GiB absorbs a typical desktop. Users
    # with a headless card can lower it.
    gpu_reserve_mib: int = Field(default=512, ge=0)


class RunSet(_Stored):
    """A named group of models started and stopped together (each with its own settings,
    `model_overrides`)."""

    name: str = Field(min_length=1)
    model_ids: list[str] = Field(default_factory=list)


class Settings(_Stored):
    """The root of settings.json."""

    schema_version: int = SCHEMA_VERSION
    model_roots: list[str] = Field(default_factory=list)
    model_overrides: dict[str, ModelOverride] = Field(default_factory=dict)
    backends: list[BackendEntry] = Field(default_factory=list)
    ui: UiState = Field(default_factory=UiState)
    favourites: list[str] = Field(default_factory=list)  # model ids offered in the tray
    pinned: list[str] = Field(default_factory=list)  # model ids never stopped to make room
    run_sets: list[RunSet] = Field(default_factory=list)

    @field_validator("run_sets")
    @classmethod
    def _unique_run_sets(cls, sets: list[RunSet]) -> list[RunSet]:
        names = [r.name.casefold() for r in sets]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"two run sets are called {dup!r}")
        return sets

    @field_validator("schema_version")
    @classmethod
    def _current_schema(cls, value: int) -> int:
        # Older files are migrated and newer ones refused before validation reaches this.
        if value != SCHEMA_VERSION:
            raise ValueError(f"must be {SCHEMA_VERSION} in this build")
        return value

    @field_validator("model_roots")
    @classmethod
    def _normalise_roots(cls, roots: list[str]) -> list[str]:
        # Keep the user's order and spelling; two spellings of one folder ("~/m", "/home/u/m/")
        # are one root, and the first one wins. Blank entries mean nothing and are dropped.
        kept: list[str] = []
        seen: set[str] = set()
        for root in roots:
            if not root.strip():
                continue
            key = os.path.normcase(os.path.normpath(Path(root).expanduser()))
            if key not in seen:
                seen.add(key)
                kept.append(os.path.normpath(root))
        return kept

    @model_validator(mode="after")
    def _registry_consistent(self) -> Settings:
        ids: set[str] = set()
        stars: dict[str, str] = {}
        for backend in self.backends:
            if backend.id in ids:
                raise ValueError(f"backend id {backend.id!r} is used by more than one backend")
            ids.add(backend.id)
            for model_class in backend.default_for:
                if model_class in stars:
                    raise ValueError(
                        f"backends {stars[model_class]!r} and {backend.id!r} are both"
                        f" the default for {model_class!r}"
                    )
                stars[model_class] = backend.id
        return self


@dataclass(frozen=True)
class LoadResult:
    """What ``load_settings`` found.

    ``messages`` are sentences for the user (empty when all went well). ``moved_aside`` is where
    an unusable file went. ``read_only`` is True when an unusable file could not be moved aside:
    saving would destroy it, so ``save_settings`` refuses this result. ``path`` is the file read.
    """

    settings: Settings
    messages: tuple[str, ...] = ()
    moved_aside: Path | None = None
    read_only: bool = False
    path: Path | None = None


# --- migrations -----------------------------------------------------------------------------


def _migrate_0_to_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 0 (a file without ``schema_version``) called the scan folders ``roots``."""
    if "roots" in data:
        roots, current = data["roots"], data.get("model_roots")
        if current is None:
            data["model_roots"] = data.pop("roots")
        elif isinstance(current, list) and isinstance(roots, list):
            data["model_roots"] = [*current, *data.pop("roots")]
        # else: leave both; validation reports the bad one and nothing is lost.
    return data


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _migrate_0_to_1}
"""``MIGRATIONS[n]`` turns a schema-n dict into a schema-(n+1) dict; the chain runs in order
and sets ``schema_version`` after each step. Add one entry per schema bump."""


# --- paths ----------------------------------------------------------------------------------


def config_dir() -> Path:
    """The folder holding qmgui's settings: ``$QMGUI_CONFIG_DIR`` if set, else the platform's."""
    override = os.environ.get(ENV_CONFIG_DIR)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir(_APP_NAME, appauthor=False))


def settings_path() -> Path:
    """The settings file in ``config_dir()``."""
    return config_dir() / SETTINGS_FILENAME


# --- load -----------------------------------------------------------------------------------

_DEFAULT_ADVICE = "to restore your settings, fix that file and rename it to {name}, or delete it"


class _UnusableError(Exception):
    """Why a settings file cannot be used: ``problem`` completes "Settings file X …", and
    ``advice`` (with ``{name}`` for the file's name) tells the user what to do next."""

    def __init__(self, problem: str, advice: str = _DEFAULT_ADVICE) -> None:
        super().__init__(problem)
        self.problem = problem
        self.advice = advice


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def load_settings(
    path: Path | None = None, *, clock: Callable[[], datetime] = _utc_now
) -> LoadResult:
    """Read the settings file; never raises for a bad file, reports it in the result instead.

    A missing file gives defaults and no message. An unusable file is moved aside (named with
    ``clock()``'s UTC time) and defaults are used; see the module docstring.
    """
    target = path if path is not None else settings_path()
    try:
        settings = _read_settings(target)
    except _UnusableError as unusable:
        return _move_aside(target, unusable, clock())
    return LoadResult(settings if settings is not None else Settings(), path=target)


def _read_settings(path: Path) -> Settings | None:
    """Parse, migrate and validate one file; ``None`` when there is no file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        # Linux says IsADirectoryError, Windows says PermissionError: ask the path itself.
        if _is_dir(path):
            raise _UnusableError("is a folder, not a file") from exc
        raise _UnusableError(
            f"could not be read ({_os_reason(exc)})",
            "to restore your settings, fix its permissions and rename it to {name}",
        ) from exc
    try:
        # utf-8-sig: an editor may have added a byte-order mark; we write plain UTF-8.
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise _UnusableError(f"is not UTF-8 text (bad byte at offset {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise _UnusableError(
            f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    except RecursionError as exc:
        raise _UnusableError("is nested too deeply to be a settings file") from exc
    if not isinstance(data, dict):
        kind = _JSON_KINDS.get(type(data), type(data).__name__)
        raise _UnusableError(f"holds a JSON {kind}, not an object")
    data = _migrate(data)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise _UnusableError(f"has invalid values ({_summarise(exc)})") from exc


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
_JSON_KINDS[type(None)] = "null"


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _migrate(data: dict[str, Any]) -> dict[str, Any]:
    version = data.get("schema_version", 0)  # files from before versioning are schema 0
    if isinstance(version, bool) or not isinstance(version, int):
        raise _UnusableError(f"has a schema_version that is not a whole number ({version!r})")
    if version > SCHEMA_VERSION:
        raise _UnusableError(
            f"was written by a newer qmgui (schema {version}); this build reads up to schema"
            f" {SCHEMA_VERSION}",
            "rename it to {name} when you use that newer qmgui again, or delete it",
        )
    if version < 0:
        raise _UnusableError(f"has an impossible schema_version ({version})")
    data = copy.deepcopy(data)
    for step_from in range(version, SCHEMA_VERSION):
        step = MIGRATIONS.get(step_from)
        if step is None:
            raise _UnusableError(f"uses schema {step_from}, which this build cannot upgrade")
        try:
            data = step(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _UnusableError(
                f"could not be upgraded from schema {step_from} ({exc!r})"
            ) from exc
        data["schema_version"] = step_from + 1
    return data


def _summarise(exc: ValidationError) -> str:
    """The first few validation errors as "where: what"."""
    parts = []
    errors = exc.errors(include_url=False)
    for error in errors[:_MAX_REPORTED_ERRORS]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        what = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where.lstrip('.')}: {what}" if where else what)
    if len(errors) > _MAX_REPORTED_ERRORS:
        parts.append(f"and {len(errors) - _MAX_REPORTED_ERRORS} more")
    return "; ".join(parts)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _aside_path(path: Path, when: datetime) -> Path:
    """``settings.json.bad-<UTC stamp>``, with ``-N`` appended when that name is taken."""
    stamp = when.astimezone(timezone.utc).strftime(_ASIDE_STAMP)
    candidate = path.with_name(f"{path.name}.bad-{stamp}")
    counter = 1
    while os.path.lexists(candidate):
        candidate = path.with_name(f"{path.name}.bad-{stamp}-{counter}")
        counter += 1
    return candidate


def _move_aside(path: Path, unusable: _UnusableError, when: datetime) -> LoadResult:
    aside = _aside_path(path, when)
    try:
        # rename, not replace: on Windows it refuses to overwrite, so it never loses a file.
        path.rename(aside)
    except OSError as exc:
        message = (
            f"Settings file {path} {unusable.problem}, and it could not be moved aside to"
            f" {aside} ({_os_reason(exc)}); qmgui is using default settings and will not save"
            " over that file until you fix, move or delete it."
        )
        return LoadResult(Settings(), (message,), None, read_only=True, path=path)
    message = (
        f"Settings file {path} {unusable.problem}, so it was moved to {aside} and qmgui is"
        f" using default settings; {unusable.advice.format(name=path.name)}."
    )
    return LoadResult(Settings(), (message,), aside, path=path)


# --- save -----------------------------------------------------------------------------------


def save_settings(settings: Settings | LoadResult, path: Path | None = None) -> Path:
    """Write settings atomically and return the path written; raise ``SettingsError`` if not.

    Given a ``LoadResult``, save its settings to the file it was loaded from, unless it is
    ``read_only``. In every case an existing file that does not load cleanly is never
    replaced: it may be the only copy of the user's settings, or a newer qmgui's.
    """
    if isinstance(settings, LoadResult):
        if settings.read_only:
            raise SettingsError(
                f"Settings were not saved: {settings.path} could not be moved aside when it"
                " was loaded, and saving would overwrite it; fix, move or delete that file"
                " first."
            )
        target = path or settings.path or settings_path()
        model = settings.settings
    else:
        target = path or settings_path()
        model = settings
    # Write through a symlink (dotfile managers) instead of replacing the link itself.
    real = Path(os.path.realpath(target))
    _refuse_to_destroy(target, real)
    _write_atomic(target, real, _serialise(model, target))
    return target


def _refuse_to_destroy(target: Path, real: Path) -> None:
    if not os.path.lexists(real):
        return
    try:
        _read_settings(real)
    except _UnusableError as unusable:
        raise SettingsError(
            f"Settings were not saved: {target} {unusable.problem}, and saving would overwrite"
            " it; fix, move or delete that file first."
        ) from None


def _serialise(model: Settings, target: Path) -> bytes:
    try:
        # Validate again: lists and dicts may have been changed in place since the last check.
        checked = Settings.model_validate(model.model_dump())
        data = checked.model_dump(mode="json")
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
    except ValidationError as exc:
        raise SettingsError(
            f"Settings were not saved to {target} because they are invalid ({_summarise(exc)})."
        ) from exc
    except (TypeError, ValueError) as exc:
        raise SettingsError(
            f"Settings were not saved to {target}: a value cannot be stored as JSON ({exc})."
        ) from exc
    return (text + "\n").encode("utf-8")


def _write_atomic(target: Path, real: Path, payload: bytes) -> None:
    folder = real.parent

    def failure(exc: OSError) -> SettingsError:
        return SettingsError(
            f"Could not save settings to {target}: {_os_reason(exc)}; check that {folder} is a"
            " folder you can write to."
        )

    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise failure(exc) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            _keep_mode(real, handle.fileno())
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp_name).replace(real)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            Path(tmp_name).unlink()
        if isinstance(exc, OSError):
            raise failure(exc) from exc
        raise
    _fsync_folder(folder)


def _keep_mode(real: Path, fd: int) -> None:
    """Give the new file the old one's permissions (mkstemp creates it 0600)."""
    if os.name == "nt":  # no POSIX modes to keep; os.fchmod does not exist there
        return
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IMODE(real.stat().st_mode))


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable; Windows cannot open a folder for this."""
    if os.name == "nt":
        return
    # Some file systems refuse to fsync a folder; the replace has happened regardless.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
