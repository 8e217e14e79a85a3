"""A sample of every architecture b11434 knows, on that build: the models its own
`test-llama-archs` writes, loaded by its llama-server (repacking on, as users run it) at the
three settings of bench/archs.py; weights, KV, recurrent state, output and compute must match
as the accuracy tables require (docs/accuracy-archs-b11434.md has every model). Skips with
the reason when b11434 is not here (scripts/build-llama 11434 --all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.accuracy import engine_build
from bench.archs import run, status, write_models
from tests.b11434 import need_b11434

# one per family the sizing core models separately, and the hybrids and cache kinds that
# b11434's loader reads in its own way (issue 17)
SAMPLE = (
    "llama-dense", "qwen3-dense", "gemma3-dense", "qwen3moe-moe", "deepseek2-moe",
    "qwen35-dense", "qwen3next-moe", "nemotron_h-dense", "falcon-h1-dense", "gpt-oss-moe",
    "lfm2-dense", "minicpm3-dense", "kimi-linear-moe", "phi3-dense", "command-r-dense",
    "gpt2-dense", "llama4-moe", "granitehybrid-dense",
    # the sparse and compressed attentions, Mamba-1, the diffusion models and MiniMax-M3's
    # MSA, laid out in their own modules (issue 17)
    "deepseek4-moe", "mamba-dense", "dream-dense", "glm5-next-moe", "minimax-m3-moe",
)  # fmt: skip


@pytest.fixture(scope="module")
def archs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    server = need_b11434()
    exe = server.with_name("test-llama-archs")
    models = write_models(exe, tmp_path_factory.mktemp("archs"), timeout_s=300)
    return server, {n: p for n, p in models.items() if n in SAMPLE}


def test_the_sample_is_sized_as_b11434_allocates(archs: tuple[Path, dict[str, Path]]) -> None:
    server, models = archs
    assert sorted(models) == sorted(SAMPLE)  # the build still writes every one of them
    build = engine_build(str(server))
    assert build == 11434  # its --version names the build: its rules size the models
    rows = run(models, str(server), jobs=2, timeout_s=120, build=build)
    bad = [
        f"{r['arch']} {r['setting']}: {status(r)} {r['verdicts']}"
        for r in rows
        if status(r) not in ("ok", "refused")
    ]
    assert not bad, "\n".join(bad)
