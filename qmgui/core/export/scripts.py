"""A launch script for one model: bash (Linux, macOS) or PowerShell (Windows, pwsh anywhere).

Both run the same argv the preview shows, on a port the caller may change (bash: `PORT=9000
./model.sh`; PowerShell: `.\\model.ps1 -Port 9000`), and pass any further arguments through to
the engine. The command is emitted with `port=PORT_MACRO`; each argument holding that macro
gets the script's port variable in its place.

- bash: `#!/usr/bin/env bash`, `set -eo pipefail`, the environment exported, and `exec`, so the
  engine replaces the shell and receives its signals (Ctrl+C stops the server, not a wrapper).
- PowerShell: `$ErrorActionPreference = 'Stop'`, `$PSNativeCommandArgumentPassing = 'Standard'`
  (PowerShell 7.3+ then passes empty arguments and embedded quotes faithfully; 5.1 ignores it),
  the call with `&`, and the engine's exit status as the script's. Windows PowerShell 5.1 reads
  a script without a byte-order mark in the ANSI code page, so a script with non-ASCII text
  (a path like C:\\Users\\Jürgen) starts with a UTF-8 BOM and has no `#!` line (a BOM before
  `#!` stops the kernel from reading it); an ASCII script starts with `#!/usr/bin/env pwsh`.
- a vLLM cluster (`render_cluster_script`): one bash script with a role per node (`head`,
  `worker ADDRESS`, `serve`), for `core.vllm_cluster`'s Ray head, workers and `vllm serve`.

Names are data (docs/architecture.md, "Exports"): every word is quoted for the
shell, so the engine receives each argument byte for byte (bash even a file name's bytes that
are not UTF-8, as `$'\\xff'`); only the port placeholder (`PORT_MARK`, or `${PORT}` in a
command emitted with it) becomes the port variable. Comments are one line each with control
characters as visible escapes. The value of `--api-key` / `--hf-token` is not written: the
script passes `"$QMGUI_API_KEY"` / `$env:QMGUI_API_KEY` (`HF_TOKEN`) and stops with a sentence
when the variable is unset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from qmgui.core.emit import Command
from qmgui.core.export import (
    PORT,
    EnvRef,
    Export,
    ExportError,
    Word,
    Words,
    comment_lines,
    export_words,
    line_groups,
)
from qmgui.core.shell import (
    ENV_NAME,
    has_surrogate,
    powershell_caveats,
    powershell_string,
    quote_bash_word,
    quote_powershell_word,
)
from qmgui.core.textsafe import printable
from qmgui.core.vllm_cluster import ClusterPlan

DEFAULT_PORT = 8080
BOM = "\ufeff"


def _lines(words: Sequence[Word], word: Callable[[Word], str]) -> list[str]:
    """The argv rendered a flag (and its values) per line."""
    return [" ".join(word(w) for w in line) for line in line_groups(words)]


def _bash_word(word: Word) -> str:
    out = []
    for part in word:
        if part is PORT:
            out.append('"$PORT"')
        elif isinstance(part, EnvRef):
            out.append(f'"${part.name}"')
        else:
            assert isinstance(part, str)
            out.append(quote_bash_word(part))
    return "".join(out) or "''"


def _ps_term(part: object) -> str:
    if part is PORT:
        return "$Port"
    if isinstance(part, EnvRef):
        return f"$env:{part.name}"
    assert isinstance(part, str)
    return powershell_string(part)


def _ps_word(word: Word) -> str:
    if len(word) == 1:
        part = word[0]
        return quote_powershell_word(part) if isinstance(part, str) else _ps_term(part)
    # the port or a secret inside a word: a parenthesised string expression,
    # e.g. ('--listen=:' + $Port)
    terms = [_ps_term(p) for p in word]
    if not isinstance(word[0], str):
        terms.insert(0, "''")  # start with a string, so + concatenates instead of adding
    return "(" + " + ".join(terms) + ")"


def _comments(prefix: str, title: str, comments: Sequence[str], warnings: Sequence[str]) -> str:
    lines = [title, "Written by qmgui.", *comments, *(f"warning: {w}" for w in warnings)]
    return "".join(f"{prefix} {line}\n" for text in lines for line in comment_lines(text))


def _check_env(env: Mapping[str, str]) -> None:
    for name in env:
        if not ENV_NAME.match(name):
            raise ExportError(f"'{printable(name)}' is not an environment variable name")


def _bash_secrets(words: Words, indent: str = "") -> str:
    """A line per secret that stops the script with a sentence when its variable is unset."""
    return "".join(
        f'{indent}: "${{{var}:?set {var} to the value for {flag}: qmgui does not write it '
        'into scripts}"\n'
        for var, flag in sorted(words.secrets.items())
    )


def render_bash_script(
    command: Command,
    *,
    title: str,
    comments: Sequence[str] = (),
    default_port: int = DEFAULT_PORT,
    script_name: str = "launch.sh",
) -> Export:
    """A bash script that runs `command` (emitted with `port=PORT_MARK`)."""
    if not command.runnable:
        return Export(text="", warnings=command.warnings)
    _check_env(command.env)
    words = export_words(command.argv)
    notes = words.notes("before running it")
    text = "#!/usr/bin/env bash\n"
    text += _comments("#", title, [*comments, *notes], command.warnings)
    text += (
        f"# Usage: PORT={int(default_port)} ./{printable(script_name)} "
        "[more arguments for the engine]\n"
    )
    text += "set -eo pipefail\n\n"
    text += f'PORT="${{PORT:-{int(default_port)}}}"\n'
    text += _bash_secrets(words)
    for name, value in command.env.items():
        text += f"export {name}={quote_bash_word(value)}\n"
    lines = _lines(words.words, _bash_word)
    text += "exec " + " \\\n  ".join([*lines, '"$@"']) + "\n"
    return Export(text=text, warnings=(*command.warnings, *notes))


def render_powershell_script(
    command: Command,
    *,
    title: str,
    comments: Sequence[str] = (),
    default_port: int = DEFAULT_PORT,
    script_name: str = "launch.ps1",
) -> Export:
    """A PowerShell script that runs `command` (emitted with `port=PORT_MARK`)."""
    if not command.runnable:
        return Export(text="", warnings=command.warnings)
    _check_env(command.env)
    for text in (*command.argv, *command.env.values()):
        if has_surrogate(text):
            raise ExportError(
                f"'{printable(text)}' holds bytes that are not UTF-8, which a PowerShell "
                "script cannot pass on; use the bash script"
            )
    words = export_words(command.argv)
    notes = words.notes("before running it")
    caveats = powershell_caveats(command.argv)
    body = _comments("#", title, [*comments, *notes], [*command.warnings, *caveats])
    body += (
        f"# Usage: .\\{printable(script_name)} [-Port {int(default_port)}] "
        "[more arguments for the engine]\n"
    )
    body += f"param([int]$Port = {int(default_port)})\n"
    body += "$ErrorActionPreference = 'Stop'\n"
    body += "$PSNativeCommandArgumentPassing = 'Standard'\n\n"
    for var, flag in sorted(words.secrets.items()):
        body += (
            f"if (-not $env:{var}) {{ throw 'set {var} to the value for {flag}: qmgui does "
            "not write it into scripts' }\n"
        )
    for name, value in command.env.items():
        body += f"$env:{name} = {powershell_string(value)}\n"
    lines = _lines(words.words, _ps_word)
    body += "& " + " `\n  ".join([*lines, "@args"]) + "\n"
    body += "exit $LASTEXITCODE\n"
    text = "#!/usr/bin/env pwsh\n" + body if body.isascii() else BOM + body
    return Export(text=text, warnings=(*command.warnings, *caveats, *notes))


def render_cluster_script(
    cluster: ClusterPlan,
    *,
    title: str,
    comments: Sequence[str] = (),
    default_port: int = 8000,
    script_name: str = "cluster.sh",
) -> Export:
    """One bash script for every node of a multi-node vLLM launch (`core.vllm_cluster`):
    `./cluster.sh head` on the head node, `./cluster.sh worker ADDRESS` on each worker, then
    `./cluster.sh serve` on the head once `ray status` shows every node. Each role `exec`s its
    command, so it runs in the foreground (Ray with `--block`) and receives the signals."""
    serve = cluster.serve
    if not serve.runnable:
        return Export(text="", warnings=serve.warnings)
    warnings = (*serve.warnings, *(() if cluster.fits else (f"does not fit: {cluster.reason}",)))
    for env in (cluster.head.env, *(w.env for w in cluster.workers), serve.env):
        _check_env(env)
    serve_words = export_words(serve.argv)
    notes = serve_words.notes("on the head node before `serve`")
    head = cluster.head.node
    name = printable(script_name)
    usage = [
        f"Usage: ./{name} head  (on {head}, first)",
        *(f"       ./{name} worker {w.node}  (on {w.node})" for w in cluster.workers),
        f"       PORT={int(default_port)} ./{name} serve  (on {head}, once `ray status` "
        f"shows {cluster.nodes} node(s))",
    ]
    text = "#!/usr/bin/env bash\n"
    text += _comments("#", title, [*comments, *usage, *notes], warnings)
    text += "set -eo pipefail\n\n"
    text += f'PORT="${{PORT:-{int(default_port)}}}"\n'
    text += 'case "${1:-}" in\n'
    text += "  head)\n" + _role(cluster.head.env, export_words(cluster.head.argv), "    ")
    if cluster.workers:
        text += '  worker)\n    case "${2:-}" in\n'
        for w in cluster.workers:
            text += f"      {quote_bash_word(w.node)})\n"
            text += _role(w.env, export_words(w.argv), "        ")
        nodes = quote_bash_word(" | ".join(w.node for w in cluster.workers))
        text += f'      *) echo "usage: $0 worker "{nodes} >&2; exit 2 ;;\n    esac\n    ;;\n'
    text += "  serve)\n" + _role(serve.env, serve_words, "    ", shift=True)
    roles = "head|worker ADDRESS|serve" if cluster.workers else "head|serve"
    text += f'  *) echo "usage: $0 {roles}" >&2; exit 2 ;;\nesac\n'
    return Export(text=text, warnings=(*warnings, *notes))


def _role(env: Mapping[str, str], words: Words, indent: str, *, shift: bool = False) -> str:
    lines = [f"{indent}export {k}={quote_bash_word(v)}\n" for k, v in env.items()]
    if shift:
        lines.append(f"{indent}shift\n")
    lines.append(_bash_secrets(words, indent))
    rendered = _lines(words.words, _bash_word)
    if shift:
        rendered.append('"$@"')
    if len(rendered) > 1 and not rendered[1].startswith("-"):  # `ray start`, `vllm serve PATH`
        rendered[:2] = [f"{rendered[0]} {rendered[1]}"]
    lines.append(f"{indent}exec " + f" \\\n{indent}  ".join(rendered) + "\n")
    lines.append(f"{indent};;\n")
    return "".join(lines)
