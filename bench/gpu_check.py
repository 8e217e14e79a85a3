"""qmgui's GPU predictions against a real card: NVML, a CUDA context, llama-server on a GPU.

Run on a machine with an NVIDIA GPU and a GPU-capable llama-server (`--binary`, or found like
the tests find theirs). It writes, under `--out`:
- `nvml-<card>.json`: NVML's answers as `qmgui.hw.nvml.record()` stores them (a fixture the
  tests replay) and what `read_nvml()` makes of them;
- `gpu_check.json` / `gpu_check.md`: one row per launch: qmgui's predicted bytes per buffer on
  the GPU and on the host next to the sizes the engine logged (`-lv 4`), and what NVML saw the
  whole process take on the card at its peak (buffers + the backend's own context);
- `context.json`: the memory a bare CUDA context takes (cuda-bindings, else PyTorch).

Every number comes from this run; nothing is assumed. Launches run one at a time so that the
NVML peak belongs to one engine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accuracy import (  # noqa: E402
    BASE_ARGS,
    BUFFERS,
    PREDICTED_FIELD,
    buffer_verdict,
    measured_json,
    setting,
    write_models,
)
from qmgui.core.errors import SizingError  # noqa: E402
from qmgui.core.footprint import Gpu, estimate  # noqa: E402
from qmgui.core.gguf_header import read_gguf_header  # noqa: E402
from qmgui.core.meta import ModelClass, ModelMeta, meta_from_gguf  # noqa: E402
from qmgui.core.readback import MIB, parse_llama_log  # noqa: E402
from qmgui.engines.llama_run import find_llama_server, load_and_stop  # noqa: E402
from qmgui.hw import nvml as qnvml  # noqa: E402

FULL = ("qwen3-4b", "llama3-8b", "gemma3-12b", "qwen3-30b-a3b")
ARCHS = ("llama", "qwen3", "qwen3moe", "gemma3", "gpt-oss", "deepseek2", "mamba2", "qwen3next")


def _full_settings(meta: ModelMeta) -> list[tuple[str, list[str], Any]]:
    """Realistic sizes: long contexts and several slots, where compute buffers are large."""
    rows = []
    for label, kw in (("c=8192", {"c": 8192}), ("c=32768 np=4", {"c": 32768, "np": 4})):
        s = setting(label, **kw)  # type: ignore[arg-type]
        rows.append((f"ngl=all {label}", [*s.args, "-ngl", "999"], s.settings))
    if meta.n_expert:
        s = setting("c=8192", c=8192)
        rows.append(("ngl=all c=8192 cpu-moe", [*s.args, "-ngl", "999", "--cpu-moe"],
                     replace(s.settings, cpu_moe=True)))  # fmt: skip
    return rows


def _settings(meta: ModelMeta) -> list[tuple[str, list[str], Any]]:
    """(label, extra args, LaunchSettings) per launch of one model."""
    half = max(1, meta.n_layer // 2)
    rows = []
    for label, kw in (
        ("default", {}),
        ("np=2 c=2048", {"c": 2048, "np": 2}),
        ("q8_0 cache fa=on", {"ctk": "q8_0", "ctv": "q8_0", "fa": "on"}),
        ("c=8192", {"c": 8192}),
    ):
        s = setting(label, **kw)  # type: ignore[arg-type]
        rows.append((f"ngl=all {label}", [*s.args, "-ngl", "999"], s.settings))
    s = setting("default")
    rows.append(
        (f"ngl={half}", [*s.args, "-ngl", str(half)], replace(s.settings, n_gpu_layers=half))
    )
    if meta.n_expert:
        rows.append(
            ("ngl=all cpu-moe", [*s.args, "-ngl", "999", "--cpu-moe"],
             replace(s.settings, cpu_moe=True))
        )  # fmt: skip
    return rows


def _row(label: str, s: Any, *extra: str, **change: Any) -> tuple[str, list[str], Any]:
    return (label, [*s.args, *extra], replace(s.settings, **change) if change else s.settings)


def _holdout_tiny(meta: ModelMeta) -> list[tuple[str, list[str], Any]]:
    """Settings the calibration run (`_settings`) did not try, for a check on unseen launches:
    flash attention off, longer contexts, other ubatches, other partial offloads."""
    n = meta.n_layer
    fa_off = setting("fa=off c=4096", c=4096, fa="off")
    ub = setting("c=4096 ub=256", c=4096, ub=256)
    rows = [
        _row("h ngl=all fa=off c=4096", fa_off, "-ngl", "999"),
        _row("h ngl=all c=4096 ub=256", ub, "-ngl", "999"),
        _row(f"h ngl={n} c=4096 ub=256", ub, "-ngl", str(n), n_gpu_layers=n),
    ]
    if meta.n_expert:
        d = setting("default")
        rows.append(
            _row("h ngl=all n-cpu-moe=1", d, "-ngl", "999", "--n-cpu-moe", "1", n_cpu_moe=1)
        )
    return rows


def _holdout_full(meta: ModelMeta) -> list[tuple[str, list[str], Any]]:
    """Unseen launches of the full-size models: partial offload (-ngl about half), flash
    attention off, a larger ubatch, --n-cpu-moe."""
    half = meta.n_layer // 2
    c8 = setting("c=8192", c=8192)
    rows = [
        _row(f"h ngl={half} c=8192", c8, "-ngl", str(half), n_gpu_layers=half),
        _row("h ngl=all c=8192 fa=off", setting("c=8192 fa=off", c=8192, fa="off"), "-ngl", "999"),
        _row(
            "h ngl=all c=16384 ub=1024", setting("c=16384 ub=1024", c=16384, ub=1024), "-ngl", "999"
        ),
    ]
    if meta.n_expert:
        rows.append(
            _row(f"h ngl=all c=8192 n-cpu-moe={half}", c8, "-ngl", "999", "--n-cpu-moe", str(half),
                 n_cpu_moe=half)
        )  # fmt: skip
    return rows


PLANS = {"standard": (_settings, _full_settings), "holdout": (_holdout_tiny, _holdout_full)}


class Sampler:
    """Polls NVML's used memory on one card every few ms; `peak()` since the last `reset()`."""

    def __init__(self, handle: Any, nvml: Any) -> None:
        self._h = handle
        self._nvml = nvml
        self._peak = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._h).used)

    def _run(self) -> None:
        while not self._stop.is_set():
            u = self.used()
            with self._lock:
                self._peak = max(self._peak, u)
            time.sleep(0.005)

    def reset(self) -> int:
        base = self.used()
        with self._lock:
            self._peak = base
        return base

    def peak(self) -> int:
        with self._lock:
            return self._peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def predicted(meta: ModelMeta, ls: Any, gpu: Gpu, embeddings: bool) -> dict[str, Any]:
    try:
        fp = estimate(meta, ls, [gpu], embeddings=embeddings)
    except SizingError as e:
        return {"error": str(e)}
    out: dict[str, Any] = {}
    for d in fp.devices:
        out[d.name] = {k: int(getattr(d, f, 0) or 0) for k, f in PREDICTED_FIELD.items()}
        out[d.name]["total"] = d.total
    return out


