"""Which engines have a chat page of their own (Open chat)."""

from __future__ import annotations

from qmgui.core.webui import kind_of_argv, web_ui_url

URL = "http://127.0.0.1:8081"


def test_llama_server_serves_its_web_ui_at_the_root() -> None:
    assert web_ui_url("llama", ["llama-server", "-m", "x"], URL) == URL + "/"
    assert web_ui_url("llama", ["llama-server", "--no-webui"], URL) is None
    assert web_ui_url("llama", ["llama-server"], None) is None


def test_other_engines_have_none() -> None:
    for kind in ("vllm", "sd", "whisper", "custom", None):
        assert web_ui_url(kind, ["x"], URL) is None


def test_kind_of_argv() -> None:
    assert kind_of_argv(["/opt/b/llama-server", "-m", "x"]) == "llama"
    assert kind_of_argv([r"C:\llama\llama-server.exe"]) == "llama"
    assert kind_of_argv(["vllm", "serve"]) is None
    assert kind_of_argv([]) is None
