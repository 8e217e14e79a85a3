"""Planned vs actual memory per device after a launch, and a store of the differences.

`readback(log_text, footprint, nvml)` lines the plan (`core.footprint.estimate`) up with what
the engine's log says it allocated (`core.readback.parse_llama_log`), per device: the planned
GPUs in order map to the engine's GPU devices in order (`CUDA0`, `CUDA1`, `Vulkan0`…), the host
row is `CPU` on both sides. With an NVML reading and the engine's pids (`engine_pids`: the
engine and its descendants) each row of the i-th planned GPU also carries the bytes NVML says
those processes hold on NVML GPU i, and `processes` lists every such figure.

`ResidualStore` keeps actual − planned per buffer kind (summed over the matched devices), keyed
by machine (hostname), engine build and model architecture, as a running mean, in
`residuals.json` under the run registry's state folder. It is written atomically; a file that
cannot be read is moved aside and reported. The sizing code may read a correction with
`read_residuals` (it does not yet).

The same store keeps the engine checks (`qmgui plan --check`, the window's "Check with the
engine": `check_launch`): llama-server's own projection of a launch (`-fit on`, stopped before
it loads anything) beside qmgui's plan, per device and part (weights, context, compute) in
MiB. A projection is not an allocation, so these entries are apart: keyed
`check|machine|build|architecture`, marked `"source": "check"` (a launch's readback is
`"source": "launch"`; entries written before the mark have none and are readbacks), with
MiB figures where a readback has bytes. `read`/`read_residuals` never return them; `summary`
lists both kinds, each as what it is.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from qmgui import notify
from qmgui.core.footprint import CPU, DeviceFootprint, Footprint
from qmgui.core.readback import DeviceReport, EngineReport, parse_llama_log
from qmgui.core.units import format_bytes
from qmgui.engines.json_store import JsonStore
from qmgui.engines.registry import state_dir
from qmgui.hw.nvml import NvmlReading

if TYPE_CHECKING:
    from qmgui.core.meta import ModelMeta
    from qmgui.engines.fit_check import FitCheck

FILE_NAME = "residuals.json"
VERSION = 1
# "other" compares the plan's bound on repacked weight copies with the engine's repack buffers
# (AMX, CPU_REPACK), so "weights" compares the mapped span with the mapped span
KINDS = ("weights", "kv", "compute", "output", "other")
_SOURCE = "engines"
# a buffer beyond the plan by more than the engine's print precision (it prints MiB with two
# decimals) plus this share of the planned size is an overrun: said, never silently absorbed
OVERRUN_SHARE = 0.02
PRINT_PRECISION = 10486  # 0.01 MiB
_INDEX = re.compile(r"(\d+)$")
LAUNCH, CHECK = "launch", "check"  # an entry's "source": a launch's readback, an engine check
# an engine check compares the projection's three parts (context: KV, recurrent state, output)
CHECK_PARTS = ("weights", "context", "compute")
CHECK_PREFIX = f"{CHECK}|"
RECENT_CHECKS = 10  # the last checks kept in full per key (model, settings, devices)


def _planned(d: DeviceFootprint) -> dict[str, int]:
    return {
        "weights": d.weights,
        "kv": d.kv + d.recurrent,
        "compute": d.compute,
        "output": d.output,
        "other": d.repack_bound,
    }


def _actual(d: DeviceReport) -> dict[str, int]:
    return {
        "weights": d.model.bytes,
        "kv": d.kv.bytes + d.recurrent.bytes,
        "compute": d.compute.bytes,
        "output": d.output.bytes,
        "other": d.repack.bytes,
    }


@dataclass(frozen=True)
class ProcessGpu:
    """Memory NVML says one of the engine's processes holds on one GPU."""

    gpu_index: int
    gpu_name: str
    pid: int
    used_bytes: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "gpu_index": self.gpu_index,
            "gpu_name": self.gpu_name,
            "pid": self.pid,
            "used_bytes": self.used_bytes,
        }


