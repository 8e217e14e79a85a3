"""This machine's devices for planning: the registered llama-server build's `--list-devices`,
merged with the host's live readings (`core.devices`).

Which build: the one `--backend` names, else the registry's ★ llama-server for chat models,
else its first llama-server entry. Without one, or when the build cannot be asked (it is
missing, hangs, crashes, or predates `--list-devices`), the host's readings stand in: NVIDIA
through NVML, then AMD through sysfs, numbered GPU0, GPU1… as before. A build that answered
is believed, a listing of no devices included (a CPU build on a desktop with a GPU runs on
the CPU whatever the drivers say), except that it is asked again, twice, a second apart, when
the host has a discrete GPU it did not list: a driver still starting up answers empty.

The engine's answer is kept between commands in qmgui's cache folder (`service.device_cache`:
a listing for `LISTED_TTL_S`, a build that could not be asked for `FAILURE_TTL_S`, a listing
that leaves out a discrete GPU the host has, after the retries, for `UNSEEN_TTL_S`), keyed by
the binary, the visibility variables and the host's GPU set, so a GPU added between runs is a
new key and is seen. Free memory is always the host's reading now. `fresh=True` asks the
engine whatever is kept (and keeps the new answer); `remember` keeps what a probe of a build
just learned (`qmgui backends add`, the window's backend editor, `qmgui doctor`). Within one
run the command line reads the machine once (`cli.plan.local_machine` keeps it on the run's
arguments). Which build: `registered_engine` reads the registry, with json alone once the full
settings loader has read that very file cleanly, so a kept answer plans in about the time of
`qmgui plan --gpu`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qmgui.core.devices import HostGpu, Machine, merge, unseen_warning
from qmgui.hw.gpus import host_gpus
from qmgui.hw.nvml import NvmlReading

if TYPE_CHECKING:
    from qmgui.core import backends as registry
    from qmgui.core.probe import EngineDevice, ProbeResult
    from qmgui.engines.probe import Runner
    from qmgui.service.device_cache import DeviceCache

__all__ = [
    "RETRIES",
    "RETRY_DELAY_S",
    "device_engine",
    "read_machine",
    "registered_engine",
    "remember",
    "stored_listing",
]

TIMEOUT_S = 10.0  # a CUDA build's --list-devices initialises every GPU: seconds
RETRIES = 2  # more asks when the host has a GPU the engine did not list (a driver starting)
RETRY_DELAY_S = 1.0


@dataclass(frozen=True)
class DeviceEngine:
    """The build whose listing is the device source: its executable, and its stored listing
    from when it was registered (None: it has none)."""

    executable: str
    variant: str | None = None
    stored: tuple[EngineDevice, ...] | None = None


def stored_listing(capabilities: Mapping[str, object]) -> tuple[EngineDevice, ...] | None:
    """The devices a registered build listed when it was probed (`capabilities`), or None
    when it did not list any (never probed, or no `--list-devices`). Values a hand-edited
    settings file got wrong are skipped."""
    if capabilities.get("devices_listed") is not True:
        return None
    from qmgui.core.probe import parse_devices  # noqa: PLC0415 - a probed build only

    raw = capabilities.get("devices")
    out: list[EngineDevice] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        name, desc = item.get("name"), item.get("description")
        total, free = item.get("total_mib"), item.get("free_mib")
        numbers = isinstance(total, int) and isinstance(free, int) and total >= 0 and free >= 0
        if isinstance(name, str) and isinstance(desc, str) and numbers:
            line = f"  {name}: {desc} ({total} MiB, {free} MiB free)"
            out += list(parse_devices(f"Available devices:\n{line}\n") or ())
    return tuple(out)


def device_engine(
    backends: Sequence[registry.Backend], backend_arg: str | None = None
) -> DeviceEngine | None:
    """The llama-server build whose `--list-devices` says which devices exist: `backend_arg`
    (an id or a path), else the ★ llama-server for chat models, else the first one."""
    from qmgui.core import backends as registry  # noqa: PLC0415 - plans with --gpu need none

    if backend_arg:
        named = registry.find_backend(backends, backend_arg)
        if named is None:
            return DeviceEngine(os.path.expanduser(backend_arg))
        if named.kind != "llama":
            return None
        return DeviceEngine(named.executable, named.variant, stored_listing(named.capabilities))
    llamas = [b for b in backends if b.kind == "llama"]
    chosen = registry.default_for_class(llamas, "llm") or (llamas[0] if llamas else None)
    if chosen is None:
        return None
    return DeviceEngine(chosen.executable, chosen.variant, stored_listing(chosen.capabilities))


MAX_SETTINGS_BYTES = 16 << 20  # as the command line's quick look at the settings file
LIGHT_SCHEMA = 1  # qmgui.settings.SCHEMA_VERSION (a test checks): other files load fully


class _NotLight(Exception):
    """The settings file is not one to read with json alone: the full loader reads it."""


def registered_engine(backend_arg: str | None = None) -> DeviceEngine | None:
    """`device_engine` over the registry in the settings file (`backend_arg`: `--backend`).

    The full loader (`qmgui.settings`: pydantic, migrations, checks) costs the command line
    about 0.3 s to import. A settings file it has read before without a word to say is read
    with json alone: its sha256 (with this build's settings module's size and mtime, so an
    upgrade reads it fully again) is kept in the device cache (`DeviceCache.mark_clean`). A
    file never seen, changed, or holding anything unexpected goes through the full loader,
    which says what is wrong with it as before. The registry read with json names only
    executables the settings file itself names."""
    data = _settings_bytes()
    if data == b"":  # no settings file: no registry (a first start), nothing to load
        return device_engine([], backend_arg) if backend_arg else None
    from qmgui.service import device_cache  # noqa: PLC0415 - only when a build is asked

    store = device_cache.DeviceCache()
    digest = None if data is None else _settings_digest(data)
    if data is not None and digest is not None and store.is_clean(digest):
        try:  # the very bytes the digest was taken of
            return device_engine(_light_registry(data), backend_arg)
        except _NotLight:
            pass
    from qmgui.service.launch import load_quietly  # noqa: PLC0415 - the full loader

    loaded = load_quietly()
    backends = [e.to_core() for e in loaded.settings.backends]
    again = _settings_bytes()
    if digest is not None and not loaded.messages and again is not None and again == data:
        store.mark_clean(digest)  # unchanged while it was loaded: these bytes load cleanly
    return device_engine(backends, backend_arg)


def _settings_bytes() -> bytes | None:
    """The settings file's bytes; b"" when there is none; None when it cannot be read."""
    from qmgui.config_paths import settings_path  # noqa: PLC0415
    from qmgui.core.errors import QmguiError  # noqa: PLC0415
    from qmgui.core.safeio import read_regular  # noqa: PLC0415

    path = settings_path()
    if not path.exists():
        return b""
    try:
        data = read_regular(path, MAX_SETTINGS_BYTES)
    except (QmguiError, OSError):
        return None
    return None if len(data) > MAX_SETTINGS_BYTES else data


