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
- A change never loses another process's change. The window, the CLI and scripts run side by
  side, so every read-modify-write goes through ``update_settings`` (or ``save_changes`` for a
  caller holding its own copy): it takes the advisory lock ``settings.json.lock`` beside the
  file (``filelock``), re-reads the file, applies the change to what is on disk now, writes
  atomically and lets go. ``save_settings`` (a whole-file write) holds the same lock.

Unknown keys are kept (``extra="allow"``) so a file edited by hand or by a later build of the
same schema survives a load/save round trip. Older schemas are upgraded by ``MIGRATIONS``.
Nothing here imports Qt; callers forward ``LoadResult.messages`` to the notifier.

Copies moved aside are pruned to the newest few per file (``qmgui.keep_aside``). A file is
unusable when it is not JSON, holds a NUL character, a number of more than
``_MAX_INT_DIGITS`` digits, a non-finite number or nesting deeper than ``_MAX_DEPTH``, or
fails validation; it is moved aside, never a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from filelock import FileLock

from qmgui.config_paths import (
    APP_NAME,
    ENV_CONFIG_DIR,
    SETTINGS_FILENAME,
    config_dir,
    settings_path,
)
from qmgui.core.backends import Backend, canonical_kind, sort_classes
from qmgui.core.errors import SettingsError
from qmgui.keep_aside import aside_path, move_aside

__all__ = [
    "ENV_CONFIG_DIR",
    "LOCK_TIMEOUT_S",
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
    "lock_path",
    "merge_settings",
    "peek_settings",
    "save_changes",
    "save_settings",
    "settings_lock",
    "settings_path",
    "update_settings",
]

SCHEMA_VERSION = 1
"""The schema this build writes and the newest one it reads."""

_APP_NAME = APP_NAME
_MAX_REPORTED_ERRORS = 3  # a message names the first few invalid values, not all of them
_MAX_INT_DIGITS = 20  # a 64-bit integer has at most 20 digits; longer ones are not settings
_MAX_DEPTH = 64  # nesting deeper than this is not a settings file (and would recurse deeply)

LOCK_TIMEOUT_S = 10.0
"""How long a read-modify-write waits for another process's lock before it gives up."""

ModelClass = Literal[
    "llm", "embedding", "rerank", "image", "tts", "asr", "segment", "upscale", "3d"
]
"""The classes a backend can serve (a vision projector is served with its llm)."""

BackendKind = Annotated[  # another spelling of a kind ("llama.cpp", "TTS.cpp") reads as the kind
    Literal["llama", "vllm", "sd", "whisper", "parakeet", "tts", "kokoro", "audiocpp", "sam",
            "realesrgan", "trellis", "custom"],
    BeforeValidator(lambda v: canonical_kind(v) if isinstance(v, str) else v),
]  # fmt: skip
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
    port: int | None = Field(default=None, ge=1, le=65535)  # chosen once, then always used
    # added with profiles (issue 13); absent in older files, which load as before
    cpu_moe: bool | None = None  # --cpu-moe: every layer's experts on the CPU
    tensor_split: list[float] | None = None  # -ts: a share per GPU
    devices: list[int] | None = None  # --devices: the GPUs the engine may use
    # vLLM (qmgui.core.vllm.VllmPins); the context is `ctx_size` (--max-model-len)
    vllm_budget_bytes: int | None = Field(default=None, gt=0)  # VRAM per GPU to plan for
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    tokenizer: str | None = None
    tool_call_parser: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None