@dataclass(frozen=True)
class Launch:
    """One llama-server launch to measure: the model, its flags and qmgui's settings for them."""

    model: Path
    meta: ModelMeta
    label: str
    args: tuple[str, ...]
    settings: Any  # LaunchSettings


@dataclass(frozen=True)
class Rig:
    """What every launch shares: the engine, the card as qmgui plans it, where logs go."""

    binary: str
    gpu: Gpu
    device: str  # llama-server --device name
    sampler: Sampler | None
    logs: Path


def one_launch(launch: Launch, rig: Rig) -> dict[str, Any]:
    meta, gpu, device, sampler = launch.meta, rig.gpu, rig.device, rig.sampler
    embedding = meta.model_class in (ModelClass.EMBEDDING, ModelClass.RERANK)
    full = [*BASE_ARGS, *launch.args, "--device", device]
    if embedding:
        full.append("--embedding")
    base = sampler.reset() if sampler else None
    outcome = load_and_stop(rig.binary, launch.model, full, timeout_s=120.0)
    peak = sampler.peak() if sampler else None
    report = parse_llama_log(outcome.log)
    safe = "".join(ch if ch.isalnum() or ch in "=._-" else "_" for ch in launch.label)
    (rig.logs / f"{launch.model.stem}__{safe}.log").write_text(outcome.log, encoding="utf-8")
    pred = predicted(meta, launch.settings, gpu, embedding)
    meas = measured_json(report)
    verdicts: dict[str, dict[str, str]] = {}
    for dev in (gpu.name, "CPU"):
        got = meas["devices"].get(device if dev == gpu.name else dev, {})
        p = pred.get(dev, {})
        verdicts[dev] = {
            b: buffer_verdict(b, p.get(b), got[b]) if b in got else "n/a" for b in BUFFERS
        }
    measured_gpu = meas["devices"].get(device, {})
    logged_gpu = sum(v["bytes"] for v in measured_gpu.values()) if measured_gpu else 0
    return {
        "model": launch.model.stem,
        "setting": launch.label,
        "args": full,
        "loaded": report.loaded,
        "failures": [f.message for f in report.failures],
        "wall_s": round(outcome.wall_s, 2),
        "predicted": pred,
        "measured": meas,
        "verdicts": verdicts,
        "nvml_before": base,
        "nvml_peak": peak,
        "nvml_delta": None if base is None or peak is None else peak - base,
        "logged_gpu_bytes": logged_gpu,
    }


