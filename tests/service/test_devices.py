"""`service.devices`: the registered build's `--list-devices`, asked through the probe's runner
seam (recorded and constructed listings: tests/fixtures/list-devices/), merged with a recorded
NVML reading and a recorded sysfs tree."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from qmgui.core.backends import Backend
from qmgui.core.probe import RunOutput
from qmgui.service.devices import RETRIES, device_engine, read_machine, stored_listing
from tests.hw.fake_nvml import FakeNvml

FIXTURES = Path(__file__).parent.parent / "fixtures"
LISTINGS = FIXTURES / "list-devices"
TREE = str(FIXTURES / "sysfs" / "amd-dgpu-igpu-intel" / "drm")
NO_DRM = "/nonexistent-drm"


class Replay:
    """A runner that answers `--list-devices` with one fixture after another."""

    def __init__(self, *fixtures: str) -> None:
        self.fixtures = list(fixtures)
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout_s: float) -> RunOutput:
        self.calls.append(tuple(argv))
        name = self.fixtures[min(len(self.calls), len(self.fixtures)) - 1]
        text = (LISTINGS / name).read_text(encoding="utf-8")
        return RunOutput(tuple(argv), text, returncode=0, timeout_s=timeout_s)


@pytest.fixture
def exe(tmp_path: Path) -> str:
    path = tmp_path / "llama-server"
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def engine(exe: str, variant: str | None = None) -> Backend:
    return Backend("llama", "llama", exe, frozenset({"llm"}), variant=variant)


def test_mixed_machine_through_the_seams(exe: str) -> None:
    runner = Replay("vulkan-amd-nvidia-igpu.txt")
    machine = read_machine(
        device_engine([engine(exe)]), runner=runner,
        nvml=FakeNvml("two-gpus-with-processes.json"), drm_root=TREE, env={},
    )  # fmt: skip
    assert runner.calls == [(exe, "--list-devices")]
    assert machine.source == "engine" and machine.notes == ()
    assert [g.name for g in machine.gpus] == ["Vulkan0", "Vulkan1", "Vulkan2"]
    # free memory now: sysfs for the 7900 XTX, NVML for the 4090 (most of it in use)
    assert machine.gpus[0].free_bytes == 25753026560 - 1210056704
    assert machine.gpus[1].free_bytes == 4601151488


def test_no_devices_listed_while_nvml_sees_one_is_asked_again_then_warned(exe: str) -> None:
    runner = Replay("cpu-b10435-recorded.txt")
    slept: list[float] = []
    machine = read_machine(
        device_engine([engine(exe)]), runner=runner, nvml=FakeNvml("h200-real.json"),
        drm_root=NO_DRM, env={}, sleep=slept.append,
    )  # fmt: skip
    assert len(runner.calls) == 1 + RETRIES and len(slept) == RETRIES
    assert machine.source == "engine" and machine.gpus == ()
    (warning,) = machine.notes
    assert "NVIDIA H200" in warning and "CUDA_VISIBLE_DEVICES" in warning


def test_a_driver_that_answers_on_the_second_ask_is_believed(exe: str) -> None:
    runner = Replay("cpu-b10435-recorded.txt", "cuda-4090-3090.txt")
    machine = read_machine(
        device_engine([engine(exe)]), runner=runner,
        nvml=FakeNvml("two-gpus-with-processes.json"), drm_root=NO_DRM, env={},
        sleep=lambda s: None,
    )  # fmt: skip
    assert len(runner.calls) == 2
    assert [g.name for g in machine.gpus] == ["CUDA0", "CUDA1"] and machine.notes == ()


def test_no_gpu_on_the_host_is_not_asked_again(exe: str) -> None:
    runner = Replay("cpu-b10435-recorded.txt")
    machine = read_machine(
        device_engine([engine(exe)]), runner=runner, nvml=FakeNvml("no-driver.json"),
        drm_root=NO_DRM, env={}, sleep=lambda s: pytest.fail("slept"),
    )  # fmt: skip
    assert len(runner.calls) == 1 and machine.gpus == () and machine.notes == ()


def test_every_gpu_refused_is_said(exe: str) -> None:
    machine = read_machine(
        device_engine([engine(exe)]), runner=Replay("vulkan-llvmpipe.txt"),
        nvml=FakeNvml("no-driver.json"), drm_root=NO_DRM, env={},
    )  # fmt: skip
    assert machine.refused_all and machine.gpus == ()
    assert any("--device none" in n for n in machine.notes)


def test_an_engine_that_cannot_run_leaves_the_host_readings(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone" / "llama-server")
    machine = read_machine(
        device_engine([engine(missing)]), nvml=FakeNvml("two-gpus-with-processes.json"),
        drm_root=TREE, env={},
    )  # fmt: skip
    assert machine.source == "host"
    assert [g.name for g in machine.gpus] == ["GPU0", "GPU1", "GPU2"]
    (note,) = machine.notes
    assert missing in note and "--list-devices" in note
    # no registered llama-server: the host's readings, nothing to say
    machine = read_machine(None, nvml=FakeNvml("two-gpus-with-processes.json"), drm_root=TREE)
    assert machine.source == "host" and len(machine.gpus) == 3 and machine.notes == ()


def test_which_build_is_asked(exe: str) -> None:
    first = Backend("a", "llama", "/a/llama-server")
    star = Backend("b", "llama", "/b/llama-server", frozenset({"llm"}), variant="vulkan")
    other = Backend("v", "vllm", "/v/vllm", frozenset({"llm"}))
    assert device_engine([]) is None
    assert device_engine([other]) is None
    chosen = device_engine([first, star, other])
    assert chosen is not None and chosen.executable == "/b/llama-server"
    assert chosen.variant == "vulkan"
    chosen = device_engine([first, other])
    assert chosen is not None and chosen.executable == "/a/llama-server"
    chosen = device_engine([first, star], "a")
    assert chosen is not None and chosen.executable == "/a/llama-server"
    chosen = device_engine([first], "~/bin/llama-server")
    assert chosen is not None and chosen.executable == os.path.expanduser("~/bin/llama-server")
    assert device_engine([first, other], "v") is None


def test_the_registered_listing_without_probing() -> None:
    caps = {
        "devices_listed": True,
        "devices": [
            {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090", "total_mib": 24080,
             "free_mib": 23586},
            {"name": "CUDA1", "description": "bad", "total_mib": "lots", "free_mib": 1},
            "not a device",
        ],
    }  # fmt: skip
    listed = stored_listing(caps)
    assert listed is not None and [d.name for d in listed] == ["CUDA0"]
    assert stored_listing({"devices": []}) is None
    backend = Backend("a", "llama", "/nowhere/llama-server", capabilities=caps)
    machine = read_machine(
        device_engine([backend]), probe_engine=False,
        runner=lambda argv, timeout_s: pytest.fail("probed"), nvml=FakeNvml("no-driver.json"),
        drm_root=NO_DRM,
    )  # fmt: skip
    assert [(g.name, g.available) for g in machine.gpus] == [("CUDA0", 23586 << 20)]
