"""The out-of-memory downshift ladder: the context size in an argv, and the next smaller one.

An engine that ran out of memory while loading is restarted once per step at half the
context, never below `MIN_CTX`, unless the user pinned the context.
"""

from __future__ import annotations

from collections.abc import Sequence

CTX_FLAGS = ("-c", "--ctx-size")
MIN_CTX = 4096


def ctx_of(argv: Sequence[str]) -> int | None:
    """The context size `argv` asks for (`-c N`, `--ctx-size N`, `--ctx-size=N`; the last
    one wins), or None."""
    found: int | None = None
    for i, tok in enumerate(argv):
        value: str | None = None
        if tok in CTX_FLAGS and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith("--ctx-size="):
            value = tok.split("=", 1)[1]
        if value is not None:
            try:
                found = int(value)
            except ValueError:
                continue
    return found


def with_ctx(argv: Sequence[str], ctx: int) -> tuple[str, ...]:
    """`argv` with every context flag set to `ctx` (`-c ctx` appended when it had none)."""
    out = list(argv)
    seen = False
    for i, tok in enumerate(out):
        if tok in CTX_FLAGS and i + 1 < len(out):
            out[i + 1] = str(ctx)
            seen = True
        elif tok.startswith("--ctx-size="):
            out[i] = f"--ctx-size={ctx}"
            seen = True
    if not seen:
        out += ["-c", str(ctx)]
    return tuple(out)


def next_ctx(ctx: int | None, *, floor: int = MIN_CTX) -> int | None:
    """The next rung down from `ctx`: half, at least `floor`; None when there is none
    (no context given, or already at the floor)."""
    if ctx is None or ctx <= floor:
        return None
    return max(ctx // 2, floor)
