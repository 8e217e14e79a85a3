"""Outside text shown on one line with visible escapes; secrets written down as <redacted>."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qmgui.core.textsafe import REDACTED, has_control, printable, redact_argv, redact_env


def test_control_characters_become_visible_escapes() -> None:
    assert printable("a\nb\x1b[31mc\x7f\x85\u2028") == "a\\nb\\x1b[31mc\\x7f\\x85\\u2028"
    assert printable("plain ünïcode — ok") == "plain ünïcode — ok"


@given(st.text())
def test_printable_has_no_control_characters(text: str) -> None:
    out = printable(text)
    assert not has_control(out)
    assert "\n" not in out and "\r" not in out


def test_secret_flag_values_are_redacted_in_both_spellings() -> None:
    argv = (
        "llama-server",
        "--api-key",
        "s3cret",
        "--api-key-file=/k",
        "-m",
        "x.gguf",
        "--hf-token",
    )
    assert redact_argv(argv) == (
        "llama-server", "--api-key", REDACTED, f"--api-key-file={REDACTED}", "-m", "x.gguf",
        "--hf-token",
    )  # fmt: skip


def test_secret_environment_names() -> None:
    env = {"HF_TOKEN": "t", "OPENAI_API_KEY": "k", "PATH": "/bin", "KEYBOARD": "us"}
    assert redact_env(env) == {
        "HF_TOKEN": REDACTED, "OPENAI_API_KEY": REDACTED, "PATH": "/bin", "KEYBOARD": "us",
    }  # fmt: skip
