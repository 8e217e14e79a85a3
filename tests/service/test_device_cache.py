"""`service.device_cache`: the engine's `--list-devices` answer kept between commands, keyed
by the binary, the visibility variables and the host's GPU set; counted through the probe's
`runner` seam, with a clock the tests move."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from qmgui.core.backends import Backend
from qmgui.core.devices import HostGpu
from qmgui.core.probe import EngineDevice, FailureKind, ProbeFailure, ProbeResult, RunOutput
from qmgui.hw.gpus import host_gpus
from qmgui.hw.nvml import STATUS_OK, GpuReading, NvmlReading
from qmgui.service import device_cache, devices
from qmgui.service.device_cache import (
    FAILURE_TTL_S,
    LISTED_TTL_S,
    MAX_FILE_BYTES,
    UNSEEN_TTL_S,
    DeviceCache,
    entry_key,
)
from qmgui.service.devices import (
    RETRIES,
    device_engine,
    read_machine,
    registered_engine,
    remember,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
LISTINGS = FIXTURES / "list-devices"
NO_DRM = "/nonexistent-drm"
GIB = 1 << 30
T0 = 1_800_000_000.0


class Replay:
    """A runner answering `--list-devices` with one fixture (or a crash), counting calls."""

    def __init__(self, fixture: str | None) -> None:
        self.fixture = fixture
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout_s: float) -> RunOutput:
        self.calls.append(tuple(argv))
        if self.fixture is None:  # a build that crashes initialising the driver
            return RunOutput(tuple(argv), "Segmentation fault\n", returncode=-11)
        text = (LISTINGS / self.fixture).read_text(encoding="utf-8")
        return RunOutput(tuple(argv), text, returncode=0, timeout_s=timeout_s)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def exe(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(tmp_path: Path, clock: Clock) -> DeviceCache:
    return DeviceCache(tmp_path / "cache" / "devices.json", clock=clock)


def two_cards(free_gib: tuple[int, int] = (20, 21)) -> NvmlReading:
    """The 4090 + 3090 host, with `free_gib` free on each."""
    return NvmlReading(
        STATUS_OK,
        "2 GPUs",
        gpus=(
            GpuReading(0, "NVIDIA GeForce RTX 4090", 24080 << 20, free_gib[0] * GIB, 0),
            GpuReading(1, "NVIDIA GeForce RTX 3090", 24135 << 20, free_gib[1] * GIB, 0),
        ),
    )


def read(
    exe: str,
    runner: Replay,
    cache: DeviceCache,
    *,
    reading: NvmlReading | None = None,
    env: dict[str, str] | None = None,
    **kw: Any,
) -> Any:
    return read_machine(
        device_engine([Backend("llama", "llama", exe, frozenset({"llm"}))]),
        runner=runner, cache=cache, reading=reading if reading is not None else two_cards(),
        drm_root=NO_DRM, env={} if env is None else env, sleep=lambda s: None, **kw,
    )  # fmt: skip


def test_a_second_read_within_the_ttl_does_not_run_the_engine(
    exe: str, cache: DeviceCache, clock: Clock
) -> None:
    runner = Replay("cuda-4090-3090.txt")
    first = read(exe, runner, cache)
    assert len(runner.calls) == 1
    clock.now += LISTED_TTL_S - 1
    again = read(exe, runner, cache)
    assert len(runner.calls) == 1  # kept
    assert [g.name for g in again.gpus] == [g.name for g in first.gpus] == ["CUDA0", "CUDA1"]
    assert again.notes == () and again.source == "engine"
    clock.now += 2  # expired
    read(exe, runner, cache)
    assert len(runner.calls) == 2


def test_free_memory_is_read_live_not_kept(exe: str, cache: DeviceCache) -> None:
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache, reading=two_cards((20, 21)))
    machine = read(exe, runner, cache, reading=two_cards((3, 7)))
    assert len(runner.calls) == 1
    assert [g.free_bytes for g in machine.gpus] == [3 * GIB, 7 * GIB]
    # the listing's own free figure is the host's now too (what --json shows)
    assert [d.listed.free_mib for d in machine.devices] == [3 * 1024, 7 * 1024]


def test_a_changed_binary_reads_again(exe: str, cache: DeviceCache) -> None:
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache)
    st = os.stat(exe)
    os.utime(exe, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    read(exe, runner, cache)
    assert len(runner.calls) == 2
    # a ggml backend library dropped beside it is a new build too
    (Path(exe).parent / "libggml-cuda.so").write_bytes(b"\0")
    read(exe, runner, cache)
    read(exe, runner, cache)
    assert len(runner.calls) == 3


def test_a_changed_visibility_variable_reads_again(exe: str, cache: DeviceCache) -> None:
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache, env={})
    read(exe, runner, cache, env={"CUDA_VISIBLE_DEVICES": "1"})
    read(exe, runner, cache, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert len(runner.calls) == 2
    read(exe, runner, cache, env={"CUDA_VISIBLE_DEVICES": "1", "GGML_VK_VISIBLE_DEVICES": "0"})
    read(exe, runner, cache, env={"HIP_VISIBLE_DEVICES": "0"})
    read(exe, runner, cache, env={"UNRELATED": "x"})  # the first key again: kept
    assert len(runner.calls) == 4


def test_a_changed_host_gpu_set_reads_again(exe: str, cache: DeviceCache) -> None:
    """A card added or removed is a new key (seeds row 99); free memory moving is not."""
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache)
    one_card = NvmlReading(STATUS_OK, "1 GPU", gpus=two_cards().gpus[:1])
    read(exe, runner, cache, reading=one_card)
    assert len(runner.calls) == 2
    read(exe, runner, cache, reading=two_cards((1, 2)))
    assert len(runner.calls) == 2


def test_a_failure_is_kept_for_its_own_ttl(exe: str, cache: DeviceCache, clock: Clock) -> None:
    runner = Replay(None)
    first = read(exe, runner, cache)
    assert len(runner.calls) == 1 and first.source == "host"
    (note,) = first.notes
    clock.now += FAILURE_TTL_S - 1
    kept = read(exe, runner, cache)
    assert len(runner.calls) == 1 and kept.source == "host"
    (kept_note,) = kept.notes
    assert kept_note.startswith(note.split(";")[0][:40]) and "59 s ago" in kept_note
    clock.now += 2
    read(exe, runner, cache)
    assert len(runner.calls) == 2


def test_an_empty_listing_on_a_gpu_host_is_kept_only_briefly(
    exe: str, cache: DeviceCache, clock: Clock
) -> None:
    """The retries run first (a driver starting up); what they end with is kept for
    `UNSEEN_TTL_S`, not `LISTED_TTL_S`, and the warning is said again from the cache."""
    runner = Replay("cpu-b10435-recorded.txt")
    first = read(exe, runner, cache)
    assert len(runner.calls) == 1 + RETRIES and first.gpus == ()
    assert UNSEEN_TTL_S < LISTED_TTL_S
    clock.now += UNSEEN_TTL_S - 1
    kept = read(exe, runner, cache)
    assert len(runner.calls) == 1 + RETRIES and kept.notes == first.notes
    clock.now += 2
    read(exe, runner, cache)
    assert len(runner.calls) == 2 * (1 + RETRIES)
    # on a host without a card the same listing is the answer, kept the usual time
    no_gpu = Replay("cpu-b10435-recorded.txt")
    host = NvmlReading(STATUS_OK, "no GPU")
    read(exe, no_gpu, cache, reading=host)
    clock.now += UNSEEN_TTL_S + 1
    read(exe, no_gpu, cache, reading=host)
    assert len(no_gpu.calls) == 1


def test_a_device_only_the_engine_knows_the_free_memory_of_is_not_kept(
    exe: str, cache: DeviceCache
) -> None:
    """An Intel Arc card through SYCL: no host reading matches it, so its free memory is the
    engine's: that listing is asked each time."""
    runner = Replay("sycl-arc-a770.txt")
    host = NvmlReading(STATUS_OK, "no GPU")
    read(exe, runner, cache, reading=host)
    read(exe, runner, cache, reading=host)
    assert len(runner.calls) == 2


