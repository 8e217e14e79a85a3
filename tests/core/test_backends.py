"""Backend registry: which entry serves a model and why, ★ moves, and registry checks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import FrozenInstanceError, dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmgui.core.backends import (
    CLASSES,
    FAMILY_CLASSES,
    KIND_CLASSES,
    KINDS,
    REGISTRY_ONLY_CLASSES,
    Backend,
    BackendChoice,
    canonical_kind,
    classes_served,
    clear_default,
    default_for_class,
    default_problem,
    is_class_served,
    kind_classes,
    model_family,
    registry_problems,
    resolve_backend,
    set_default,
    sort_classes,
)
from qmgui.core.discovery import ModelEntry
from qmgui.core.errors import SettingsError
from qmgui.core.meta import ModelClass, ModelMeta


def make_meta(model_class: str = "llm", fmt: str = "gguf", arch: str | None = None) -> ModelMeta:
    """The smallest ModelMeta resolution reads: format, class and (for a family hint) the
    architecture, blank by default for the classes whose engines read different weights."""
    if arch is None:
        arch = "" if model_class in FAMILY_CLASSES else "llama"
    return ModelMeta(
        format=fmt,
        architecture=arch,
        name="t",
        model_class=ModelClass(model_class),
        quant="F16",
        param_count=1,
        weight_bytes=1,
        context_length=8192,
        n_layer=1,
        n_embd=64,
        n_head=(4,),
        n_head_kv=(2,),
        head_dim_k=16,
        head_dim_v=16,
    )


def model(model_class: str = "llm", fmt: str = "gguf", arch: str | None = None) -> ModelEntry:
    return ModelEntry(
        id=f"/m/{model_class}.{fmt}",
        path=f"/m/{model_class}.{fmt}",
        name=f"a {model_class} model",
        format=fmt,
        source="folder",
        size_bytes=1,
        meta=make_meta(model_class, fmt, arch),
    )


UNREADABLE = ModelEntry(
    id="/m/broken.gguf",
    path="/m/broken.gguf",
    name="broken",
    format="gguf",
    source="folder",
    size_bytes=8,
    error="not a GGUF file (bad magic)",
)


def be(
    backend_id: str,
    kind: str,
    *,
    star: Iterable[str] = (),
    classes: Iterable[str] = (),
    family: str | None = None,
) -> Backend:
    return Backend(
        id=backend_id,
        kind=kind,
        executable=f"/opt/{backend_id}",
        default_for=frozenset(star),
        classes=frozenset(classes),
        family=family,
    )


LLAMA = be("llama", "llama")
LLAMA_STAR = be("llama*", "llama", star={"llm"})
LLAMA_EMBED_STAR = be("llama-embed*", "llama", star={"embedding"})
VLLM = be("vllm", "vllm")
VLLM_STAR = be("vllm*", "vllm", star={"llm"})
VLLM_EMBED = be("vllm-embed", "vllm")
SD = be("sd", "sd")
SD_BAD_STAR = be("sd-llm*", "sd", star={"llm"})  # ★ for a class its kind does not serve
TTS_STAR = be("ttscpp*", "tts", star={"tts"})
KOKORO = be("kokoro", "kokoro")
QWEN_TTS = be("qwentts", "custom", classes={"tts"}, family="qwen3-tts")
QWEN_TTS_STAR = be("qwentts*", "custom", star={"tts"}, classes={"tts"}, family="Qwen3-TTS, x")
AUDIO_TTS_STAR = be("audio*", "audiocpp", star={"tts"})
AUDIO_ASR_STAR = be("audio-asr*", "audiocpp", star={"asr"})
PARAKEET = be("parakeet", "parakeet")
WHISPER = be("whisper", "whisper")
CUSTOM_IMAGE = be("comfy", "custom", classes={"image"})
CUSTOM_NONE = be("nothing", "custom")
CUSTOM_LLM = be("sglang", "custom", classes={"llm"})

NO_BACKEND_TTS = "no backend serves tts: add one in Backends"
HF_NO_VLLM = "Hugging Face folder needs vLLM: no vLLM backend registered"


@dataclass(frozen=True)
class Case:
    """One row of the resolution table: what is resolved, and what must come out."""

    model: ModelEntry
    registry: tuple[Backend, ...]
    chosen: str | None  # the id of the entry that must be picked
    reason: str
    pin: str | None = None
    hint: str | None = None
    skipped: bool = False


HF_LLM = model(fmt="hf")
NOT_FOR_HF = "cannot read a Hugging Face folder"

CASES = {
    # --- nothing, first, ★ --------------------------------------------------------------------
    "empty-registry": Case(model(), (), None, "no backend serves llm: add one in Backends"),
    "none": Case(model("tts"), (LLAMA, SD), None, NO_BACKEND_TTS),
    "first": Case(model(), (SD, LLAMA, VLLM), "llama", "first llm backend"),
    "star": Case(model(), (LLAMA, VLLM_STAR), "vllm*", "★ default for llm"),
    "star-of-another-class-is-no-star": Case(
        model(), (LLAMA_EMBED_STAR, VLLM), "llama-embed*", "first llm backend"
    ),
    "star-per-class": Case(
        model("embedding"), (VLLM, LLAMA_EMBED_STAR), "llama-embed*", "★ default for embedding"
    ),
    "vllm-serves-rerank": Case(
        model("rerank"), (VLLM_EMBED, LLAMA), "vllm-embed", "first rerank backend"
    ),
    "star-on-a-kind-that-does-not-serve-is-ignored": Case(
        model(), (SD_BAD_STAR, LLAMA), "llama", "first llm backend"
    ),
    "two-stars-first-wins": Case(
        model(), (LLAMA, LLAMA_STAR, replace(VLLM_STAR, id="2nd*")), "llama*", "★ default for llm"
    ),
    "custom-serves-declared-class": Case(
        model("image"), (CUSTOM_NONE, CUSTOM_IMAGE), "comfy", "first image backend"
    ),
    "custom-without-classes": Case(
        model("image"), (CUSTOM_NONE,), None, "no backend serves image: add one in Backends"
    ),
    # --- pins ---------------------------------------------------------------------------------
    "pin": Case(model(), (LLAMA_STAR, VLLM), "vllm", "pinned", pin="vllm"),
    "blank-pin-is-no-pin": Case(
        model(), (LLAMA_STAR, VLLM), "llama*", "★ default for llm", pin="  "
    ),
    "stale-pin-unknown-id": Case(
        model(),
        (LLAMA, VLLM_STAR),
        "vllm*",
        "stale pin 'gone' (no such backend): used ★ default for llm",
        pin="gone",
    ),
    "stale-pin-wrong-class": Case(
        model(),
        (SD, LLAMA),
        "llama",
        "stale pin 'sd' (a sd backend does not serve llm): used first llm backend",
        pin="sd",
    ),
    "stale-pin-and-nothing": Case(
        model("tts"),
        (SD,),
        None,
        f"stale pin 'gone' (no such backend): {NO_BACKEND_TTS}",
        pin="gone",
    ),
    "pin-beats-family-hint": Case(
        model("tts"), (AUDIO_TTS_STAR, KOKORO), "kokoro", "pinned", pin="kokoro", hint="audiocpp"
    ),
    # --- multi-class kinds --------------------------------------------------------------------
    "audiocpp-serves-asr-too": Case(model("asr"), (AUDIO_TTS_STAR,), "audio*", "first asr backend"),
    "audiocpp-star-for-tts": Case(
        model("tts"), (PARAKEET, AUDIO_TTS_STAR), "audio*", "★ default for tts"
    ),
    "audiocpp-pinned-for-asr": Case(
        model("asr"), (AUDIO_TTS_STAR, PARAKEET), "audio*", "pinned", pin="audio*"
    ),
    # --- family hints -------------------------------------------------------------------------
    "hint-matches-kind-beats-star": Case(
        model("tts"),
        (TTS_STAR, KOKORO),
        "kokoro",
        "first tts backend for family 'kokoro'",
        hint="kokoro",
    ),
    "hint-prefers-star-of-the-family": Case(
        model("tts"),
        (TTS_STAR, QWEN_TTS, QWEN_TTS_STAR),
        "qwentts*",
        "★ default for tts (family 'qwen3-tts')",
        hint="qwen3-tts",
    ),
    "hint-matches-declared-family": Case(
        model("tts"),
        (TTS_STAR, QWEN_TTS),
        "qwentts",
        "first tts backend for family 'qwen3-tts'",
        hint=" Qwen3-TTS ",
    ),
    "hint-unmatched": Case(
        model("tts"),
        (KOKORO, TTS_STAR),
        "ttscpp*",
        "★ default for tts (no tts backend for family 'orpheus')",
        hint="orpheus",
    ),
    "hint-unmatched-first": Case(
        model("tts"),
        (KOKORO,),
        "kokoro",
        "first tts backend (no tts backend for family 'orpheus')",
        hint="orpheus",
    ),
    "hint-keeps-parakeet-from-audiocpp-star": Case(
        model("asr"),
        (AUDIO_ASR_STAR, WHISPER, PARAKEET),
        "parakeet",
        "first asr backend for family 'parakeet'",
        hint="parakeet",
    ),
    # the hint from the model's header when the caller gives none (every real path)
    "header-hint-keeps-whisper-from-audiocpp-star": Case(
        model("asr", arch="whisper"),
        (AUDIO_ASR_STAR, PARAKEET, WHISPER),
        "whisper",
        "first asr backend for family 'whisper'",
    ),
    "header-hint-picks-kokoro-over-the-tts-star": Case(
        model("tts", arch="Kokoro"),
        (TTS_STAR, replace(KOKORO, default_for=frozenset({"tts"}))),
        "kokoro",
        "★ default for tts (family 'kokoro')",
    ),
    "header-hint-unmatched-is-named": Case(
        model("image", arch="flux"),
        (SD,),
        "sd",
        "first image backend (no image backend for family 'flux')",
    ),
    "blank-hint-asks-for-none": Case(
        model("asr", arch="whisper"),
        (AUDIO_ASR_STAR, WHISPER),
        "audio-asr*",
        "★ default for asr",
        hint="",
    ),
    "header-hint-ignored-for-llm": Case(
        model(arch="vllm"), (LLAMA_STAR, VLLM), "llama*", "★ default for llm"
    ),
    "hint-ignored-for-interchangeable-llm-engines": Case(
        model(), (LLAMA_STAR, VLLM), "llama*", "★ default for llm", hint="vllm"
    ),
    "hint-for-image": Case(
        model("image"),
        (SD, replace(CUSTOM_IMAGE, family="flux")),
        "comfy",
        "first image backend for family 'flux'",
        hint="flux",
    ),
    # --- Hugging Face folders -----------------------------------------------------------------
    "hf-vllm-star": Case(HF_LLM, (LLAMA, VLLM_STAR), "vllm*", "★ default for llm"),
    "hf-vllm-beats-llama-star": Case(
        HF_LLM,
        (LLAMA_STAR, VLLM),
        "vllm",
        f"first vLLM backend for llm (the ★ llm default 'llama*' is llama and {NOT_FOR_HF})",
    ),
    "hf-vllm-star-before-first-vllm": Case(
        HF_LLM, (LLAMA, VLLM, replace(VLLM_STAR, id="vllm-b*")), "vllm-b*", "★ default for llm"
    ),
    "hf-first-vllm": Case(
        HF_LLM, (LLAMA, VLLM), "vllm", "first vLLM backend for llm (Hugging Face folder)"
    ),
    "hf-without-vllm-skipped": Case(
        HF_LLM, (LLAMA_STAR, CUSTOM_LLM), None, HF_NO_VLLM, skipped=True
    ),
    "hf-empty-registry": Case(HF_LLM, (), None, HF_NO_VLLM, skipped=True),
    "hf-class-vllm-does-not-serve": Case(
        model("image", "hf"),
        (VLLM, SD),
        None,
        "Hugging Face folder needs vLLM: no vLLM backend serves image",
        skipped=True,
    ),
    "hf-embedding": Case(
        model("embedding", "hf"),
        (LLAMA_EMBED_STAR, VLLM_EMBED),
        "vllm-embed",
        "first vLLM backend for embedding (the ★ embedding default 'llama-embed*' is llama and"
        f" {NOT_FOR_HF})",
    ),
    "hf-llama-pin-is-stale": Case(
        HF_LLM,
        (LLAMA, VLLM),
        "vllm",
        f"stale pin 'llama' (a llama backend {NOT_FOR_HF}): used first vLLM backend for llm"
        " (Hugging Face folder)",
        pin="llama",
    ),
    "hf-llama-pin-and-no-vllm": Case(
        HF_LLM,
        (LLAMA,),
        None,
        f"stale pin 'llama' (a llama backend {NOT_FOR_HF}): {HF_NO_VLLM}",
        pin="llama",
        skipped=True,
    ),
    "hf-custom-pin-is-trusted": Case(
        HF_LLM, (VLLM_STAR, CUSTOM_LLM), "sglang", "pinned", pin="sglang"
    ),
    "hf-ignores-hint": Case(
        HF_LLM,
        (LLAMA, VLLM),
        "vllm",
        "first vLLM backend for llm (Hugging Face folder)",
        hint="vllm",
    ),
    # --- models that cannot be served ---------------------------------------------------------
    "unreadable": Case(
        UNREADABLE,
        (LLAMA_STAR,),
        None,
        "the model could not be read (not a GGUF file (bad magic)): no backend chosen",
    ),
    "unreadable-pinned": Case(
        UNREADABLE,
        (LLAMA_STAR,),
        None,
        "the model could not be read (not a GGUF file (bad magic)): no backend chosen",
        pin="llama*",
    ),
    "unreadable-without-error": Case(
        replace(UNREADABLE, error=None),
        (LLAMA_STAR,),
        None,
        "the model could not be read: no backend chosen",
    ),
    "projector": Case(
        model("projector"),
        (LLAMA_STAR,),
        None,
        "a projector is loaded with its model, not on its own",
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_resolution_order(case: Case) -> None:
    choice = resolve_backend(case.model, case.registry, pin=case.pin, family_hint=case.hint)
    expected = next((b for b in case.registry if b.id == case.chosen), None)
    assert choice == BackendChoice(expected, case.reason, case.skipped)
    assert choice.backend_id == case.chosen


def test_only_an_unpinned_model_follows_a_star_switch() -> None:
    registry = (LLAMA, VLLM)
    auto, pinned = model(), model()
    assert resolve_backend(auto, registry).backend == LLAMA
    switched = set_default(registry, "vllm", "llm")
    assert resolve_backend(auto, switched).backend_id == "vllm"
    assert resolve_backend(pinned, switched, pin="llama").backend_id == "llama"


# --- the kind table ---------------------------------------------------------------------------


def test_kind_table() -> None:
    assert KINDS == (
        "llama", "vllm", "sd", "whisper", "parakeet", "tts", "kokoro", "audiocpp", "sam",
        "realesrgan", "trellis", "custom",
    )  # fmt: skip
    assert kind_classes("llama") == {"llm", "embedding", "rerank"}
    assert kind_classes("vllm") == {"llm", "embedding", "rerank"}
    assert kind_classes("sd") == {"image"}
    assert kind_classes("whisper") == kind_classes("parakeet") == {"asr"}
    assert kind_classes("tts") == kind_classes("kokoro") == {"tts"}
    assert kind_classes("audiocpp") == {"tts", "asr"}
    assert kind_classes("sam") == {"segment"}
    assert kind_classes("realesrgan") == {"upscale"}
    assert kind_classes("trellis") == {"3d"}
    assert kind_classes("custom") == frozenset()
    assert kind_classes("custom", ["image", "tts", "projector", "nonsense"]) == {"image", "tts"}
    assert kind_classes("custom", ["segment", "3d"]) == {"segment", "3d"}
    assert kind_classes("ollama") == frozenset()
    assert kind_classes("llama", ["image"]) == kind_classes("llama")  # declared: custom only
    assert all(classes <= set(CLASSES) for classes in KIND_CLASSES.values())
    # a discovered model has one of the other classes; these only have registry entries
    assert {"segment", "upscale", "3d"} == REGISTRY_ONLY_CLASSES
    assert set(CLASSES) - REGISTRY_ONLY_CLASSES == {c.value for c in ModelClass} - {"projector"}
    assert {"image", "tts", "asr"} == FAMILY_CLASSES
    with pytest.raises(TypeError):
        KIND_CLASSES["new"] = frozenset()  # type: ignore[index]


def test_classes_served_counts_every_class_of_a_kind() -> None:
    assert classes_served([]) == frozenset()
    assert classes_served([AUDIO_TTS_STAR]) == {"tts", "asr"}
    assert classes_served([LLAMA, SD, CUSTOM_IMAGE, CUSTOM_NONE]) == {
        "llm", "embedding", "rerank", "image",
    }  # fmt: skip
    assert is_class_served("asr", [AUDIO_TTS_STAR])
    assert not is_class_served("asr", [TTS_STAR, KOKORO])
    assert not is_class_served("tts", [CUSTOM_NONE])
    assert is_class_served("tts", iter([SD, QWEN_TTS]))  # any iterable


def test_sort_classes_uses_the_ui_order() -> None:
    assert sort_classes({"asr", "llm", "zzz", "tts", "aaa"}) == ["llm", "tts", "asr", "aaa", "zzz"]


# --- Backend ----------------------------------------------------------------------------------


def test_backend_is_frozen_hashable_and_copies_its_inputs() -> None:
    caps: dict[str, object] = {"flags": ["--fit"], "devices": ["CUDA0"]}
    b = Backend(
        "b",
        "llama",
        "/x",
        default_for=["llm"],  # type: ignore[arg-type]
        classes={"tts"},  # type: ignore[arg-type]
        capabilities=caps,
    )
    assert b.default_for == frozenset({"llm"})
    assert isinstance(b.default_for, frozenset)
    assert isinstance(b.classes, frozenset)
    caps["flags"] = ["--changed"]
    assert b.capabilities["flags"] == ["--fit"]
    with pytest.raises(TypeError):
        b.capabilities["new"] = 1  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        b.id = "c"  # type: ignore[misc]
    assert hash(b) == hash(replace(b, capabilities={"other": 1}))  # capabilities not hashed
    assert b == replace(b)
    assert b != replace(b, capabilities={})


def test_backend_flags_families_and_json() -> None:
    assert Backend("a", "llama", "x").flags == frozenset()
    probed = Backend("a", "llama", "x", capabilities={"flags": frozenset({"--fit", "-ngl"})})
    stored = Backend("a", "llama", "x", capabilities={"flags": ["--fit", "-ngl", 3]})
    assert probed.flags == stored.flags == {"--fit", "-ngl"}
    assert Backend("a", "llama", "x", capabilities={"flags": "--fit"}).flags == frozenset()
    assert QWEN_TTS_STAR.families == {"qwen3-tts", "x"}
    assert Backend("a", "tts", "x", family=" , ").families == frozenset()
    assert LLAMA.families == frozenset()

    b = Backend(
        "a",
        "audiocpp",
        "/opt/audio",
        default_for=frozenset({"asr", "tts"}),
        version="1.2",
        build=42,
        family="kokoro",
        capabilities={"flags": frozenset({"-b", "-a"}), "devices": ("CUDA0",), "n": {"k": {1}}},
    )
    assert b.to_json() == {
        "id": "a",
        "kind": "audiocpp",
        "executable": "/opt/audio",
        "serves": ["tts", "asr"],
        "default_for": ["tts", "asr"],
        "classes": [],
        "managed": False,
        "version": "1.2",
        "variant": None,
        "build": 42,
        "family": "kokoro",
        "capabilities": {"flags": ["-a", "-b"], "devices": ["CUDA0"], "n": {"k": [1]}},
    }


# --- moving the ★ -----------------------------------------------------------------------------


def test_set_default_moves_the_star_and_keeps_the_others() -> None:
    registry = (
        be("a", "llama", star={"llm", "embedding"}),
        be("b", "vllm"),
        be("c", "sd", star={"image"}),
    )
    moved = set_default(registry, "b", "llm")
    assert [b.default_for for b in moved] == [{"embedding"}, {"llm"}, {"image"}]
    assert moved[2] is registry[2]  # untouched entries are the same objects
    assert registry[0].default_for == {"llm", "embedding"}  # the input is not changed
    assert set_default(moved, "b", "llm") == moved  # idempotent
    assert [b.default_for for b in set_default(moved, "b", "rerank")] == [
        {"embedding"}, {"llm", "rerank"}, {"image"},
    ]  # fmt: skip


def test_set_default_refuses_with_a_sentence() -> None:
    registry = (LLAMA, SD)
    with pytest.raises(SettingsError, match="backend 'sd' \\(sd\\) does not serve llm; it serves"):
        set_default(registry, "sd", "llm")
    with pytest.raises(SettingsError, match="no backend has the id 'gone'"):
        set_default(registry, "gone", "llm")
    with pytest.raises(SettingsError, match="unknown model class 'video'"):
        set_default(registry, "llama", "video")
    assert default_problem(registry, "llama", "rerank") is None
    assert default_problem((CUSTOM_NONE,), "nothing", "tts") == (
        "backend 'nothing' (custom) does not serve tts; it serves nothing"
    )
    assert default_problem((AUDIO_TTS_STAR,), "audio*", "asr") is None


def test_set_default_on_duplicate_ids_stars_the_first() -> None:
    registry = (be("a", "llama"), be("a", "vllm"))
    assert [b.default_for for b in set_default(registry, "a", "llm")] == [{"llm"}, frozenset()]


def test_clear_default() -> None:
    registry = (be("a", "llama", star={"llm", "embedding"}), be("b", "sd", star={"image"}))
    cleared = clear_default(registry, "llm")
    assert [b.default_for for b in cleared] == [{"embedding"}, {"image"}]
    assert cleared[1] is registry[1]
    assert default_for_class(cleared, "llm") is None
    assert resolve_backend(model(), cleared).reason == "first llm backend"


kinds = st.sampled_from([k for k in KINDS if k != "custom"])
registries = st.lists(
    st.builds(
        lambda i, kind, star: be(f"b{i}", kind, star=star),
        st.integers(0, 1000),
        kinds,
        st.frozensets(st.sampled_from(CLASSES)),
    ),
    max_size=8,
    unique_by=lambda b: b.id,
)


@given(registries, st.data())
def test_set_default_leaves_exactly_one_star(registry: list[Backend], data: st.DataObject) -> None:
    servable = [(b.id, c) for b in registry for c in sorted(b.served_classes)]
    if not servable:
        return
    backend_id, model_class = data.draw(st.sampled_from(servable))
    moved = set_default(registry, backend_id, model_class)
    assert [b.id for b in moved if model_class in b.default_for] == [backend_id]
    for old, new in zip(registry, moved, strict=True):  # every other class is untouched
        assert old.default_for - {model_class} == new.default_for - {model_class}
    if model_class not in REGISTRY_ONLY_CLASSES:  # no model file has those classes
        assert resolve_backend(model(model_class), moved).backend_id == backend_id


# --- registry checks --------------------------------------------------------------------------


def test_a_clean_registry_has_no_problems() -> None:
    assert registry_problems(()) == ()
    assert registry_problems((LLAMA_STAR, VLLM, AUDIO_TTS_STAR, CUSTOM_IMAGE, KOKORO)) == ()


def test_registry_problems_are_sentences() -> None:
    registry = (
        be("a", "llama", star={"llm"}),
        be("a", "vllm"),
        be(" ", "sd"),
        be("b", "vllm", star={"llm", "image"}),
        be("c", "ollama"),
        be("d", "custom"),
        be("e", "custom", classes={"tts", "video"}),
        be("f", "kokoro", classes={"tts"}),
        replace(be("g", "sd"), executable=" "),
    )
    assert registry_problems(registry) == (
        "backend id 'a' is used by more than one backend",
        "a sd backend has a blank id",
        "backends 'a' and 'b' are both ★ for llm; 'a' is used",
        "backend 'b' is ★ for image, which a vllm backend does not serve",
        "backend 'c' has an unknown kind 'ollama'; one of llama, vllm, sd, whisper, parakeet,"
        " tts, kokoro, audiocpp, sam, realesrgan, trellis, custom",
        "custom backend 'd' declares no class, so it serves no model",
        "backend 'e' declares unknown classes video; one of llm, embedding, rerank, image, tts,"
        " asr, segment, upscale, 3d",
        "backend 'f' declares classes, which only custom backends use; a kokoro backend serves tts",
        "backend 'g' has no executable",
    )


# --- other spellings of a kind, and the registry-only classes -----------------------------------


@pytest.mark.parametrize(
    ("spelling", "kind"),
    [
        ("llama.cpp", "llama"),
        ("SERVER", "llama"),
        (" Llama.CPP ", "llama"),
        ("sd-server", "sd"),
        ("tts-server", "tts"),
        ("ttscpp", "tts"),
        ("TTS.cpp", "tts"),
        ("tts . cpp", "tts"),
        ("parakeet-server", "parakeet"),
        ("Transcribe", "parakeet"),
        ("audio.cpp", "audiocpp"),
        ("AudioCpp-Server", "audiocpp"),
        ("audio cpp", "audiocpp"),
        ("AudioCpp Server", "audiocpp"),
        ("tts_server", "tts"),
        ("Real-ESRGAN", "realesrgan"),
        ("sam3", "sam"),
        ("Segment", "sam"),
        ("esrgan", "realesrgan"),
        ("RealESRGAN", "realesrgan"),
        ("upscale", "realesrgan"),
        ("trellis2", "trellis"),
        ("3D", "trellis"),
        ("VLLM", "vllm"),
        ("custom", "custom"),
    ],
)
def test_other_spellings_read_as_the_kind(spelling: str, kind: str) -> None:
    assert canonical_kind(spelling) == kind
    b = Backend("x", spelling, "/opt/x")
    assert b.kind == kind  # stored as the kind it names
    assert b.served_classes == kind_classes(kind) == kind_classes(spelling)
    assert registry_problems((b,)) == () or kind == "custom"


def test_an_unknown_kind_stays_as_given() -> None:
    assert canonical_kind(" Ollama ") == " Ollama "
    assert Backend("x", "Ollama", "/opt/x").kind == "Ollama"
    assert kind_classes("Ollama") == frozenset()


def test_family_hint_from_the_header() -> None:
    assert model_family(make_meta("tts", arch=" Kokoro ")) == "kokoro"
    assert model_family(make_meta("asr", arch="whisper")) == "whisper"
    assert model_family(make_meta("image", arch="")) is None
    assert model_family(make_meta("llm", arch="llama")) is None  # llm engines are interchangeable


def test_registry_only_classes_take_entries_and_stars() -> None:
    sam = be("sam3", "sam3", star={"segment"})
    esrgan = be("esrgan", "esrgan")
    trellis = be("trellis", "trellis2", star={"3d"})
    registry = (LLAMA_STAR, sam, esrgan, trellis)
    assert registry_problems(registry) == ()
    assert classes_served(registry) >= REGISTRY_ONLY_CLASSES
    starred = set_default(registry, "esrgan", "upscale")
    assert default_for_class(starred, "upscale") == replace(esrgan, default_for={"upscale"})
    assert default_for_class(starred, "segment") == sam
    # none of them serves a class a model file has
    for model_class in ("llm", "embedding", "rerank", "image", "tts", "asr"):
        assert not any(b.serves(model_class) for b in (sam, esrgan, trellis))
    assert resolve_backend(model(), starred).backend == LLAMA_STAR
    assert all(b.registry_only for b in (sam, esrgan, trellis))
    assert be("u", "custom", classes={"upscale"}).registry_only
    assert not be("u", "custom", classes={"upscale", "image"}).registry_only
    assert not LLAMA.registry_only and not CUSTOM_NONE.registry_only  # serves nothing: no
