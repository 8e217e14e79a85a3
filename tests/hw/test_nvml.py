"""NVML readings replayed from recorded fixtures; no driver is a state, not an error."""

from __future__ import annotations

import json
import sys
import time

import pytest

from qmgui.hw import nvml
from qmgui.hw.nvml import (
    STATUS_ERROR,
    STATUS_NO_DRIVER,
    STATUS_NO_GPU,
    STATUS_NO_LIBRARY,
    STATUS_OK,
    read_gpus,
    read_nvml,
    record,
)
from tests.hw.fake_nvml import FIXTURES, FakeNvml

MIB = 1024**2


def test_two_gpus_with_processes() -> None:
    fake = FakeNvml("two-gpus-with-processes.json")
    r = read_nvml(fake)
    assert r.status == STATUS_OK and r.ok and not r.broken
    assert r.driver_version == "550.54.14"
    assert r.cuda_driver_version == "12.4"
    assert r.message == (
        "NVIDIA driver 550.54.14, 2 GPUs: NVIDIA GeForce RTX 4090, NVIDIA GeForce RTX 3090"
    )
    g0, g1 = r.gpus
    assert (g0.index, g0.name, g0.uuid) == (
        0,
        "NVIDIA GeForce RTX 4090",
        "GPU-5f3c2a1e-8b7d-4c6e-9a0f-1d2e3f4a5b6c",
    )
    assert (g0.total_bytes, g0.free_bytes, g0.used_bytes) == (24564 * MIB, 4388 * MIB, 20176 * MIB)
    procs = {p.pid: p for p in g0.processes}
    assert [p.pid for p in g0.processes] == sorted(procs)
    assert procs[40211].kind == "compute"
    assert procs[40211].used_bytes == 18432 * MIB
    assert procs[40211].name == "/opt/llama.cpp/build/bin/llama-server"
    assert procs[1873].kind == "graphics"
    # one process in both lists is one process, its usage counted once
    assert procs[51234].kind == "compute+graphics"
    assert procs[51234].used_bytes == 1024 * MIB
    assert g0.process_bytes == (18432 + 1024 + 272 + 48) * MIB
    # the same llama-server on the second GPU; that GPU cannot list graphics processes
    assert [(p.pid, p.used_bytes) for p in g1.processes] == [(40211, 20480 * MIB)]
    assert r.problems == ("GPU 1: graphics processes could not be read (Not Supported)",)
    assert fake.inits == 1 and fake.shutdowns == 1


def test_read_gpus_keeps_its_shape_for_the_planner() -> None:
    """`qmgui plan` reads .index, .name, .total_bytes, .free_bytes from read_gpus()."""
    gpus = read_gpus(FakeNvml("two-gpus-with-processes.json"))
    assert [(g.index, g.name, g.total_bytes, g.free_bytes) for g in gpus] == [
        (0, "NVIDIA GeForce RTX 4090", 24564 * MIB, 4388 * MIB),
        (1, "NVIDIA GeForce RTX 3090", 24576 * MIB, 3796 * MIB),
    ]
    assert isinstance(gpus, list)


def test_recorded_h200() -> None:
    """A reading recorded on a real H200 (driver 580, CUDA 13.0) by bench/gpu_check.py."""
    fake = FakeNvml("h200-real.json")
    r = read_nvml(fake)
    assert r.status == STATUS_OK and r.ok and not r.broken
    assert (r.driver_version, r.cuda_driver_version) == ("580.159.04", "13.0")
    assert r.message == "NVIDIA driver 580.159.04, 1 GPU: NVIDIA H200"
    (g,) = r.gpus
    assert (g.index, g.name, g.uuid) == (
        0,
        "NVIDIA H200",
        "GPU-94765b0c-3471-1a2e-b60b-33a94ca56fe5",
    )
    # 143771 MiB as nvidia-smi and llama-server's --list-devices report it; 615 MiB used by the
    # driver with no process on the card
    assert g.total_bytes == 150_754_820_096 == 143_771 * MIB
    assert g.free_bytes == 150_109_880_320
    assert g.used_bytes == 644_939_776 == g.total_bytes - g.free_bytes
    assert g.processes == () and g.process_bytes == 0
    assert r.problems == ()
    assert fake.inits == 1 and fake.shutdowns == 1
    assert [
        (x.name, x.total_bytes, x.free_bytes) for x in read_gpus(FakeNvml("h200-real.json"))
    ] == [("NVIDIA H200", 143_771 * MIB, 150_109_880_320)]


def test_no_driver_is_a_state_not_an_error() -> None:
    fake = FakeNvml("no-driver.json")
    r = read_nvml(fake)
    assert r.status == STATUS_NO_DRIVER
    assert not r.ok and not r.broken
    assert r.gpus == ()
    assert r.message == "no NVIDIA driver: the NVIDIA driver's NVML library was not found"
    assert r.fix is not None and "install the NVIDIA driver" in r.fix
    assert read_gpus(FakeNvml("no-driver.json")) == []
    assert fake.shutdowns == 0  # nothing to shut down when init failed


