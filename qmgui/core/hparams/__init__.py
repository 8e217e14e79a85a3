"""The per-family hyper-parameter readers `core/meta.py` calls: one module per family of keys,
each holding the architecture sets it reads its own way (its `ARCHS`) and its reader over the
shared key lookup (`keys.Keys`), as llama.cpp's `llama_model::load_hparams` reads per
architecture. `meta.py` keeps the common keys, the checks and the `ModelMeta` value.

Imports go one way: `keys` imports nothing of the others, each reader imports `keys` (the
indexer reads `mla.MlaDims` too), `meta` imports them all; nothing here imports `meta`.
Adding an architecture's rule is its entry here and its case in tests/core/test_hparams.py,
which fails for an architecture in a reader's `ARCHS` that no case checks."""

from __future__ import annotations

from qmgui.core.hparams import indexer, linear_attn, mla, ple, recurrent, rwkv, ssm, windows

# reader module -> the architectures it reads its own way
READERS: dict[str, frozenset[str]] = {
    m.__name__.rsplit(".", 1)[1]: m.ARCHS
    for m in (windows, recurrent, mla, ssm, linear_attn, rwkv, indexer, ple)
}