def _settings_digest(data: bytes) -> str:
    """The sha256 of the settings file's bytes and this build's settings module."""
    import hashlib  # noqa: PLC0415

    import qmgui  # noqa: PLC0415

    h = hashlib.sha256(f"qmgui {qmgui.__version__}\n".encode())
    module = os.path.join(os.path.dirname(qmgui.__file__), "settings.py")
    try:
        st = os.stat(module)
        h.update(f"{st.st_size} {st.st_mtime_ns}\n".encode())
    except OSError:
        h.update(b"no settings module\n")
    h.update(data)
    return h.hexdigest()


def _light_registry(data: bytes) -> list[registry.Backend]:
    """The registry's entries read with json alone (fields `device_engine` reads); raises
    `_NotLight` for anything the full loader would have to say something about."""
    from qmgui.core.errors import QmguiError  # noqa: PLC0415
    from qmgui.core.safeio import loads_json  # noqa: PLC0415

    if not data:
        return []
    try:
        doc = loads_json(data, "settings")
    except (QmguiError, ValueError, RecursionError) as e:
        raise _NotLight from e
    if not isinstance(doc, dict) or doc.get("schema_version") != LIGHT_SCHEMA:
        raise _NotLight
    raw = doc.get("backends", [])
    if not isinstance(raw, list):
        raise _NotLight
    return [_light_backend(item) for item in raw]


