"""ggml.graph.Graph.expand: ggml_visit_parents' order (sources in order, depth first, each
tensor once, a node after its sources), recursive while shallow and by an explicit stack
when deep, the same order either way."""

from __future__ import annotations

import random

import pytest

from qmgui.core.ggml import graph as graph_mod
from qmgui.core.ggml.graph import Graph
from qmgui.core.ggml.tensor import Tensor


def _reference(roots: list[Tensor]) -> tuple[list[int], list[int]]:
    """ggml_visit_parents written plainly (recursion without a limit), by tensor ids."""
    seen: set[int] = set()
    nodes: list[int] = []
    leafs: list[int] = []

    def visit(t: Tensor) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        for s in t.src:
            visit(s)
        (leafs if t.op == "none" else nodes).append(id(t))

    for r in roots:
        visit(r)
    return nodes, leafs


def _random_graph(rng: random.Random, n: int) -> tuple[Graph, list[Tensor]]:
    g = Graph()
    made = [g.input("f32", 4) for _ in range(3)]
    for _ in range(n):
        srcs = rng.sample(made, k=min(len(made), rng.randint(1, 3)))
        made.append(g.op("add", *srcs))
    roots = rng.sample(made[3:], k=min(5, n))
    return g, roots


@pytest.mark.parametrize("deep", [200, 3])
@pytest.mark.parametrize("seed", range(20))
def test_expand_visits_as_ggml_does(seed: int, deep: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order of ggml_visit_parents, with the recursion's depth limit as set and tiny
    (so that the explicit stack takes over mid-walk)."""
    monkeypatch.setattr(graph_mod, "_DEEP", deep)
    g, roots = _random_graph(random.Random(seed), 60)
    for r in roots:
        g.expand(r)
    assert ([id(t) for t in g.nodes], [id(t) for t in g.leafs]) == _reference(roots)


def test_a_chain_deeper_than_the_recursion_limit_expands() -> None:
    g = Graph()
    t = g.input("f32", 8)
    chain = [t]
    for _ in range(5000):
        chain.append(g.op("scale", chain[-1]))
    g.expand(chain[-1])
    assert g.leafs == [t]
    assert g.nodes == chain[1:]
