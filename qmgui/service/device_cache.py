"""The engine's `--list-devices` answers, kept on disk between qmgui commands.

`qmgui plan`, `place`, `preview` and `get` read this machine's devices from the registered
llama-server (`service.devices.read_machine`), and the command line is one process per
command: without a cache each command starts the engine once (a CPU build: a few tenths of a
second; a CUDA build initialising every GPU: seconds). The answer is kept in
``devices.json`` in qmgui's cache folder (``$QMGUI_CACHE_DIR``, else the platform's), under a
key made of everything that changes what the engine lists:

- the binary: its real path, size and mtime_ns, and the same for the ggml/llama libraries
  beside it (and in ``../lib``): a build that loads its backends at run time lists a
  ``libggml-cuda.so`` dropped next to it;
- the variables that hide devices or change their order or the libraries loaded
  (`ENV_VARS`), as this process has them;
- the host's GPU set as NVML and amdgpu sysfs see it: vendor, name, total memory, index
  (a card added or removed is a new key, so its first command asks the engine again).

How long an answer is kept (`ttl_of`, decided when it is read, so a crafted file cannot
extend it):

- a listing: `LISTED_TTL_S`. Everything that changes it is in the key; what is left (a
  driver upgraded in place, a MIG layout changed) is what the time bounds;
- a listing that leaves out a discrete GPU the host has: `UNSEEN_TTL_S`, short. It was
  asked `RETRIES` more times already (a driver still starting up answers empty), and a CPU
  build on a GPU desktop would pay those retries on every command if it were not kept;
- a build that could not be asked (it hung, crashed): `FAILURE_TTL_S`, so a wedged driver
  costs one `TIMEOUT_S` a minute rather than one a command;
- a listing with a device no host reading matched that a model could be placed on (an Intel
  card, Apple's Metal, an integrated GPU on Vulkan): not kept at all, since its free memory
  could only come from the engine, and free memory never comes from the cache.

Free memory is the host's live reading: a kept listing's devices get NVML's or sysfs's free
figure when read back (`with_live_free`). Refused devices (llvmpipe…), on which nothing is
placed, show the figure the engine gave when it was asked.

The file also lists the sha256 digests of the last `MAX_CLEAN` settings files the full
settings loader read without a word to say (`mark_clean`, `is_clean`): such a file is read
with json alone to find the registered build (`service.devices.registered_engine`).

The file may be hostile: it is read up to `MAX_FILE_BYTES`, every field is checked (a device
must read back through `core.probe.parse_devices` unchanged, a reason must be printable and
short, a time finite and not in the future), and anything wrong is a miss; the next answer
rewrites the file without it. Writes take ``devices.json.lock`` (`filelock`, waiting at most
`LOCK_TIMEOUT_S`), re-read the file, change one entry and replace the file atomically (a temp
file in the same folder, fsync, `os.replace`); a lock or a folder that cannot be had only
means this answer is not kept. Reads take no lock: a replaced file is whole, old or new.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from qmgui.atomic import replace_file
from qmgui.core.devices import VISIBILITY_VARS, VULKAN_VISIBILITY, HostGpu, merge
from qmgui.core.errors import QmguiError
from qmgui.core.probe import MAX_DEVICES, EngineDevice, parse_devices
from qmgui.core.safeio import loads_json, read_regular
from qmgui.core.textsafe import printable

__all__ = [
    "ENV_VARS",
    "FAILURE_TTL_S",
    "LISTED_TTL_S",
    "UNSEEN_TTL_S",
    "Answer",
    "DeviceCache",
    "cache_path",
    "entry_key",
    "ttl_of",
    "with_live_free",
]

FORMAT = 1  # bump when the stored form or its meaning changes: old entries are then misses
FILENAME = "devices.json"

LISTED_TTL_S = 300.0
UNSEEN_TTL_S = 30.0
FAILURE_TTL_S = 60.0

MAX_ENTRIES = 32  # builds x environments x GPU sets: more than one desktop has
MAX_CLEAN = 8  # digests of settings files that load cleanly (`registered_engine`)
MAX_FILE_BYTES = 256 * 1024
MAX_WHY = 500
MAX_PATH = 4096
MAX_LIBRARIES = 256
CLOCK_SLACK_S = 5.0  # an entry from further in the future than this is not believed
LOCK_TIMEOUT_S = 1.0
_MIB = 1 << 20
_KEY_LEN = 64  # sha256, hex

# what changes which devices a build lists, or how it numbers them: the vendors' visibility
# variables (`core.devices`), ordering, Level Zero's mask, the library search path
ENV_VARS: tuple[str, ...] = tuple(
    sorted(
        {
            *(v for names in VISIBILITY_VARS.values() for v in names),
            VULKAN_VISIBILITY,
            "CUDA_DEVICE_ORDER",
            "GPU_DEVICE_ORDINAL",
            "ZE_AFFINITY_MASK",
            "LD_LIBRARY_PATH",
        }
    )
)


@dataclass(frozen=True)
class Answer:
    """What the engine said when asked at `at` (wall-clock seconds): `listed` (None: no
    listing) and `why` it could not be asked (None: it answered, or predates the flag)."""

    listed: tuple[EngineDevice, ...] | None
    why: str | None
    at: float


@dataclass(frozen=True)
class _Entry:
    executable: str  # the real path (what the key was made from, for a reader of the file)
    answer: Answer


def cache_path() -> Path:
    """``devices.json`` in qmgui's cache folder (as `qmgui.cache.cache_dir`, which this does
    not import: it brings SQLite)."""
    env = os.environ.get("QMGUI_CACHE_DIR")
    if env:
        return Path(env) / FILENAME
    import platformdirs  # noqa: PLC0415 - only without $QMGUI_CACHE_DIR

    return Path(platformdirs.user_cache_dir("qmgui", appauthor=False)) / FILENAME


def _libraries(folder: str) -> list[list[object]]:
    """Name, size and mtime_ns of the ggml/llama libraries in `folder` (sorted, bounded)."""
    out: list[list[object]] = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for e in entries:
            name = e.name.lower()
            if "ggml" not in name and "llama" not in name:
                continue
            if not (name.endswith((".so", ".dylib", ".dll")) or ".so." in name):
                continue
            with contextlib.suppress(OSError):
                st = e.stat()
                out.append([e.name, st.st_size, st.st_mtime_ns])
            if len(out) >= MAX_LIBRARIES:
                break
    return sorted(out, key=lambda row: str(row[0]))


def entry_key(executable: str, host: Sequence[HostGpu], env: Mapping[str, str]) -> str | None:
    """The key of `executable`'s answer on this host in this environment (see the module
    docstring); None when the binary cannot be read (nothing is kept for it)."""
    try:
        real = os.path.realpath(os.path.expanduser(executable))
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    folder = os.path.dirname(real)
    parts = {
        "format": FORMAT,
        "exe": [real, st.st_size, st.st_mtime_ns],
        "libs": [_libraries(folder), _libraries(os.path.join(folder, os.pardir, "lib"))],
        "env": {v: env.get(v) for v in ENV_VARS},
        "host": [[g.vendor, g.name, g.total_bytes, g.index, g.integrated] for g in host],
    }
    text = json.dumps(parts, sort_keys=True)  # ASCII: odd path bytes are escaped
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def ttl_of(answer: Answer, host: Sequence[HostGpu]) -> float:
    """How long `answer` is kept on `host`, in seconds; 0: not kept (module docstring)."""
    if answer.why is not None:
        return FAILURE_TTL_S
    if answer.listed is None:  # a build without --list-devices: only a new binary changes it
        return LISTED_TTL_S
    merged = merge(answer.listed, host)
    if any(d.refused is None and d.host is None for d in merged):
        return 0.0  # its free memory would be the engine's: never from the cache
    matched = {(d.host.vendor, d.host.index) for d in merged if d.host is not None}
    if any(not g.integrated and (g.vendor, g.index) not in matched for g in host):
        return UNSEEN_TTL_S
    return LISTED_TTL_S


def with_live_free(
    listed: tuple[EngineDevice, ...], host: Sequence[HostGpu]
) -> tuple[EngineDevice, ...]:
    """`listed` with each device's free memory the host's reading now, where one matched."""
    merged = merge(listed, host)
    return tuple(
        d if m.host is None else replace(d, free_mib=min(m.host.free_bytes, d.total_bytes) // _MIB)
        for d, m in zip(listed, merged, strict=True)
    )


# --- reading a file that may be hostile -------------------------------------------------------


def _number(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12:
        return value
    return None


def _device(raw: object) -> EngineDevice | None:
    """One stored device, or None unless it reads back through the engine's parser as is."""
    if not isinstance(raw, dict) or set(raw) != {"name", "description", "total_mib", "free_mib"}:
        return None
    name, desc = raw["name"], raw["description"]
    total, free = _number(raw["total_mib"]), _number(raw["free_mib"])
    if not (isinstance(name, str) and isinstance(desc, str)) or total is None or free is None:
        return None
    if len(name) > 64 or len(desc) > 512:
        return None
    device = EngineDevice(name, desc, total, free)
    line = f"  {name}: {desc} ({total} MiB, {free} MiB free)"
    return device if parse_devices(f"Available devices:\n{line}\n") == (device,) else None