def _light_backend(raw: object) -> registry.Backend:
    from qmgui.core import backends as registry  # noqa: PLC0415

    if not isinstance(raw, dict):
        raise _NotLight
    bid, kind, exe = raw.get("id"), raw.get("kind"), raw.get("executable")
    stars, classes = raw.get("default_for", []), raw.get("classes", [])
    variant, caps = raw.get("variant"), raw.get("capabilities", {})
    if not (isinstance(bid, str) and isinstance(kind, str) and isinstance(exe, str)):
        raise _NotLight
    lists = (stars, classes)
    if not all(isinstance(v, list) and all(isinstance(c, str) for c in v) for v in lists):
        raise _NotLight
    if not (variant is None or isinstance(variant, str)) or not isinstance(caps, dict):
        raise _NotLight
    try:
        return registry.Backend(
            id=bid, kind=kind, executable=exe, default_for=frozenset(stars), variant=variant,
            capabilities=caps, classes=frozenset(classes),
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise _NotLight from e


def _ask(
    executable: str, runner: Runner | None, timeout_s: float
) -> tuple[tuple[EngineDevice, ...] | None, str | None]:
    from qmgui.core.probe import ARG_LIST_DEVICES  # noqa: PLC0415 - a registered build only
    from qmgui.engines.probe import probe  # noqa: PLC0415 - only when a build is registered

    result = probe(
        executable, kind="llama", commands=[(ARG_LIST_DEVICES,)], timeout_s=timeout_s,
        runner=runner,
    )  # fmt: skip
    if result.devices_listed:
        return result.devices, None
    # a build that predates --list-devices is not worth a warning; one that cannot run is
    return None, str(result.failure) if result.failure else None


def read_machine(
    engine: DeviceEngine | None,
    *,
    probe_engine: bool = True,
    fresh: bool = False,
    cache: DeviceCache | None = None,
    runner: Runner | None = None,
    nvml: Any = None,
    drm_root: str | None = None,
    reading: NvmlReading | None = None,
    env: Mapping[str, str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    timeout_s: float = TIMEOUT_S,
) -> Machine:
    """This machine's devices (see the module docstring). `probe_engine` False: the build's
    listing from when it was registered, not a new one (commands for another machine).
    `fresh`: ask the engine even when an answer is kept. `cache` (default: the one in
    qmgui's cache folder), `runner`, `nvml`, `drm_root`, `reading`, `env` and `sleep` are the
    seams tests use."""
    host = host_gpus(nvml=nvml, drm_root=drm_root, reading=reading)
    if engine is None:
        return Machine("host", host=host)
    exe = engine.executable
    environ = os.environ if env is None else env
    kept_for: str | None = None  # a failure read from the cache: how old, for the note
    if probe_engine:
        from qmgui.service import device_cache  # noqa: PLC0415 - only when a build is asked

        store = cache if cache is not None else device_cache.DeviceCache()
        key = device_cache.entry_key(exe, host, environ)
        kept = None if key is None or fresh else store.get(key, host)
        if kept is not None:
            listed, why = kept.listed, kept.why
            age = max(store.clock() - kept.at, 0.0)
            kept_for = (
                f"the answer of {age:.0f} s ago, kept {device_cache.FAILURE_TTL_S:g} s: "
                "qmgui doctor asks again now"
            )
        else:
            listed, why = _ask(exe, runner, timeout_s)
            for _ in range(RETRIES):
                if listed is None or listed or not _has_card(host):
                    break
                sleep(RETRY_DELAY_S)  # a driver still starting up answers with no devices
                listed, why = _ask(exe, runner, timeout_s)
            if key is not None:
                store.put(key, exe, listed, why, host)
    else:  # commands for another machine, maybe: what the build listed when registered
        listed, why = engine.stored, None
    if listed is None:
        from qmgui.core.probe import ARG_LIST_DEVICES  # noqa: PLC0415 - a registered build only

        said_why = why if kept_for is None else f"{why}; {kept_for}"
        notes: tuple[str, ...] = () if why is None else (
            f"could not read {exe} {ARG_LIST_DEVICES} ({said_why}); planning for the GPUs the "
            "drivers report",
        )  # fmt: skip
        return Machine("host", host=host, engine=exe, notes=notes)
    machine = Machine("engine", merge(listed, host), host, exe)
    said = [
        f"{d.name} ({d.listed.description}) is left out: {d.refused}"
        for d in machine.devices
        if d.refused is not None
    ]
    if machine.refused_all:
        said.append(
            "every GPU the engine offered was refused: its models run on the CPU (--device none)"
        )
    warning = unseen_warning(machine, environ, vulkan=engine.variant == "vulkan")
    if warning:
        said.append(warning)
    return Machine(machine.source, machine.devices, host, exe, tuple(said))


def _has_card(host: Sequence[HostGpu]) -> bool:
    return any(not g.integrated for g in host)


def remember(
    executable: str,
    result: ProbeResult,
    *,
    host: Sequence[HostGpu] | None = None,
    env: Mapping[str, str] | None = None,
    cache: DeviceCache | None = None,
) -> None:
    """Keep what a probe of `executable` just learned (`qmgui backends add`, the window's
    backend editor, `qmgui doctor`) as this host's answer, so the next command does not ask
    again and does not use an older one: a listing, or the probe's failure. Anything else
    drops the entry, so the next read asks: no listing (the probe's `--list-devices` run
    may have failed alone), or a listing that leaves out a discrete GPU the host has (asked
    again there, with the retries). `result` is a probe of a llama-server build. `host`
    (default: read now), `env` and `cache` are seams. Never raises."""
    from qmgui.service import device_cache  # noqa: PLC0415 - only after a probe

    host = host_gpus() if host is None else host
    key = device_cache.entry_key(executable, host, os.environ if env is None else env)
    if key is None:
        return
    store = cache if cache is not None else device_cache.DeviceCache()
    listed = result.devices if result.devices_listed else None
    why = None if result.failure is None or listed is not None else str(result.failure)
    answer = device_cache.Answer(listed, why, store.clock())
    if why is not None or (
        listed is not None and device_cache.ttl_of(answer, host) >= device_cache.LISTED_TTL_S
    ):
        store.put(key, executable, listed, why, host)
    else:  # no listing (a run of it may have failed), or one read_machine would ask again
        store.drop(key)
