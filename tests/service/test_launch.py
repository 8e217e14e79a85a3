"""service.launch: the engine each model resolves to on the real path (`qmgui preview`,
`serve`, `export` and the window's Start all ask `Resolver.target`)."""

from __future__ import annotations

from qmgui.core.discovery import ModelEntry
from qmgui.service.launch import Resolver, Target, default_executable
from qmgui.settings import BackendEntry, LoadResult, Settings
from tests.core.test_backends import make_meta


def entry(model_class: str, arch: str) -> ModelEntry:
    return ModelEntry(
        id=f"/m/{arch}.gguf",
        path=f"/m/{arch}.gguf",
        name=arch,
        format="gguf",
        source="folder",
        size_bytes=1,
        meta=make_meta(model_class, arch=arch),
    )


def resolver(*backends: dict[str, object]) -> Resolver:
    settings = Settings(backends=[BackendEntry.model_validate(b) for b in backends])
    return Resolver(LoadResult(settings=settings), probe=False)


AUDIO_STAR = {
    "id": "audio", "kind": "audio.cpp", "executable": "/opt/audio", "default_for": ["asr", "tts"],
}  # fmt: skip
WHISPER = {"id": "whisper", "kind": "whisper", "executable": "/opt/whisper-server"}
KOKORO = {"id": "kokoro", "kind": "kokoro", "executable": "/opt/kokoro"}


def test_another_asr_engine_keeps_its_model_from_an_audio_cpp_star() -> None:
    r = resolver(AUDIO_STAR, WHISPER, KOKORO)
    whisper = r.target(entry("asr", "whisper"))
    assert isinstance(whisper, Target)
    assert (whisper.backend_id, whisper.kind) == ("whisper", "whisper")
    assert whisper.reason == "first asr backend for family 'whisper'"
    kokoro = r.target(entry("tts", "kokoro"))
    assert isinstance(kokoro, Target) and kokoro.backend_id == "kokoro"
    # a model of no installed family keeps the ★, and the reason names its family
    other = r.target(entry("tts", "orpheus"))
    assert isinstance(other, Target) and other.backend_id == "audio"
    assert other.reason == "★ default for tts (no tts backend for family 'orpheus')"


def test_without_an_entry_of_its_family_the_audio_cpp_star_serves() -> None:
    target = resolver(AUDIO_STAR).target(entry("asr", "whisper"))
    assert isinstance(target, Target) and target.backend_id == "audio"
    assert target.kind == "audiocpp"  # stored as the kind its spelling names


def test_an_empty_registry_falls_back_to_the_kinds_usual_engine() -> None:
    r = resolver()
    chat = r.target(entry("llm", "llama"))
    assert isinstance(chat, Target)
    assert (chat.kind, chat.backend_id) == ("llama", None)
    assert chat.executable == default_executable("llama")
    assert chat.reason == f"no backends registered: {chat.executable}"
    image = r.target(entry("image", "flux"))
    assert isinstance(image, Target) and (image.kind, image.executable) == ("sd", "sd-server")


def test_a_class_no_entry_serves_falls_back_to_its_usual_engine() -> None:
    """Reference 001: with no registry entry for the model's class, the engine found the old
    way (llama-server on PATH for a GGUF language model) runs it, as with an empty registry;
    the entries of other classes change nothing."""
    r = resolver(WHISPER)
    chat = r.target(entry("llm", "llama"))
    assert isinstance(chat, Target)
    assert (chat.kind, chat.backend_id) == ("llama", None)
    assert chat.executable == default_executable("llama")
    assert chat.reason == f"no llm backend registered: {chat.executable}"
    asr = r.target(entry("asr", "whisper"))  # its class has an entry: that entry
    assert isinstance(asr, Target) and asr.backend_id == "whisper"


def test_a_vllm_launch_is_probed_on_the_openai_servers_health() -> None:
    """vLLM needs no health endpoint of its own: its OpenAI server answers `/health`."""
    from qmgui.core.emit import Command
    from qmgui.core.emit import vllm as emit_vllm
    from qmgui.service.launch import HEALTH, engine_spec

    command = Command(argv=("vllm", "serve", "/m/hf-llama", "--port", "8000"))
    spec = engine_spec(command, "vllm", entry("llm", "llama"), port=8000)
    assert spec.health_path == emit_vllm.HEALTH_PATH == HEALTH["vllm"] == "/health"
    assert spec.argv == command.argv  # nothing llama-server-only is added
