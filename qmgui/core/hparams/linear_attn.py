"""Linear attention: Kimi delta attention (KDA) and MiniMax-01's lightning attention, a
head_dim x head_dim state per head."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.hparams.keys import MAX_HEAD_DIM, MAX_SMALL, Keys

# architectures whose recurrent layers are Kimi delta attention ({arch}.kda.head_dim)
KDA_ARCHS = frozenset({"kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next"})
ARCHS = frozenset({*KDA_ARCHS, "minimax-01"})


@dataclass(frozen=True)
class LinearAttnDims:
    """Kimi delta attention (KDA: kimi-linear, kimi-k3, bailingmoe3, glm5-next) or MiniMax-01
    lightning attention: a head_dim x head_dim state per head (llama-hparams.cpp n_embd_s)."""

    head_dim: int  # {arch}.kda.head_dim; MiniMax-01: the attention key length
    n_head: int  # llama.cpp sizes the state with n_head(), layer 0's head count
    conv_kernel: int  # KDA's Q, K and V short convolutions (ssm.conv_kernel); 0: none
    kda: bool  # KDA keeps conv states; lightning attention keeps none


def linear_attn_dims(
    k: Keys, arch: str, n_head: tuple[int, ...], head_dim_k: int | None
) -> LinearAttnDims | None:
    """KDA (models/kimi-linear.cpp: get_key LLM_KV_KDA_HEAD_DIM) or MiniMax-01 lightning
    attention (models/minimax-01.cpp: n_embd_head_la = n_embd_head_k_full)."""
    heads = n_head[0] if n_head else 0
    if arch in KDA_ARCHS:
        head = k.get_int("kda.head_dim", 0, hi=MAX_HEAD_DIM, unit="values per head") or 0
        conv = k.get_int("ssm.conv_kernel", 0, hi=MAX_SMALL, unit="values") or 0
        return LinearAttnDims(head, heads, conv, kda=True) if head else None
    if arch == "minimax-01" and head_dim_k:
        return LinearAttnDims(head_dim_k, heads, 0, kda=False)
    return None