@dataclass(frozen=True)
class DeviceRow:
    """One device: the plan's name, the engine's, both breakdowns (None when one side has no
    such device) and, for a GPU, what NVML says the engine's processes hold there."""

    name: str
    engine_device: str | None
    planned: Mapping[str, int] | None
    actual: Mapping[str, int] | None
    nvml_bytes: int | None = None

    @property
    def residual(self) -> dict[str, int] | None:
        """actual − planned per buffer kind, when both sides exist."""
        if self.planned is None or self.actual is None:
            return None
        return {k: self.actual.get(k, 0) - self.planned.get(k, 0) for k in KINDS}

    def to_json(self) -> dict[str, object]:
        def total(m: Mapping[str, int] | None) -> int | None:
            return None if m is None else sum(m.values())

        return {
            "name": self.name,
            "engine_device": self.engine_device,
            "planned": None
            if self.planned is None
            else {**self.planned, "total": total(self.planned)},
            "actual": None if self.actual is None else {**self.actual, "total": total(self.actual)},
            "residual": self.residual,
            "nvml_bytes": self.nvml_bytes,
        }


@dataclass(frozen=True)
class Readback:
    rows: tuple[DeviceRow, ...]
    processes: tuple[ProcessGpu, ...] = ()
    build: str | None = None  # "b1234-abcdef0", from the log
    architecture: str | None = None
    notes: tuple[str, ...] = field(default=())

    def residuals(self) -> dict[str, int]:
        """actual − planned per buffer kind, summed over the devices both sides have."""
        out = dict.fromkeys(KINDS, 0)
        for row in self.rows:
            for k, v in (row.residual or {}).items():
                out[k] += v
        return out

    @property
    def comparable(self) -> bool:
        return any(r.residual is not None for r in self.rows)

    def overruns(self) -> tuple[str, ...]:
        """Each buffer the engine allocated beyond the plan by more than the print precision
        plus 2%, as a sentence ("GPU0 compute: the engine allocated …")."""
        out = []
        for row in self.rows:
            if row.planned is None or row.actual is None:
                continue
            for kind in KINDS:
                planned, actual = row.planned.get(kind, 0), row.actual.get(kind, 0)
                over = actual - planned
                if over <= PRINT_PRECISION + OVERRUN_SHARE * planned:
                    continue
                share = f" ({over / planned:.0%})" if planned else ""
                what = "weight copies" if kind == "other" else kind
                out.append(
                    f"{row.name} {what}: the engine allocated {format_bytes(actual)}, "
                    f"{format_bytes(over)}{share} more than planned ({format_bytes(planned)}); "
                    "a fuller card may not hold what the plan says fits"
                )
        return tuple(out)

    def to_json(self) -> dict[str, object]:
        return {
            "build": self.build,
            "architecture": self.architecture,
            "devices": [r.to_json() for r in self.rows],
            "residuals": self.residuals() if self.comparable else None,
            "overruns": list(self.overruns()),
            "nvml_processes": [p.to_json() for p in self.processes],
            "notes": list(self.notes),
        }


def engine_pids(pid: int | None) -> frozenset[int]:
    """`pid` and its descendants now (an engine may put its GPU work in a child)."""
    if pid is None:
        return frozenset()
    try:
        root = psutil.Process(pid)
        return frozenset({pid, *(c.pid for c in root.children(recursive=True))})
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return frozenset({pid})


def _gpu_order(name: str) -> tuple[int, str]:
    m = _INDEX.search(name)
    return (int(m.group(1)) if m else 1 << 30, name)


def _build_key(report: EngineReport) -> str | None:
    if report.build is None:
        return None
    return f"b{report.build.number}-{report.build.commit}"


