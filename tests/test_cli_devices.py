"""Where `qmgui place`, `plan` and `doctor` get this machine's devices: the registered build's
`--list-devices` (the real CPU engine here: no GPU), merged with NVML and amdgpu sysfs
(recorded readings through `service.devices.read_machine`'s seams)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qmgui.cli import doctor
from qmgui.cli import plan as plan_cmd
from qmgui.core.devices import os_floor
from qmgui.core.probe import RunOutput, build_probe
from qmgui.hw.host import read_ram
from qmgui.service import devices as service_devices
from qmgui.settings import BackendEntry
from tests.hw.fake_nvml import FakeNvml
from tests.service.test_devices import LISTINGS, NO_DRM, TREE, Replay
from tests.synth.factory import PRESETS, write_gguf
from tests.test_cli import run
from tests.test_cli_doctor import with_backends

CPU_ENGINE = os.environ.get("QMGUI_TEST_LLAMA_SERVER")


@pytest.fixture
def models(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "llama.gguf", PRESETS["llama"])
    write_gguf(tmp_path / "qwen2.gguf", PRESETS["qwen2"])
    return tmp_path


@pytest.fixture
def stand_in(tmp_path: Path) -> str:
    """A registered llama-server whose listing the tests replay (it never runs)."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    with_backends(BackendEntry(id="llama", kind="llama", executable=str(path),
                               default_for=["llm"]))  # fmt: skip
    return str(path)


def machine_of(
    monkeypatch: pytest.MonkeyPatch, listing: str, nvml: str, drm: str = NO_DRM
) -> list[tuple[str, ...]]:
    """Every run of the CLI reads this machine: `listing` from the registered build, `nvml`
    and the sysfs tree `drm` from the host. Returns the runner's calls."""
    runner = Replay(listing)
    real: Callable[..., Any] = service_devices.read_machine

    def read(engine: Any, *, probe_engine: bool = True) -> Any:
        return real(engine, probe_engine=probe_engine, runner=runner, nvml=FakeNvml(nvml),
                    drm_root=drm, env={}, sleep=lambda s: None)  # fmt: skip

    monkeypatch.setattr(plan_cmd, "read_machine", read)
    return runner.calls


