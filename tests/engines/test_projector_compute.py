"""The projector's compute buffer against the real engines (issue 17, items 4 and 7).

A tiny gemma3 model with a CLIP projector written by tests/synth (gguf's writer), loaded by
llama-server b10435 (and b11434 where it is here) with its warm-up on, so clip.cpp reserves
its compute buffer at load (`reserve_compute_meta: CPU compute buffer size = X MiB`, read as
the `projector` buffer by core.readback). The plan charges that buffer as an upper bound on
the projector's device; the bound must hold what the engine allocated, at flash attention
auto (the warm-up turns it on) and off (the encoder keeps its attention scores).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qmgui.core.fit import Budget, check
from qmgui.core.footprint import CPU
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelClass, meta_from_gguf
from qmgui.core.readback import parse_llama_log
from qmgui.engines.llama_run import find_llama_server, load_and_stop
from tests.b11434 import b11434_server

B10435 = os.environ.get("QMGUI_TEST_LLAMA_SERVER") or find_llama_server()
B11434 = b11434_server()
ENGINES = [
    pytest.param(B10435, id="b10435", marks=pytest.mark.skipif(B10435 is None, reason="no engine")),
    pytest.param(
        None if B11434 is None else str(B11434),
        id="b11434",
        marks=pytest.mark.skipif(B11434 is None, reason="llama.cpp b11434 is not here"),
    ),
]
PRINTED = 5243  # bytes: the engine prints MiB with two decimals


@pytest.fixture(scope="module", params=["gemma3", "mlp"])
def files(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """The tiny gemma3 model and a projector: gemma3's (SigLIP, pooled) or LLaVA's (CLIP
    with a class token, the two-layer MLP), wide enough that the printed MiB says something:
    1024 patches of a 128-wide encoder with 8 heads."""
    from tests.synth._mmproj import write_mmproj
    from tests.synth.factory import PRESETS, write_gguf

    kind = str(request.param)
    d = tmp_path_factory.mktemp(f"projector-{kind}")
    model = write_gguf(d / "tiny-gemma3.gguf", PRESETS["gemma3"])
    proj = write_mmproj(
        d / "mmproj-tiny-gemma3.gguf", projector_type=kind, image_size=448, patch_size=14,
        n_embd=128, n_ff=512, n_head=8, n_layer=3,
    )  # fmt: skip
    return model, proj


@pytest.mark.parametrize("binary", ENGINES)
@pytest.mark.parametrize("fa", ["auto", "off"])
def test_the_plan_bounds_the_projector_compute_buffer_the_engine_allocates(
    files: tuple[Path, Path], binary: str, fa: str
) -> None:
    model, proj = files
    args = ("--mmproj", str(proj), "-c", "1024", "-fa", fa, "-lv", "4", "-fit", "off")
    out = load_and_stop(binary, model, args, timeout_s=60)
    assert out.loaded and "reserve_compute_meta" in out.log, out.log[-2000:]
    report = parse_llama_log(out.log)
    cpu = report.device("CPU")
    assert cpu is not None and cpu.projector.lines == 1
    allocated = cpu.projector.bytes
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    pmeta = meta_from_gguf(read_gguf_header(proj), file_name=proj.name)
    assert pmeta.model_class == ModelClass.PROJECTOR
    s = LaunchSettings(ctx_size=1024, flash_attn=fa)
    plain = check(meta, s, Budget(host_bytes=1 << 34))
    result = check(meta, s, Budget(host_bytes=1 << 34), mmproj=pmeta)
    (bound,) = result.footprint.bounds
    assert bound.part == "projector compute" and bound.device == CPU
    # the engine's own compute buffer is planned as before; the projector's sits on top
    added = result.footprint.host.compute - plain.footprint.host.compute
    assert added == bound.bytes
    assert bound.bytes >= allocated + PRINTED, (bound.bytes, allocated)
    # and within a small multiple of it: the bound does not make launches that fit refuse
    assert bound.bytes <= 4 * allocated + (1 << 20), (bound.bytes, allocated)
    assert result.verdict == "fits (bound)"
    # the projector's weights: the size clip prints
    assert report.projector_model is not None
    w = sum(d.weights for d in result.footprint.devices)
    w -= sum(d.weights for d in plain.footprint.devices)
    assert f"{w / 2**20:.2f}" == f"{report.projector_model.mib:.2f}"
