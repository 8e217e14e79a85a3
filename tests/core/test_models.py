"""The architecture families (qmgui.core.models): adding an architecture is one module and
its test. Every module there declares its FAMILY and its architectures in models.INDEX, no
architecture is served twice, and every architecture a family serves is checked here against
what an engine allocated (tests/core/fixtures/compute): a verified architecture exactly, on
the test engine's launches (launches.csv); a laid-out one or a close relative within the
margin, on b11434's launches of test-llama-archs' models (archs_b11434.json,
bounds_b11434.json). An architecture without a measured launch fails here."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections import Counter
from dataclasses import replace
from functools import cache

import pytest

from qmgui.core import models
from qmgui.core.compute import MIXED_BATCH_BUILD, compute_buffer_bytes, is_embedding
from qmgui.core.errors import SizingError
from qmgui.core.gguf_header import header_from_data
from qmgui.core.launch import LaunchSettings, resolve
from qmgui.core.meta import ModelMeta, meta_from_gguf
from qmgui.core.models.family import Family
from tests.core.test_bounds import SETTINGS
from tests.core.test_compute import FIXTURES, MIB, OVER, PRINTED, _launches, _models, _resolved

_SAMPLE = 6  # launches per verified architecture (test_compute checks every one)


def _family_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(models.__path__) if m.name != "family")


def _served() -> list[tuple[str, str, str]]:
    """(module, architecture, how far it is checked) for everything the registry serves."""
    out = []
    for f in models.all_families():
        module = f.build.__module__.rsplit(".", 1)[1]
        out += [(module, a, "verified") for a in f.verified]
        out += [(module, a, "margin") for a in (*f.laid_out, *f.relatives)]
    return out


def test_every_family_module_is_registered() -> None:
    names = _family_modules()
    assert len(names) == len(models.all_families())
    for name in names:
        module = importlib.import_module(f"qmgui.core.models.{name}")
        family = getattr(module, "FAMILY", None)
        assert isinstance(family, Family), f"{name} declares no FAMILY"
        index = {a for a, m in models.INDEX.items() if m == name}
        assert index == set(family.architectures), f"models.INDEX lists {name} wrong"
        assert family.build.__module__ == module.__name__, f"{name}'s graph lives elsewhere"
        assert family.architectures, f"{name} serves no architecture"


def test_no_architecture_is_served_twice() -> None:
    counts = Counter(a for f in models.all_families() for a in f.architectures)
    assert [a for a, n in counts.items() if n > 1] == []
    assert set(counts) == set(models.INDEX)
    for arch, module in models.INDEX.items():
        assert (
            models.family_of(arch) is importlib.import_module(f"qmgui.core.models.{module}").FAMILY
        )


@cache
def _b11434_cases() -> dict[str, list[tuple[ModelMeta, str, float]]]:
    """b11434's measured compute buffers of test-llama-archs' models, by architecture."""
    by_arch: dict[str, list[tuple[ModelMeta, str, float]]] = {}
    for name in ("archs_b11434.json", "bounds_b11434.json"):
        data = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
        metas: dict[str, ModelMeta] = {}
        for model, setting, measured in data["cases"]:
            if model not in metas:
                header = header_from_data(f"{model}.gguf", data["models"][model]["header"])
                metas[model] = meta_from_gguf(header, file_name=model)
            meta = metas[model]
            by_arch.setdefault(meta.architecture, []).append((meta, setting, float(measured)))
    return by_arch


@pytest.mark.parametrize(("module", "arch", "check"), _served())
def test_each_architecture_a_family_serves_is_measured(module: str, arch: str, check: str) -> None:
    if check == "verified":
        rows = [row for row in _launches() if _models()[row["model"]].architecture == arch]
        assert rows, f"{module}: no launch of {arch} in fixtures/compute/launches.csv"
        for row in rows[:: max(1, len(rows) // _SAMPLE)]:
            meta = _models()[row["model"]]
            predicted = compute_buffer_bytes(
                meta, _resolved(row), embeddings=row["embedding"] == "1"
            )
            assert abs(predicted / MIB - float(row["compute_mib"])) <= PRINTED, (module, row)
        return
    cases = _b11434_cases().get(arch, [])
    assert cases, f"{module}: no b11434 launch of {arch} in fixtures/compute"
    for meta, setting, measured in cases:
        embeddings = is_embedding(meta)
        r = resolve(meta, SETTINGS[setting])
        got = compute_buffer_bytes(meta, r, embeddings=embeddings, mixed_batch=True) / MIB
        assert measured - PRINTED <= got <= measured * OVER, (module, meta.name, setting)


# Launches of a build whose compute buffer qmgui does not predict within the band, each with
# its reason (issue 17: at least 95% of the launches in [measured, measured x 1.05]).
_KNOWN_MISSES: dict[int, dict[tuple[str, str], str]] = {10435: {}, 11434: {}}


@cache
def _build_cases(build: int) -> list[tuple[str, ModelMeta, str, float]]:
    """bench/compute_bounds.py's measurements of one build (fixtures/compute/bounds_bN.json):
    every model that build's test-llama-archs writes, at the seven settings of test_bounds."""
    data = json.loads((FIXTURES / f"bounds_b{build}.json").read_text(encoding="utf-8"))
    metas: dict[str, ModelMeta] = {}
    out = []
    for model, setting, measured in data["cases"]:
        if model not in metas:
            header = header_from_data(f"{model}.gguf", data["models"][model]["header"])
            metas[model] = meta_from_gguf(header, file_name=model)
        out.append((model, metas[model], setting, float(measured)))
    return out


