"""What the window's bars say on a real GPU while engines run: each engine's share and the
memory of other processes, from NVML, checked against the engines' own logs.

Run where an NVIDIA GPU and a GPU-capable llama-server are (`--binary`, `--device`). Starts two
engines one after the other under qmgui's supervisor (full-size sparse models on the GPU),
reads the machine the way the window does (`occupancy.read_live`) before, with one, with two,
and after, and prints per phase: NVML's used memory, the processes NVML lists, each engine's
planned / measured share and what `others_on` leaves to other processes. With NVML listing the
engines' processes, "others" must stay what it was before they started (the driver's own use).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from qmgui.core.footprint import Gpu, estimate  # noqa: E402
from qmgui.core.gguf_header import read_gguf_header  # noqa: E402
from qmgui.core.launch import LaunchSettings  # noqa: E402
from qmgui.core.meta import meta_from_gguf  # noqa: E402
from qmgui.engines.llama_run import find_llama_server  # noqa: E402
from qmgui.engines.residuals import readback  # noqa: E402
from qmgui.engines.supervisor import EngineSpec, State, Supervisor  # noqa: E402
from qmgui.hw.nvml import read_nvml  # noqa: E402
from qmgui.ui.occupancy import EngineLoad, others_on, read_live, shares_on  # noqa: E402
from tests.synth.factory import FULL_SIZE_PRESETS, write_gguf  # noqa: E402

MIB = 1 << 20
MODELS = (("qwen3-4b", 8192), ("llama3-8b", 16384))


def _load(key: int, name: str, sup: Supervisor, fp: Any, gpu_name: str) -> EngineLoad:
    rb = readback(sup.log.text(), fp)
    measured = {r.name: sum(r.actual.values()) for r in rb.rows if r.actual is not None}
    pids = frozenset({sup.pid}) if sup.pid else frozenset()
    return EngineLoad(key, name, name, fp, measured, pids)


def _phase(label: str, gpu_name: str, loads: Sequence[EngineLoad]) -> dict[str, Any]:
    live = read_live()
    assert live.nvml is not None
    g = live.nvml.gpus[0]
    row = {
        "phase": label,
        "nvml_used_mib": round(g.used_bytes / MIB, 1),
        "nvml_processes": [
            (p.pid, None if p.used_bytes is None else round(p.used_bytes / MIB, 1), p.kind)
            for p in g.processes
        ],
        "engines": [
            {
                "name": s.name,
                "planned_mib": round(s.planned / MIB, 1),
                "measured_mib": None if s.measured is None else round(s.measured / MIB, 1),
            }
            for s in shares_on(gpu_name, loads)
        ],
        "others_mib": round((others_on(gpu_name, live, loads) or 0) / MIB, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary")
    ap.add_argument("--device", default="Vulkan0")
    ap.add_argument("--backend", default="vulkan")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    binary = a.binary or find_llama_server()
    reading = read_nvml()
    if binary is None or not reading.ok or not reading.gpus:
        print(f"needs a llama-server and an NVIDIA GPU: {reading.message}")
        return 2
    card = reading.gpus[0]
    gpu_name = f"GPU{card.index} ({card.name})"  # as hardware.this_machine names it
    rows = [_phase("before", gpu_name, [])]
    sups: list[Supervisor] = []
    loads: list[EngineLoad] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for key, (preset, ctx) in enumerate(MODELS, start=1):
                path = write_gguf(Path(tmp) / f"{preset}.gguf", FULL_SIZE_PRESETS[preset],
                                  sparse=True)  # fmt: skip
                meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
                free = read_nvml().gpus[0].free_bytes
                gpu = Gpu(gpu_name, card.total_bytes, free, backend=a.backend)
                fp = estimate(meta, LaunchSettings(ctx_size=ctx), [gpu])
                argv_ = (binary, "-m", str(path), "-c", str(ctx), "-ngl", "999",
                         "--device", a.device, "-lv", "4", "--no-warmup")  # fmt: skip
                sup = Supervisor(EngineSpec(argv=argv_, name=preset))
                sups.append(sup)
                sup.start()
                if not sup.wait_ready(180) or sup.state != State.READY:
                    print(f"{preset} did not become ready: {sup.outcome}")
                    print("\n".join(sup.log.tail(30)))
                    return 1
                time.sleep(1.0)  # NVML's figures settle after the load
                loads.append(_load(key, preset, sup, fp, gpu_name))
                rows.append(_phase(f"{key} engine(s)", gpu_name, loads))
            for sup in sups:
                sup.stop(10)
            time.sleep(1.0)
            rows.append(_phase("after", gpu_name, []))
    finally:
        for sup in sups:
            if not sup.state.final:
                sup.stop(5)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
