"""RWKV's time-mix state dimensions (wkv.head_size, token_shift_count), read whatever the
architecture."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.hparams.keys import MAX_HEAD_DIM, MAX_SMALL, Keys

ARCHS: frozenset[str] = frozenset()  # no architecture has its own rule here


@dataclass(frozen=True)
class RwkvDims:
    head_size: int
    token_shift_count: int


def rwkv_dims(k: Keys) -> RwkvDims | None:
    head = k.get_int("wkv.head_size", 0, hi=MAX_HEAD_DIM, unit="values per head") or 0
    if not head:
        return None
    return RwkvDims(
        head_size=head,
        token_shift_count=k.get_int("token_shift_count", 2, hi=MAX_SMALL, unit="states") or 2,
    )
