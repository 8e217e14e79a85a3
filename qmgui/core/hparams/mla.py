"""Multi-head latent attention (DeepSeek-V2/V3, Kimi, MiniCPM3...): the compressed KV
dimensions."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.hparams.keys import MAX_HEAD_DIM, MAX_WIDTH, Keys

MLA_ARCHS = frozenset(
    {"deepseek2", "deepseek2ocr", "kimi-linear", "minicpm3", "glm-dsa", "mistral4"}
)
ARCHS = MLA_ARCHS  # an old GGUF of one of these (no key_length_mla) is warned about


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi): the compressed KV dimensions."""

    kv_lora_rank: int
    q_lora_rank: int | None
    rope_dim: int | None  # qk_rope_head_dim
    key_length_mla: int | None  # per-head K size before compression (None on old GGUFs)
    value_length_mla: int | None


def mla_dims(k: Keys, arch: str, warnings: list[str]) -> MlaDims | None:
    kv_lora = k.get_int("attention.kv_lora_rank", hi=MAX_WIDTH, unit="values")
    if not kv_lora:
        return None

    def head(key: str) -> int | None:
        # a key written as 0 is no value: llama.cpp's is_mla() needs key_length_mla and
        # value_length_mla both non-zero, else it caches full K and V (llama-hparams.cpp)
        return k.get_int(key, hi=MAX_HEAD_DIM, unit="values per head") or None

    mla = MlaDims(
        kv_lora_rank=kv_lora,
        q_lora_rank=k.get_int("attention.q_lora_rank", hi=MAX_WIDTH, unit="values"),
        rope_dim=head("rope.dimension_count"),
        key_length_mla=head("attention.key_length_mla"),
        value_length_mla=head("attention.value_length_mla"),
    )
    if mla.key_length_mla is None and arch in MLA_ARCHS:
        warnings.append(
            "old MLA GGUF (no key_length_mla): llama.cpp caches full K and V "
            "for it, far more memory than a re-converted file"
        )
    return mla
