"""Quoting an argv for people: one command line that, pasted into a shell, runs that very argv.

qmgui starts engines from an argv list, never through a shell. These functions only render that
list for display, scripts and exported configs, and the one promise they keep is the round trip:
the shell (or parser) named splits the line back into exactly the same strings.

- `quote_bash`: POSIX shells (bash, zsh, dash). Plain words stay bare; anything else goes in
  single quotes (nothing is special inside them; a `'` is written `'\\''`); a word holding a
  control character uses bash's `$'...'` so the command stays on one line, and so does a word
  holding a byte that is not UTF-8 (a lone surrogate from `os.fsdecode`), written `\\xNN`,
  so the program receives that very byte.
- `quote_powershell`: Windows PowerShell 5.1 and PowerShell 7. Single-quoted strings are
  literal except for the quote itself, which is doubled; PowerShell also takes the typographic
  quotes ‘ ’ ‚ ‛ as single quotes, so those are doubled too. Words with control characters use a
  double-quoted string with backtick escapes. The executable is invoked with `&`.
- `join_windows`: the Microsoft C runtime's rules (`CommandLineToArgvW`), which llama-swap uses
  to split a `cmd` on Windows.

Environment variables are written as the shell sets them for one command: `NAME=value cmd` in
bash, `$env:NAME = 'value'; & cmd` in PowerShell (which sets it for the rest of the session).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# words bash leaves alone: the same set as Python's shlex.quote
_BASH_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+\Z")
# a command word must also not be an assignment, a job spec (%1) or a reserved word
_BASH_SAFE_COMMAND = re.compile(r"[A-Za-z0-9_@+:,./-]+\Z")
_BASH_RESERVED = frozenset(
    {
        "!",
        "[[",
        "]]",
        "{",
        "}",
        "case",
        "coproc",
        "do",
        "done",
        "elif",
        "else",
        "esac",
        "fi",
        "for",
        "function",
        "if",
        "in",
        "select",
        "then",
        "time",
        "until",
        "while",
    }
)
_BASH_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}

# PowerShell barewords that reach a native command unchanged: flags, integers, and words made
# of letters, digits and path characters that start with a letter or a path separator. Anything
# else (commas are array operators, `1kb` is a number, `$` expands, `@` splats…) is quoted.
_PS_SAFE = (
    re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9-]*\Z"),
    re.compile(r"-?[0-9]+\Z"),
    re.compile(r"[A-Za-z_/\\][A-Za-z0-9_./\\:-]*\Z"),
)
# characters PowerShell reads as a single quote (the ASCII one and four typographic ones)
_PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
# characters special inside a PowerShell double-quoted string: backtick, dollar, and the
# double quotes (ASCII and typographic “ ” „)
_PS_DQ_SPECIAL = '`$"\u201c\u201d\u201e'
_PS_ESCAPES = {"\n": "`n", "\t": "`t", "\r": "`r", "\a": "`a", "\b": "`b", "\f": "`f", "\v": "`v"}


def _has_control(word: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in word)


def _is_byte(c: str) -> bool:
    """A character `os.fsdecode` made of a byte that is not UTF-8 (surrogateescape)."""
    return "\udc80" <= c <= "\udcff"


def has_surrogate(word: str) -> bool:
    """Whether `word` holds a lone surrogate: text no UTF-8 file can hold as it is."""
    return any("\ud800" <= c <= "\udfff" for c in word)


def _check_word(word: str) -> None:
    if "\0" in word:
        raise ValueError("a command argument cannot contain a NUL character")


def _check_env(env: Mapping[str, str] | None) -> list[tuple[str, str]]:
    items = list((env or {}).items())
    for name, value in items:
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a usable environment variable name")
        _check_word(value)
    return items


# --- bash ----------------------------------------------------------------------------------------


def quote_posix_word(word: str) -> str:
    """One argument for any POSIX shell-like splitter: bare when safe, else in single quotes
    (which every POSIX splitter reads literally, control characters included)."""
    _check_word(word)
    if has_surrogate(word):
        raise ValueError("a word with bytes that are not UTF-8 cannot be single-quoted")
    if _BASH_SAFE.match(word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def quote_bash_word(word: str) -> str:
    """One argument as bash reads it back: bare when safe, else quoted; a control character
    makes it `$'...'`, so the command stays on one line."""
    _check_word(word)
    if _BASH_SAFE.match(word):
        return word
    if _has_control(word) or has_surrogate(word):
        return f"$'{''.join(_bash_escape(c) for c in word)}'"
    return quote_posix_word(word)


def _bash_escape(c: str) -> str:
    if c in _BASH_ESCAPES:
        return _BASH_ESCAPES[c]
    if ord(c) < 32 or ord(c) == 127:
        return f"\\x{ord(c):02x}"
    if _is_byte(c):
        return f"\\x{ord(c) - 0xDC00:02x}"
    if "\ud800" <= c <= "\udfff":
        raise ValueError("a command argument holds a lone surrogate, which is no byte")
    return c


def _bash_command_word(word: str) -> str:
    if word.startswith("%"):
        # bash reads a command starting with % as a job (`fg %1`), quoted or not: run it
        # through env, which looks it up on PATH like the shell would
        return "env " + quote_bash_word(word)
    quoted = quote_bash_word(word)
    if quoted == word and (word in _BASH_RESERVED or not _BASH_SAFE_COMMAND.match(word)):
        return f"'{word}'"  # bare, it would be read as an assignment, a job or a keyword
    return quoted


def quote_bash(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The argv (with `env` set for it) as one bash command line."""
    if not argv:
        raise ValueError("an empty command cannot be quoted")
    parts = [f"{name}={quote_bash_word(value)}" for name, value in _check_env(env)]
    parts.append(_bash_command_word(argv[0]))
    parts += [quote_bash_word(a) for a in argv[1:]]
    return " ".join(parts)