class PortRange(_Stored):
    """Where a model's port is chosen from the first time it is started."""

    first: int = Field(default=8080, ge=1, le=65535)
    last: int = Field(default=8179, ge=1, le=65535)

    @model_validator(mode="after")
    def _ordered(self) -> PortRange:
        if self.first > self.last:
            raise ValueError(f"the first port ({self.first}) is after the last ({self.last})")
        return self


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
        extra = self.model_extra or {}  # a dict lookup: pydantic's getattr is slow per entry
        build, family = extra.get("build"), extra.get("family")
        return Backend(
            id=self.id,
            kind=self.kind,
            executable=self.executable,
            default_for=frozenset(self.default_for),
            managed=self.managed,
            version=self.version,
            variant=self.variant,
            build=build if isinstance(build, int) and not isinstance(build, bool) else None,
            capabilities=copy.deepcopy(self.capabilities) if self.capabilities else {},
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
    `model_overrides`). With `roles` it is a role set: `ROLE=MODEL[:KEY=VALUE,...]` lines
    (`core.roles`; MODEL a model id or a path) planned together on every start
    (`service.role_sets`), and `model_ids` lists the models the roles name. The lines are
    checked when the set is saved (`ui.fleet.Fleet.save_role_set`), not here: a line a later
    build reads differently is said at its start, never a reason to move the file aside."""

    name: str = Field(min_length=1)
    model_ids: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)

    @property
    def is_role_set(self) -> bool:
        return bool(self.roles)


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
    ports: PortRange = Field(default_factory=PortRange)

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
    except _UnusableError:
        # Move it aside under the lock, reading it again there: another process may have
        # replaced it since (a save is atomic, so a good file never reads as a bad one). A
        # lock that cannot be had (a read-only folder) does not stop the move: it may fail
        # on its own, and then the result is read-only.
        try:
            lock = _acquire(target, LOCK_TIMEOUT_S)
        except SettingsError:
            return _load_locked(target, clock)[0]
        try:
            return _load_locked(target, clock)[0]
        finally:
            lock.release()
    return LoadResult(settings if settings is not None else Settings(), path=target)


def peek_settings(path: Path | None = None) -> Settings | None:
    """The settings in the file now, or None when there is none or it is unusable; never moves
    a file aside and never raises for a bad file (a watcher's read: the file may be half-way
    through a hand edit)."""
    try:
        return _read_settings(path if path is not None else settings_path())
    except _UnusableError:
        return None


def _load_locked(target: Path, clock: Callable[[], datetime]) -> tuple[LoadResult, bytes | None]:
    """`load_settings` for a caller that holds the lock, and the bytes of the usable file that
    was there (None: missing, or unusable and moved aside or kept read-only)."""
    try:
        settings, raw = _read_file(target)
    except _UnusableError as unusable:
        return _move_aside(target, unusable, clock()), None
    if settings is None:
        return LoadResult(Settings(), path=target), None
    return LoadResult(settings, path=target), raw


def _read_settings(path: Path) -> Settings | None:
    """Parse, migrate and validate one file; ``None`` when there is no file."""
    return _read_file(path)[0]


def _read_file(path: Path) -> tuple[Settings | None, bytes | None]:
    """`_read_settings`, and the bytes it read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        # Linux says IsADirectoryError, Windows says PermissionError: ask the path itself.
        if _is_dir(path):
            raise _UnusableError("is a folder, not a file") from exc
        raise _UnusableError(
            f"could not be read ({_os_reason(exc)})",
            "to restore your settings, fix its permissions and rename it to {name}",
        ) from exc
    data = _parse_json(raw)
    if not isinstance(data, dict):
        kind = _JSON_KINDS.get(type(data), type(data).__name__)
        raise _UnusableError(f"holds a JSON {kind}, not an object")
    _check_values(data)
    try:
        data = _migrate(data)
        return Settings.model_validate(data), raw
    except ValidationError as exc:
        raise _UnusableError(f"has invalid values ({_summarise(exc)})") from exc
    except RecursionError as exc:
        raise _UnusableError("is nested too deeply to be a settings file") from exc
    except (ValueError, TypeError, OverflowError) as exc:
        # a validator's own error (pydantic wraps most, not all): still this file's fault
        raise _UnusableError(f"has invalid values ({exc})") from exc


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        # Python refuses over 4,300 digits with a ValueError; settings never need more than 20
        raise _UnusableError(
            f"holds a number with {digits:,} digits (a setting has at most {_MAX_INT_DIGITS})"
        )
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _UnusableError(f"holds a number too large for a setting ({text[:40]})")
    return value


def _parse_constant(name: str) -> float:
    raise _UnusableError(f"holds {name}, which is not a number JSON allows")


