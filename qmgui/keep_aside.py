"""Moving an unusable file aside as ``<name>.bad-<UTC time>``, and keeping only the newest few.

qmgui never silently drops a file it cannot use (settings, the header cache, the run registry):
it renames it beside itself so the user can look at it, fix it or delete it. Without a bound,
a file that keeps going bad (a disk that corrupts it, a newer qmgui that keeps rewriting it)
fills the folder with copies, so each new copy prunes the older ones of the same file beyond
`KEEP_ASIDE`.

The names are ``<name>.bad-YYYYmmddTHHMMSS`` (UTC), with ``-N`` appended when a copy of that
second exists; they sort by the time in the name, then by N. Only regular files and links are
pruned: a folder that was moved aside (a folder where a file belongs) is the user's to delete.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["ASIDE_STAMP", "KEEP_ASIDE", "aside_copies", "aside_path", "move_aside", "prune_aside"]

KEEP_ASIDE = 5
"""How many ``.bad-*`` copies of one file are kept, the newest one included."""

ASIDE_STAMP = "%Y%m%dT%H%M%S"
_STAMP_RE = r"(\d{8}T\d{6})(?:-(\d+))?"


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def aside_path(path: Path, when: datetime | None = None) -> Path:
    """Where `path` would go now: ``<name>.bad-<UTC stamp>``, or with ``-N`` appended when a
    copy of that second exists, N above every existing one (so a name freed by pruning is not
    reused, and the names keep their order). Nothing is renamed."""
    moment = when if when is not None else _utc_now()
    stamp = moment.astimezone(timezone.utc).strftime(ASIDE_STAMP)
    base = f"{path.name}.bad-{stamp}"
    taken = [_counter(p.name, base) for p in aside_copies(path)]
    counter = max((n for n in taken if n is not None), default=-1) + 1
    while True:
        candidate = path.with_name(f"{base}-{counter}" if counter else base)
        if not os.path.lexists(candidate):
            return candidate
        counter += 1


def _counter(name: str, base: str) -> int | None:
    """0 for `base` itself, N for ``base-N``, None for another name."""
    if name == base:
        return 0
    rest = name.removeprefix(f"{base}-")
    return int(rest) if rest != name and rest.isascii() and rest.isdigit() else None


def aside_copies(path: Path) -> list[Path]:
    """The ``.bad-*`` copies of `path` in its folder, oldest first (by the name's time, then
    its counter). Names that do not follow the pattern are not copies."""
    pattern = re.compile(re.escape(path.name) + r"\.bad-" + _STAMP_RE + r"\Z")
    found: list[tuple[str, int, Path]] = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    for name in names:
        match = pattern.match(name)
        if match is not None:
            found.append((match.group(1), int(match.group(2) or 0), path.parent / name))
    found.sort(key=lambda item: (item[0], item[1]))
    return [p for _, _, p in found]


def prune_aside(path: Path, keep: int = KEEP_ASIDE, *, spare: Path | None = None) -> list[Path]:
    """Delete the oldest ``.bad-*`` copies of `path` so at most `keep` remain; `spare` (the
    copy just made) is never deleted and counts as one of them. Returns the copies deleted.
    Failures to delete are ignored: pruning is housekeeping, never a reason to fail."""
    copies = [p for p in aside_copies(path) if spare is None or p != spare]
    room = max(keep - (1 if spare is not None else 0), 0)
    doomed = copies[: max(len(copies) - room, 0)]
    deleted: list[Path] = []
    for old in doomed:
        try:
            mode = old.lstat().st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            continue  # a folder moved aside: its contents are the user's
        with contextlib.suppress(OSError):
            old.unlink()
            deleted.append(old)
    return deleted


def move_aside(path: Path, *, when: datetime | None = None, keep: int = KEEP_ASIDE) -> Path:
    """Rename `path` to its next ``.bad-<UTC time>`` name, then prune older copies so at most
    `keep` remain (this one included). Returns the new path; raises OSError when the rename
    fails (the file is then where it was). ``rename``, not ``replace``: on Windows it refuses
    to overwrite, so a race for one name never loses a copy."""
    target = aside_path(path, when)
    path.rename(target)
    prune_aside(path, keep, spare=target)
    return target