def test_fresh_asks_the_engine_and_keeps_the_new_answer(exe: str, cache: DeviceCache) -> None:
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache)
    read(exe, runner, cache, fresh=True)
    read(exe, runner, cache)
    assert len(runner.calls) == 2


def _key(exe: str, reading: NvmlReading | None = None) -> str:
    key = entry_key(exe, host_gpus(reading=reading or two_cards(), drm_root=NO_DRM), {})
    assert key is not None
    return key


def _entry(program: str, **fields: Any) -> dict[str, Any]:
    good = {
        "at": T0,
        "exe": os.path.realpath(program),
        "why": None,
        "listed": [
            {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090", "total_mib": 24080,
             "free_mib": 1},
            {"name": "CUDA1", "description": "NVIDIA GeForce RTX 3090", "total_mib": 24135,
             "free_mib": 1},
        ],
    }  # fmt: skip
    return {**good, **fields}


def _device(name: str, desc: str, total: Any = 24080, free: Any = 1) -> dict[str, Any]:
    return {"name": name, "description": desc, "total_mib": total, "free_mib": free}


def hostile(exe: str) -> list[bytes]:
    """Files a crafted or broken cache could hold, each keyed right for `exe` on two_cards."""
    key = _key(exe)

    def doc(entry: Any, fmt: Any = 1, k: str = key) -> bytes:
        return json.dumps({"format": fmt, "entries": {k: entry}}).encode()

    injected = [
        _device("CUDA0", "NVIDIA GeForce RTX 4090"),
        _device("CUDA1", "NVIDIA GeForce RTX 3090\n  CUDA9: Evil (99999 MiB, 99999 MiB free)"),
    ]
    return [
        b"",
        b"\x00\xff garbage",
        b"[" * 100_000,  # deeper than the JSON reader goes
        b'{"format": 1, "entries": {"' + b"a" * (MAX_FILE_BYTES + 10) + b'": 1}}',
        json.dumps([1, 2]).encode(),
        doc(_entry(exe), fmt=2),
        doc(_entry(exe), k=key.upper()),
        doc("not an entry"),
        doc(_entry(exe, at="yesterday")),
        doc(_entry(exe, at=True)),
        doc(_entry(exe, at=float("nan"))),
        doc(_entry(exe, at=float("inf"))),
        doc(_entry(exe, at=T0 + 3600)),  # from the future
        doc(_entry(exe, exe=7)),
        doc(_entry(exe, why="x" * 10_000, listed=None)),
        doc(_entry(exe, why="\x1b[31mred\x1b[0m", listed=None)),
        doc(_entry(exe, why="both", listed=[])),
        doc(_entry(exe, listed="CUDA0")),
        doc(_entry(exe, listed=injected)),
        doc(_entry(exe, listed=[_device("CUDA0", "NVIDIA GeForce RTX 4090", total=True)])),
        doc(_entry(exe, listed=[_device("CUDA0", "NVIDIA GeForce RTX 4090", total=-1)])),
        doc(_entry(exe, listed=[_device("CUDA0", "NVIDIA GeForce RTX 4090", total=10**15)])),
        doc(_entry(exe, listed=[{**_device("CUDA0", "x"), "extra": 1}])),
        doc(_entry(exe, listed=[_device("CU DA0", "NVIDIA GeForce RTX 4090")])),
        doc(_entry(exe, listed=[_device("CUDA0", "NVIDIA GeForce RTX 4090")] * 65)),
    ]


