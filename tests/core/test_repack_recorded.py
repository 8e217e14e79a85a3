"""The repacking rules against recorded runs of an AVX-512 + AMX machine (docs/accuracy.json:
the test wheel, llama.cpp b10434, an earlier session): there the F16 presets' matmul weights
went to the AMX buffer (plain F16 copies); the plan must give the same AMX buffer and mapped
span to the engine's 0.01 MiB print precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qmgui.core.footprint import estimate
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import meta_from_gguf
from qmgui.core.repack import CpuTarget
from qmgui.core.units import MIB
from tests.synth.factory import PRESETS, write_gguf

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "accuracy.json"
# the features of that machine's CPU variant (AVX-512 with VNNI, AMX), what-if here
AMX = CpuTarget(
    frozenset({"AVX2", "AVX512", "AVX512_VNNI", "AMX_INT8", "REPACK"}), source="what-if",
    build=10434,
)  # fmt: skip


def _rows() -> list[dict[str, object]]:
    rows = json.loads(RECORDED.read_text(encoding="utf-8"))["rows"]
    return [
        r for r in rows if r["measured"]["devices"].get("CPU", {}).get("repack", {}).get("lines")
    ]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['arch']}-{r['setting']}")
def test_recorded_amx_buffer_and_span(row: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    arch, args = str(row["arch"]), list(row["args"])
    model = write_gguf(tmp_path / f"{arch}.gguf", PRESETS[arch])
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    np_ = int(args[args.index("-np") + 1]) if "-np" in args else None
    s = LaunchSettings(ctx_size=int(args[args.index("-c") + 1]), parallel=np_)
    host = estimate(meta, s, cpu=AMX).host
    cpu = row["measured"]["devices"]["CPU"]
    assert f"{host.repack / MIB:.2f}" == f"{cpu['repack']['mib']:.2f}", (host.repack, cpu)
    assert f"{host.weights / MIB:.2f}" == f"{cpu['model']['mib']:.2f}", (host.weights, cpu)
    # without AMX (an AVX2 CPU) F16 stays in the mapped file
    avx2 = CpuTarget(frozenset({"AVX2", "REPACK"}), build=10434)
    assert estimate(meta, s, cpu=avx2).host.repack == 0


def test_there_are_recorded_amx_runs() -> None:
    assert len(_rows()) >= 5
