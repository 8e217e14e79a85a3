"""Stable ports: a model's port is part of its saved settings.

It is chosen once, the first time the model is started (the window's Start, `qmgui serve`):
the first port of `settings.ports` (8080-8179 by default) that no other model holds in
settings and nothing listens on now. From then on every start, restart, preview and export
uses it. When it is taken at start the engine fails, saying by what (`port_holder`, best
effort) and offering the next free one (`next_free_port`); qmgui never picks another silently.
"""

from __future__ import annotations

from pathlib import Path

from qmgui import notify
from qmgui.core.errors import SettingsError
from qmgui.engines.ports import HOST, port_is_free
from qmgui.settings import ModelOverride, Settings, update_settings


def stored_port(settings: Settings, model_id: str) -> int | None:
    ov = settings.model_overrides.get(model_id)
    return ov.port if ov is not None else None


def _held_by_others(settings: Settings, model_id: str) -> set[int]:
    return {
        o.port for k, o in settings.model_overrides.items() if k != model_id and o.port is not None
    }


def choose_port(settings: Settings, model_id: str, host: str = HOST) -> int:
    """The model's stored port, else the one it would be given now: the first of the range
    that no other model holds and nothing listens on (the range's first when none is free)."""
    port = stored_port(settings, model_id)
    if port is not None:
        return port
    held = _held_by_others(settings, model_id)
    first, last = settings.ports.first, settings.ports.last
    for candidate in range(first, last + 1):
        if candidate not in held and port_is_free(candidate, host):
            return candidate
    return first


def with_port(settings: Settings, model_id: str, port: int) -> Settings:
    """`settings` with `port` saved as the model's (a copy; its other overrides kept)."""
    overrides = dict(settings.model_overrides)
    old = overrides.get(model_id)
    overrides[model_id] = old.model_copy(update={"port": port}) if old else ModelOverride(port=port)
    return settings.model_copy(update={"model_overrides": overrides})


def ensure_port(model_id: str, host: str = HOST, path: Path | None = None) -> int:
    """The model's port, chosen and saved (through `update_settings`) if it has none yet."""
    chosen: list[int] = []

    def change(current: Settings) -> Settings:
        port = choose_port(current, model_id, host)
        chosen.append(port)
        if stored_port(current, model_id) is None:
            return with_port(current, model_id, port)
        return current

    update_settings(change, path)
    return chosen[-1]


def port_for_start(
    model_id: str, settings: Settings, host: str = HOST, path: Path | None = None
) -> int:
    """`ensure_port`; when the settings cannot be written, the port `settings` give (said)."""
    try:
        return ensure_port(model_id, host, path)
    except SettingsError as e:
        port = choose_port(settings, model_id, host)
        notify.warning(f"port {port} is used but could not be saved: {e}", source="settings")
        return port