def _listing(raw: object) -> tuple[EngineDevice, ...] | None:
    """A stored listing, or None when it is not one (too long, a device that is not)."""
    if not isinstance(raw, list) or len(raw) > MAX_DEVICES:
        return None
    read = [_device(d) for d in raw]
    return tuple(d for d in read if d is not None) if None not in read else None


def _why(raw: object) -> str | None:
    """A stored reason: a short printable sentence, else None."""
    if isinstance(raw, str) and 0 < len(raw) <= MAX_WHY and printable(raw) == raw:
        return raw
    return None


def _entry(key: object, raw: object) -> _Entry | None:
    if not (_is_key(key) and isinstance(raw, dict)):
        return None
    at, exe = raw.get("at"), raw.get("exe")
    if not isinstance(exe, str):
        return None
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        return None
    if not exe or len(exe) > MAX_PATH:
        return None
    why, listed = _why(raw.get("why")), _listing(raw.get("listed"))
    stored_why, stored_listed = raw.get("why"), raw.get("listed")
    if (stored_why is not None and why is None) or (stored_listed is not None and listed is None):
        return None  # a field that is there but wrong: the entry is not believed
    if why is not None and listed is not None:
        return None  # a failure has no listing
    return _Entry(exe, Answer(listed, why, float(at)))