def readback(
    log_text: str,
    footprint: Footprint,
    nvml: NvmlReading | None = None,
    *,
    pids: Iterable[int] = (),
) -> Readback:
    """Planned vs actual per device; see the module text for the mapping."""
    report = parse_llama_log(log_text)
    planned_gpus = [d for d in footprint.devices if d.name != CPU]
    engine_gpus = sorted(
        (d for d in report.devices if d.device != CPU), key=lambda d: _gpu_order(d.device)
    )
    notes: list[str] = []
    if len(planned_gpus) != len(engine_gpus) and report.devices:
        notes.append(
            f"the plan has {len(planned_gpus)} GPU(s) and the engine reported "
            f"{len(engine_gpus)}; devices are matched in order"
        )
    wanted = frozenset(pids)
    processes: list[ProcessGpu] = []
    per_gpu: dict[int, int] = {}
    if nvml is not None and nvml.ok and wanted:
        for gpu in nvml.gpus:
            for p in gpu.processes:
                if p.pid in wanted:
                    processes.append(ProcessGpu(gpu.index, gpu.name, p.pid, p.used_bytes))
                    if p.used_bytes is not None:
                        per_gpu[gpu.index] = per_gpu.get(gpu.index, 0) + p.used_bytes
    rows: list[DeviceRow] = []
    for i in range(max(len(planned_gpus), len(engine_gpus))):
        plan = planned_gpus[i] if i < len(planned_gpus) else None
        eng = engine_gpus[i] if i < len(engine_gpus) else None
        name = plan.name if plan is not None else eng.device if eng is not None else "?"
        rows.append(
            DeviceRow(
                name,
                eng.device if eng is not None else None,
                _planned(plan) if plan is not None else None,
                _actual(eng) if eng is not None else None,
                per_gpu.get(i),
            )
        )
    host_plan = next((d for d in footprint.devices if d.name == CPU), None)
    host_eng = report.device(CPU)
    if host_plan is not None or host_eng is not None:
        rows.append(
            DeviceRow(
                CPU,
                CPU if host_eng is not None else None,
                _planned(host_plan) if host_plan is not None else None,
                _actual(host_eng) if host_eng is not None else None,
            )
        )
    return Readback(
        tuple(rows), tuple(processes), _build_key(report), report.architecture, tuple(notes)
    )


@dataclass(frozen=True)
class CheckRow:
    """One device of an engine check: qmgui's plan and llama-server's projection in MiB per
    part (weights, context, compute). The engine prints whole MiB, floored: a plan within
    [0, 1) MiB above it agrees."""

    device: str  # the plan's name: "GPU0", "CPU"
    engine_device: str  # the engine's: "CUDA0 (H200)", "Host"
    planned_mib: tuple[float, float, float]
    engine_mib: tuple[int, int, int]

    @property
    def residual_mib(self) -> dict[str, float]:
        """engine − planned per part: the sign of a readback's actual − planned."""
        return {
            k: round(e - p, 2)
            for k, p, e in zip(CHECK_PARTS, self.planned_mib, self.engine_mib, strict=True)
        }

    @property
    def agrees(self) -> bool:
        return all(0 <= p - e < 1 for p, e in zip(self.planned_mib, self.engine_mib, strict=True))

    def to_json(self) -> dict[str, object]:
        """The row as `core.projection.compared` gives it, with the residual added."""
        return {
            "device": self.device,
            "engine_device": self.engine_device,
            "planned_mib": list(self.planned_mib),
            "engine_mib": list(self.engine_mib),
            "difference_mib": [
                round(p - e, 2) for p, e in zip(self.planned_mib, self.engine_mib, strict=True)
            ],
            "residual_mib": self.residual_mib,
            "agrees": self.agrees,
        }


