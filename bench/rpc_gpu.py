"""llama.cpp RPC on a real GPU: an rpc-server offering a GPU, alone and beside the same
machine's local GPU, planned by qmgui and loaded by the real llama-server.

    python bench/rpc_gpu.py --remote-device Vulkan0 --local-device Vulkan0 --out DIR

Each case places a model with `core.placement` (RPC devices are `Gpu(endpoint=...)`), emits
the command with `core.emit.llama` (`--rpc`, `--device RPC0,...`, `-ts`), runs it with `-lv 4`
and compares every buffer the engine logs with the plan, per device: RPC buffers by their
address, local ones by name. Without `--local-device` only the remote cases run; without
`--remote-device` the rpc-server uses its default backend (the CPU on a machine without a
GPU). Writes rpc_gpu.json and rpc_gpu.md under `--out`; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gguf import GGMLQuantizationType as Q  # noqa: E402

from qmgui.core.discovery import ModelEntry, entry_for_path  # noqa: E402
from qmgui.core.emit import DevicePin  # noqa: E402
from qmgui.core.emit.llama import emit_llama  # noqa: E402
from qmgui.core.footprint import CPU, Gpu  # noqa: E402
from qmgui.core.launch import LaunchSettings  # noqa: E402
from qmgui.core.placement import Pin, Placed, Request, place  # noqa: E402
from qmgui.core.readback import MIB, DeviceReport, EngineReport, parse_llama_log, rpc_endpoint  # noqa: E402
from qmgui.core.units import GIB  # noqa: E402
from qmgui.engines.llama_run import find_llama_server, load_and_stop  # noqa: E402
from qmgui.engines.rpc import find_rpc_server, rpc_server  # noqa: E402
from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf, write_sparse_gguf  # noqa: E402

MID = replace(
    PRESETS["llama"], n_layer=4, n_embd=256, n_ff=512, n_head=8, n_head_kv=4, n_vocab=4096,
    weight_type=Q.Q4_0, embd_type=Q.Q8_0,
)  # fmt: skip
KINDS = (("weights", "model"), ("kv", "kv"), ("compute", "compute"), ("output", "output"))


@dataclass(frozen=True)
class Case:
    label: str
    model: ModelEntry
    request: Request
    gpus: tuple[Gpu, ...]


def _argv(entry: ModelEntry, placed: Placed, gpus: Sequence[Gpu], api: str) -> list[str]:
    pin = DevicePin.for_devices(placed.devices, gpus, api)
    cmd = emit_llama(entry, placed.settings, executable="llama-server", port=0, devices=pin)
    argv = list(cmd.argv[1:])
    for flag in ("-m", "--host", "--port"):
        i = argv.index(flag)
        del argv[i : i + 2]
    return [*argv, "--no-warmup"]


def _logged(report: EngineReport, gpu: Gpu | None) -> DeviceReport | None:
    if gpu is None:
        return report.device(CPU)
    if gpu.endpoint is not None:
        return next((d for d in report.devices if rpc_endpoint(d.device) == gpu.endpoint), None)
    return report.device(gpu.name)


def run_case(case: Case, binary: str, api: str) -> dict[str, Any]:
    p = place([case.request], case.gpus, reserve=0)
    placed = p.model(case.request.name)
    if placed is None:
        return {"case": case.label, "error": p.unplaced[0].reason}
    argv = _argv(case.model, placed, case.gpus, api)
    out = load_and_stop(binary, case.model.path, argv, timeout_s=180)
    report = parse_llama_log(out.log)
    rows = []
    for d in placed.footprint.devices:
        gpu = next((g for g in case.gpus if g.name == d.name), None)
        got = _logged(report, gpu)
        for kind, field in KINDS:
            planned = getattr(d, kind)
            amount = getattr(got, field) if got is not None else None
            rows.append(
                {
                    "device": d.name,
                    "kind": kind,
                    "planned": planned,
                    "logged": None if amount is None else amount.bytes,
                    "logged_mib": None if amount is None else amount.mib,
                    "match": None if amount is None else amount.matches(planned),
                }
            )
    return {
        "case": case.label,
        "argv": argv,
        "loaded": out.loaded,
        "failures": [f.message for f in report.failures],
        "devices": list(placed.devices),
        "layer_devices": list(placed.footprint.layer_devices),
        "logged_devices": [d.device for d in report.devices],
        "rows": rows,
        "log_tail": out.log[-1500:] if not out.loaded else "",
    }


def render(results: Sequence[dict[str, Any]]) -> str:
    lines = ["| case | device | buffer | planned MiB | logged MiB | |", "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r or not r.get("loaded"):
            why = r.get("error") or "; ".join(r.get("failures", [])) or "did not load"
            lines.append(f"| {r['case']} | not run: {why[:100]} |||||")
            continue
        for row in r["rows"]:
            logged = "—" if row["logged_mib"] is None else f"{row['logged_mib']:.2f}"
            mark = "" if row["match"] is None else ("ok" if row["match"] else "differs")
            lines.append(
                f"| {r['case']} | {row['device']} | {row['kind']} | "
                f"{row['planned'] / MIB:.2f} | {logged} | {mark} |"
            )
    return "\n".join(lines) + "\n"


def cases(tmp: Path, remote: str, local: str | None, backend: str, full: bool) -> list[Case]:
    mid = entry_for_path(str(write_gguf(tmp / "rpc-mid.gguf", MID)))
    models = [("mid", mid, 1024)]
    if full:
        path = write_sparse_gguf(tmp / "qwen3-4b.gguf", FULL_SIZE_PRESETS["qwen3-4b"])
        models.append(("qwen3-4b", entry_for_path(str(path)), 8192))
    rpc = Gpu(f"RPC0[{remote}]", 64 * GIB, backend=backend, endpoint=remote)
    out = []
    for label, entry, ctx in models:
        assert entry.meta is not None, entry.error
        req = Request(label, entry.meta, LaunchSettings(ctx_size=ctx, repack=False))
        out.append(Case(f"{label}: all on the rpc-server", entry, req, (rpc,)))
        out.append(
            Case(
                f"{label}: 3 layers on the rpc-server, the rest on the CPU",
                entry,
                replace(req, settings=replace(req.settings, n_gpu_layers=3)),
                (rpc,),
            )
        )
        if local:
            gpu = Gpu(local, 64 * GIB, backend=backend)
            pin = Pin((rpc.name, gpu.name), (1, 1))
            out.append(
                Case(f"{label}: 1:1 rpc-server and local {local}", entry,
                     replace(req, pin=pin), (rpc, gpu))
            )  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=find_llama_server())
    ap.add_argument("--rpc-binary", default=find_rpc_server())
    ap.add_argument("--remote-device", help="the rpc-server's device (e.g. Vulkan0)")
    ap.add_argument("--local-device", help="a local GPU for the mixed case (e.g. Vulkan0)")
    ap.add_argument("--full", action="store_true", help="also a full-size Qwen3-4B header")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    if not args.binary or not args.rpc_binary:
        print("llama-server or rpc-server not found", file=sys.stderr)
        return 2
    backend = "vulkan" if args.remote_device else "cpu"
    api = (args.local_device or "Vulkan").rstrip("0123456789").lower()
    results = []
    devices = (args.remote_device,) if args.remote_device else ()
    with (
        tempfile.TemporaryDirectory() as tmp,
        rpc_server(args.rpc_binary, devices=devices, threads=4) as srv,
    ):
        for case in cases(Path(tmp), srv.endpoint, args.local_device, backend, args.full):
            r = run_case(case, args.binary, api)
            results.append(r)
            print(f"{case.label}: {r.get('devices')} loaded={r.get('loaded')}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rpc_gpu.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    table = render(results)
    (args.out / "rpc_gpu.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
