"""What one module of qmgui.core.models declares: its graph and the architectures it serves."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.graph.builder import Build


@dataclass(frozen=True)
class Family:
    """One family's graph and the architectures laid out with it.

    `verified`: compared node by node with the engine's own dump, and its totals match every
    measured launch (tests/core/fixtures/compute): exact. `laid_out`: from b11434's source and
    dump (test-llama-archs' models), not the test engine's fixtures. `relatives`: close
    relatives of a verified architecture, not measured here. The last two get
    core.compute.GENERIC_MARGIN on top."""

    build: Build
    verified: tuple[str, ...] = ()
    laid_out: tuple[str, ...] = ()
    relatives: tuple[str, ...] = ()

    @property
    def architectures(self) -> tuple[str, ...]:
        return (*self.verified, *self.laid_out, *self.relatives)
