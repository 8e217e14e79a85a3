"""Which layers keep a recurrent state (llama.cpp's recurrent_layer_arr: pure recurrent models,
hybrids by KV heads or by a full-attention interval, Nemotron-H, Falcon-H1)."""

from __future__ import annotations

from qmgui.core.hparams.keys import MAX_LAYERS, Keys

PURE_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# hybrids whose attention layers are those with head_count_kv > 0
HYBRID_BY_KV_ARCHS = frozenset(
    {
        "jamba",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "plamo2",
        "nemotron_h",
        "nemotron_h_moe",
        "kimi-linear",
        "kimi-k3",
        "bailingmoe3",
        "glm5-next",
    }
)
INTERVAL_HYBRID_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
# the architectures read here their own way
ARCHS = frozenset(
    {
        *PURE_RECURRENT_ARCHS,
        *HYBRID_BY_KV_ARCHS,
        *INTERVAL_HYBRID_ARCHS,
        "nemotron_h",
        "nemotron_h_moe",
        "falcon-h1",
    }
)


def recurrent_layers(
    k: Keys, arch: str, n_layer: int, kv: tuple[int, ...], ff: tuple[int, ...]
) -> tuple[bool, ...]:
    if arch in PURE_RECURRENT_ARCHS:
        return (True,) * n_layer
    if arch in INTERVAL_HYBRID_ARCHS:
        # llama.cpp reads {arch}.attention.recurrent_layers (models/qwen35.cpp: get_key_or_arr
        # LLM_KV_ATTENTION_RECURRENT_LAYERS), else full_attention_interval
        arr = k.raw("attention.recurrent_layers")
        if isinstance(arr, tuple) and arr:
            flags = tuple(bool(x) for x in arr)
            return (flags + (False,) * n_layer)[:n_layer]
        if isinstance(arr, (bool, int)):
            return (bool(arr),) * n_layer  # one value for every layer
        default = 8 if arch == "minimax-01" else 4  # models/minimax-01.cpp: 8
        interval = (
            k.get_int("full_attention_interval", default, hi=MAX_LAYERS, unit="layers") or default
        )
        return tuple((il + 1) % interval != 0 for il in range(n_layer))
    if arch in ("nemotron_h", "nemotron_h_moe"):
        # attention layers have KV heads, MLP-only layers have a feed-forward, the rest are SSM
        return tuple(kv[il] == 0 and ff[il] == 0 for il in range(n_layer))
    if arch == "falcon-h1":
        return (True,) * n_layer  # every layer has both an SSM and attention
    if arch in HYBRID_BY_KV_ARCHS:
        return tuple(h == 0 for h in kv)  # llama.cpp: is_recr = n_head_kv(il) == 0
    return (False,) * n_layer