def test_driver_library_mismatch_is_broken_with_a_fix() -> None:
    r = read_nvml(FakeNvml("driver-mismatch.json"))
    assert r.status == STATUS_ERROR and r.broken
    assert "NVMLError_LibRmVersionMismatch" in r.message
    assert r.fix is not None and "reboot" in r.fix
    assert read_gpus(FakeNvml("driver-mismatch.json")) == []


def test_driver_not_loaded_counts_as_no_driver() -> None:
    r = read_nvml(FakeNvml({"init": {"error": "NVMLError_DriverNotLoaded"}}))
    assert r.status == STATUS_NO_DRIVER
    assert "not loaded" in r.message


def test_a_gpu_failing_mid_read_gives_no_half_list() -> None:
    fake = FakeNvml("two-gpus-with-processes.json")
    fake.fail[("memory", 1)] = "NVMLError_GpuIsLost"
    r = read_nvml(fake)
    assert r.status == STATUS_ERROR
    assert r.gpus == ()
    assert r.driver_version == "550.54.14"
    assert "reading the GPUs failed (NVMLError_GpuIsLost" in r.message
    assert r.fix is not None and "fell off the bus" in r.fix
    assert fake.shutdowns == 1


def test_driver_without_gpus() -> None:
    reading = {
        "init": None,
        "driver_version": "550.54.14",
        "cuda_driver_version": 12040,
        "devices": [],
    }
    r = read_nvml(FakeNvml(reading))
    assert r.status == STATUS_NO_GPU
    assert r.message == "NVIDIA driver 550.54.14 is installed but sees no GPU"


def test_missing_uuid_and_process_lists_are_noted_not_fatal() -> None:
    reading = json.loads((FIXTURES / "two-gpus-with-processes.json").read_text())
    reading["devices"][0]["uuid"] = {"error": "NVMLError_NotSupported"}
    reading["devices"][0]["compute_processes"] = {"error": "NVMLError_NoPermission"}
    r = read_nvml(FakeNvml(reading))
    assert r.ok
    assert r.gpus[0].uuid is None
    assert {p.kind for p in r.gpus[0].processes} == {"graphics"}
    assert any("UUID could not be read" in p for p in r.problems)
    assert any("compute processes could not be read" in p for p in r.problems)


def test_process_usage_unknown_stays_none() -> None:
    reading = json.loads((FIXTURES / "two-gpus-with-processes.json").read_text())
    reading["devices"][1]["compute_processes"] = [{"pid": 7, "usedGpuMemory": None}]
    r = read_nvml(FakeNvml(reading))
    (p,) = r.gpus[1].processes
    assert p.used_bytes is None and p.name is None
    assert r.gpus[1].process_bytes == 0


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
        r = read_nvml()
        assert read_gpus() == []
        assert record() == {"init": {"error": "ImportError"}}
    assert r.status == STATUS_NO_LIBRARY


@pytest.mark.parametrize(
    "name", ["two-gpus-with-processes.json", "no-driver.json", "driver-mismatch.json"]
)
def test_record_reproduces_the_fixture(name: str) -> None:
    """The fixtures are in record()'s format: recording the replay gives the file back."""
    fake = FakeNvml(name)
    assert record(fake) == fake.reading


def test_to_json_is_plain_json() -> None:
    r = read_nvml(FakeNvml("two-gpus-with-processes.json"))
    data = json.loads(json.dumps(r.to_json()))
    assert data["status"] == "ok"
    assert data["gpus"][0]["processes"][0] == {
        "pid": 1873,
        "used_bytes": 272 * MIB,
        "kind": "graphics",
        "name": "/usr/lib/xorg/Xorg",
    }


def test_the_real_library_never_raises() -> None:
    """On this machine: whatever the driver situation, a reading comes back, quickly."""
    start = time.monotonic()
    r = read_nvml()
    assert r.status in {STATUS_OK, STATUS_NO_DRIVER, STATUS_NO_GPU, STATUS_NO_LIBRARY, STATUS_ERROR}
    assert time.monotonic() - start < 5
    if r.status == STATUS_OK:
        assert all(g.total_bytes > 0 for g in r.gpus)
    else:
        assert nvml.read_gpus() == []


def test_without_the_driver_library_pynvml_is_not_imported() -> None:
    """No libnvidia-ml.so.1 (this CI machine): the reading says "no driver" without importing
    pynvml, whose import costs more than the rest of `qmgui plan`'s hardware reading."""
    import ctypes
    import subprocess

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has the NVIDIA driver's library")
    except OSError:
        pass
    code = (
        "import sys; from qmgui.hw.nvml import read_nvml; r = read_nvml(); "
        "print(r.status, 'pynvml' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == [STATUS_NO_DRIVER, "False"]
