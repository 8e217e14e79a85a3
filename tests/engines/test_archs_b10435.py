"""A sample of the architectures the test engine's llama.cpp (b10435, one build after the
test wheel's b10434) knows, on that build: the models its own `test-llama-archs` writes,
loaded by its llama-server (repacking on, as users run it) at the three settings of
bench/archs.py; weights, KV, recurrent state, output and compute must match as the accuracy
tables require (docs/accuracy-archs-b10435.md has every model). Skips with the reason when
the test engine or its `test-llama-archs` is not here (scripts/build-llama 10435 builds both)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.accuracy import engine_build
from bench.archs import run, status, write_models

# one per family the sizing core lays out apart, the hybrids, latent and sparse attention,
# and the diffusion models (no KV cache)
SAMPLE = (
    "llama-dense", "gemma2-dense", "qwen3moe-moe", "deepseek2-moe", "deepseek32-moe",
    "qwen3next-moe", "nemotron_h-dense", "falcon-h1-dense", "jamba-dense", "mamba-dense",
    "plamo2-dense", "minicpm3-dense", "kimi-linear-moe", "dream-dense", "llada-moe-moe",
    "arctic-moe",
)  # fmt: skip
_CACHE = Path(
    os.environ.get("QMGUI_ENGINE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qmgui-engines"
)  # read at import: the tests' own HOME is set later, per test


def _engine() -> tuple[Path, Path]:
    """The test engine's llama-server and its build's test-llama-archs, or skip."""
    found = os.environ.get("QMGUI_TEST_LLAMA_SERVER")
    if not found:
        pytest.skip("set QMGUI_TEST_LLAMA_SERVER to the test engine (scripts/test does)")
    server = Path(found)
    for exe in (
        server.with_name("test-llama-archs"),
        _CACHE / "llama-b10435-cpu" / "test-llama-archs",
        _CACHE / "llama-b10435-cpu-all" / "test-llama-archs",
    ):
        if exe.is_file() and os.access(exe, os.X_OK):
            return server, exe
    pytest.skip("no test-llama-archs of b10435: scripts/build-llama 10435 builds it")


@pytest.fixture(scope="module")
def archs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    server, exe = _engine()
    models = write_models(exe, tmp_path_factory.mktemp("archs10"), timeout_s=300)
    return server, {n: p for n, p in models.items() if n in SAMPLE}


def test_the_sample_is_sized_as_the_test_engine_allocates(
    archs: tuple[Path, dict[str, Path]],
) -> None:
    server, models = archs
    assert sorted(models) == sorted(SAMPLE)  # the build still writes every one of them
    build = engine_build(str(server))
    assert build is not None and build < 11434  # the older build's rules size the models
    rows = run(models, str(server), jobs=2, timeout_s=120, build=build)
    bad = [
        f"{r['arch']} {r['setting']}: {status(r)} {r['verdicts']}"
        for r in rows
        if status(r) not in ("ok", "refused")
    ]
    assert not bad, "\n".join(bad)
    assert sum(status(r) == "ok" for r in rows) >= 3 * len(SAMPLE) - 3