def cuda_context_bytes(handle: Any, nvml: Any) -> dict[str, Any]:
    """What NVML sees a bare CUDA context take: a child process creates one and waits."""
    code = (
        "import sys,time\n"
        "try:\n"
        " from cuda.bindings import driver as cu\n"
        " cu.cuInit(0); e,d=cu.cuDeviceGet(0); e,c=cu.cuDevicePrimaryCtxRetain(d)\n"
        " cu.cuCtxSetCurrent(c); e,p=cu.cuMemAlloc(1<<20); how='cuda-bindings'\n"
        "except Exception as x:\n"
        " import torch; torch.empty(1, device='cuda'); how='torch (%s)' % x\n"
        "print(how, flush=True); time.sleep(3)\n"
    )
    before = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    how = (p.stdout.readline() if p.stdout else "").strip()
    time.sleep(1.0)
    during = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
    procs = []
    try:
        procs = [
            {"pid": q.pid, "used": q.usedGpuMemory}
            for q in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ]
    except Exception as e:
        procs = [{"error": type(e).__name__}]
    p.wait(timeout=30)
    return {"how": how, "before": before, "during": during, "delta": during - before,
            "processes": procs, "note": "delta includes the 1 MiB allocation"}  # fmt: skip


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / MIB:.2f}"


