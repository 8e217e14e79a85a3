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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from qmgui.core.emit import PORT_MACRO, Command, flag_head
from qmgui.core.export import Export
from qmgui.core.shell import (
    powershell_caveats,
    powershell_string,
    quote_bash_word,
    quote_powershell_word,
)
from qmgui.core.vllm_cluster import ClusterPlan

DEFAULT_PORT = 8080
BOM = "\ufeff"


def _lines(argv: Sequence[str], word: Callable[[str], str]) -> list[str]:
    """The argv rendered a flag (and its values) per line."""
    lines: list[list[str]] = []
    for i, token in enumerate(argv):
        if i <= 1 or flag_head(token) is not None:
            lines.append([])
        lines[-1].append(word(token))
    return [" ".join(line) for line in lines]


def _bash_word(token: str) -> str:
    if PORT_MACRO not in token:
        return quote_bash_word(token)
    return '"$PORT"'.join(quote_bash_word(p) if p else "" for p in token.split(PORT_MACRO))


def _ps_word(token: str) -> str:
    if token == PORT_MACRO:
        return "$Port"
    if PORT_MACRO not in token:
        return quote_powershell_word(token)
    # text around the port: a parenthesised string expression, e.g. ('--listen=:' + $Port)
    terms: list[str] = []
    for i, piece in enumerate(token.split(PORT_MACRO)):
        if i:
            terms.append("$Port")
        if piece:
            terms.append(powershell_string(piece))
    if terms[0] == "$Port":
        terms.insert(0, "''")  # start with a string, so + concatenates instead of adding
    return "(" + " + ".join(terms) + ")"


def _comments(prefix: str, title: str, comments: Sequence[str], warnings: Sequence[str]) -> str:
    lines = [title, "Written by qmgui.", *comments, *(f"warning: {w}" for w in warnings)]
    return "".join(f"{prefix} {line}\n" for text in lines for line in text.splitlines())


def render_bash_script(
    command: Command,
    *,
    title: str,
    comments: Sequence[str] = (),
    default_port: int = DEFAULT_PORT,
    script_name: str = "launch.sh",
) -> Export:
    """A bash script that runs `command` (emitted with `port=PORT_MACRO`)."""
    if not command.runnable:
        return Export(text="", warnings=command.warnings)
    text = "#!/usr/bin/env bash\n"
    text += _comments("#", title, comments, command.warnings)
    text += f"# Usage: PORT={default_port} ./{script_name} [more arguments for the engine]\n"
    text += "set -eo pipefail\n\n"
    text += f'PORT="${{PORT:-{default_port}}}"\n'
    for name, value in command.env.items():
        text += f"export {name}={quote_bash_word(value)}\n"
    lines = _lines(command.argv, _bash_word)
    text += "exec " + " \\\n  ".join([*lines, '"$@"']) + "\n"
    return Export(text=text, warnings=command.warnings)


def render_powershell_script(
    command: Command,
    *,
    title: str,
    comments: Sequence[str] = (),
    default_port: int = DEFAULT_PORT,
    script_name: str = "launch.ps1",
) -> Export:
    """A PowerShell script that runs `command` (emitted with `port=PORT_MACRO`)."""
    if not command.runnable:
        return Export(text="", warnings=command.warnings)
    caveats = powershell_caveats(command.argv)
    body = _comments("#", title, comments, [*command.warnings, *caveats])
    body += f"# Usage: .\\{script_name} [-Port {default_port}] [more arguments for the engine]\n"
    body += f"param([int]$Port = {default_port})\n"
    body += "$ErrorActionPreference = 'Stop'\n"
    body += "$PSNativeCommandArgumentPassing = 'Standard'\n\n"
    for name, value in command.env.items():
        body += f"$env:{name} = {powershell_string(value)}\n"
    lines = _lines(command.argv, _ps_word)
    body += "& " + " `\n  ".join([*lines, "@args"]) + "\n"
    body += "exit $LASTEXITCODE\n"
    text = "#!/usr/bin/env pwsh\n" + body if body.isascii() else BOM + body
    return Export(text=text, warnings=(*command.warnings, *caveats))


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
    head = cluster.head.node
    usage = [
        f"Usage: ./{script_name} head  (on {head}, first)",
        *(f"       ./{script_name} worker {w.node}  (on {w.node})" for w in cluster.workers),
        f"       PORT={default_port} ./{script_name} serve  (on {head}, once `ray status` "
        f"shows {cluster.nodes} node(s))",
    ]
    text = "#!/usr/bin/env bash\n"
    text += _comments("#", title, [*comments, *usage], warnings)
    text += "set -eo pipefail\n\n"
    text += f'PORT="${{PORT:-{default_port}}}"\n'
    text += 'case "${1:-}" in\n'
    text += "  head)\n" + _role(cluster.head.env, cluster.head.argv, "    ")
    if cluster.workers:
        text += '  worker)\n    case "${2:-}" in\n'
        for w in cluster.workers:
            text += f"      {quote_bash_word(w.node)})\n" + _role(w.env, w.argv, "        ")
        nodes = " | ".join(w.node for w in cluster.workers)
        text += f'      *) echo "usage: $0 worker {nodes}" >&2; exit 2 ;;\n    esac\n    ;;\n'
    text += "  serve)\n" + _role(serve.env, (*serve.argv, '"$@"'), "    ", shift=True)
    roles = "head|worker ADDRESS|serve" if cluster.workers else "head|serve"
    text += f'  *) echo "usage: $0 {roles}" >&2; exit 2 ;;\nesac\n'
    return Export(text=text, warnings=warnings)


def _role(env: Mapping[str, str], argv: Sequence[str], indent: str, *, shift: bool = False) -> str:
    lines = [f"{indent}export {k}={quote_bash_word(v)}\n" for k, v in env.items()]
    if shift:
        lines.append(f"{indent}shift\n")
    words = [*_lines(argv[:-1], _bash_word), argv[-1]] if shift else _lines(argv, _bash_word)
    if len(words) > 1 and not words[1].startswith("-"):  # `ray start`, `vllm serve PATH`
        words[:2] = [f"{words[0]} {words[1]}"]
    lines.append(f"{indent}exec " + f" \\\n{indent}  ".join(words) + "\n")
    lines.append(f"{indent};;\n")
    return "".join(lines)
