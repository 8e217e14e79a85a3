"""Mamba / gated-delta-net state dimensions, read from the ssm.* keys whatever the
architecture."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.hparams.keys import MAX_SMALL, MAX_WIDTH, Keys

ARCHS: frozenset[str] = frozenset()  # no architecture has its own rule here


@dataclass(frozen=True)
class SsmDims:
    """Mamba / gated-delta-net state dimensions."""

    conv_kernel: int
    inner_size: int
    state_size: int
    group_count: int
    time_step_rank: int | None


def ssm_dims(k: Keys) -> SsmDims | None:
    def width(key: str) -> int:
        return k.get_int(key, 0, hi=MAX_WIDTH, unit="values") or 0

    if not width("ssm.state_size"):
        return None
    return SsmDims(
        conv_kernel=k.get_int("ssm.conv_kernel", 0, hi=MAX_SMALL, unit="values") or 0,
        inner_size=width("ssm.inner_size"),
        state_size=width("ssm.state_size"),
        group_count=width("ssm.group_count"),
        time_step_rank=k.get_int("ssm.time_step_rank", hi=MAX_WIDTH, unit="values"),
    )
