"""Where other tools keep models: LM Studio, Ollama and the Hugging Face cache.

These are looked up, never written. Each function returns only folders that exist.
"""

from __future__ import annotations

import os
from pathlib import Path


def _home() -> Path:
    return Path.home()


def hf_cache_dirs() -> list[Path]:
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return [Path(env)]
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return [Path(hf_home) / "hub"]
    return [_home() / ".cache" / "huggingface" / "hub"]


def lmstudio_dirs() -> list[Path]:
    return [_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models"]


def ollama_dirs() -> list[Path]:
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(env)]
    return [
        _home() / ".ollama" / "models",
        Path("/usr/share/ollama/.ollama/models"),
        Path("/var/lib/ollama/.ollama/models"),
    ]


def default_store_roots() -> list[Path]:
    """The stores of other tools that exist on this machine, in a stable order."""
    out: list[Path] = []
    for p in (*lmstudio_dirs(), *ollama_dirs(), *hf_cache_dirs()):
        try:
            if p.is_dir() and p not in out:
                out.append(p)
        except OSError:
            continue
    return out


def common_model_folders() -> list[Path]:
    """Folders people often keep models in (offered on first run, never scanned unasked):
    ~/models and its spellings, llama.cpp's own download cache, a checkout's models folder."""
    home = _home()
    candidates = [
        home / "models",
        home / "Models",
        home / "llm",
        home / "LLM",
        home / "ai" / "models",
        home / "llama.cpp" / "models",
        home / ".cache" / "llama.cpp",
    ]
    out: list[Path] = []
    for p in candidates:
        try:
            if p.is_dir() and any(p.iterdir()):
                out.append(p)
        except OSError:
            continue
    return out
