"""Bounds for the buffers qmgui cannot model (issue 17, item 4: never a silent "fits").

fixtures/compute/bounds_b11434.json (bench/compute_bounds.py) holds every model b11434's
`test-llama-archs` writes (their GGUF headers) and the compute buffer llama-server b11434
allocated for each at three settings (`sched_reserve: CPU compute buffer size`, MiB with two
decimals): 382 runs of 128 models. No engine runs here.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from qmgui.core.bounds import (
    PROJECTOR_DYNAMIC_PATCHES,
    Bound,
    compute_bound,
    projector_compute_bound,
)
from qmgui.core.compute import compute_buffer_bytes, is_embedding
from qmgui.core.errors import SizingError
from qmgui.core.fit import Budget, check
from qmgui.core.footprint import CPU, Gpu, estimate
from qmgui.core.gguf_header import header_from_data, read_gguf_header
from qmgui.core.launch import LaunchSettings, resolve
from qmgui.core.meta import ModelMeta, meta_from_gguf
from qmgui.core.units import GIB, MIB

FIXTURE = Path(__file__).parent / "fixtures" / "compute" / "bounds_b11434.json"
PRINTED = 0.005  # MiB: the engine prints two decimals
SETTINGS = {
    "default": LaunchSettings(ctx_size=1024),
    "fa_off": LaunchSettings(ctx_size=4096, parallel=4, flash_attn="off"),
    "q8": LaunchSettings(
        ctx_size=1024, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on", ubatch_size=128
    ),
    # how the buffer grows with the cache: one slot of 16k and 64k cells
    "c16k_fa_on": LaunchSettings(ctx_size=16384, parallel=1, flash_attn="on"),
    "c16k_fa_off": LaunchSettings(ctx_size=16384, parallel=1, flash_attn="off"),
    "c64k_fa_on": LaunchSettings(ctx_size=65536, parallel=1, flash_attn="on"),
    "c64k_fa_off": LaunchSettings(ctx_size=65536, parallel=1, flash_attn="off"),
}


@cache
def _fixture() -> dict[str, object]:
    data: dict[str, object] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return data


@cache
def _meta(model: str) -> ModelMeta:
    models = _fixture()["models"]
    assert isinstance(models, dict)
    header = header_from_data(f"{model}.gguf", models[model]["header"])
    return meta_from_gguf(header, file_name=model)


def _cases() -> list[tuple[str, str, float]]:
    cases = _fixture()["cases"]
    assert isinstance(cases, list)
    return [(str(m), str(s), float(v)) for m, s, v in cases]


def _embeddings(meta: ModelMeta) -> bool:
    return is_embedding(meta)


@pytest.fixture
def unlaid(monkeypatch: pytest.MonkeyPatch) -> None:
    """deepseek4 as it was before it had a layout (models/deepseek4.py): an architecture
    without one, which the plan charges its bound. The fixture's models all have layouts now;
    this keeps a real one to charge (compute's caches emptied, so nothing laid out leaks in)."""
    from qmgui.core import compute, models

    monkeypatch.delitem(models.INDEX, "deepseek4")
    monkeypatch.setitem(compute._NO_LAYOUT, "deepseek4", "treated as unlaid by the test")
    for name in ("_BYTES_CACHE", "_PROGRAMS", "_BUILT", "_PEAKS", "_SEEN"):
        monkeypatch.setattr(compute, name, {})


def _has_layout(meta: ModelMeta, setting: str) -> bool:
    r = resolve(meta, SETTINGS[setting])
    try:
        compute_buffer_bytes(meta, r, embeddings=_embeddings(meta), mixed_batch=True)
    except SizingError:
        return False
    return True


def test_the_fixture_covers_every_kind_of_graph(unlaid: None) -> None:
    cases = _cases()
    models = {m for m, _, _ in cases}
    assert len(cases) >= 890 and len(models) >= 120
    assert {s for _, s, _ in cases} == set(SETTINGS)
    unlaid = {m for m in models if not _has_layout(_meta(m), "default")}
    # recurrent, latent-attention and encoder graphs, and deepseek4's compressed
    # attention, which the generic layout put at a third of its measured buffer
    for m in ("deepseek4-moe",):
        assert m in unlaid
    assert len(unlaid) >= 1


@pytest.mark.parametrize(("model", "setting", "measured"), _cases())
def test_the_compute_bound_is_never_below_the_measured_buffer(
    model: str, setting: str, measured: float
) -> None:
    """On every architecture b11434 loads, laid out or not: the bound holds the buffer."""
    meta = _meta(model)
    r = resolve(meta, SETTINGS[setting])
    bound = compute_bound(meta, r, embeddings=_embeddings(meta)) / MIB
    assert bound >= measured + PRINTED, f"{model} {setting}: bound {bound:.2f} < {measured}"


def test_the_compute_bound_is_not_absurd(unlaid: None) -> None:
    """Within a small multiple of the buffer where there is no layout (a bound of many times
    the buffer would refuse launches that fit): at most 10x (deepseek4 with flash attention
    at 64k cells, whose buffer grows by less than one f32 per cell and token where the other
    sparse-attention models grow by 4-6, as charged), most under 4x."""
    ratios = []
    for model, setting, measured in _cases():
        meta = _meta(model)
        if _has_layout(meta, setting) or measured < 1.0:
            continue
        r = resolve(meta, SETTINGS[setting])
        ratios.append(compute_bound(meta, r, embeddings=_embeddings(meta)) / MIB / measured)
    assert len(ratios) >= 7
    ratios.sort()
    assert ratios[0] >= 1.2
    assert ratios[-1] <= 10.0
    # deepseek4 alone is left unlaid: its median bound is 4.8x
    assert ratios[len(ratios) // 2] <= 5.0


def test_a_graph_without_a_layout_is_charged_its_bound_not_zero(unlaid: None) -> None:
    meta = _meta("deepseek4-moe")
    s = SETTINGS["default"]
    with pytest.raises(SizingError):
        compute_buffer_bytes(meta, resolve(meta, s), mixed_batch=True)
    fp = estimate(meta, s)
    (bound,) = fp.bounds
    assert bound == Bound("compute", CPU, fp.host.compute, bound.why)
    assert fp.host.compute == compute_bound(meta, fp.settings, embeddings=False) > 0
    assert "no compute-buffer layout" in bound.why and "upper bound" in bound.why
    assert not any("not estimated" in n for n in fp.notes)
    assert bound.to_json() == {
        "part": "compute",
        "device": "CPU",
        "bytes": bound.bytes,
        "why": bound.why,
    }


def test_each_gpu_that_runs_an_unlaid_graph_is_charged_the_bound(unlaid: None) -> None:
    meta = _meta("deepseek4-moe")
    gpus = (Gpu("GPU0", 80 * GIB), Gpu("GPU1", 80 * GIB))
    fp = estimate(meta, SETTINGS["default"], gpus)
    charged = {b.device: b.bytes for b in fp.bounds if b.part == "compute"}
    assert set(charged) == {"GPU0", "GPU1"}
    for name, n in charged.items():
        assert fp.device(name).compute == n >= compute_bound(meta, fp.settings, embeddings=False)
    # one GPU: the scheduler's walk has no graph to replay either; the bound stands in
    one = estimate(meta, SETTINGS["default"], gpus[:1])
    assert {b.device for b in one.bounds} == {"GPU0"}
    # partial offload: the host runs part of the graph and is charged the bound too
    half = estimate(meta, LaunchSettings(ctx_size=1024, n_gpu_layers=2), gpus[:1])
    assert {b.device for b in half.bounds} == {"GPU0", CPU}


def test_a_laid_out_graph_has_no_bound() -> None:
    meta = _meta("llama-dense")
    assert estimate(meta, SETTINGS["default"]).bounds == ()
    assert check(meta, SETTINGS["default"], Budget(host_bytes=GIB)).verdict == "fits"


def test_the_verdict_says_fits_bound_when_a_checked_device_holds_a_bound(unlaid: None) -> None:
    meta = _meta("deepseek4-moe")
    s = SETTINGS["default"]
    fp = estimate(meta, s)
    resident = fp.host.total - fp.host.weights
    fits = check(meta, s, Budget(host_bytes=resident))
    assert fits.fits and fits.bounded and fits.verdict == "fits (bound)"
    # nothing checked (no GPUs, host memory not given): the verdict rests on no bound
    free = check(meta, s, Budget())
    assert free.fits and not free.bounded and free.verdict == "fits"
    # over the limit: the reason says how much of the need is an upper bound
    over = check(meta, s, Budget(host_bytes=resident - 1))
    assert not over.fits and over.verdict == "does not fit" and over.reason is not None
    assert "is an upper bound" in over.reason


# --- the projector's encoder -------------------------------------------------------------------


def _projector(tmp_path: Path, **kw: object) -> ModelMeta:
    from tests.synth._mmproj import write_mmproj

    path = write_mmproj(tmp_path / "mmproj.gguf", **kw)  # type: ignore[arg-type]
    return meta_from_gguf(read_gguf_header(path), file_name=path.name)


# What llama-server b10435 and b11434 logged (`reserve_compute_meta: CPU compute buffer size`,
# identical on both) for tests/synth's projectors beside the tiny gemma3 model, -c 1024, with
# flash attention auto (the warm-up enabled it), on and off. 0.08/0.16 and 0.10/0.14 are the
# default projectors.
PROJECTORS = (
    ({"projector_type": "gemma3"}, 0.08, 0.16),
    ({"projector_type": "mlp"}, 0.10, 0.14),
    (
        {"projector_type": "gemma3", "image_size": 224, "patch_size": 14, "n_embd": 256,
         "n_ff": 1024, "n_head": 4},
        1.75,
        2.50,
    ),
    (
        {"projector_type": "mlp", "image_size": 224, "patch_size": 14, "n_embd": 256,
         "n_ff": 1024, "n_head": 4},
        1.58,
        2.09,
    ),
    (
        {"projector_type": "gemma3", "image_size": 448, "patch_size": 14, "n_embd": 128,
         "n_ff": 512, "n_head": 8, "n_layer": 3},
        3.50,
        35.00,
    ),
    (
        {"projector_type": "mlp", "image_size": 336, "patch_size": 14, "n_embd": 128,
         "n_ff": 768, "n_head": 2, "n_layer": 1},
        1.94,
        1.94,
    ),
)  # fmt: skip


@pytest.mark.parametrize(("kw", "with_fa", "without_fa"), PROJECTORS)
def test_the_projector_bound_holds_the_measured_buffer(
    tmp_path: Path, kw: dict[str, object], with_fa: float, without_fa: float
) -> None:
    proj = _projector(tmp_path, **kw)
    for fa in ("auto", "on"):
        n, why = projector_compute_bound(proj, flash_attn=fa)
        assert with_fa + PRINTED <= n / MIB <= 6 * with_fa + 1, (fa, n / MIB)
        assert "flash attention on" in why
    # without flash attention the head count is bounded (a 16-wide head), not read: up to
    # 8x the scores of a 2-head encoder (the last projector, whose one layer llava skips)
    n, why = projector_compute_bound(proj, flash_attn="off")
    assert without_fa + PRINTED <= n / MIB <= 10 * without_fa + 1, n / MIB
    assert "attention scores" in why


def test_a_projector_without_position_embeddings_is_bounded_at_the_largest_image(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    proj = _projector(tmp_path)
    dynamic = replace(
        proj, tensors=tuple(t for t in proj.tensors if t.name != "v.position_embd.weight")
    )
    fixed, _ = projector_compute_bound(proj, flash_attn="on")
    n, why = projector_compute_bound(dynamic, flash_attn="on")
    assert n > 100 * fixed
    assert f"{PROJECTOR_DYNAMIC_PATCHES:,} patches" in why and "dynamic resolution" in why


def test_the_projector_compute_is_charged_on_its_device(tmp_path: Path) -> None:
    meta = _meta("gemma3-dense")
    proj = _projector(tmp_path)
    s = LaunchSettings(ctx_size=1024)
    gpus = (Gpu("GPU0", 8 * GIB),)
    plain = estimate(meta, s, gpus)
    fp = estimate(meta, s, gpus, mmproj=proj)
    (bound,) = fp.bounds
    assert bound.part == "projector compute" and bound.device == "GPU0"
    assert fp.device("GPU0").compute == plain.device("GPU0").compute + bound.bytes
    assert fp.device("GPU0").weights == plain.device("GPU0").weights + proj.weight_bytes
    host = estimate(meta, s, gpus, mmproj=proj, mmproj_offload=False)
    assert [b.device for b in host.bounds] == [CPU]
    assert host.host.compute == plain.host.compute + host.bounds[0].bytes
    # the cheap estimate of the fit searches leaves every compute buffer out
    assert estimate(meta, s, gpus, mmproj=proj, compute=False).bounds == ()
    # a checked card: the verdict rests on the projector's bound
    result = check(meta, s, Budget(gpus=gpus), mmproj=proj)
    assert result.verdict == "fits (bound)"


def test_the_fit_searches_make_room_for_the_projector(tmp_path: Path) -> None:
    """The largest context and the nearest fit count the projector's weights and compute
    bound: on a card that holds the model at its full context only without the projector,
    the search with it lands lower."""
    from qmgui.core.fit import max_context, nearest_fit
    from tests.synth.factory import PRESETS, write_gguf

    path = write_gguf(tmp_path / "tiny-gemma3.gguf", PRESETS["gemma3"])
    meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    proj = _projector(tmp_path, image_size=448, patch_size=14, n_embd=128, n_ff=512)
    s = LaunchSettings(ctx_size=meta.context_length or 4096)
    gpus = (Gpu("GPU0", 8 * GIB),)
    plain = estimate(meta, s, gpus)
    with_proj = estimate(meta, s, gpus, mmproj=proj)
    extra = with_proj.device("GPU0").total - plain.device("GPU0").total
    assert extra > 0
    card = (Gpu("GPU0", plain.device("GPU0").total + extra // 2),)
    budget = Budget(gpus=card, gpu_reserve=0)
    assert check(meta, s, budget).fits
    assert not check(meta, s, budget, mmproj=proj).fits
    alone = max_context(meta, s, budget)
    both = max_context(meta, s, budget, mmproj=proj)
    assert alone.fits and both.fits and both.verdict == "fits (bound)"
    assert both.footprint.settings.n_ctx < alone.footprint.settings.n_ctx
    near = nearest_fit(meta, s, budget, mmproj=proj)
    assert near is not None and check(meta, near, budget, mmproj=proj).fits


def test_the_schedulers_delta_net_bound_is_listed(tmp_path: Path) -> None:
    """qwen3next with its recurrent state in host memory on a Vulkan card: llama.cpp runs the
    unfused delta net, which core.sched bounds; the plan lists that bound on the card."""
    from qmgui.core.sched import _unfused_delta_net_bound
    from tests.synth.factory import PRESETS, write_gguf

    path = write_gguf(tmp_path / "tiny-qwen3next.gguf", PRESETS["qwen3next"])
    meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    gpus = (Gpu("GPU0", 8 * GIB, backend="vulkan"),)
    on_card = estimate(meta, LaunchSettings(ctx_size=1024), gpus)
    assert on_card.bounds == ()
    fp = estimate(meta, LaunchSettings(ctx_size=1024, kv_offload=False), gpus)
    (bound,) = fp.bounds
    assert bound.part == "compute" and bound.device == "GPU0"
    assert bound.bytes == _unfused_delta_net_bound(meta, fp.settings, False) > 0
    assert "gated-delta-net" in bound.why and not any("carries a bound" in n for n in fp.notes)
    assert fp.device("GPU0").compute >= bound.bytes