# --- PowerShell ----------------------------------------------------------------------------------


def quote_powershell_word(word: str) -> str:
    """One argument as PowerShell passes it to a native command: bare when safe, else quoted."""
    _check_word(word)
    if any(p.match(word) for p in _PS_SAFE):
        return word
    if _has_control(word) or has_surrogate(word):
        out = []
        for c in word:
            if c in _PS_DQ_SPECIAL:
                out.append("`" + c)
            elif c in _PS_ESCAPES:
                out.append(_PS_ESCAPES[c])
            elif ord(c) < 32 or ord(c) == 127 or "\ud800" <= c <= "\udfff":
                # `u{…} exists only in PowerShell 6+; a sub-expression works in 5.1 too
                out.append(f"$([char]0x{ord(c):02x})")
            else:
                out.append(c)
        return '"' + "".join(out) + '"'
    return "'" + "".join(c + c if c in _PS_SINGLE_QUOTES else c for c in word) + "'"


def quote_powershell(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The argv (with `env` set first) as one PowerShell line, the executable called with `&`."""
    if not argv:
        raise ValueError("an empty command cannot be quoted")
    parts = [f"$env:{name} = {powershell_string(value)}; " for name, value in _check_env(env)]
    call = "& " + " ".join(quote_powershell_word(a) for a in argv)
    return "".join(parts) + call


def powershell_string(value: str) -> str:
    """`value` as a PowerShell string expression (always quoted, unlike an argument)."""
    quoted = quote_powershell_word(value)
    return quoted if quoted[:1] in "'\"" else f"'{value}'"


def powershell_caveats(argv: Sequence[str]) -> list[str]:
    """What Windows PowerShell 5.1 (and 7.0-7.2) passes to a native program differently.

    Before PowerShell 7.3 an empty argument is dropped and an embedded double quote is not
    escaped, so such an argv does not survive the round trip there."""
    notes = []
    if any(a == "" for a in argv[1:]):
        notes.append("PowerShell before 7.3 drops empty arguments")
    if any('"' in a for a in argv):
        notes.append("PowerShell before 7.3 does not escape double quotes inside arguments")
    return notes


# --- Windows (CommandLineToArgvW) ----------------------------------------------------------------


def quote_windows_word(word: str, *, always: bool = False) -> str:
    """One argument by the Microsoft C runtime's rules: backslashes are literal except before a
    double quote, where 2n (+1) of them mean n backslashes (and a literal quote). `always`:
    quoted even when a bare word would do."""
    _check_word(word)
    if word and not always and not any(c in word for c in ' \t\n\v"'):
        return word
    out = ['"']
    backslashes = 0
    for c in word:
        if c == "\\":
            backslashes += 1
            continue
        if c == '"':
            out.append("\\" * (2 * backslashes + 1) + '"')
        else:
            out.append("\\" * backslashes + c)
        backslashes = 0
    out.append("\\" * (2 * backslashes) + '"')
    return "".join(out)


def join_windows(argv: Sequence[str]) -> str:
    """The argv as one Windows command line (what llama-swap splits on Windows)."""
    if not argv:
        raise ValueError("an empty command cannot be quoted")
    return " ".join(quote_windows_word(a) for a in argv)