def render(rows: Sequence[dict[str, Any]], gpu: Gpu, header: dict[str, Any]) -> str:
    out = [
        "# qmgui predictions against llama-server on a real GPU",
        "",
        f"Card: {header['card']}, driver {header['driver']}; engine {header['engine']};"
        f" backend device `{header['device']}`; {header['when']}.",
        "",
        "MiB. pred/log per buffer on the GPU; `NVML Δ` = peak used on the card while the "
        "engine ran, less what was used before it started (buffers + the backend's context).",
        "",
        "| model | setting | GPU weights pred/log | KV pred/log | RS pred/log |"
        " compute pred/log | host compute pred/log | logged GPU total | NVML Δ | verdicts |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.get("loaded"):
            out.append(f"| {r['model']} | {r['setting']} | not loaded: "
                       f"{'; '.join(r.get('failures', []))[:120]} |||||||")  # fmt: skip
            continue
        p = r["predicted"].get(gpu.name, {})
        h = r["predicted"].get("CPU", {})
        m = r["measured"]["devices"].get(header["device"], {})
        mh = r["measured"]["devices"].get("CPU", {})

        def pair(pp: dict[str, Any], mm: dict[str, Any], k: str) -> str:
            got = mm.get(k, {}).get("bytes") if mm.get(k, {}).get("lines") else None
            return f"{_mib(pp.get(k))} / {_mib(got)}"

        v = r["verdicts"]
        bad = [f"{d}:{b}={x}" for d, vs in v.items() for b, x in vs.items()
               if x not in ("ok", "n/a")]  # fmt: skip
        out.append(
            f"| {r['model']} | {r['setting']} | {pair(p, m, 'model')} | {pair(p, m, 'kv')} | "
            f"{pair(p, m, 'recurrent')} | {pair(p, m, 'compute')} | {pair(h, mh, 'compute')} | "
            f"{_mib(r['logged_gpu_bytes'])} | {_mib(r['nvml_delta'])} | "
            f"{', '.join(bad) or 'all ok'} |"
        )
    return "\n".join(out) + "\n"


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--binary")
    ap.add_argument("--device", default="Vulkan0", help="llama-server --device name")
    ap.add_argument("--backend", default="vulkan", help="qmgui Gpu.backend for the prediction")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds for all launches")
    ap.add_argument("--arch", action="append", help="repeatable; default: a spread")
    ap.add_argument("--full", action="append", help="full-size sparse models; default: 4")
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("--plan", choices=sorted(PLANS), default="standard",
                    help="holdout: settings the standard run did not try")  # fmt: skip
    ap.add_argument("--tiny-deadline", type=float, default=150.0)
    return ap.parse_args(argv)


def _record_nvml(out: Path) -> tuple[str, str | None]:
    """NVML's answers as a fixture (nvml-<card>.json); (card name, driver version)."""
    rec = qnvml.record()
    card = rec["devices"][0]["name"] if rec.get("devices") else "no NVML device"
    safe_card = "".join(ch if ch.isalnum() else "-" for ch in card).strip("-").lower()
    (out / f"nvml-{safe_card}.json").write_text(json.dumps(rec, indent=1), encoding="utf-8")
    print("NVML reading:", qnvml.read_nvml(), flush=True)
    return card, rec.get("driver_version")


def _nvml_handle() -> tuple[Any, Any]:
    """(pynvml module, handle of card 0), the handle None where there is no driver."""
    import pynvml as nvml  # only here, where a driver may exist

    try:
        nvml.nvmlInit()
        return nvml, nvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as e:  # a dry run on a machine without a driver
        print("NVML unavailable:", e, flush=True)
        return nvml, None


def _engine_version(binary: str) -> list[str]:
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    devices = subprocess.run(
        [binary, "--list-devices"], capture_output=True, text=True, timeout=60, check=False
    )
    print(devices.stdout, devices.stderr[-2000:], flush=True)
    return (version.stdout + version.stderr).strip().splitlines()


def _launches(a: argparse.Namespace, tmp: Path) -> Iterator[tuple[bool, Launch]]:
    """(tiny, launch) for every model and setting: the tiny architectures, then the
    full-size sparse models."""
    tiny_plan, full_plan = PLANS[a.plan]
    models = [(p, tiny_plan) for p in write_models(a.arch or ARCHS, tmp).values()]
    if not a.no_full:
        from tests.synth.factory import FULL_SIZE_PRESETS, write_gguf

        models += [
            (write_gguf(tmp / f"{n}.gguf", FULL_SIZE_PRESETS[n], sparse=True), full_plan)
            for n in (a.full or FULL)
        ]
    for path, plan in models:
        meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
        for label, args, ls in plan(meta):
            yield plan is tiny_plan, Launch(path, meta, label, tuple(args), ls)


def _run_all(a: argparse.Namespace, rig: Rig, t0: float, rows: list[dict[str, Any]]) -> None:
    """Appends one row per launch to `rows` (kept by the caller if a launch raises)."""
    with tempfile.TemporaryDirectory() as tmp:
        for tiny, launch in _launches(a, Path(tmp)):
            if time.monotonic() - t0 > (a.tiny_deadline if tiny else a.deadline):
                print("deadline reached; stopping", flush=True)
                break
            row = one_launch(launch, rig)
            rows.append(row)
            print(
                launch.model.stem, launch.label, row["loaded"], row["verdicts"],
                "NVMLΔ", _mib(row["nvml_delta"]), "logged", _mib(row["logged_gpu_bytes"]),
                flush=True,
            )  # fmt: skip


def _write_results(
    out: Path, rows: list[dict[str, Any]], gpu: Gpu, header: dict[str, Any], logs: Path
) -> None:
    (out / "gpu_check.json").write_text(
        json.dumps({"header": header, "gpu": gpu.__dict__, "rows": rows}, indent=1),
        encoding="utf-8",
    )
    (out / "gpu_check.md").write_text(render(rows, gpu, header), encoding="utf-8")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
        tf.add(logs, arcname="logs")


def main(argv: Sequence[str] | None = None) -> int:
    a = _args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    card, driver = _record_nvml(a.out)
    nvml, handle = _nvml_handle()
    if handle is not None:
        ctx = cuda_context_bytes(handle, nvml)
        (a.out / "context.json").write_text(json.dumps(ctx, indent=1), encoding="utf-8")
        print("CUDA context:", ctx, flush=True)

    binary = a.binary or find_llama_server()
    if binary is None:
        print("no llama-server found", flush=True)
        return 2
    engine = _engine_version(binary)
    if handle is not None:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        gpu = Gpu(a.device, int(mem.total), int(mem.free), backend=a.backend)
    else:
        gpu = Gpu(a.device, 80 << 30, backend=a.backend)
    sampler = Sampler(handle, nvml) if handle is not None else None
    rig = Rig(binary, gpu, a.device, sampler, Path(tempfile.mkdtemp(prefix="gpu-logs-")))
    rows: list[dict[str, Any]] = []
    try:
        _run_all(a, rig, t0, rows)
    finally:
        if sampler is not None:
            sampler.close()
        header = {
            "card": card,
            "driver": driver,
            "engine": " ".join(engine[-2:]),
            "device": a.device,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        _write_results(a.out, rows, gpu, header, rig.logs)
    print(f"done in {time.monotonic() - t0:.1f} s, {len(rows)} launches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
