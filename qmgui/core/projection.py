"""llama-server's own projection of a launch: what `-fit on` prints before it loads anything
(`common_memory_breakdown_print`, whole MiB per device), read so qmgui's plan can be shown
beside it (`qmgui plan --check`). Pure: the engine is run by `qmgui.engines.fit_check`.

    | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
    |   - CUDA0 (H200)       | 143140 = 140000 + (3000 = 2000 + 500 + 500) + 140 |
    |   - Host               |                    6 =     0 +       1 +       5                |

The first table is the projection for the settings given (later ones follow `-fit`'s own
changes, which a fully given command does not need)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from qmgui.core.footprint import DeviceFootprint
from qmgui.core.units import MIB

MARK = "common_memory_breakdown_print:"
_GPU = re.compile(
    r"\|\s*-\s*(?P<name>[^|]+?)\s*\|\s*(?P<total>\d+)\s*=\s*(?P<free>\d+)\s*\+\s*\(\s*"
    r"(?P<self>\d+)\s*=\s*(?P<model>\d+)\s*\+\s*(?P<context>\d+)\s*\+\s*(?P<compute>\d+)\s*\)"
)
_OTHER = re.compile(
    r"\|\s*-\s*(?P<name>[^|]+?)\s*\|\s*(?P<self>\d+)\s*=\s*(?P<model>\d+)\s*\+\s*"
    r"(?P<context>\d+)\s*\+\s*(?P<compute>\d+)\s*\|"
)
HEADER = "memory breakdown [MiB]"


@dataclass(frozen=True)
class ProjectedDevice:
    name: str  # as llama.cpp names it: "CUDA0 (H200)", "Host"
    model_mib: int
    context_mib: int  # KV cache, recurrent state and output
    compute_mib: int
    total_mib: int | None = None  # a GPU's memory (None for the host)
    free_mib: int | None = None

    @property
    def self_mib(self) -> int:
        return self.model_mib + self.context_mib + self.compute_mib

    @property
    def is_host(self) -> bool:
        return self.name == "Host"


def parse_projection(log: str) -> tuple[ProjectedDevice, ...]:
    """The devices of the first breakdown table in `log` (() when it printed none)."""
    devices: list[ProjectedDevice] = []
    started = False
    for line in log.splitlines():
        if MARK not in line:
            if started and devices:
                break  # the first table ended
            continue
        body = line.split(MARK, 1)[1]
        if HEADER in body:
            if started and devices:
                break  # a second table: -fit's own adjustments
            started = True
            continue
        if not started:
            continue
        if m := _GPU.search(body):
            parts = (int(m["model"]), int(m["context"]), int(m["compute"]))
            devices.append(ProjectedDevice(m["name"], *parts, int(m["total"]), int(m["free"])))
        elif m := _OTHER.search(body):
            devices.append(
                ProjectedDevice(m["name"], int(m["model"]), int(m["context"]), int(m["compute"]))
            )
    return tuple(devices)


def compared(
    projection: tuple[ProjectedDevice, ...], devices: Sequence[DeviceFootprint]
) -> list[dict[str, object]]:
    """Each device side by side: the plan's weights, context (KV, recurrent state, output)
    and compute per device ("GPU0"…, "CPU") against the engine's MiB, matched in order
    (GPUs, then the host). The engine floors to whole MiB, so a difference under 1 MiB per
    part is agreement."""
    planned = {d.name: (d.weights, d.kv + d.recurrent + d.output, d.compute) for d in devices}
    gpus = [d for d in projection if not d.is_host]
    host = next((d for d in projection if d.is_host), None)
    names = [n for n in planned if n != "CPU"]
    pairs = list(zip(names, gpus, strict=False))
    if host is not None and "CPU" in planned:
        pairs.append(("CPU", host))
    rows = []
    for name, dev in pairs:
        weights, context, compute = planned[name]
        ours = (weights / MIB, context / MIB, compute / MIB)
        theirs = (dev.model_mib, dev.context_mib, dev.compute_mib)
        rows.append(
            {
                "device": name,
                "engine_device": dev.name,
                "planned_mib": [round(x, 2) for x in ours],
                "engine_mib": list(theirs),
                "difference_mib": [round(o - t, 2) for o, t in zip(ours, theirs, strict=True)],
                "agrees": all(0 <= o - t < 1 for o, t in zip(ours, theirs, strict=True)),
            }
        )
    return rows
