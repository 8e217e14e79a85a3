"""Loading and saving a model's profile (`Settings.model_overrides[model id]`).

The values and the rules are pure (`qmgui.core.profile`); this module turns a stored
`ModelOverride` into a profile and back, and saves through `update_settings` (the settings
lock, a read-modify-write of the file as it is now), for the window and the command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qmgui.core.profile import PROFILE_FIELDS, clean
from qmgui.settings import LoadResult, ModelOverride, Settings, update_settings

KEEP_ON_RESET = ("port",)  # a model's port stays its own (chat clients point at it)


def profile_of(ov: ModelOverride | None) -> dict[str, Any]:
    """The saved values of a stored override (unset fields left out)."""
    if ov is None:
        return {}
    return clean({k: getattr(ov, k) for k in PROFILE_FIELDS})


def with_profile(
    settings: Settings,
    model_id: str,
    values: Mapping[str, Any],
    *,
    replace: Iterable[str] = (),
) -> Settings:
    """`settings` with `values` stored in the model's profile: the fields in `values` are set,
    those in `replace` that `values` lacks are cleared, the rest kept. An override left with
    nothing is removed. ValueError (pydantic's) for a value the schema refuses."""
    overrides = dict(settings.model_overrides)
    old = overrides.get(model_id)
    data = old.model_dump() if old is not None else {}
    for key in replace:
        if key in PROFILE_FIELDS:
            data[key] = [] if key == "extra_args" else None
    data.update(values)
    ov = ModelOverride.model_validate(data)
    if profile_of(ov) or (ov.model_extra or {}):
        overrides[model_id] = ov
    else:
        overrides.pop(model_id, None)
    return settings.model_copy(update={"model_overrides": overrides})


def save_profile(
    model_id: str,
    values: Mapping[str, Any],
    *,
    replace: Iterable[str] = (),
    path: Path | None = None,
) -> LoadResult:
    """Store `values` in the model's profile on disk (under the settings lock)."""
    fields = tuple(replace)
    return update_settings(lambda s: with_profile(s, model_id, values, replace=fields), path)


def reset_profile(
    model_id: str, *, path: Path | None = None, keep: Iterable[str] = KEEP_ON_RESET
) -> tuple[LoadResult, dict[str, Any]]:
    """Clear the model's profile on disk but for `keep` (its port); returns the settings now
    and what was cleared."""
    kept = frozenset(keep)
    cleared: dict[str, Any] = {}

    def change(s: Settings) -> Settings:
        old = profile_of(s.model_overrides.get(model_id))
        cleared.clear()
        cleared.update({k: v for k, v in old.items() if k not in kept})
        return with_profile(s, model_id, {}, replace=cleared.keys())

    return update_settings(change, path), cleared