def _parse_json(raw: bytes) -> object:
    """The JSON value of `raw`; every way it can fail is an `_UnusableError`."""
    try:
        # utf-8-sig: an editor may have added a byte-order mark; we write plain UTF-8.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _UnusableError(f"is not UTF-8 text (bad byte at offset {exc.start})") from exc
    try:
        return json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as exc:
        raise _UnusableError(
            f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    except RecursionError as exc:
        raise _UnusableError("is nested too deeply to be a settings file") from exc
    except (ValueError, OverflowError) as exc:  # a limit of the parser itself
        raise _UnusableError(f"is not usable JSON ({exc})") from exc


def _check_values(data: dict[str, Any]) -> None:
    """Refuse what JSON allows but a settings file cannot hold: a NUL character (no path,
    argument or name can carry one) and nesting deeper than `_MAX_DEPTH`. Walks with a stack,
    not recursion, so a deep file cannot exhaust Python's; the place is worked out only for a
    file that fails."""
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise _UnusableError(f"holds a NUL character (\\u0000) in {_locate(data)}")
        elif isinstance(value, dict | list):
            if depth >= _MAX_DEPTH:
                raise _UnusableError(
                    f"is nested more than {_MAX_DEPTH} levels deep (at {_locate(data)})"
                )
            if isinstance(value, dict):
                if any("\x00" in key for key in value):
                    raise _UnusableError(f"holds a NUL character (\\u0000) in {_locate(data)}")
                stack.extend((item, depth + 1) for item in value.values())
            else:
                stack.extend((item, depth + 1) for item in value)


def _locate(data: dict[str, Any]) -> str:
    """Where the first NUL character or too deep a value in `data` is, as "a.b[2].c"."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str) and "\x00" in value:
            break
        if isinstance(value, dict | list) and depth >= _MAX_DEPTH:
            break
        if isinstance(value, dict):
            if any("\x00" in key for key in value):
                where += " (a key)"
                break
            stack.extend((v, f"{where}.{k[:40]}", depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    else:
        return "the top level"
    return where.lstrip(".") or "the top level"


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
    if version < SCHEMA_VERSION:
        data = copy.deepcopy(data)  # the steps change it in place; keep the parsed original
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


def _move_aside(path: Path, unusable: _UnusableError, when: datetime) -> LoadResult:
    try:
        aside = move_aside(path, when=when)  # keeps the newest few copies, prunes the rest
    except OSError as exc:
        aside = aside_path(path, when)
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


# --- locking --------------------------------------------------------------------------------

_LOCKS: dict[str, FileLock] = {}  # one per lock file in this process: reentrant per thread
_LOCK_POLL_S = 0.005
_LOCKS_GUARD = threading.Lock()


def lock_path(path: Path | None = None) -> Path:
    """The advisory lock file of the settings file at `path`: ``settings.json.lock`` beside it
    (beside a symlink, not its target). It stays there between uses; that is normal."""
    target = path if path is not None else settings_path()
    return target.with_name(f"{target.name}.lock")


def _file_lock(lock_file: Path) -> FileLock:
    from filelock import FileLock  # noqa: PLC0415 - at the first save: not on the start path

    key = os.path.abspath(lock_file)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = FileLock(key)
        return lock


def _acquire(target: Path, timeout_s: float) -> FileLock:
    from filelock import Timeout  # noqa: PLC0415

    lock_file = lock_path(target)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        lock = _file_lock(lock_file)
        # filelock polls a non-blocking lock; its default 50 ms leaves the lock idle most of
        # the time when several processes queue for it, each holding it for a few ms
        lock.acquire(timeout=timeout_s, poll_interval=_LOCK_POLL_S)
    except Timeout:
        raise SettingsError(
            f"Settings were not saved to {target}: another qmgui (a window, a command or a"
            f" script) held its lock {lock_file} for more than {timeout_s:g} s; nothing was"
            " changed, try again when it is done."
        ) from None
    except OSError as exc:
        raise SettingsError(
            f"Could not save settings to {target}: {_os_reason(exc)}; check that"
            f" {lock_file.parent} is a folder you can write to."
        ) from exc
    return lock


@contextlib.contextmanager
def settings_lock(path: Path | None = None, *, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[Path]:
    """Hold the advisory lock of the settings file at `path` (default ``settings_path()``)
    and yield that path. Other processes and other threads wait for it; the thread holding it
    may take it again. Raises ``SettingsError`` (a sentence naming the file) when it is not
    had within `timeout_s` seconds or its lock file cannot be created."""
    target = path if path is not None else settings_path()
    lock = _acquire(target, timeout_s)
    try:
        yield target
    finally:
        lock.release()


# --- read-modify-write ------------------------------------------------------------------------


def update_settings(
    change: Callable[[Settings], Settings],
    path: Path | None = None,
    *,
    timeout_s: float = LOCK_TIMEOUT_S,
    clock: Callable[[], datetime] = _utc_now,
) -> LoadResult:
    """Change the settings file without losing another process's change: take the lock,
    read the file as it is now (an unusable file is moved aside as ``load_settings`` does,
    and `change` gets defaults), call ``change(current)``, write its result atomically when it
    differs, let go. `change` may edit `current` in place and return it, or return a new
    value; an exception it raises propagates and nothing is written.

    Returns the settings now in the file (validated, as a later load reads them), with the
    messages of the read (a file moved aside). Raises ``SettingsError`` when the lock is not
    had in `timeout_s`, an unusable file could not be moved aside, the result is invalid or
    the write fails."""
    target = path if path is not None else settings_path()
    return _update(target, lambda current, _found: change(current.settings), timeout_s, clock)


def save_changes(
    base: Settings,
    ours: Settings,
    path: Path | None = None,
    *,
    timeout_s: float = LOCK_TIMEOUT_S,
    clock: Callable[[], datetime] = _utc_now,
) -> LoadResult:
    """Save what a holder of its own copy changed, `base` → `ours`, merged into the file as it
    is now (``merge_settings``), under the lock: what another process changed meanwhile is
    kept. With no usable file on disk (none yet, or one just moved aside) there is nothing to
    merge with, and `ours` is written whole. Returns and raises as ``update_settings``."""
    target = path if path is not None else settings_path()

    def change(current: LoadResult, found: bool) -> Settings:
        return merge_settings(base, ours, current.settings) if found else ours

    return _update(target, change, timeout_s, clock)


def _update(
    target: Path,
    change: Callable[[LoadResult, bool], Settings],
    timeout_s: float,
    clock: Callable[[], datetime],
) -> LoadResult:
    with settings_lock(target, timeout_s=timeout_s):
        current, raw = _load_locked(target, clock)
        if current.read_only:
            raise SettingsError(f"Settings were not saved: {current.messages[0]}")
        checked, payload = _checked(change(current, raw is not None), target)
        if payload != raw:  # the same bytes: nothing changed (and no watcher is woken)
            _write_atomic(target, Path(os.path.realpath(target)), payload)
    return replace(current, settings=checked)


_MISSING: Any = object()


def merge_settings(base: Settings, ours: Settings, theirs: Settings) -> Settings:
    """Three-way merge: the changes from `base` to `ours` applied to `theirs` (the file as
    another process left it). Per value: one side changed it, that side wins; both did, ours
    wins. Lists that are sets (roots, favourites, pins, a ★'s classes) merge by what each
    side added and removed; lists of entries with unique ids or names (backends, run sets)
    merge per entry; other lists (an override's extra arguments) are one side's whole.
    When the merged whole is inconsistent (both sides gave one class its ★), each top-level
    field we changed is taken from `ours` as a whole. Raises ``SettingsError`` if even that
    is invalid."""
    b, o, t = (s.model_dump(mode="json") for s in (base, ours, theirs))
    try:
        return Settings.model_validate(_merge3(b, o, t))
    except ValidationError:
        pass
    fallback = {k: v for k, v in t.items() if not (k in b and k not in o)}
    fallback.update({k: v for k, v in o.items() if b.get(k, _MISSING) != v})
    try:
        return Settings.model_validate(fallback)
    except ValidationError as exc:
        raise SettingsError(
            "Settings were not saved: the change made here conflicts with one another qmgui"
            f" made to the file meanwhile ({_summarise(exc)})."
        ) from exc


# Lists that are sets (order aside, each item means itself): merged by what each side added
# and removed. Any other list (extra_args, splitter sizes) is a sequence: one side's whole.
_SET_LISTS = frozenset(
    {"model_roots", "favourites", "pinned", "model_ids", "default_for", "classes"}
)


def _merge3(base: Any, ours: Any, theirs: Any, key: str = "") -> Any:
    if ours == base:
        return theirs
    if theirs in (base, ours):
        return ours
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return _merge_dicts(base if isinstance(base, dict) else {}, ours, theirs)
    if isinstance(ours, list) and isinstance(theirs, list):
        old = base if isinstance(base, list) else []
        keyed = _merge_keyed(old, ours, theirs)
        if keyed is not None:
            return keyed
        if key in _SET_LISTS and all(_unique_strings(x) for x in (old, ours, theirs)):
            removed = set(old) - set(ours)
            kept = [x for x in theirs if x not in removed]
            return kept + [x for x in ours if x not in old and x not in kept]
    return ours


def _merge_dicts(
    base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in theirs.items():
        if key in ours:
            out[key] = _merge3(base.get(key, _MISSING), ours[key], value, key)
        elif not (key in base and value == base[key]):
            out[key] = value  # they added it, or changed what we removed
        # else: we removed it and they left it alone
    for key, value in ours.items():
        if key not in theirs and not (key in base and value == base[key]):
            out[key] = value  # we added it, or changed what they removed
    return out


def _unique_strings(items: list[Any]) -> bool:
    return all(isinstance(x, str) for x in items) and len(set(items)) == len(items)


def _keyed(items: list[Any], field: str) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(field), str):
            return None
        if item[field] in out:
            return None
        out[item[field]] = item
    return out


def _merge_keyed(base: list[Any], ours: list[Any], theirs: list[Any]) -> list[Any] | None:
    """Lists of entries keyed by "id" (backends) or "name" (run sets), merged per entry in
    their order, then ours' new ones; None when the lists are not such lists."""
    for field in ("id", "name"):
        b, o, t = (_keyed(x, field) for x in (base, ours, theirs))
        if b is not None and o is not None and t is not None:
            merged = _merge_dicts(b, o, t)
            order = [k for k in t if k in merged] + [k for k in o if k in merged and k not in t]
            return [merged[k] for k in order]
    return None


# --- save -----------------------------------------------------------------------------------


def save_settings(settings: Settings | LoadResult, path: Path | None = None) -> Path:
    """Write settings atomically and return the path written; raise ``SettingsError`` if not.

    This replaces the whole file with `settings`: for a read-modify-write use
    ``update_settings`` or ``save_changes``, which keep another process's changes. It holds
    the lock while it writes. Given a ``LoadResult``, save its settings to the file it was
    loaded from, unless it is ``read_only``. In every case an existing file that does not load
    cleanly is never replaced: it may be the only copy of the user's settings, or a newer
    qmgui's.
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
    payload = _checked(model, target)[1]
    with settings_lock(target):
        # Write through a symlink (dotfile managers) instead of replacing the link itself.
        real = Path(os.path.realpath(target))
        _refuse_to_destroy(target, real)
        _write_atomic(target, real, payload)
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


def _checked(model: Settings, target: Path) -> tuple[Settings, bytes]:
    """`model` validated again (lists and dicts may have been changed in place since the last
    check; the validators normalise, so this is what a later load reads) and the bytes to
    store; ``SettingsError`` when it cannot be stored."""
    try:
        checked = Settings.model_validate(model.model_dump())
        data = checked.model_dump(mode="json")
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except ValidationError as exc:
        raise SettingsError(
            f"Settings were not saved to {target} because they are invalid ({_summarise(exc)})."
        ) from exc
    except (TypeError, ValueError, RecursionError) as exc:
        raise SettingsError(
            f"Settings were not saved to {target}: a value cannot be stored as JSON ({exc})."
        ) from exc
    return checked, (text + "\n").encode("utf-8")


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