def _is_key(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == _KEY_LEN
        and all(c in "0123456789abcdef" for c in value)
    )


def _doc_of(data: bytes, path: str) -> tuple[dict[str, _Entry], list[str]]:
    """The entries and the clean settings digests a file holds (what could be read)."""
    try:  # bounded: values, depth, digits (`core.safeio`)
        doc = loads_json(data, path)
    except (QmguiError, ValueError, RecursionError):
        return {}, []
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return {}, []
    raw, marks = doc.get("entries"), doc.get("settings")
    out: dict[str, _Entry] = {}
    for key, value in list(raw.items() if isinstance(raw, dict) else ())[: MAX_ENTRIES * 2]:
        entry = _entry(key, value)
        if entry is not None:
            out[key] = entry
    clean = [m for m in (marks if isinstance(marks, list) else [])[:MAX_CLEAN] if _is_key(m)]
    return out, clean


def _stored(entry: _Entry) -> dict[str, object]:
    a = entry.answer
    listed = None if a.listed is None else [
        {"name": d.name, "description": d.description, "total_mib": d.total_mib,
         "free_mib": d.free_mib}
        for d in a.listed
    ]  # fmt: skip
    return {"at": a.at, "exe": entry.executable, "why": a.why, "listed": listed}


class DeviceCache:
    """The answers in one file (`cache_path()` unless `path`); `clock` gives wall-clock
    seconds (the seam tests use)."""

    def __init__(self, path: Path | None = None, *, clock: Callable[[], float] = time.time):
        self.path = path if path is not None else cache_path()
        self.clock = clock

    def get(self, key: str, host: Sequence[HostGpu]) -> Answer | None:
        """The answer kept under `key` while it is fresh, its free memory the host's now;
        None: there is none, it expired, or the file could not be trusted."""
        entry = self._read()[0].get(key)
        if entry is None:
            return None
        answer = entry.answer
        age = self.clock() - answer.at
        if age < -CLOCK_SLACK_S or age >= ttl_of(answer, host):
            return None
        if answer.listed is None:
            return answer
        return replace(answer, listed=with_live_free(answer.listed, host))

    def put(
        self,
        key: str,
        executable: str,
        listed: tuple[EngineDevice, ...] | None,
        why: str | None,
        host: Sequence[HostGpu],
    ) -> None:
        """Keep what the engine said now (an answer `ttl_of` would not keep drops the
        entry instead). Never raises: a cache that cannot be written is only slower."""
        why = None if why is None else printable(why)[:MAX_WHY] or "it could not be asked"
        answer = Answer(listed, why, self.clock())
        try:
            real = os.path.realpath(os.path.expanduser(executable))
        except (OSError, ValueError):  # a NUL in the path
            return
        if len(real) > MAX_PATH:
            return
        keep = ttl_of(answer, host) > 0

        def change(entries: dict[str, _Entry], clean: list[str]) -> bool:
            if keep:
                entries[key] = _Entry(real, answer)
                return True
            return entries.pop(key, None) is not None

        self._update(change)

    def drop(self, key: str) -> None:
        """Forget the answer under `key`: the next read asks the engine."""
        self._update(lambda entries, clean: entries.pop(key, None) is not None)

    def is_clean(self, digest: str) -> bool:
        """The settings file whose `digest` this is was read by the full loader without a
        word to say (`service.devices.registered_engine`)."""
        return digest in self._read()[1]

    def mark_clean(self, digest: str) -> None:
        """Remember that the settings file of `digest` loads cleanly (newest first)."""

        def change(entries: dict[str, _Entry], clean: list[str]) -> bool:
            if clean[:1] == [digest]:
                return False
            if digest in clean:
                clean.remove(digest)
            clean.insert(0, digest)
            del clean[MAX_CLEAN:]
            return True

        if _is_key(digest):
            self._update(change)

    def _read(self) -> tuple[dict[str, _Entry], list[str]]:
        try:  # a regular file only (a FIFO put there would block), bounded
            data = read_regular(self.path, MAX_FILE_BYTES)
        except (QmguiError, OSError):
            return {}, []
        if len(data) > MAX_FILE_BYTES:
            return {}, []
        return _doc_of(data, str(self.path))

    def _update(self, change: Callable[[dict[str, _Entry], list[str]], bool]) -> None:
        """Under the lock: read the file, `change` the entries and, when it changed them
        (True), write them back; entries that could not be read are left out then."""
        from filelock import FileLock  # noqa: PLC0415 - only after the engine was asked

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{self.path}.lock", timeout=LOCK_TIMEOUT_S):
                entries, clean = self._read()
                if change(entries, clean):
                    self._write(entries, clean)
        except OSError:  # filelock's Timeout is one: another process holds it for too long
            return

    def _write(self, entries: dict[str, _Entry], clean: list[str]) -> None:
        now = self.clock()
        live = [
            (k, e)
            for k, e in entries.items()
            if -CLOCK_SLACK_S <= now - e.answer.at < max(LISTED_TTL_S, FAILURE_TTL_S)
        ]
        live.sort(key=lambda item: item[1].answer.at, reverse=True)
        live = live[:MAX_ENTRIES]
        while True:
            doc = {
                "format": FORMAT,
                "entries": {k: _stored(e) for k, e in live},
                "settings": clean[:MAX_CLEAN],
            }
            text = json.dumps(doc, separators=(",", ":")).encode("ascii")
            if len(text) <= MAX_FILE_BYTES or not live:
                break
            live.pop()  # the oldest goes first
        replace_file(self.path, text, prefix=".devices-")
