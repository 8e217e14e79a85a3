"""Serving beyond this computer: an engine that listens on anything but loopback gets an API key.

`--host 0.0.0.0` or a LAN address makes an engine reachable from the network; it is never the
default. When the command line does not give a key itself (`--api-key`, `--api-key-file`),
qmgui passes `--api-key-file` naming `api-key` in the settings folder: generated the first time
(32 random bytes, URL-safe), written with mode 0600, and shown once (the caller prints it
when `Exposure.new_key` is set). The warning names the address.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from qmgui.config_paths import config_dir
from qmgui.core.errors import SettingsError
from qmgui.core.textsafe import printable
from qmgui.engines.ports import reachable_from_network
from qmgui.engines.supervisor import EngineSpec, flag_value

KEY_FILE = "api-key"
KEY_MODE = 0o600
_KEY_FLAGS = ("--api-key", "--api-key-file")


@dataclass(frozen=True)
class Exposure:
    """What listening on `host` adds to the command: arguments, a warning, a new key."""

    host: str
    extra: tuple[str, ...] = ()  # `--api-key-file PATH` when the command has no key
    warning: str | None = None
    new_key: str | None = None  # generated now: shown once


def key_path() -> Path:
    return config_dir() / KEY_FILE


def _read_or_create(path: Path) -> tuple[str, bool]:
    """The stored key, or a new one written 0600 (True when new)."""
    with contextlib.suppress(FileNotFoundError):
        key = path.read_text(encoding="utf-8").strip()
        if key:
            return key, False
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    with contextlib.suppress(OSError):
        os.chmod(path, KEY_MODE)  # an existing empty file keeps no wider mode
    return key, True


def exposure(host: str, argv: Sequence[str] = ()) -> Exposure:
    """The key and warning for listening on `host` (SettingsError when the key file cannot be
    written). Loopback: nothing."""
    if not reachable_from_network(host):
        return Exposure(host)
    has_key = any(a.split("=", 1)[0] in _KEY_FLAGS for a in argv)
    extra: tuple[str, ...] = ()
    new_key = None
    if not has_key:
        path = key_path()
        try:
            key, created = _read_or_create(path)
        except OSError as e:
            raise SettingsError(
                f"listening on {printable(host)} needs an API key, and {path} could not be "
                f"written ({e.strerror or e})"
            ) from e
        extra = ("--api-key-file", str(path))
        new_key = key if created else None
    warning = (
        f"listening on {printable(host)}: reachable from the network, not only from this "
        f"computer; clients need the API key (Authorization: Bearer KEY"
        + ("" if has_key else f", kept in {key_path()}")
        + ")"
    )
    return Exposure(host, extra, warning, new_key)


def expose_spec(spec: EngineSpec, host: str | None = None) -> tuple[EngineSpec, Exposure | None]:
    """`spec` made safe for the host it listens on (`host`, else a `--host` in its arguments,
    the last one as the engine reads it): beyond loopback, with the API key's arguments and
    the host set. None when it listens on loopback only. SettingsError as `exposure`."""
    if host is None:
        host = flag_value(spec.argv, "--host")
    if host is None:
        return spec, None
    exposed = exposure(host, spec.argv)
    if exposed.warning is None:
        return replace(spec, host=host), None
    return replace(spec, argv=(*spec.argv, *exposed.extra), host=host), exposed


def api_key_of(argv: Sequence[str]) -> str | None:
    """The API key an engine was started with (`--api-key KEY`, `--api-key-file PATH`: its
    first line), for qmgui's own requests to it (/metrics); None when it has none or the file
    cannot be read."""
    key = flag_value(tuple(argv), "--api-key")
    if key:
        return key
    path = flag_value(tuple(argv), "--api-key-file")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.read(4096).strip().splitlines()
    except OSError:
        return None
    return first[0].strip() if first else None
