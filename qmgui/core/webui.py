"""Which engines serve a chat page of their own, and where: llama-server serves its web UI at
`/` (unless started with `--no-webui`); vLLM, whisper-server and sd-server serve none. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

WEB_UI_KINDS = frozenset({"llama"})
_NO_UI_FLAGS = frozenset({"--no-webui", "--no-ui"})


def kind_of_argv(argv: Sequence[str]) -> str | None:
    """An engine's kind guessed from its executable's name (for an engine qmgui did not
    start this run: the run registry keeps no kind); None when the name says nothing."""
    if not argv:
        return None
    name = PurePath(argv[0].replace("\\", "/")).name.lower()
    return "llama" if name.startswith("llama-server") else None


def web_ui_url(kind: str | None, argv: Sequence[str], url: str | None) -> str | None:
    """The address of the engine's own chat page, None when it has none."""
    if url is None or kind not in WEB_UI_KINDS:
        return None
    if any(a.split("=", 1)[0] in _NO_UI_FLAGS for a in argv[1:]):
        return None
    return url.rstrip("/") + "/"
