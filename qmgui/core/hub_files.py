"""A Hugging Face repository's GGUF files as models: split sets and projectors grouped.

Pure: takes the file list the hub gives (path, size, SHA-256) and returns one `RepoModel` per
model a user can download: a single file or every shard of a split set (complete only when all
shards are listed), with the vision projectors (`mmproj*`) of its folder beside it, and the
quantisation read from the name (`Q4_K_M`, `IQ3_XXS`, `BF16` ...). File paths come from the
repository and are attacker-controlled: nothing here touches the disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from qmgui.core.discovery import SPLIT_RE

_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"I?Q\d(?:_[0-9A-Z]+)*|TQ\d_\d|MXFP4(?:_MOE)?|UD-[A-Z0-9_]+|BF16|F16|F32|FP16|FP8"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RepoFile:
    path: str  # as the repository names it (folders with /)
    size: int
    sha256: str | None = None  # the LFS object id, when the hub gives it


@dataclass(frozen=True)
class RepoModel:
    """One downloadable model of a repository."""

    name: str  # the file name, or a split set's base name
    quant: str  # "" when the name tells none
    files: tuple[RepoFile, ...]  # a split set's shards, in order
    projectors: tuple[RepoFile, ...]  # mmproj files of the same folder
    shard_count: int  # 1 for a single file

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def complete(self) -> bool:
        return len(self.files) == self.shard_count

    @property
    def first(self) -> RepoFile:
        return self.files[0]


def quant_of(name: str) -> str:
    """The quantisation a GGUF's file name tells (the last one in it), upper-cased; ''."""
    base = name.rsplit("/", 1)[-1]
    m = SPLIT_RE.match(base)
    stem = m.group("base") if m else base.removesuffix(".gguf").removesuffix(".GGUF")
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else ""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def safe_repo_path(path: str) -> bool:
    """A repository path qmgui may request and name a file after: relative, with no empty,
    `.` or `..` segment, no backslash or control character, at most 1000 characters."""
    if not path or len(path) > 1000 or "\\" in path or _CONTROL.search(path):
        return False
    return all(seg not in ("", ".", "..") for seg in path.split("/"))


def is_projector(path: str) -> bool:
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


def group_repo_files(files: Iterable[RepoFile]) -> list[RepoModel]:
    """The repository's GGUF models, sorted by size (a split set is one model; projectors
    are attached to the models of their folder, not listed as models)."""
    singles: list[RepoFile] = []
    sets: dict[tuple[str, str, int], dict[int, RepoFile]] = {}
    projectors: dict[str, list[RepoFile]] = {}
    for f in files:
        if not f.path.lower().endswith(".gguf") or f.size < 0 or not safe_repo_path(f.path):
            continue
        folder, _, base = f.path.rpartition("/")
        if is_projector(f.path):
            projectors.setdefault(folder, []).append(f)
            continue
        m = SPLIT_RE.match(base)
        if m:
            count = int(m.group("count"))
            index = int(m.group("no"))
            sets.setdefault((folder, m.group("base"), count), {})[index] = f
        else:
            singles.append(f)
    models = [
        RepoModel(
            f.path.rsplit("/", 1)[-1],
            quant_of(f.path),
            (f,),
            tuple(projectors.get(f.path.rpartition("/")[0], ())),
            1,
        )
        for f in singles
    ]
    for (folder, base, count), shards in sets.items():
        ordered = tuple(shards[i] for i in sorted(shards))
        models.append(
            RepoModel(
                base, quant_of(ordered[0].path), ordered, tuple(projectors.get(folder, ())), count
            )
        )
    models.sort(key=lambda m: (m.size, m.name))
    return models


def find_model(
    models: list[RepoModel], *, quant: str | None = None, file: str | None = None
) -> list[RepoModel]:
    """The models a `--quant Q` (case-insensitive, exact) or `--file NAME` (a file's path or
    name, any shard of a set, or a set's base name) selects."""
    if quant is not None:
        return [m for m in models if m.quant == quant.upper()]
    if file is not None:
        return [
            m
            for m in models
            if m.name == file
            or any(f.path == file or f.path.rsplit("/", 1)[-1] == file for f in m.files)
        ]
    return []