@pytest.mark.parametrize("build", sorted(_KNOWN_MISSES))
def test_every_architecture_of_a_build_is_predicted_within_the_band(build: int) -> None:
    """Each build's own test models (b10435: the test engine's llama.cpp, b11434: the newer
    one), at every setting measured: the compute buffer predicted by that build's rules lies
    in [measured, measured x 1.05]: no architecture is charged a bound, and only the listed
    launches miss, for the reason given."""
    misses: dict[tuple[str, str], str] = {}
    cases = _build_cases(build)
    for model, meta, setting, measured in cases:
        embeddings = is_embedding(meta)
        r = resolve(meta, SETTINGS[setting])
        try:
            got = compute_buffer_bytes(
                meta, r, embeddings=embeddings, mixed_batch=build >= MIXED_BATCH_BUILD
            )
        except SizingError as e:
            misses[(model, setting)] = f"bound: {e}"
            continue
        if not measured - PRINTED <= got / MIB <= measured * OVER:
            misses[(model, setting)] = f"{got / MIB:.2f} vs {measured:.2f} MiB"
    assert set(misses) == set(_KNOWN_MISSES[build]), misses
    assert len(cases) > 700
    assert len(misses) <= 0.05 * len(cases)


@pytest.mark.parametrize(
    "model",
    [
        "deepseek32-moe",
        "glm-dsa-moe",
        "dots3note-moe",
        "hy_v4-moe",
        "glm5-next-moe",
        "deepseek4-moe",
    ],
)
def test_a_walk_compiled_above_the_indexer_selection_is_not_replayed_below_it(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sparse attention keeps min(cells, indexer top-k) cells a query: not affine in the
    cells, so a walk compiled at a context above the selection must not be replayed at one
    below it (nor the reverse): each context gives what building and walking its own graph
    gives, whatever context came first."""
    from qmgui.core import compute

    meta = next(m for name, m, _, _ in _build_cases(11434) if name == model)
    meta = replace(meta, indexer_top_k=2048)
    build, _ = compute._layout(meta, mixed_batch=True)
    for order in ((8192, 1024, 3072), (1024, 8192, 3072)):
        for name in ("_PROGRAMS", "_BUILT", "_PEAKS"):
            monkeypatch.setattr(compute, name, {})
        for ctx in order:
            r = resolve(meta, LaunchSettings(ctx_size=ctx, parallel=1))
            plain = compute._reserve_bytes_plain(meta, r, build, False)
            with compute.searching():  # compiled at the first context (not walked plainly)
                assert compute._reserve_bytes(meta, r, build, False) == plain, (order, ctx)