def test_a_corrupt_or_hostile_file_is_ignored_and_rewritten(
    exe: str, cache: DeviceCache, tmp_path: Path
) -> None:
    cache.path.parent.mkdir(parents=True)
    for i, data in enumerate(hostile(exe)):
        cache.path.write_bytes(data)
        runner = Replay("cuda-4090-3090.txt")
        machine = read(exe, runner, cache)
        assert len(runner.calls) == 1, i  # not believed: the engine is asked
        assert [g.name for g in machine.gpus] == ["CUDA0", "CUDA1"], i
        stored = json.loads(cache.path.read_bytes())  # rewritten, whole and valid
        assert stored["format"] == 1 and list(stored["entries"]) == [_key(exe)], i
        read(exe, runner, cache)
        assert len(runner.calls) == 1, i  # and read back
    # the same entry, well formed, is believed (what a file that is not crafted holds)
    cache.path.write_bytes(json.dumps({"format": 1, "entries": {_key(exe): _entry(exe)}}).encode())
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache)
    assert runner.calls == []


def test_a_file_that_is_not_a_regular_file_is_a_miss(exe: str, cache: DeviceCache) -> None:
    cache.path.mkdir(parents=True)  # a folder where the file should be
    runner = Replay("cuda-4090-3090.txt")
    read(exe, runner, cache)
    read(exe, runner, cache)
    assert len(runner.calls) == 2  # nothing kept, nothing raised
    cache.path.rmdir()
    if hasattr(os, "mkfifo"):  # a FIFO would block a plain open(): it is not read
        os.mkfifo(cache.path)
        read(exe, runner, cache)
        assert len(runner.calls) == 3 and cache.path.is_file()  # replaced by the cache
        cache.path.unlink()
    cache.path.symlink_to("/dev/zero")  # endless: not read
    read(exe, runner, cache)
    assert len(runner.calls) == 4


_WRITER = """
import sys
from pathlib import Path
from qmgui.service.device_cache import DeviceCache
path, me, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cache = DeviceCache(path)
for i in range(n):
    key = f"{me:02x}{i % 4:02x}".ljust(64, "0")
    cache.put(key, sys.executable, None, f"writer {me} round {i}", ())
"""