@pytest.mark.skipif(not CPU_ENGINE, reason="set QMGUI_TEST_LLAMA_SERVER to the CPU engine")
def test_place_on_this_gpu_less_machine_with_the_real_engine(models: Path) -> None:
    """The real CPU build is registered: it lists no device, so the models go to host memory,
    the RAM available now less the OS floor (the reserve, capped at a quarter of the RAM)."""
    assert CPU_ENGINE is not None
    with_backends(BackendEntry(id="cpu", kind="llama", executable=CPU_ENGINE,
                               default_for=["llm"]))  # fmt: skip
    code, out, err = run("place", str(models / "llama.gguf"), str(models / "qwen2.gguf"),
                         "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert [d["name"] for d in data["devices"]] == ["CPU"]
    total, available = read_ram()
    assert total is not None and available is not None
    (host,) = data["devices"]
    # the RAM moves between the two readings: within 256 MiB of available - floor
    assert abs(host["budget"] - (available - os_floor(total))) < 256 << 20
    assert all(m["placed"] and m["devices"] == [] for m in data["models"])


def test_mixed_nvidia_and_amd_are_pinned_by_the_engines_names(
    models: Path, stand_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Vulkan build on the 4090 + 3090 + RX 7900 XTX machine: the cards are Vulkan0 (the
    AMD card), Vulkan1 and Vulkan2, and each model's `--device` is the card it was placed on
    by that name (the host's readers numbered the AMD card third)."""
    calls = machine_of(monkeypatch, "vulkan-amd-nvidia-igpu.txt",
                       "two-gpus-with-processes.json", TREE)  # fmt: skip
    code, out, err = run("place", str(models / "llama.gguf"), str(models / "qwen2.gguf"),
                         "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    names = [d["name"] for d in data["devices"]]
    assert names[:3] == ["Vulkan0", "Vulkan1", "Vulkan2"] and "Vulkan3" not in names
    assert calls == [(stand_in, "--list-devices")]  # once per run
    placed = {m["name"]: m["devices"] for m in data["models"]}
    code, out, err = run("place", str(models / "llama.gguf"), str(models / "qwen2.gguf"),
                         "--llama-swap", "-")  # fmt: skip
    assert code == 0, err
    for name, devices in placed.items():
        assert devices, name
        assert f"--device {','.join(devices)}" in out, (name, out)


def test_every_gpu_refused_runs_on_the_cpu_with_device_none(
    models: Path, stand_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine_of(monkeypatch, "vulkan-llvmpipe.txt", "no-driver.json")
    code, out, err = run("place", str(models / "llama.gguf"), "--llama-swap", "-")
    assert code == 0, err
    assert "--device none" in out
    assert "llvmpipe" in err and "refused" in err
    code, out, err = run("place", str(models / "llama.gguf"), "--json")
    assert [d["name"] for d in json.loads(out)["devices"]] == ["CPU"]


def test_a_role_set_with_every_gpu_refused_gets_device_none(
    models: Path, stand_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role-set path (`service.role_sets`) pins as the plain one: every GPU refused, each
    instance in host memory runs with `--device none`, in --json argv and the exports."""
    machine_of(monkeypatch, "vulkan-llvmpipe.txt", "no-driver.json")
    role = f"chat={models / 'llama.gguf'}:ctx=2048"
    code, out, err = run("place", "--role", role, "--json")
    assert code == 0, err
    (row,) = json.loads(out)["models"]
    assert row["devices"] == [] and row["argv"][row["argv"].index("--device") + 1] == "none"
    code, out, err = run("place", "--role", role, "--script", "-")
    assert code == 0, err
    assert "--device none" in out


def test_plan_warns_when_the_engine_lists_no_gpu_nvml_sees(
    models: Path, stand_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = machine_of(monkeypatch, "cpu-b10435-recorded.txt", "h200-real.json")
    code, out, err = run("plan", str(models / "llama.gguf"), "--json")
    assert code == 0, err
    assert [d["name"] for d in json.loads(out)["devices"]] == ["CPU"]
    assert len(calls) == 1 + service_devices.RETRIES  # asked again: a driver starting up
    assert "NVIDIA H200" in err and "CUDA_VISIBLE_DEVICES" in err
    # planning for a card given on the command line does not ask the engine
    code, out, err = run("plan", str(models / "llama.gguf"), "--gpu", "24GiB", "--json")
    assert code == 0 and len(calls) == 1 + service_devices.RETRIES


def test_plan_without_a_registered_engine_reads_the_drivers(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine_of(monkeypatch, "cuda-4090-3090.txt", "two-gpus-with-processes.json", TREE)
    code, out, err = run("plan", str(models / "llama.gguf"), "--json")
    assert code == 0, err
    names = [d["name"] for d in json.loads(out)["devices"]]
    assert names[-1] == "CPU" and set(names[:-1]) <= {"GPU0", "GPU1", "GPU2"}


def test_doctor_compares_the_engines_list_with_the_hosts_gpus(
    stand_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (LISTINGS / "cpu-b10435-recorded.txt").read_text(encoding="utf-8")

    def prober(exe: str, **_: Any) -> Any:
        return build_probe(exe, [RunOutput((exe, "--list-devices"), text, returncode=0)])

    monkeypatch.setattr(doctor, "host_gpus", lambda reading: service_devices.host_gpus(
        reading=reading, drm_root=NO_DRM))  # fmt: skip
    _, findings = doctor.collect(nvml=FakeNvml("h200-real.json"), prober=prober)
    (warning,) = [f for f in findings if f.section == "backends" and f.status == doctor.WARNING]
    assert "NVIDIA H200" in warning.message and "CUDA_VISIBLE_DEVICES" in warning.message
    _, findings = doctor.collect(nvml=FakeNvml("no-driver.json"), prober=prober)
    assert not [f for f in findings if f.section == "backends" and f.status == doctor.WARNING]
