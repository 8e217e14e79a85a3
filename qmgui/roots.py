"""Model roots as a set of folders: adding one that another root already covers adds nothing,
adding a parent of roots replaces them, and a root is found by any spelling of its path.

Shared by `qmgui roots` and the window (drops, Add folder, the Model folders dialog); no Qt
and no CLI here. Paths are compared resolved (``~`` expanded, symlinks followed, case folded
where the file system folds it); the spelling stored is the caller's."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Addition", "covering_root", "find_root", "plan_add", "root_key"]


def root_key(path: str) -> str:
    """`path` as it is compared: absolute, resolved, normalised."""
    return os.path.normcase(os.path.realpath(os.path.expanduser(path)))


def _inside(child: str, parent: str) -> bool:
    """Keys: `child` is `parent` or lies under it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def covering_root(roots: Sequence[str], path: str) -> str | None:
    """The root among `roots` that `path` is, or lies inside; None when none does."""
    key = root_key(path)
    return next((r for r in roots if _inside(key, root_key(r))), None)


def find_root(roots: Sequence[str], path: str) -> str | None:
    """The root among `roots` that `path` names: as given, normalised, or resolved."""
    for r in roots:
        if r == path or os.path.normpath(r) == os.path.normpath(path):
            return r
    key = root_key(path)
    return next((r for r in roots if root_key(r) == key), None)


@dataclass
class Addition:
    """What adding paths to a list of roots does."""

    roots: list[str]  # the roots afterwards
    added: list[str] = field(default_factory=list)
    already: list[tuple[str, str]] = field(default_factory=list)  # (path, the root covering it)
    replaced: list[tuple[str, str]] = field(default_factory=list)  # (old root, its new parent)

    def messages(self) -> list[str]:
        """Sentences for what was not simply added."""
        out = []
        for path, root in self.already:
            if root_key(path) == root_key(root):
                out.append(f"{path} is already a model folder; not added again")
            else:
                out.append(f"{path} is inside the model folder {root}, which is scanned already")
        for old, new in self.replaced:
            out.append(f"{old} is inside {new}: {new} replaces it as a model folder")
        return out


def plan_add(roots: Sequence[str], paths: Sequence[str]) -> Addition:
    """Add `paths` to `roots`, in order: a path some root already covers is not added; a path
    that contains roots takes the place of the first of them and the others go."""
    result = Addition(list(roots))
    for path in paths:
        covering = covering_root(result.roots, path)
        if covering is not None:
            result.already.append((path, covering))
            continue
        key = root_key(path)
        inner = [r for r in result.roots if _inside(root_key(r), key)]
        if inner:
            at = result.roots.index(inner[0])
            result.roots = [r for r in result.roots if r not in inner]
            result.roots.insert(at, path)
            result.replaced += [(r, path) for r in inner]
        else:
            result.roots.append(path)
        result.added.append(path)
    return result
