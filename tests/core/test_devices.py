"""`core.devices`: the engine's `--list-devices` of every vendor, merged with the host's live
readings (fixtures: tests/fixtures/list-devices/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.core.devices import (
    AMD,
    NVIDIA,
    OS_RESERVE,
    HostGpu,
    Machine,
    host_budget,
    merge,
    os_floor,
    unseen_warning,
    vendor_of,
)
from qmgui.core.emit import DevicePin
from qmgui.core.probe import EngineDevice, parse_devices

LISTINGS = Path(__file__).parent.parent / "fixtures" / "list-devices"
GIB = 1 << 30
MIB = 1 << 20


def listing(name: str) -> tuple[EngineDevice, ...]:
    devices = parse_devices((LISTINGS / name).read_text(encoding="utf-8"))
    assert devices is not None, name
    return devices


# the recorded 4090 + 3090 (tests/fixtures/nvml/two-gpus-with-processes.json) and the RX 7900
# XTX and 7840U iGPU of tests/fixtures/sysfs/amd-dgpu-igpu-intel, as the hw readers give them
RTX4090 = HostGpu(NVIDIA, "NVIDIA GeForce RTX 4090", 25757220864, 4601151488, 0, None, frozenset())
RTX3090 = HostGpu(NVIDIA, "NVIDIA GeForce RTX 3090", 25769803776, 3980394496, 1, None, frozenset())
XTX = HostGpu(AMD, "AMD Radeon RX 7900 XTX", 25753026560, 25753026560 - 1210056704, 0)
IGPU = HostGpu(AMD, "AMD GPU (1002:15bf)", 536870912, 536870912 - 94371840, 1, integrated=True)


@pytest.mark.parametrize(
    ("fixture", "names", "backend", "vendor"),
    [
        ("cuda-4090-3090.txt", ["CUDA0", "CUDA1"], "cuda", NVIDIA),
        ("rocm-7900xtx.txt", ["ROCm0"], "rocm", AMD),
        ("sycl-arc-a770.txt", ["SYCL0"], "sycl", "intel"),
        ("metal-m2-max.txt", ["MTL0"], "metal", "apple"),
        ("vulkan-intel-igpu.txt", ["Vulkan0"], "vulkan", "intel"),
        ("cpu-b10435-recorded.txt", [], None, None),
    ],
)
def test_every_vendors_listing_is_read(
    fixture: str, names: list[str], backend: str | None, vendor: str | None
) -> None:
    devices = listing(fixture)
    assert [d.name for d in devices] == names
    assert all(d.backend == backend and vendor_of(d) == vendor for d in devices)
    assert all(0 < d.free_mib <= d.total_mib for d in devices)


def test_the_recorded_cpu_engine_lists_no_device_and_is_believed() -> None:
    """The real b10435 CPU build printed `Available devices:` then `(none)`: an answer (no
    GPUs), not a missing listing; with a GPU on the host it is still no card to plan for."""
    text = (LISTINGS / "cpu-b10435-recorded.txt").read_text(encoding="utf-8")
    assert "Available devices:" in text and "(none)" in text
    machine = Machine("engine", merge(listing("cpu-b10435-recorded.txt"), [RTX4090]), (RTX4090,))
    assert machine.gpus == () and machine.unified and not machine.refused_all
    assert machine.unseen == (RTX4090,)


def test_mixed_nvidia_and_amd_keep_the_engines_numbering() -> None:
    """A Vulkan build lists the RX 7900 XTX first: it is Vulkan0 (the host's readers number
    NVIDIA first, which made it GPU2); free memory is NVML's and sysfs's, not the engine's;
    the 780M iGPU is host memory."""
    host = (RTX4090, RTX3090, XTX, IGPU)
    devices = merge(listing("vulkan-amd-nvidia-igpu.txt"), host)
    machine = Machine("engine", devices, host)
    assert [(d.name, d.vendor, d.free_from) for d in devices] == [
        ("Vulkan0", AMD, "sysfs"),
        ("Vulkan1", NVIDIA, "nvml"),
        ("Vulkan2", NVIDIA, "nvml"),
        ("Vulkan3", AMD, "engine"),
    ]
    assert devices[3].unified and not devices[3].planned
    gpus = machine.gpus
    assert [g.name for g in gpus] == ["Vulkan0", "Vulkan1", "Vulkan2"]
    assert gpus[0].free_bytes == XTX.free_bytes and gpus[1].free_bytes == RTX4090.free_bytes
    assert gpus[0].total_bytes == 24560 * MIB  # the memory the engine can use
    assert all(g.backend == "vulkan" for g in gpus)
    assert gpus[1].nvlink == frozenset() and gpus[0].nvlink is None
    assert machine.unseen == () and not machine.refused_all
    # the 7900 XTX's pin is the engine's Vulkan0, not its position among the host's GPUs
    pin = DevicePin.for_devices(["Vulkan0"], gpus, "vulkan")
    assert pin is not None and pin.names == "Vulkan0"
    pin = DevicePin.for_devices(["Vulkan2"], gpus[1:], None)
    assert pin is not None and pin.names == "Vulkan2" and pin.api == "vulkan"


def test_cuda_devices_are_matched_by_name_whatever_their_order() -> None:
    devices = merge(listing("cuda-swapped-order.txt"), (RTX4090, RTX3090))
    assert [(d.name, d.host) for d in devices] == [("CUDA0", RTX3090), ("CUDA1", RTX4090)]
    assert devices[0].free_bytes == RTX3090.free_bytes
    pin = DevicePin.for_devices(["CUDA1"], Machine("engine", devices, ()).gpus, "cuda")
    assert pin is not None and pin.env() == {"CUDA_VISIBLE_DEVICES": "1"}


def test_rocm_is_matched_to_sysfs_and_an_unnamed_card_by_its_memory() -> None:
    (d,) = merge(listing("rocm-7900xtx.txt"), (XTX, IGPU))
    assert d.host == XTX and d.free_bytes == XTX.free_bytes and d.planned
    nameless = HostGpu(AMD, "AMD GPU (1002:744c)", XTX.total_bytes, 5 * GIB, 3)
    (d,) = merge(listing("rocm-7900xtx.txt"), (nameless,))
    assert d.host == nameless and d.free_bytes == 5 * GIB
    small = HostGpu(AMD, "AMD GPU (1002:73ff)", 8 * GIB, 8 * GIB, 3)  # another card
    (d,) = merge(listing("rocm-7900xtx.txt"), (small,))
    assert d.host is None and d.free_from == "engine"


def test_unified_memory_devices_place_in_host_memory() -> None:
    for fixture in ("metal-m2-max.txt", "vulkan-intel-igpu.txt"):
        machine = Machine("engine", merge(listing(fixture), ()), ())
        assert machine.gpus == () and machine.unified and not machine.refused_all, fixture
    # an Arc A770 is a card (SYCL), the engine's free memory stands
    machine = Machine("engine", merge(listing("sycl-arc-a770.txt"), ()), ())
    assert [(g.name, g.available) for g in machine.gpus] == [("SYCL0", 15473 * MIB)]


def test_every_gpu_refused_pins_the_cpu() -> None:
    machine = Machine("engine", merge(listing("vulkan-llvmpipe.txt"), ()), ())
    assert machine.refused_all and machine.gpus == ()
    assert "software" in (machine.devices[0].refused or "")
    pin = DevicePin.none("vulkan")
    assert pin.names == "none" and pin.env() is None
    assert DevicePin.none("cuda").env() == {"CUDA_VISIBLE_DEVICES": ""}
    # a listing with no devices refused nothing
    assert not Machine("engine", merge(listing("cpu-b10435-recorded.txt"), ()), ()).refused_all


def test_one_gpu_through_two_apis_is_planned_once() -> None:
    devices = merge(listing("cuda-and-vulkan.txt"), (RTX4090,))
    assert [d.refused for d in devices] == [None, "the same GPU as CUDA0"]
    assert [g.name for g in Machine("engine", devices, (RTX4090,)).gpus] == ["CUDA0"]


def test_a_gpu_the_engine_did_not_list_is_named_with_its_visibility_variable() -> None:
    machine = Machine("engine", merge(listing("rocm-7900xtx.txt"), (RTX4090, XTX)),
                      (RTX4090, XTX), engine="/opt/llama/llama-server")  # fmt: skip
    warning = unseen_warning(machine, {"CUDA_VISIBLE_DEVICES": ""})
    assert warning is not None
    assert "NVIDIA" in warning and "RTX 4090" in warning and "CUDA_VISIBLE_DEVICES" in warning
    assert "CUDA_VISIBLE_DEVICES='' is set here" in warning
    assert "HIP_VISIBLE_DEVICES" not in warning  # the 7900 XTX was listed
    empty = Machine("engine", (), (XTX,), engine="llama-server")
    warning = unseen_warning(empty, {}, vulkan=True)
    assert warning is not None and "listed no devices" in warning
    assert "HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES" in warning
    assert "GGML_VK_VISIBLE_DEVICES" in warning
    listed = Machine("engine", merge(listing("cuda-4090-3090.txt"), (RTX4090, RTX3090)),
                     (RTX4090, RTX3090, IGPU))  # fmt: skip
    assert unseen_warning(listed, {}) is None  # every card listed; the iGPU is host memory


def test_the_host_readings_stand_in_without_an_engine() -> None:
    machine = Machine("host", host=(RTX4090, RTX3090, XTX, IGPU))
    assert [g.name for g in machine.gpus] == ["GPU0", "GPU1", "GPU2"]
    assert machine.unseen == ()  # nothing to compare against


@pytest.mark.parametrize(
    ("total", "floor"),
    [(64 * GIB, OS_RESERVE), (8 * GIB, OS_RESERVE), (4 * GIB, GIB), (2 * GIB, GIB // 2),
     (None, OS_RESERVE)],
)  # fmt: skip
def test_the_os_floor_is_the_reserve_capped_at_a_quarter_of_ram(
    total: int | None, floor: int
) -> None:
    assert os_floor(total) == floor
    assert host_budget(3 * GIB, total) == max(3 * GIB - floor, 0)
    assert host_budget(None, total) is None
    assert os_floor(64 * GIB, reserve=8 * GIB) == 8 * GIB
    assert os_floor(16 * GIB, reserve=8 * GIB) == 4 * GIB


def test_hostile_listings_are_bounded() -> None:
    huge = "9" * 5000
    text = "\n".join(
        [
            "Available devices:",
            f"  CUDA0: big ({huge} MiB, {huge} MiB free)",  # int() would refuse 5000 digits
            "  CUDA1: " + "x" * 5000 + " (1 MiB, 1 MiB free)",
            "  CUDA2: evil\x1b[2Jname (24000 MiB, 1000 MiB free)",
            *(f"  Vulkan{i}: card (1024 MiB, 1024 MiB free)" for i in range(200)),
        ]
    )
    devices = parse_devices(text)
    assert devices is not None
    assert devices[0].name == "CUDA2" and "\x1b" not in devices[0].description
    assert len(devices) == 64
    machine = Machine("engine", merge(devices, ()), ())
    assert len(machine.gpus) == 64