@dataclass(frozen=True)
class EngineCheck:
    """llama-server's projection of a launch beside qmgui's plan: a projection, not an
    allocation (see the module text)."""

    rows: tuple[CheckRow, ...]
    build: str | None = None  # "b1234-abcdef0", from the engine's log
    architecture: str | None = None
    model: str | None = None  # the model's file name
    settings: Mapping[str, object] = field(default_factory=dict)  # as resolved, with -ngl
    error: str = ""  # why there is no projection

    @property
    def comparable(self) -> bool:
        return bool(self.rows)

    def residuals_mib(self) -> dict[str, float]:
        """engine − planned MiB per part, summed over the devices."""
        out = dict.fromkeys(CHECK_PARTS, 0.0)
        for row in self.rows:
            for k, v in row.residual_mib.items():
                out[k] = round(out[k] + v, 2)
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "source": CHECK,
            "build": self.build,
            "architecture": self.architecture,
            "model": self.model,
            "settings": dict(self.settings),
            "devices": [r.to_json() for r in self.rows],
            "residuals_mib": self.residuals_mib() if self.comparable else None,
            "error": self.error or None,
        }


def _settings_json(footprint: Footprint) -> dict[str, object]:
    resolved = footprint.settings
    out: dict[str, object] = {} if resolved is None else dict(vars(resolved))
    out["n_gpu_layers"] = footprint.n_gpu_layers
    return out


def engine_check(
    fit: FitCheck, footprint: Footprint, *, meta: ModelMeta | None = None,
    model: str | None = None,
) -> EngineCheck:  # fmt: skip
    """The projection `fit` beside the plan `footprint` (its devices matched as
    `core.projection.compared` matches them); the build from the engine's log, the
    architecture from `meta` (the log of a projection does not name it); `model` (the
    file's name) or else the model's own name."""
    from qmgui.core.projection import compared  # noqa: PLC0415 - with a check only

    rows = tuple(
        CheckRow(
            str(r["device"]),
            str(r["engine_device"]),
            tuple(r["planned_mib"]),  # type: ignore[arg-type]
            tuple(r["engine_mib"]),  # type: ignore[arg-type]
        )
        for r in compared(fit.devices, footprint.devices)
    )
    report = parse_llama_log(fit.log)
    return EngineCheck(
        rows,
        _build_key(report),
        meta.architecture if meta is not None else report.architecture,
        model or (meta.name if meta is not None else None),
        _settings_json(footprint),
        fit.error,
    )


def machine_name() -> str:
    return socket.gethostname() or "unknown"


def _key(machine: str, build: str | None, architecture: str | None) -> str:
    return f"{machine}|{build or 'unknown'}|{architecture or 'unknown'}"


