"""The embed role's argv with the real llama-server: a whole 2,000-token chunk is accepted in
one request, for a decoder-only embedder (pooling last) and an encoder (pooling mean), because
the role sets batch and micro-batch to its context (`core.roles`). An encoder attends to the
whole input at once, so it must fit one micro-batch: the same command with the engine's default
micro-batch (512) refuses that chunk, which is what the rule is for."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from qmgui.cli import place as place_cmd
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import EngineSpec, Supervisor
from tests.synth.factory import PRESETS, write_gguf
from tests.test_cli import run

BINARY = find_llama_server()
pytestmark = pytest.mark.skipif(BINARY is None, reason="llama-server not found")
CHUNK_TOKENS = 2000
# a decoder-only embedder (qwen3, pooling_type last) and a BERT encoder trained for 4096 tokens
MODELS = {
    "decoder": (PRESETS["qwen3-embed"], "last"),
    "encoder": (replace(PRESETS["bert"], context_length=4096), "mean"),
}


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


def embed_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> list[str]:
    """The embed role's argv from `qmgui place --json` (host memory: the engine is a CPU one)."""
    assert BINARY is not None
    model = write_gguf(tmp_path / f"{kind}.gguf", MODELS[kind][0])
    monkeypatch.setattr(place_cmd, "gpus_from", lambda args: ())
    code, out, err = run(
        "place", "--role", f"embed={model}", "--host-memory", "4GiB",
        "--backend", BINARY, "--json",
    )  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out)["models"]
    assert row["role"] == "embed" and row["placed"]
    return list(row["argv"])


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def chunk(url: str) -> tuple[str, int]:
    """Text the engine's own tokenizer reads as at least CHUNK_TOKENS tokens."""
    words = []
    n = 0
    for i in range(100_000):
        words.append(f"word{i % 97} token{i % 13}")
        if i % 200 == 199:
            status, doc = post(f"{url}/tokenize", {"content": " ".join(words)})
            assert status == 200, doc
            n = len(doc["tokens"])
            if n >= CHUNK_TOKENS:
                break
    return " ".join(words), n


def serve(argv: list[str], model_bytes: int) -> tuple[Supervisor, str]:
    """The engine started on a free port of 127.0.0.1, ready; and its URL."""
    sup = Supervisor(EngineSpec(argv=tuple(argv), model_bytes=model_bytes))
    sup.start()
    assert sup.wait_ready(60), sup.outcome
    assert sup.url is not None
    return sup, sup.url


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_2000_token_chunk_is_accepted_by_the_embed_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    argv = embed_argv(tmp_path, monkeypatch, kind)
    ctx = argv[argv.index("-c") + 1]
    assert argv[argv.index("-b") + 1] == argv[argv.index("-ub") + 1] == ctx == "4096"
    assert "--embedding" in argv and argv[argv.index("--pooling") + 1] == MODELS[kind][1]
    model = Path(argv[argv.index("-m") + 1])
    sup, url = serve(argv, model.stat().st_size)
    try:
        text, n = chunk(url)
        assert CHUNK_TOKENS <= n < int(ctx)
        status, doc = post(f"{url}/v1/embeddings", {"input": text})
        assert status == 200, doc
        (item,) = doc["data"]
        assert len(item["embedding"]) == MODELS[kind][0].n_embd
        assert doc["usage"]["prompt_tokens"] >= CHUNK_TOKENS
    finally:
        out = sup.stop()
    assert out.was_successful(), out


def test_the_engine_default_micro_batch_refuses_that_chunk_on_an_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = embed_argv(tmp_path, monkeypatch, "encoder")
    for name in ("-b", "-ub"):  # back to the engine's defaults (2048 / 512)
        i = argv.index(name)
        del argv[i : i + 2]
    model = Path(argv[argv.index("-m") + 1])
    sup, url = serve(argv, model.stat().st_size)
    try:
        text, n = chunk(url)
        assert n >= CHUNK_TOKENS
        status, doc = post(f"{url}/v1/embeddings", {"input": text})
        assert status != 200, doc
        assert "batch" in json.dumps(doc).lower()  # "increase the physical batch size"
    finally:
        out = sup.stop()
    assert out.was_successful(), out
