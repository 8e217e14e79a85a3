"""Quoting: the line a shell reads back is the argv we quoted, for bash (run for real),
PowerShell (its rules, checked by a parser of the subset we write; pwsh when installed) and the
Windows C runtime (CommandLineToArgvW's rules)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from qmgui.core.shell import (
    join_windows,
    powershell_caveats,
    quote_bash,
    quote_bash_word,
    quote_posix_word,
    quote_powershell,
    quote_powershell_word,
    quote_windows_word,
)

TRICKY = [
    "plain",
    "/models/My Models/qwen 7b.gguf",
    "C:\\Users\\Jürgen\\models\\x.gguf",
    "it's",
    'say "hi"',
    "both ' and \"",
    "$HOME",
    "${PORT}",
    "`uname`",
    "$(uname)",
    "a;b&c|d>e<f",
    "*.gguf",
    "?",
    "[ab]",
    "{a,b}",
    "~/models",
    "~",
    "!x",
    "#not a comment",
    "a=b",
    "-",
    "--",
    "--flag=value with space",
    "-ts",
    "3,1",
    "0,1",
    "1kb",
    "-1",
    "0.5",
    "",
    " ",
    "trailing\\",
    "back\\slash\\\\",
    'quote"\\',
    "\\\\server\\share\\m.gguf",
    "naïve — ünïcödé 模型 🚀",
    "typo\u2019graphic \u2018quotes\u2019 \u201cdouble\u201d",
    "line\nbreak",
    "tab\there",
    "bell\x07",
    "del\x7f",
    "%1",
    "@args",
    "a`b",
]


# --- bash ----------------------------------------------------------------------------------------


def _bash(line: str, env: dict[str, str] | None = None) -> bytes:
    out = subprocess.run(
        ["bash", "-c", line],
        capture_output=True,
        check=True,
        timeout=30,
        env={
            "PATH": os.environ["PATH"],
            "HOME": "/nonexistent",
            "LC_ALL": "C.UTF-8",
            **(env or {}),
        },
    )
    return out.stdout


def test_bash_reads_back_every_word() -> None:
    line = quote_bash(["printf", "%s\\0", *TRICKY])
    assert "\n" not in line  # one line, even with a line break inside a word
    words = _bash(line).split(b"\0")[:-1]
    assert [w.decode("utf-8") for w in words] == TRICKY


def test_bash_line_per_word_with_printf_newline() -> None:
    # the brief's form: printf "%s\n" over words without line breaks
    words = [w for w in TRICKY if "\n" not in w]
    out = _bash(quote_bash(["printf", "%s\\n", *words])).decode("utf-8")
    assert out.split("\n")[:-1] == words


def test_bash_environment_is_set_for_the_command() -> None:
    value = "0,1 $HOME 'x' \"y\" `z` ü"
    line = quote_bash(
        ["bash", "-c", 'printf "%s" "$CUDA_VISIBLE_DEVICES"'], {"CUDA_VISIBLE_DEVICES": value}
    )
    assert line.startswith("CUDA_VISIBLE_DEVICES=")
    assert _bash(line).decode("utf-8") == value


def test_bash_command_word_is_never_an_assignment_or_keyword(tmp_path: Path) -> None:
    for name in ("a=b", "time", "%job"):
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\nprintf 'ran %s' \"$1\"\n", encoding="utf-8")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        line = quote_bash([name, "x"])
        assert line.startswith("'" if name != "%job" else "env ")
        out = _bash(line, {"PATH": f"{tmp_path}:{os.environ['PATH']}"})
        assert out == b"ran x"


def test_bash_quoting_rules() -> None:
    assert quote_bash_word("-ngl") == "-ngl"
    assert quote_bash_word("3,1") == "3,1"
    assert quote_bash_word("a b") == "'a b'"
    assert quote_bash_word("it's") == "'it'\\''s'"
    assert quote_bash_word("") == "''"
    assert quote_bash_word("a\nb") == "$'a\\nb'"
    assert quote_bash_word("x'\\y\t") == "$'x\\'\\\\y\\t'"
    assert quote_posix_word("a\nb") == "'a\nb'"  # no $'…' for POSIX splitters
    assert quote_bash(["llama-server", "-m", "a b.gguf"], {"X": "1"}) == (
        "X=1 llama-server -m 'a b.gguf'"
    )


def test_bash_passes_file_name_bytes_that_are_not_utf8() -> None:
    """A path os.fsdecode made of invalid UTF-8 holds lone surrogates: bash gets the bytes."""
    words = ["bytes\udcff\udc80.gguf", "ok"]
    line = quote_bash(["printf", "%s\\0", *words])
    line.encode("utf-8")  # a script can hold it
    assert "$'bytes\\xff\\x80.gguf'" in line
    assert _bash(line).split(b"\0")[:-1] == [os.fsencode(w) for w in words]
    with pytest.raises(ValueError, match="lone surrogate"):
        quote_bash(["x", "\ud800"])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="empty command"):
        quote_bash([])
    with pytest.raises(ValueError, match="empty command"):
        quote_powershell([])
    with pytest.raises(ValueError, match="NUL"):
        quote_bash(["a\0b"])
    with pytest.raises(ValueError, match="not a usable environment variable name"):
        quote_bash(["x"], {"BAD-NAME": "1"})
    with pytest.raises(ValueError, match="not a usable environment variable name"):
        quote_powershell(["x"], {"1X": "1"})


# --- PowerShell ----------------------------------------------------------------------------------

_PS_BARE = re.compile(r"[^\s'\"\u2018\u2019\u201a\u201b\u201c\u201d\u201e]+")
_PS_SQ = "'\u2018\u2019\u201a\u201b"
_PS_DQ = '"\u201c\u201d\u201e'
_PS_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "0": "\0",
}


def _ps_parse_word(line: str, i: int) -> tuple[str, int]:
    """One argument of the subset quote_powershell writes, by PowerShell's own rules: a
    bareword, a single-quoted string (any of its quote characters doubled inside), or a
    double-quoted string with backtick escapes and $([char]0xNN) sub-expressions."""
    c = line[i]
    if c in _PS_SQ:
        out, i = [], i + 1
        while True:
            ch = line[i]
            if ch in _PS_SQ:
                if i + 1 < len(line) and line[i + 1] in _PS_SQ:
                    out.append(ch)  # a doubled quote character stands for itself
                    i += 2
                    continue
                return "".join(out), i + 1
            out.append(ch)
            i += 1
    if c in _PS_DQ:
        out, i = [], i + 1
        while line[i] not in _PS_DQ:
            if line[i] == "`":
                nxt = line[i + 1]
                out.append(_PS_ESCAPES.get(nxt, nxt))
                i += 2
            elif line.startswith("$([char]0x", i):
                end = line.index(")", i + 2)
                out.append(chr(int(line[i + 10 : end], 16)))
                i = end + 1
            else:
                assert line[i] != "$", f"an unescaped $ would expand: {line[i:]!r}"
                out.append(line[i])
                i += 1
        return "".join(out), i + 1
    m = _PS_BARE.match(line, i)
    assert m is not None
    word = m.group()
    # what PowerShell would not pass verbatim as a bareword to a native command
    assert not re.search(r"[$@`,;|&(){}<>#]", word), f"unsafe bareword {word!r}"
    assert not re.fullmatch(r"[0-9].*[A-Za-z].*", word), f"{word!r} may read as a number"
    return word, m.end()


def ps_split(line: str) -> tuple[dict[str, str], list[str]]:
    """Split a quote_powershell line back into its environment and argv."""
    env: dict[str, str] = {}
    while line.startswith("$env:"):
        name, rest = line[5:].split(" = ", 1)
        value, end = _ps_parse_word(rest, 0)
        assert rest[end : end + 2] == "; "
        env[name] = value
        line = rest[end + 2 :]
    assert line.startswith("& ")
    argv, i = [], 2
    while i < len(line):
        word, i = _ps_parse_word(line, i)
        argv.append(word)
        assert i == len(line) or line[i] == " "
        i += 1
    return env, argv


def test_powershell_round_trip_by_its_rules() -> None:
    argv = ["C:\\Program Files\\llama\\llama-server.exe", *[w for w in TRICKY if w != ""]]
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "X": "it's $HOME"}
    line = quote_powershell(argv, env)
    assert "\n" not in line
    assert ps_split(line) == (env, argv)


def test_powershell_quoting_rules() -> None:
    assert quote_powershell_word("-ngl") == "-ngl"
    assert quote_powershell_word("--n-cpu-moe") == "--n-cpu-moe"
    assert quote_powershell_word("8080") == "8080"
    assert quote_powershell_word("C:\\models\\x.gguf") == "C:\\models\\x.gguf"
    assert quote_powershell_word("3,1") == "'3,1'"  # a comma builds an array
    assert quote_powershell_word("1kb") == "'1kb'"  # a numeric literal (1024)
    assert quote_powershell_word("$HOME") == "'$HOME'"
    assert quote_powershell_word("it's") == "'it''s'"
    assert quote_powershell_word("a\u2019b") == "'a\u2019\u2019b'"  # a typographic quote too
    assert quote_powershell_word("@args") == "'@args'"
    assert quote_powershell_word("a\nb") == '"a`nb"'
    assert quote_powershell_word("$x\n") == '"`$x`n"'
    assert quote_powershell_word("\x01") == '"$([char]0x01)"'
    assert quote_powershell(["llama-server", "-m", "a b.gguf"], {"HIP_VISIBLE_DEVICES": "1"}) == (
        "$env:HIP_VISIBLE_DEVICES = '1'; & llama-server -m 'a b.gguf'"
    )


def test_powershell_caveats_name_what_old_versions_mangle() -> None:
    assert powershell_caveats(["x", "-a", "b"]) == []
    assert len(powershell_caveats(["x", "", 'say "hi"'])) == 2


@pytest.mark.skipif(shutil.which("pwsh") is None, reason="PowerShell (pwsh) is not installed")
def test_powershell_runs_it_for_real() -> None:  # pragma: no cover - only where pwsh exists
    words = [w for w in TRICKY if w and "\0" not in w]
    script = "[Console]::OutputEncoding = [Text.Encoding]::UTF8; "
    script += "$PSNativeCommandArgumentPassing = 'Standard'; "
    script += quote_powershell(
        ["python3", "-c", "import sys; print('\\0'.join(sys.argv[1:]))", *words]
    )
    out = subprocess.run(
        ["pwsh", "-NoProfile", "-Command", script], capture_output=True, check=True, timeout=60
    )
    assert out.stdout.decode("utf-8").rstrip("\n").split("\0") == words


# --- Windows -------------------------------------------------------------------------------------


def windows_split(line: str) -> list[str]:
    """CommandLineToArgvW's rules (what the C runtime and llama-swap's Windows dialect do):
    2n backslashes + quote -> n backslashes and a quote toggle; 2n+1 -> n and a literal quote;
    backslashes elsewhere literal; "" inside quotes is a literal quote (post-2008 rule)."""
    args: list[str] = []
    cur: list[str] = []
    in_quotes = False
    have = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            n = 0
            while i < len(line) and line[i] == "\\":
                n += 1
                i += 1
            if i < len(line) and line[i] == '"':
                cur.append("\\" * (n // 2))
                if n % 2:
                    cur.append('"')
                    i += 1
                have = True
            else:
                cur.append("\\" * n)
                have = True
            continue
        if c == '"':
            if in_quotes and i + 1 < len(line) and line[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            in_quotes = not in_quotes
            have = True
        elif c in " \t" and not in_quotes:
            if have:
                args.append("".join(cur))
                cur, have = [], False
        else:
            cur.append(c)
            have = True
        i += 1
    if have:
        args.append("".join(cur))
    return args


def test_windows_round_trip() -> None:
    argv = ["C:\\Program Files\\llama\\llama-server.exe", *[w for w in TRICKY if "\n" not in w]]
    assert windows_split(join_windows(argv)) == argv


def test_windows_quoting_rules() -> None:
    assert quote_windows_word("C:\\models\\x.gguf") == "C:\\models\\x.gguf"
    assert quote_windows_word("C:\\my models\\") == '"C:\\my models\\\\"'
    assert quote_windows_word('a"b') == '"a\\"b"'
    assert quote_windows_word("") == '""'