class ResidualStore:
    """Thread-safe and process-safe (a file lock beside the store around each
    read-modify-write: the window and `qmgui serve` record at the same time); every change is
    written atomically."""

    def __init__(
        self, path: Path | None = None, *, notifier: notify.Notifier | None = None
    ) -> None:
        self.path = path or state_dir() / FILE_NAME
        self._file = JsonStore(
            self.path, key="entries", version=VERSION, what="the memory residual store",
            source=_SOURCE, notifier=notifier,
        )  # fmt: skip

    def record(self, result: Readback, *, machine: str | None = None) -> dict[str, Any] | None:
        """Fold `result`'s residuals into the running mean of its key; the new entry, or None
        when there was nothing to compare (no device on both sides). OSError when it cannot
        be written."""
        if not result.comparable:
            return None
        machine = machine or machine_name()
        key = _key(machine, result.build, result.architecture)
        residuals = result.residuals()
        with self._file.changing() as entries:
            old = entries.get(key) or {}
            n = int(old.get("samples", 0)) if isinstance(old, dict) else 0
            mean = old.get("mean", {}) if isinstance(old, dict) else {}
            new_mean = {
                k: round((float(mean.get(k, 0)) * n + residuals[k]) / (n + 1)) for k in KINDS
            }
            entry = {
                "source": LAUNCH,
                "machine": machine,
                "build": result.build,
                "architecture": result.architecture,
                "samples": n + 1,
                "mean": new_mean,
                "last": residuals,
                # buffers beyond the plan (print precision + 2%): how often, and the last ones
                "overruns": int(old.get("overruns", 0) if isinstance(old, dict) else 0)
                + bool(result.overruns()),
                "last_overruns": list(result.overruns()),
                "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            entries[key] = entry
        return entry

    def record_check(
        self, check: EngineCheck, *, machine: str | None = None
    ) -> dict[str, Any] | None:
        """Fold an engine check into its own entry (`check|machine|build|architecture`,
        `"source": "check"`): the running mean of engine − planned MiB per part, how many
        agreed on every device, and the last few checks in full. None when the engine gave
        no projection. OSError when it cannot be written."""
        if not check.comparable:
            return None
        machine = machine or machine_name()
        key = CHECK_PREFIX + _key(machine, check.build, check.architecture)
        residuals = check.residuals_mib()
        agrees = all(r.agrees for r in check.rows)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._file.changing() as entries:
            old = entries.get(key)
            old = old if isinstance(old, dict) else {}
            n = int(old.get("samples", 0))
            mean = old.get("mean_mib", {})
            mean = mean if isinstance(mean, dict) else {}
            recent = old.get("recent", [])
            recent = recent if isinstance(recent, list) else []
            one = {
                "model": check.model,
                "settings": dict(check.settings),
                "devices": [r.to_json() for r in check.rows],
                "residuals_mib": residuals,
                "agrees": agrees,
                "updated": now,
            }
            entry = {
                "source": CHECK,
                "machine": machine,
                "build": check.build,
                "architecture": check.architecture,
                "samples": n + 1,
                "mean_mib": {
                    k: round((float(mean.get(k, 0)) * n + residuals[k]) / (n + 1), 2)
                    for k in CHECK_PARTS
                },
                "last_mib": residuals,
                "agreed": int(old.get("agreed", 0)) + agrees,
                "recent": [*recent, one][-RECENT_CHECKS:],
                "updated": now,
            }
            entries[key] = entry
        return entry

    def summary(self) -> dict[str, list[dict[str, Any]]]:
        """Every entry, apart by source: `launch` (readbacks: bytes the engine allocated
        against the plan; an entry without a source is one) and `check` (the engine's
        projections against the plan, MiB). Newest first."""
        out: dict[str, list[dict[str, Any]]] = {LAUNCH: [], CHECK: []}
        for entry in self._file.read().values():
            if not isinstance(entry, dict):
                continue
            source = entry.get("source", LAUNCH)
            if source in out:
                out[source].append(entry)
        for entries in out.values():
            entries.sort(key=lambda e: str(e.get("updated", "")), reverse=True)
        return out

    def read(
        self, *, build: str | None, architecture: str | None, machine: str | None = None
    ) -> dict[str, int] | None:
        """The mean actual − planned bytes per buffer kind for this key, or None (a launch's
        readbacks only: an engine check is a projection, not an allocation)."""
        entry = self._file.read().get(_key(machine or machine_name(), build, architecture))
        if not isinstance(entry, dict) or entry.get("source", LAUNCH) != LAUNCH:
            return None
        mean = entry.get("mean")
        if not isinstance(mean, dict):
            return None
        return {k: int(mean.get(k, 0)) for k in KINDS}


def read_residuals(
    *,
    build: str | None,
    architecture: str | None,
    machine: str | None = None,
    path: Path | None = None,
) -> dict[str, int] | None:
    """A correction for the sizing code: mean actual − planned per buffer kind, or None."""
    return ResidualStore(path).read(build=build, architecture=architecture, machine=machine)


__all__ = [
    "CHECK",
    "CHECK_PARTS",
    "KINDS",
    "LAUNCH",
    "CheckRow",
    "DeviceRow",
    "EngineCheck",
    "ProcessGpu",
    "Readback",
    "ResidualStore",
    "engine_check",
    "engine_pids",
    "machine_name",
    "read_residuals",
    "readback",
]
