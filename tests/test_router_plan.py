"""The router's preset goes through each model's own launch: its saved profile, the command
line over it, one section per model named by the model, and what cannot run left out; and
`qmgui serve` refuses router-only flags without `--router`. No engine runs here."""

from __future__ import annotations

import io
from pathlib import Path

from qmgui.core.discovery import entry_for_path
from qmgui.core.launch import LaunchSettings
from qmgui.service.launch import Request, Resolver, emit_model
from qmgui.service.router import plan_router, router_id
from qmgui.settings import LoadResult, ModelOverride, Settings
from tests.synth.factory import PRESETS, write_gguf


def _entries(tmp_path: Path) -> list:  # type: ignore[type-arg]
    paths = [write_gguf(tmp_path / f"{n}.gguf", PRESETS["llama"]) for n in ("m-one", "m-two")]
    return [entry_for_path(str(p)) for p in paths]


def test_sections_carry_each_models_own_launch(tmp_path: Path) -> None:
    one, two = _entries(tmp_path)
    saved = {one.id: ModelOverride(ctx_size=1024, extra_args=["--no-warmup"])}
    resolver = Resolver(LoadResult(Settings(model_overrides=saved)), probe=False)
    req = Request(settings=LaunchSettings(), gpus=(), reserve=0, port=8080, extra=("-np", "1"))
    plan = plan_router([one, two], resolver, req, host_bytes=None)
    assert plan.models == ("m-one", "m-two") and plan.models_max == 2
    first, second = plan.preset.split("[m-one]\n", 1)[1].split("[m-two]\n")
    assert f"model = {one.path}\n" in first and "ctx-size = 1024\n" in first
    assert "no-warmup = true\n" in first and "np = 1\n" in first
    assert "ctx-size = 1024" not in second and "np = 1\n" in second
    # the same values as the model's own launch command
    own = emit_model(one, resolver.target(one), req, saved[one.id]).command.argv  # type: ignore[arg-type]
    assert "--no-warmup" in own and own[own.index("-c") + 1] == "1024"
    # the command line wins over the saved profile
    given = Request(
        settings=LaunchSettings(ctx_size=512), gpus=(), reserve=0, port=8080, extra=(),
        given=frozenset({"ctx_size"}),
    )  # fmt: skip
    assert "ctx-size = 1024" not in plan_router([one], resolver, given).preset
    assert plan_router([one], resolver, req, max_models=5).models_max == 1  # at most n
    assert router_id([one, two]) == router_id([two, one]) != router_id([one])


def test_a_model_that_cannot_run_is_left_out(tmp_path: Path) -> None:
    one, _ = _entries(tmp_path)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00")
    resolver = Resolver(LoadResult(Settings()), probe=False)
    req = Request(settings=LaunchSettings(), gpus=(), reserve=0, port=8080, extra=())
    plan = plan_router([one, entry_for_path(str(broken))], resolver, req)
    assert plan.models == ("m-one",)
    assert any(w.startswith("broken: left out") for w in plan.warnings)


def test_serve_refuses_router_flags_without_router(tmp_path: Path) -> None:
    from qmgui.cli import main

    one, two = _entries(tmp_path)
    for argv in (
        ["serve", one.path, two.path],
        ["serve", one.path, "--models-max", "2"],
        ["serve", "--router", one.path, two.path, "--models-max", "0"],
    ):
        err = io.StringIO()
        assert main(argv, out=io.StringIO(), err=err) == 2, argv
        assert err.getvalue()
