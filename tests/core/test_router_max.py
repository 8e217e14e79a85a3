"""`--models-max` from the memory budget: the largest k such that the k largest fit together."""

from __future__ import annotations

from qmgui.core.fit import Budget, gpus_from_sizes
from qmgui.core.footprint import CPU, DeviceFootprint, Footprint
from qmgui.core.launch import LaunchSettings
from qmgui.core.router import Sized, models_max

GIB = 1 << 30


def sized(name: str, gpu: int, host: int = 0) -> Sized:
    fp = Footprint(
        settings=None,  # type: ignore[arg-type]
        n_gpu_layers=99,
        layer_devices=(),
        devices=(DeviceFootprint("GPU0", weights=gpu), DeviceFootprint(CPU, kv=host)),
    )
    return Sized(name, LaunchSettings(), fp)


def test_the_largest_that_fit_together() -> None:
    budget = Budget(gpus=gpus_from_sizes([10 * GIB]), gpu_reserve=0)
    models = [sized("a", 2 * GIB), sized("b", 5 * GIB), sized("c", 4 * GIB), sized("d", 1 * GIB)]
    # 5 + 4 = 9 fits, 5 + 4 + 2 = 11 does not: any two fit, not every three
    assert models_max(models, budget) == 2
    assert models_max(models, Budget(gpus=gpus_from_sizes([11 * GIB]), gpu_reserve=0)) == 3
    assert models_max(models, Budget(gpus=gpus_from_sizes([64 * GIB]), gpu_reserve=0)) == 4


def test_host_memory_counts_and_at_least_one() -> None:
    budget = Budget(gpus=(), host_bytes=3 * GIB)
    models = [sized("a", 0, 2 * GIB), sized("b", 0, 2 * GIB)]
    assert models_max(models, budget) == 1
    assert models_max([sized("huge", 0, 9 * GIB)], budget) == 1  # its own load says why
    assert models_max(models, Budget()) == 2  # nothing checked: all of them
    unsized = Sized("x", LaunchSettings(), None)
    assert models_max([unsized, *models], Budget(host_bytes=5 * GIB)) == 3
