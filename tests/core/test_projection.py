"""Reading llama-server's own projection (`-fit on`'s memory breakdown) and comparing it."""

from __future__ import annotations

from qmgui.core.footprint import DeviceFootprint
from qmgui.core.projection import ProjectedDevice, compared, parse_projection
from qmgui.core.units import MIB

# the format of common/fit.cpp (b11434): a GPU row, the host row; then -fit's second table
LOG = """\
0.00.010.591 I common_params_fit_impl: getting device memory data for initial parameters:
0.00.018.329 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.018.330 I common_memory_breakdown_print: |   - CUDA0 (H200)       | 143140 = 140000 + (3000 = 2000 + 500 + 500) + 140 |
0.00.018.359 I common_memory_breakdown_print: |   - Host               |                    6 =     0 +       1 +       5                |
0.00.018.728 I common_params_fit_impl: projected to use 3006 MiB of device memory
0.00.019.329 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.019.330 I common_memory_breakdown_print: |   - CUDA0 (H200)       | 143140 = 1 + (9 = 9 + 0 + 0) + 0 |
"""  # noqa: E501 - the engine's own lines


def test_the_first_table_is_read() -> None:
    assert parse_projection(LOG) == (
        ProjectedDevice("CUDA0 (H200)", 2000, 500, 500, 143140, 140000),
        ProjectedDevice("Host", 0, 1, 5),
    )
    assert parse_projection("no table here\n") == ()


def test_compared_matches_devices_in_order_and_floors() -> None:
    planned = (  # context is KV + recurrent state + output
        DeviceFootprint("GPU0", weights=2000 * MIB + 5, kv=400 * MIB, output=100 * MIB,
                        compute=500 * MIB + MIB // 2),  # within the floor: agrees
        DeviceFootprint("CPU", kv=MIB, compute=7 * MIB),  # 2 MiB more compute: differs
    )  # fmt: skip
    gpu, host = compared(parse_projection(LOG), planned)
    assert gpu["device"] == "GPU0" and gpu["engine_device"] == "CUDA0 (H200)" and gpu["agrees"]
    assert host["device"] == "CPU" and not host["agrees"]
    assert host["difference_mib"] == [0.0, 0.0, 2.0]
