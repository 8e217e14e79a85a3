"""A bash script that starts a whole run set (`qmgui place --script`): every placed engine at
once, each on its own port (`BASE_PORT`, `BASE_PORT+1`, ... in the order given), and stops them
all when one ends or the script is interrupted.

Each engine runs in a subshell with its own environment (its GPU pin) and `exec`s, so the
script's `wait -n` sees the engine itself; a trap on exit kills the others. Names are data as in
`core.export.scripts`: every word is quoted for bash, the port placeholder (`PORT_MARK`) becomes
the engine's port, secrets are read from the environment, comments are one line each.
"""

from __future__ import annotations

from collections.abc import Sequence

from qmgui.core.emit import Command
from qmgui.core.export import Export, comment_lines, export_words
from qmgui.core.export.scripts import (
    DEFAULT_PORT,
    _bash_secrets,
    _bash_word,
    _check_env,
    _comments,
    _lines,
)
from qmgui.core.shell import quote_bash_word
from qmgui.core.textsafe import printable


def render_run_set_script(
    commands: Sequence[tuple[str, Command]],
    *,
    title: str,
    comments: Sequence[str] = (),
    base_port: int = DEFAULT_PORT,
    script_name: str = "run-set.sh",
) -> Export:
    """The script for `(name, command)` pairs emitted with `port=PORT_MARK`; a command that
    cannot run is left out with its warnings."""
    runnable = [(n, c) for n, c in commands if c.runnable]
    warnings = [f"{printable(n)}: {w}" for n, c in commands for w in c.warnings]
    warnings += [f"{printable(n)}: no command, left out" for n, c in commands if not c.runnable]
    if not runnable:
        return Export(text="", warnings=tuple(warnings))
    words = [export_words(c.argv) for _, c in runnable]
    notes = sorted({n for w in words for n in w.notes("before running it")})
    base = int(base_port)
    text = "#!/usr/bin/env bash\n"
    text += _comments("#", title, [*comments, *notes], warnings)
    text += (
        f"# Usage: BASE_PORT={base} ./{printable(script_name)} (engine i listens on "
        "BASE_PORT+i; Ctrl+C stops them all)\n"
    )
    text += "set -eo pipefail\n\n"
    text += f'BASE_PORT="${{BASE_PORT:-{base}}}"\n'
    for w in words:
        text += _bash_secrets(w)
    text += "pids=()\n"
    text += "trap 'kill \"${pids[@]}\" 2>/dev/null || true' EXIT\n"
    text += "trap 'exit 130' INT TERM\n"
    for i, ((name, command), w) in enumerate(zip(runnable, words, strict=True)):
        _check_env(command.env)
        text += "\n" + "".join(f"# {x}\n" for x in comment_lines(f"{name}: port BASE_PORT+{i}"))
        text += "(\n"
        text += f"  PORT=$((BASE_PORT + {i}))\n"
        for key, value in command.env.items():
            text += f"  export {key}={quote_bash_word(value)}\n"
        lines = _lines(w.words, _bash_word)
        text += "  exec " + " \\\n    ".join(lines) + "\n"
        text += ') &\npids+=("$!")\n'
    text += "\n# the first engine to end ends the set (the trap stops the others)\nwait -n\n"
    return Export(text=text, warnings=(*warnings, *notes))
