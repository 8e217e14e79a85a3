"""qwen4exp's per-layer embeddings: the PLE n-gram convolution history kept in the recurrent
state of the PLE layers."""

from __future__ import annotations

from qmgui.core.hparams.keys import MAX_LAYERS, MAX_SMALL, Keys

ARCHS = frozenset({"qwen4exp"})


def ple_state(k: Keys, arch: str, n_layer: int, n_embd: int) -> tuple[int, tuple[bool, ...]]:
    """models/qwen4exp.cpp: ple.layers lists the PLE layer; its conv history holds
    (ple.conv_kernel - 1) x ple.ngram_size x hyper_connection.count x n_embd floats."""
    layers = k.raw("ple.layers")
    if arch != "qwen4exp" or not isinstance(layers, tuple) or not layers:
        return 0, ()
    flags = [False] * n_layer
    for i, x in enumerate(layers):
        il = k.element("ple.layers", i, x, MAX_LAYERS, "layers")
        if il < n_layer:
            flags[il] = True
    kernel = k.get_int("ple.conv_kernel", 0, hi=MAX_SMALL, unit="values") or 0
    ngram = k.get_int("ple.ngram_size", 0, hi=MAX_SMALL, unit="tokens") or 0
    hc = k.get_int("hyper_connection.count", 0, hi=MAX_SMALL, unit="streams") or 0
    if not (kernel and ngram and hc):
        return 0, ()
    return (kernel - 1) * ngram * hc * n_embd, tuple(flags)