def test_processes_writing_at_once_leave_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "devices.json"
    writers, rounds = 4, 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(me), str(rounds)],
            cwd=Path(__file__).resolve().parent.parent.parent,
        )
        for me in range(writers)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    data = json.loads(path.read_bytes())
    assert data["format"] == 1
    cache = DeviceCache(path)
    entries = device_cache.DeviceCache._read(cache)[0]
    assert len(entries) == len(data["entries"]) == writers * 4  # none lost, none unreadable
    for me in range(writers):  # each writer's last round is there
        last = entries[f"{me:02x}{(rounds - 1) % 4:02x}".ljust(64, "0")].answer
        assert last.why == f"writer {me} round {rounds - 1}" and last.listed is None
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def _probe(listed: tuple[EngineDevice, ...] | None, failure: bool = False) -> ProbeResult:
    why = ProbeFailure(FailureKind.CRASHED, "x", (), "it crashed") if failure else None
    return ProbeResult("x", devices=listed or (), devices_listed=listed is not None, failure=why)


def test_a_probe_of_the_build_refreshes_the_entry(exe: str, cache: DeviceCache) -> None:
    """`qmgui backends add`, the window's editor and `qmgui doctor` keep what they learned."""
    host = host_gpus(reading=two_cards(), drm_root=NO_DRM)
    old = Replay(None)
    read(exe, old, cache)  # a failure, kept
    listing = (
        EngineDevice("CUDA0", "NVIDIA GeForce RTX 4090", 24080, 100),
        EngineDevice("CUDA1", "NVIDIA GeForce RTX 3090", 24135, 100),
    )
    remember(exe, _probe(listing), host=host, env={}, cache=cache)
    runner = Replay("cuda-4090-3090.txt")
    machine = read(exe, runner, cache)
    assert runner.calls == [] and [g.name for g in machine.gpus] == ["CUDA0", "CUDA1"]
    # a listing without the cards the host has is dropped: read_machine asks, with retries
    remember(exe, _probe(()), host=host, env={}, cache=cache)
    read(exe, runner, cache)
    assert len(runner.calls) == 1
    # the probe failing is kept as a failure
    remember(exe, _probe(None, failure=True), host=host, env={}, cache=cache)
    assert read(exe, runner, cache).source == "host" and len(runner.calls) == 1


