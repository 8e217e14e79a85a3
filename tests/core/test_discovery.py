"""Discovery: every layout a user's models live in, and every way a tree can be broken."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qmgui.core import discovery
from qmgui.core.discovery import ModelEntry, scan
from qmgui.core.meta import ModelClass
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_mmproj, write_split


def by_name(models: tuple[ModelEntry, ...]) -> dict[str, ModelEntry]:
    return {m.name: m for m in models}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_gguf(root / "chat" / "tiny-llama-F16.gguf", PRESETS["llama"])
    write_gguf(root / "vision" / "tiny-qwen2-F16.gguf", PRESETS["qwen2"])
    write_mmproj(root / "vision" / "mmproj-tiny-qwen2-f16.gguf")
    write_split(root / "big", PRESETS["qwen3moe"], n_shards=3)
    write_gguf(root / "embed" / "tiny-bert.gguf", PRESETS["bert"])
    write_hf_folder(root / "hf" / "TinyLlama")
    # an HF folder with a conversion beside it: the GGUF is the model, the folder is not
    conv = write_hf_folder(root / "hf" / "Converted")
    write_gguf(conv / "converted-F16.gguf", PRESETS["llama"])
    # an HF folder that is not a chat model (a classifier)
    write_hf_folder(root / "hf" / "Classifier", architecture="BertForSequenceClassification")
    (root / "broken").mkdir()
    (root / "broken" / "truncated.gguf").write_bytes(
        (root / "chat" / "tiny-llama-F16.gguf").read_bytes()[:5000]
    )
    (root / "broken" / "notes.txt").write_text("not a model")
    return root


def test_finds_every_kind_in_a_folder(tree: Path) -> None:
    result = scan([tree])
    models = by_name(result.models)
    assert set(models) == {
        "tiny-llama-F16",
        "tiny-qwen2-F16",
        next(n for n in models if n.startswith(PRESETS["qwen3moe"].name)),
        "tiny-bert",
        "TinyLlama",
        "converted-F16",
        "truncated",
    }
    assert result.problems == ()
    llama = models["tiny-llama-F16"]
    assert llama.format == "gguf"
    assert llama.meta is not None and llama.meta.architecture == "llama"
    assert llama.model_class == ModelClass.LLM
    assert llama.error is None
    assert llama.size_bytes == (tree / "chat" / "tiny-llama-F16.gguf").stat().st_size


def test_projector_is_paired_not_listed(tree: Path) -> None:
    models = by_name(scan([tree]).models)
    assert models["tiny-qwen2-F16"].mmproj == str(tree / "vision" / "mmproj-tiny-qwen2-f16.gguf")
    assert all("mmproj" not in m.name for m in models.values())
    assert models["tiny-llama-F16"].mmproj is None


def test_split_set_is_one_model_with_summed_size(tree: Path) -> None:
    models = scan([tree]).models
    split = next(m for m in models if m.name.startswith(PRESETS["qwen3moe"].name))
    shards = sorted((tree / "big").glob("*.gguf"))
    assert len(shards) == 3
    assert split.shards == tuple(str(p) for p in shards)
    assert split.path == str(shards[0])
    assert split.size_bytes == sum(p.stat().st_size for p in shards)
    assert split.error is None
    assert split.meta is not None and split.meta.architecture == "qwen3moe"
    # the tensor table spans every shard
    assert split.meta.weight_bytes > 0
    assert len(split.meta.tensors) > len(split.meta.tensors) // 3


def test_missing_shard_is_an_error_on_the_row(tmp_path: Path) -> None:
    shards = write_split(tmp_path, PRESETS["llama"], n_shards=3)
    shards[1].unlink()
    (m,) = scan([tmp_path]).models
    assert m.error is not None
    assert "missing shard(s) 2 of 3" in m.error


def test_classes(tree: Path) -> None:
    models = by_name(scan([tree]).models)
    assert models["tiny-bert"].model_class == ModelClass.EMBEDDING
    assert models["TinyLlama"].model_class == ModelClass.LLM
    assert models["TinyLlama"].format == "hf"


def test_hf_folder_rules(tree: Path) -> None:
    models = by_name(scan([tree]).models)
    hf = models["TinyLlama"]
    assert hf.path == str(tree / "hf" / "TinyLlama")
    assert hf.meta is not None and hf.meta.weight_bytes > 0
    assert "Converted" not in models  # a GGUF beside it wins
    assert "Classifier" not in models  # not a causal LM


def test_broken_file_marks_its_row_and_the_scan_goes_on(tree: Path) -> None:
    models = by_name(scan([tree]).models)
    bad = models["truncated"]
    assert bad.error is not None
    assert "truncated" in bad.error
    assert bad.meta is None
    assert models["tiny-llama-F16"].error is None


def test_json_form_has_the_documented_keys(tree: Path) -> None:
    for m in scan([tree]).models:
        d = m.to_json()
        for key in (
            "path",
            "name",
            "format",
            "architecture",
            "class",
            "size_bytes",
            "shards",
            "mmproj",
            "context_length",
            "quant",
            "error",
        ):
            assert key in d
        json.dumps(d)


def test_hf_cache_layout(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    repo = hub / "models--SomeOrg--Tiny-Chat"
    blobs = repo / "blobs"
    old = write_hf_folder(tmp_path / "staging-old")
    new = write_hf_folder(tmp_path / "staging-new")
    blobs.mkdir(parents=True)
    for commit, staging in (("aaa111", old), ("bbb222", new)):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for f in staging.iterdir():
            blob = blobs / f"{commit}-{f.name}"
            blob.write_bytes(f.read_bytes())
            (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("bbb222")
    (hub / "datasets--x--y").mkdir()
    (m,) = scan([hub]).models
    assert m.name == "SomeOrg/Tiny-Chat"
    assert m.source == "hf-cache"
    assert m.path == str(repo / "snapshots" / "bbb222")
    assert m.size_bytes == sum(p.stat().st_size for p in new.glob("*.safetensors"))
    assert m.size_bytes > 0


def test_hf_cache_gguf_repo_is_named_after_the_repo(tmp_path: Path) -> None:
    snap = tmp_path / "models--bartowski--Tiny-GGUF" / "snapshots" / "c0ffee"
    write_gguf(snap / "Tiny-Q8_0.gguf", PRESETS["llama"])
    (m,) = scan([tmp_path]).models
    assert m.name == "bartowski/Tiny-GGUF/Tiny-Q8_0"
    assert m.source == "hf-cache"


def _ollama_store(root: Path, *, with_projector: bool = False) -> Path:
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    model = write_gguf(root / "tmp.gguf", PRESETS["llama"])
    model.rename(blobs / "sha256-abc123")
    layers = [
        {
            "mediaType": "application/vnd.ollama.image.model",
            "digest": "sha256:abc123",
            "size": (blobs / "sha256-abc123").stat().st_size,
        },
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:t1", "size": 10},
    ]
    if with_projector:
        write_mmproj(blobs / "sha256-proj1")
        layers.append(
            {
                "mediaType": "application/vnd.ollama.image.projector",
                "digest": "sha256:proj1",
                "size": 1,
            }
        )
    for host_ns, tag in (
        ("registry.ollama.ai/library/tiny", "latest"),
        ("registry.ollama.ai/someone/tiny", "q8"),
        ("hf.co/org/repo", "Q4_K_M"),
    ):
        mf = root / "manifests" / host_ns / tag
        mf.parent.mkdir(parents=True, exist_ok=True)
        mf.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root


def test_ollama_store(tmp_path: Path) -> None:
    store = _ollama_store(tmp_path / "ollama" / "models", with_projector=True)
    models = by_name(scan([store]).models)
    assert set(models) == {"tiny:latest", "someone/tiny:q8", "hf.co/org/repo:Q4_K_M"}
    m = models["tiny:latest"]
    assert m.source == "ollama"
    assert m.path == str(store / "blobs" / "sha256-abc123")
    assert m.mmproj == str(store / "blobs" / "sha256-proj1")
    assert m.meta is not None and m.meta.architecture == "llama"
    assert m.error is None


def test_ollama_missing_blob_and_bad_manifest(tmp_path: Path) -> None:
    store = _ollama_store(tmp_path / "models")
    (store / "blobs" / "sha256-abc123").unlink()
    bad = store / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    models = by_name(scan([store]).models)
    assert "ollama pull tiny:latest" in (models["tiny:latest"].error or "")
    assert "unreadable" in (models["broken:latest"].error or "")


def test_lmstudio_folder_is_marked(tmp_path: Path) -> None:
    root = tmp_path / ".lmstudio" / "models"
    write_gguf(root / "publisher" / "Tiny-GGUF" / "tiny-Q4.gguf", PRESETS["llama"])
    (m,) = scan([root]).models
    assert m.source == "lmstudio"
    (m,) = scan([tmp_path]).models  # a root above LM Studio's folder
    assert m.source == "lmstudio"


def test_symlink_loop_is_reported_not_followed(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a" / "m.gguf", PRESETS["llama"])
    (tmp_path / "a" / "loop").symlink_to(tmp_path / "a", target_is_directory=True)
    (tmp_path / "a" / "dangling.gguf").symlink_to(tmp_path / "nowhere.gguf")
    result = scan([tmp_path])
    names = by_name(result.models)
    assert names["m"].error is None
    assert "broken symlink" in (names["dangling"].error or "")
    assert any("loop" in p.reason for p in result.problems)


def test_offline_root_and_unreadable_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_gguf(tmp_path / "ok" / "m.gguf", PRESETS["llama"])
    (tmp_path / "locked").mkdir()
    real_scandir = os.scandir

    def scandir(path: str):  # type: ignore[no-untyped-def]
        # root can read any folder, so a permission fault is injected here
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(discovery.os, "scandir", scandir)
    result = scan([tmp_path / "offline-drive", tmp_path])
    assert [m.name for m in result.models] == ["m"]
    reasons = {Path(p.path).name: p.reason for p in result.problems}
    assert "offline drive" in reasons["offline-drive"]
    assert "Permission denied" in reasons["locked"]


def test_file_vanishing_mid_scan(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a.gguf", PRESETS["llama"])
    write_gguf(tmp_path / "b.gguf", PRESETS["llama"])

    def progress(done: int, total: int, path: str) -> None:
        if path.endswith("b.gguf"):
            os.unlink(path)

    models = by_name(scan([tmp_path], progress=progress).models)
    assert models["a"].error is None
    assert "vanished" in (models["b"].error or "")


def test_progress_and_cancel(tmp_path: Path) -> None:
    for i in range(3):
        write_gguf(tmp_path / f"m{i}.gguf", PRESETS["llama"])
    calls: list[tuple[int, int]] = []
    scan([tmp_path], progress=lambda d, t, p: calls.append((d, t)))
    assert calls[0] == (0, 3)
    assert calls[-1] == (3, 3)
    stopped = scan([tmp_path], should_stop=lambda: True)
    assert stopped.cancelled


def test_a_single_file_root(tmp_path: Path) -> None:
    p = write_gguf(tmp_path / "solo.gguf", PRESETS["llama"])
    (m,) = scan([p]).models
    assert m.path == str(p)


def test_a_projector_pairs_with_its_own_model_not_its_neighbours(tmp_path: Path) -> None:
    write_gguf(tmp_path / "gemma-3-4b-it-Q4_K_M.gguf", PRESETS["gemma3"])
    write_gguf(tmp_path / "gemma-3-4b-it-Q8_0.gguf", PRESETS["gemma3"])
    write_gguf(tmp_path / "qwen3-8b-Q4_K_M.gguf", PRESETS["qwen3"])
    proj = write_mmproj(tmp_path / "mmproj-gemma-3-4b-it-f16.gguf")
    models = by_name(scan([tmp_path]).models)
    assert models["gemma-3-4b-it-Q4_K_M"].mmproj == str(proj)
    assert models["gemma-3-4b-it-Q8_0"].mmproj == str(proj)  # every quantisation of it
    assert models["qwen3-8b-Q4_K_M"].mmproj is None


def test_the_walk_goes_on_below_a_hugging_face_folder(tmp_path: Path) -> None:
    """Reference 001: an HF folder is a model, and a GGUF in a folder below it is another."""
    folder = write_hf_folder(tmp_path / "Llama-HF")
    write_gguf(folder / "gguf" / "llama-q8.gguf", PRESETS["llama"])
    models = {m.path: m for m in scan([tmp_path]).models}
    assert set(models) == {str(folder), str(folder / "gguf" / "llama-q8.gguf")}
    assert models[str(folder)].format == "hf"
    assert models[str(folder / "gguf" / "llama-q8.gguf")].format == "gguf"


def test_a_model_is_known_by_its_path_not_its_folder_name(tmp_path: Path) -> None:
    """docs/guide.md, The model table: two folders of one name in two roots (the same model
    and quantisation) are two models, each its own id for profiles, ports and exports."""
    for root in ("a", "b"):
        write_gguf(tmp_path / root / "llama" / "model-Q4_K_M.gguf", PRESETS["llama"])
    found = scan([str(tmp_path / "a"), str(tmp_path / "b")]).models
    assert len(found) == 2 and len({e.name for e in found}) == 1  # one name shown twice
    assert {e.id for e in found} == {e.path for e in found}
    assert len({e.id for e in found}) == 2
