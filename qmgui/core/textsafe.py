"""Text that came from outside (file names, metadata strings, argv) made safe to show or log.

- `printable`: one line of text for a terminal, a log line or a comment in a file written for
  another program. Control characters (C0, DEL, C1, and the Unicode line and paragraph
  separators) become visible escapes (`\\x1b`, `\\n`, `\\u2028`), so no byte of a crafted name
  can move the cursor, recolour a terminal or start a new line in a config. A lone surrogate
  (a file name's byte that is not UTF-8, as `os.fsdecode` keeps it) is written as that byte,
  `\\xff`, so the text can always be encoded and printed.
- `redact_argv`: the argv with the values of secret flags (`--api-key`, `--hf-token`, …)
  replaced by `<redacted>`, for logs, previews shown to others and exports. The argv that is
  started is never changed; only what is written down.
- `redact_env`: the same for an environment mapping: values of names that end in `_TOKEN`,
  `_KEY`, `_SECRET` or `_PASSWORD` are replaced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"

# flags whose value is a secret, as llama-server, vLLM and the tools beside them spell them
SECRET_FLAGS = frozenset(
    {
        "--api-key",
        "--api-key-file",
        "--hf-token",
        "-hft",
        "--ssl-key-file",
    }
)
_SECRET_ENV = re.compile(r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)

# C0 controls, DEL, C1 controls, and the separators some viewers break lines at
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u0085]")
# what printable escapes: the controls above and lone surrogates (undecodable file-name bytes)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u0085\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape: the undecodable byte itself
        n -= 0xDC00
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}"


def printable(text: str) -> str:
    """`text` on one line with every control character written as a visible escape."""
    return _UNPRINTABLE.sub(_escape, text)


# what terminal_text escapes: the same but line breaks and tabs, which lay a table out
_UNPRINTABLE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u0085\ud800-\udfff]")


def terminal_text(text: str) -> str:
    """`text` for a terminal: lines and tabs kept, every other control character (ESC
    sequences that move the cursor or retitle the window, a carriage return that overwrites
    the line) and undecodable bytes written as visible escapes."""
    return _UNPRINTABLE_IN_LINES.sub(_escape, text)


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def is_secret_env(name: str) -> bool:
    return _SECRET_ENV.search(name) is not None


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` with the value of every secret flag replaced (`--api-key X`, `--api-key=X`)."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = a.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(a)
    return tuple(out)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the values of secret-looking names replaced."""
    return {k: (REDACTED if is_secret_env(k) else v) for k, v in env.items()}