def test_the_cache_adds_nothing_to_hostgpu_keys_but_names_and_totals() -> None:
    """Free memory is not part of the key: the same cards with other free figures match."""
    a = HostGpu("nvidia", "NVIDIA GeForce RTX 4090", 24 * GIB, 1 * GIB, 0)
    b = HostGpu("nvidia", "NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB, 0)
    assert entry_key(sys.executable, [a], {}) == entry_key(sys.executable, [b], {})
    assert entry_key(sys.executable, [a], {}) != entry_key(sys.executable, [], {})
    assert entry_key("/nonexistent/llama-server", [a], {}) is None


# --- the registry, read with json alone once the full loader has read the file cleanly ---


def _save(*entries: Any) -> None:
    from qmgui.settings import Settings, save_settings

    save_settings(Settings(backends=list(entries)))


def _count_full_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from qmgui.service import launch

    calls: list[int] = []
    real = launch.load_quietly

    def counted() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(launch, "load_quietly", counted)
    return calls


def test_a_settings_file_read_cleanly_once_is_read_with_json_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qmgui.settings import BackendEntry

    full = _count_full_loads(monkeypatch)
    caps = {"devices_listed": True, "devices": [_device("CUDA0", "NVIDIA GeForce RTX 4090")]}
    _save(
        BackendEntry(id="a", kind="llama", executable="/a/llama-server"),
        BackendEntry(id="b", kind="llama", executable="/b/llama-server", default_for=["llm"],
                     variant="vulkan", capabilities=caps),
        BackendEntry(id="v", kind="vllm", executable="/v/vllm"),
    )  # fmt: skip
    first = registered_engine()
    assert len(full) == 1
    for arg in (None, "a", "b", "v", "~/bin/llama-server"):
        full.clear()
        light = registered_engine(arg)
        assert full == [], arg  # json alone
        with monkeypatch.context() as m:
            m.setattr(devices, "_light_registry", _refuse_light)
            assert registered_engine(arg) == light, arg  # what the full loader makes of it
    full.clear()
    assert first is not None and first.executable == "/b/llama-server"
    assert first.variant == "vulkan" and first.stored is not None
    # a changed file is read fully again, then with json again
    _save(BackendEntry(id="c", kind="llama", executable="/c/llama-server"))
    chosen = registered_engine()
    assert len(full) == 1 and chosen is not None and chosen.executable == "/c/llama-server"
    registered_engine()
    assert len(full) == 1


def _refuse_light(data: bytes) -> Any:
    raise devices._NotLight


def test_a_settings_file_with_something_to_say_is_always_read_fully(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qmgui.config_paths import settings_path

    full = _count_full_loads(monkeypatch)
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema_version": 1, "backends": [{"id": "x"}]}', encoding="utf-8")
    registered_engine()
    assert len(full) == 1  # the loader said something (and moved the file aside)
    for _ in range(2):  # each time (the loader moves it aside: written again)
        path.write_text("{not json", encoding="utf-8")
        registered_engine()
    assert len(full) == 3
    path.unlink(missing_ok=True)
    registered_engine()  # no file at all: no registry, nothing to load
    assert len(full) == 3


def test_a_forged_clean_mark_does_not_let_a_bad_file_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A digest marked clean by a crafted cache file: the json reader still checks every
    field it reads and leaves anything unexpected to the full loader."""
    from qmgui.config_paths import settings_path

    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    bad = [
        '{"schema_version": 1, "backends": [{"id": "x", "kind": "llama", "executable": 7}]}',
        '{"schema_version": 1, "backends": [{"id": "x", "kind": "llama", "executable": "/x",'
        ' "default_for": "llm"}]}',
        '{"schema_version": 1, "backends": [{"id": "x", "kind": "llama", "executable": "/x",'
        ' "capabilities": []}]}',
        '{"schema_version": 1, "backends": ["x"]}',
        '{"schema_version": 1, "backends": {"x": 1}}',
        '{"schema_version": 2, "backends": []}',
        "[]",
    ]
    full = _count_full_loads(monkeypatch)
    for text in bad:
        path.write_text(text, encoding="utf-8")
        DeviceCache().mark_clean(devices._settings_digest(path.read_bytes()))
        full.clear()
        registered_engine()
        assert len(full) == 1, text


def test_the_json_reader_knows_the_settings_schema() -> None:
    from qmgui.settings import SCHEMA_VERSION

    assert devices.LIGHT_SCHEMA == SCHEMA_VERSION


_PLAN_TWICE = """
import io, json, sys
from qmgui.cli import main
for _ in range(2):
    assert main(["plan", sys.argv[1], "--json"], out=io.StringIO()) == 0
print(json.dumps(sorted(sys.modules)))
"""


def test_a_kept_answer_plans_without_the_settings_loader_or_the_engine(tmp_path: Path) -> None:
    """The second `qmgui plan` with a registered build starts no engine and imports neither
    pydantic, the settings module nor the engines package (a fresh interpreter each)."""
    from qmgui.settings import BackendEntry
    from tests.synth.factory import PRESETS, write_gguf

    stand_in = tmp_path / "llama-server"
    runs = tmp_path / "runs"
    stand_in.write_text(
        f"#!/bin/sh\necho run >> {runs}\nprintf 'Available devices:\\n  (none)\\n'\n",
        encoding="utf-8",
    )
    stand_in.chmod(0o755)
    _save(BackendEntry(id="l", kind="llama", executable=str(stand_in), default_for=["llm"]))
    model = tmp_path / "m.gguf"
    write_gguf(str(model), PRESETS["llama"])
    root = Path(__file__).resolve().parent.parent.parent

    def plan() -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-c", _PLAN_TWICE, str(model)], capture_output=True, text=True,
            timeout=120, check=False, cwd=root, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        loaded: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
        return loaded

    plan()  # asks the engine once, reads the settings fully once
    loaded = plan()
    assert runs.read_text(encoding="utf-8").count("run") == 1
    heavy = ("pydantic", "qmgui.settings", "qmgui.engines", "qmgui.service.launch")
    assert [m for m in loaded if m.startswith(heavy)] == []


def test_a_lock_held_elsewhere_or_an_odd_path_only_means_nothing_is_kept(
    exe: str, cache: DeviceCache
) -> None:
    from filelock import FileLock

    cache.put("0" * 64, "/a\0b", None, "x", ())  # never raises
    cache.path.parent.mkdir(parents=True)
    other = FileLock(f"{cache.path}.lock")
    with other:  # another process writing for longer than LOCK_TIMEOUT_S
        runner = Replay("cuda-4090-3090.txt")
        machine = read(exe, runner, cache)
    assert [g.name for g in machine.gpus] == ["CUDA0", "CUDA1"] and not cache.path.exists()
    read(exe, runner, cache)  # the lock is free again: kept now
    read(exe, runner, cache)
    assert len(runner.calls) == 2
