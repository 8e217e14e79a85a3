"""Discovery: walk model roots and turn what is there into `ModelEntry` rows.

Finds GGUF files (split sets as one model, `mmproj` projectors paired with their model), Hugging
Face folders (three narrow rules, see `hf.is_hf_llm_config`), the Hugging Face cache layout,
LM Studio's folder and Ollama's manifests and blobs. Files are found where they are and never
moved. Every problem is data: a broken file marks its row (`error`), a folder that cannot be
read becomes a `ScanProblem`; nothing a scan meets stops it.

Reading is the only side effect here. Headers go through an injected `HeaderCache` (the real
one is `qmgui.cache.SqliteHeaderCache`); without one every header is read from disk.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Protocol

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import GGUFHeader, read_gguf_header
from qmgui.core.hf import (
    SafetensorsHeader,
    classify_hf,
    meta_from_hf,
    read_config,
    read_safetensors_header,
)
from qmgui.core.meta import ModelClass, ModelMeta, meta_from_gguf
from qmgui.core.safeio import kind_of, loads_json, not_regular, read_regular

SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
MAX_DEPTH = 16  # deeper than any real models tree; bounds a walk of a wrong root
# folders that never hold models and can be huge
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        ".Trash",
        "$RECYCLE.BIN",
        "System Volume Information",
        ".ipynb_checkpoints",
    }
)
PARTIAL_SUFFIXES = (".part", ".partial", ".incomplete", ".download", ".crdownload", ".tmp")
OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"
OLLAMA_DEFAULT_HOST = "registry.ollama.ai"
_COMMIT = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z._-]{0,99}")


@dataclass(frozen=True)
class ModelEntry:
    """One model as the library shows it."""

    id: str  # stable key for per-model settings: the file, folder or Ollama manifest path
    path: str  # what an engine is given: first shard, HF folder, or Ollama blob
    name: str
    format: str  # "gguf" or "hf"
    source: str  # "folder", "hf-cache", "lmstudio", "ollama", or "url" (qmgui plan URL)
    size_bytes: int
    shards: tuple[str, ...] = ()
    mmproj: str | None = None
    meta: ModelMeta | None = None
    error: str | None = None

    @property
    def model_class(self) -> ModelClass | None:
        return self.meta.model_class if self.meta else None

    def to_json(self) -> dict[str, object]:
        m = self.meta
        return {
            "id": self.id,
            "path": self.path,
            "name": self.name,
            "format": self.format,
            "source": self.source,
            "architecture": m.architecture if m else None,
            "class": m.model_class.value if m else None,
            "size_bytes": self.size_bytes,
            "shards": list(self.shards),
            "mmproj": self.mmproj,
            "context_length": m.context_length if m else None,
            "quant": m.quant if m else None,
            "params": m.param_count if m else None,
            "warnings": list(m.warnings) if m else [],
            "error": self.error,
        }


@dataclass(frozen=True)
class ScanProblem:
    """Something under a root that could not be looked at (the rest of the scan went on)."""

    path: str
    reason: str


@dataclass(frozen=True)
class ScanResult:
    models: tuple[ModelEntry, ...]
    problems: tuple[ScanProblem, ...] = ()
    cancelled: bool = False


class HeaderCache(Protocol):
    """Where parsed GGUF headers are kept between scans, keyed by (path, size, mtime)."""

    def get(self, path: str, size: int, mtime_ns: int) -> GGUFHeader | ModelReadError | None: ...

    def put(
        self, path: str, size: int, mtime_ns: int, value: GGUFHeader | ModelReadError
    ) -> None: ...


Progress = Callable[[int, int, str], None]  # (done, total, current path)


@dataclass
class _Found:
    """What the walk collected, before any header is read."""

    ggufs: list[tuple[str, str, str]] = field(default_factory=list)  # (dir, file, source)
    hf_folders: list[tuple[str, str, str]] = field(default_factory=list)  # (dir, name, source)
    ollama: list[ModelEntry] = field(default_factory=list)
    problems: list[ScanProblem] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # dir -> display prefix (HF cache)


def scan(
    roots: Sequence[str | os.PathLike[str]],
    *,
    cache: HeaderCache | None = None,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ScanResult:
    """Find and read every model under `roots`."""
    stop = should_stop or (lambda: False)
    found = _Found()
    walker = _Walker(found, stop)
    for root in roots:
        walker.root(os.fspath(root))
        if stop():
            return ScanResult((), tuple(found.problems), cancelled=True)
    reader = _HeaderReader(cache)
    # each job reads one model: (path shown in progress, reader returning an entry or None)
    jobs: list[tuple[str, Callable[[], ModelEntry | None]]] = []
    for group in _group_ggufs(found.ggufs):
        jobs.append((group.first, partial(group.entry, reader, found.names)))
    for folder, name, source in found.hf_folders:
        jobs.append((folder, partial(_hf_entry, folder, name, source)))
    for pending in found.ollama:
        jobs.append((pending.path, partial(_read_ollama_entry, pending, reader)))
    models: list[ModelEntry] = []
    cancelled = False
    for done, (path, job) in enumerate(jobs):
        if stop():
            cancelled = True
            break
        if progress:
            progress(done, len(jobs), path)
        entry = job()
        if entry is not None:
            models.append(entry)
    else:
        if progress:
            progress(len(jobs), len(jobs), "")
    models = _pair_header_projectors(models)
    models.sort(key=lambda m: (m.name.casefold(), m.path))
    return ScanResult(tuple(models), tuple(found.problems), cancelled=cancelled)


# --- the walk ------------------------------------------------------------------------------


def _source_of(root: str) -> str:
    norm = root.replace("\\", "/").lower()
    if ".lmstudio/models" in norm or "lm-studio/models" in norm or "lmstudio/models" in norm:
        return "lmstudio"
    return "folder"


class _Walker:
    """Walks roots depth-first, collecting candidate files and special layouts into `found`."""

    def __init__(self, found: _Found, stop: Callable[[], bool]) -> None:
        self.found = found
        self.stop = stop
        self.seen: set[tuple[int, int]] = set()  # (device, inode) of folders walked
        self.stack: list[tuple[str, int, str]] = []

    def problem(self, path: str, reason: str) -> None:
        self.found.problems.append(ScanProblem(path, reason))

    def root(self, root: str) -> None:
        try:
            st = os.stat(root)
        except FileNotFoundError:
            self.problem(
                root,
                "not found: an offline drive or a removed folder? Reconnect it or remove the root",
            )
            return
        except OSError as exc:
            self.problem(root, f"cannot be read ({exc.strerror or exc})")
            return
        if stat.S_ISREG(st.st_mode):
            if root.lower().endswith(".gguf"):
                folder = os.path.dirname(root) or "."
                self.found.ggufs.append((folder, os.path.basename(root), _source_of(root)))
            else:
                self.problem(root, "not a .gguf file or a folder")
            return
        if not stat.S_ISDIR(st.st_mode):
            # a FIFO, socket or device: never opened (a FIFO would block the scan forever)
            self.problem(root, f"is {kind_of(st.st_mode)}, not a folder or a .gguf file")
            return
        self.stack.append((root, 0, _source_of(root)))
        while self.stack and not self.stop():
            self.visit(*self.stack.pop())

    def list_folder(self, folder: str) -> list[os.DirEntry[str]] | None:
        try:
            st = os.stat(folder)
            key = (st.st_dev, st.st_ino)
            if key in self.seen:
                if os.path.islink(folder):
                    self.problem(folder, "symlink to a folder already scanned (a loop?); skipped")
                return None
            self.seen.add(key)
            with os.scandir(folder) as it:
                return list(it)
        except FileNotFoundError:
            self.problem(folder, "vanished during the scan")
        except OSError as exc:
            self.problem(folder, f"cannot be read ({exc.strerror or exc}); check its permissions")
        return None

    def visit(self, folder: str, depth: int, source: str) -> None:
        entries = self.list_folder(folder)
        if entries is None:
            return
        names = {e.name for e in entries}
        base = os.path.basename(folder)
        if "manifests" in names and "blobs" in names:
            _ollama_store(folder, self.found)
            return
        if base.startswith("models--") and "snapshots" in names:
            snap = _hf_cache_snapshot(folder)
            if snap:
                self.found.names[snap] = base[len("models--") :].replace("--", "/")
                self.stack.append((snap, depth + 1, "hf-cache"))
            return
        if base.startswith(("datasets--", "spaces--")):
            return
        files, subdirs = _split_entries(entries)
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        self.found.ggufs.extend((folder, f, source) for f in ggufs)
        if "config.json" in names and not ggufs and any(f.endswith(".safetensors") for f in files):
            name = self.found.names.get(folder, base)
            self.found.hf_folders.append((folder, name, source))
        if depth < MAX_DEPTH:
            self.stack.extend(
                (d, depth + 1, source if source != "folder" else _source_of(d))
                for d in sorted(subdirs, reverse=True)
            )
        elif subdirs:
            self.problem(folder, f"deeper than {MAX_DEPTH} folders; not scanned further")


def _split_entries(entries: Iterable[os.DirEntry[str]]) -> tuple[list[str], list[str]]:
    """File names and sub-folder paths of one listing (a broken .gguf symlink counts as a file,
    so its row can say what is wrong)."""
    files: list[str] = []
    subdirs: list[str] = []
    for entry in entries:
        try:
            if entry.is_dir():
                if entry.name not in SKIP_DIRS:
                    subdirs.append(entry.path)
            elif entry.is_file() or entry.name.lower().endswith(".gguf"):
                files.append(entry.name)
        except OSError:
            continue
    return files, subdirs


def _size_of(paths: Iterable[str]) -> int:
    """Summed sizes, following symlinks (the HF cache links weights to blobs)."""
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += os.stat(p).st_size
    return total


def _hf_cache_snapshot(repo_dir: str) -> str | None:
    """The snapshot `refs/main` points at, else the newest one."""
    snaps = os.path.join(repo_dir, "snapshots")
    try:
        ref = read_regular(os.path.join(repo_dir, "refs", "main"), 200)
        commit = ref.decode("utf-8", errors="replace").strip()
        # a commit hash: nothing that could climb out of snapshots/ ("..", "/")
        if _COMMIT.fullmatch(commit) and os.path.isdir(os.path.join(snaps, commit)):
            return os.path.join(snaps, commit)
    except (ModelReadError, ValueError):  # ValueError: a NUL byte in the name
        pass
    try:
        with os.scandir(snaps) as it:
            dirs = [(e.stat().st_mtime, e.path) for e in it if e.is_dir()]
    except OSError:
        return None
    return max(dirs)[1] if dirs else None


# --- GGUF files: split sets, projectors ----------------------------------------------------


@dataclass
class _GgufGroup:
    folder: str
    first: str  # full path of the first file (shard 1)
    source: str
    split_count: int = 1
    shards: dict[int, str] = field(default_factory=dict)
    projectors: list[str] = field(default_factory=list)  # same-folder mmproj candidates

    def stem(self) -> str:
        base = os.path.basename(self.first)
        m = SPLIT_RE.match(base)
        return m.group("base") if m else base[: -len(".gguf")]

    def entry(self, reader: _HeaderReader, names: dict[str, str]) -> ModelEntry:
        shard_paths = tuple(self.shards[i] for i in sorted(self.shards))
        prefix = names.get(self.folder)
        name = f"{prefix}/{self.stem()}" if prefix else self.stem()
        size = _size_of(shard_paths)
        base = ModelEntry(
            id=self.first,
            path=self.first,
            name=name,
            format="gguf",
            source=self.source,
            size_bytes=size,
            shards=shard_paths,
        )
        missing = [i for i in range(1, self.split_count + 1) if i not in self.shards]
        try:
            headers = [reader.read(p) for p in shard_paths]
        except ModelReadError as e:
            return replace(base, error=_sentence(e))
        incomplete = None
        if missing:
            shown = ", ".join(str(i) for i in missing[:5])
            incomplete = (
                f"split set is missing shard(s) {shown} of "
                f"{self.split_count}; download them into {self.folder}"
            )
        elif 1 not in self.shards:
            incomplete = "split set has no first shard (00001)"
        try:
            meta = meta_from_gguf(
                headers[0],
                file_name=os.path.basename(self.first),
                more_shards=headers[1:],
                partial=incomplete is not None,
            )
        except ModelReadError as e:
            # an incomplete set says so first: its first header may not be the model's
            return replace(base, error=incomplete or _sentence(e))
        entry = replace(base, meta=meta)
        if incomplete:
            return replace(entry, error=incomplete)
        return replace(entry, mmproj=self.pick_projector(meta))

    def pick_projector(self, meta: ModelMeta) -> str | None:
        if meta.model_class not in (ModelClass.LLM, ModelClass.TTS) or not self.projectors:
            return None
        stem = self.stem().lower()
        return max(self.projectors, key=lambda p: (_common_prefix_len(stem, _proj_key(p)), p))


def _common_prefix_len(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _proj_key(path: str) -> str:
    return os.path.basename(path).lower().replace("mmproj-", "").replace("-mmproj", "")


def _is_projector_name(file_name: str) -> bool:
    return "mmproj" in file_name.lower()


def _group_ggufs(ggufs: Iterable[tuple[str, str, str]]) -> list[_GgufGroup]:
    groups: dict[tuple[str, str], _GgufGroup] = {}
    projectors: dict[str, list[str]] = {}
    seen_files: set[str] = set()
    for folder, file_name, source in ggufs:
        path = os.path.join(folder, file_name)
        if path in seen_files:
            continue
        seen_files.add(path)
        if file_name.lower().endswith(PARTIAL_SUFFIXES):
            continue
        if _is_projector_name(file_name):
            projectors.setdefault(folder, []).append(path)
            continue
        m = SPLIT_RE.match(file_name)
        if m:
            key = (folder, m.group("base").lower() + "@" + m.group("count"))
            group = groups.get(key)
            if group is None:
                count = int(m.group("count"))
                first = os.path.join(folder, f"{m.group('base')}-00001-of-{m.group('count')}.gguf")
                group = groups[key] = _GgufGroup(folder, first, source, split_count=count)
            group.shards[int(m.group("no"))] = path
        else:
            groups[(folder, file_name)] = _GgufGroup(folder, path, source, shards={1: path})
    _assign_projectors(list(groups.values()), projectors)
    return sorted(groups.values(), key=lambda g: g.first)


def _assign_projectors(groups: list[_GgufGroup], projectors: dict[str, list[str]]) -> None:
    """A projector belongs to the models of its folder whose names share the most of its
    name (every quantisation of one model alike), not to every model in the folder."""
    by_folder: dict[str, list[_GgufGroup]] = {}
    for group in groups:
        by_folder.setdefault(group.folder, []).append(group)
    for folder, paths in projectors.items():
        members = by_folder.get(folder, [])
        for proj in paths:
            key = _proj_key(proj)
            scores = [_common_prefix_len(g.stem().lower(), key) for g in members]
            best = max(scores, default=0)
            for g, score in zip(members, scores, strict=True):
                if score == best:
                    g.projectors.append(proj)
    for group in groups:
        group.projectors.sort()


def _pair_header_projectors(models: list[ModelEntry]) -> list[ModelEntry]:
    """Drop projectors from the list; ones found by header (arch `clip`) rather than by name
    are paired with the unpaired models of their folder."""
    by_folder: dict[str, str] = {}
    for m in models:
        if m.model_class == ModelClass.PROJECTOR and not m.error:
            by_folder.setdefault(os.path.dirname(m.path), m.path)
    out = []
    for m in models:
        if m.model_class == ModelClass.PROJECTOR and not m.error:
            continue
        proj = by_folder.get(os.path.dirname(m.path))
        if proj and m.format == "gguf" and m.mmproj is None and m.model_class == ModelClass.LLM:
            out.append(replace(m, mmproj=proj))
        else:
            out.append(m)
    return out


# --- headers through the cache -------------------------------------------------------------


class _HeaderReader:
    def __init__(self, cache: HeaderCache | None) -> None:
        self.cache = cache

    def read(self, path: str) -> GGUFHeader:
        try:
            st = os.stat(path)
        except FileNotFoundError as e:
            if os.path.islink(path):
                raise ModelReadError(path, "is a broken symlink; its target is gone") from e
            raise ModelReadError(path, "vanished during the scan; rescan") from e
        except OSError as e:
            raise ModelReadError(path, f"cannot be read ({e.strerror or e})") from e
        bad = not_regular(path, st.st_mode)
        if bad is not None:  # a FIFO, socket or device: never opened, never cached
            raise bad
        if self.cache is not None:
            hit = self.cache.get(path, st.st_size, st.st_mtime_ns)
            if isinstance(hit, ModelReadError):
                raise hit
            if hit is not None:
                return hit
        try:
            header = read_gguf_header(path)
        except ModelReadError as e:
            if self.cache is not None:
                self.cache.put(path, st.st_size, st.st_mtime_ns, e)
            raise
        if self.cache is not None:
            self.cache.put(path, st.st_size, st.st_mtime_ns, header)
        return header


def _sentence(e: ModelReadError) -> str:
    where = f" (at byte {e.offset})" if e.offset is not None else ""
    return f"{e.reason}{where}"


# --- Hugging Face folders ------------------------------------------------------------------


def _hf_entry(folder: str, name: str, source: str) -> ModelEntry | None:
    """The entry for an HF folder; None when its config names no model qmgui serves (a
    classifier, a diffusion component): such folders are not models, not broken ones."""
    cfg_path = os.path.join(folder, "config.json")
    try:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    except OSError as e:
        files = []
        err: str | None = f"cannot be read ({e.strerror or e})"
    else:
        err = None
    paths = tuple(os.path.join(folder, f) for f in files)
    base = ModelEntry(
        id=folder,
        path=folder,
        name=name,
        format="hf",
        source=source,
        size_bytes=_size_of(paths),
        shards=paths,
        error=err,
    )
    if err:
        return base
    try:
        cfg = read_config(cfg_path)
        model_class = classify_hf(cfg)
        if model_class is None:
            return None
        headers: list[SafetensorsHeader] = [read_safetensors_header(p) for p in paths]
        missing = _missing_index_shards(folder, files)
        meta = meta_from_hf(cfg, headers, name=name, model_class=model_class, path=cfg_path)
    except ModelReadError as e:
        return replace(base, error=f"{os.path.basename(e.path)}: {_sentence(e)}")
    entry = replace(base, meta=meta)
    if missing:
        return replace(
            entry,
            error=f"missing weight file(s) {', '.join(missing[:3])} named in "
            "model.safetensors.index.json; download them",
        )
    return entry


MAX_INDEX_BYTES = 16 * 1024 * 1024  # DeepSeek-V3's index (91k tensors) is 6.5 MB


def _missing_index_shards(folder: str, present: Sequence[str]) -> list[str]:
    """Weight files model.safetensors.index.json names that are not in the folder. No index:
    none; an index that is not a regular file or not usable JSON: ModelReadError."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.lexists(index):
        return []
    raw = read_regular(index, MAX_INDEX_BYTES)
    if len(raw) > MAX_INDEX_BYTES:
        raise ModelReadError(index, f"larger than {MAX_INDEX_BYTES} bytes; not a weight index")
    data = loads_json(raw, index)
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict):
        return []
    return sorted({str(v) for v in wm.values()} - set(present))


# --- Ollama --------------------------------------------------------------------------------


def _ollama_store(store: str, found: _Found) -> None:
    manifests = Path(store, "manifests")
    blobs = Path(store, "blobs")
    try:
        manifest_files = [p for p in manifests.rglob("*") if p.is_file()]
    except OSError as e:
        found.problems.append(ScanProblem(str(manifests), f"cannot be read ({e})"))
        return
    for mf in sorted(manifest_files):
        rel = mf.relative_to(manifests).parts
        if len(rel) < 4:
            continue
        host, namespace, model, tag = rel[-4], rel[-3], rel[-2], rel[-1]
        if host == OLLAMA_DEFAULT_HOST:
            name = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        else:
            name = f"{host}/{namespace}/{model}:{tag}"
        found.ollama.append(_ollama_entry(str(mf), name, blobs))


def _ollama_entry(manifest: str, name: str, blobs: Path) -> ModelEntry:
    base = ModelEntry(
        id=manifest, path=manifest, name=name, format="gguf", source="ollama", size_bytes=0
    )
    try:
        data = loads_json(read_regular(manifest, 1 << 20), manifest)
        layers = data["layers"]
        model = next(x for x in layers if x.get("mediaType") == OLLAMA_MODEL)
        proj = next((x for x in layers if x.get("mediaType") == OLLAMA_PROJECTOR), None)
    except (ModelReadError, KeyError, TypeError, StopIteration, AttributeError):
        return replace(base, error=f"manifest {manifest} is unreadable or names no model layer")
    blob = str(blobs / str(model.get("digest", "")).replace(":", "-"))
    mmproj = str(blobs / str(proj.get("digest", "")).replace(":", "-")) if proj else None
    return replace(base, path=blob, shards=(blob,), mmproj=mmproj)


def _read_ollama_entry(entry: ModelEntry, reader: _HeaderReader) -> ModelEntry:
    if entry.error:
        return entry
    try:
        size = os.stat(entry.path).st_size
        header = reader.read(entry.path)
    except FileNotFoundError:
        return replace(
            entry,
            error=f"blob {entry.path} named by the manifest is missing; "
            f"run `ollama pull {entry.name}`",
        )
    except OSError as e:
        return replace(entry, error=f"blob cannot be read ({e.strerror or e})")
    except ValueError:  # a NUL byte in the digest the manifest gives
        return replace(entry, error=f"manifest {entry.id} names a blob that is no file name")
    except ModelReadError as e:
        return replace(entry, size_bytes=size, error=_sentence(e))
    try:
        meta = meta_from_gguf(header, file_name=entry.name)
    except ModelReadError as e:
        return replace(entry, size_bytes=size, error=_sentence(e))
    mmproj = entry.mmproj if entry.mmproj and os.path.exists(entry.mmproj) else None
    return replace(entry, size_bytes=size, meta=meta, mmproj=mmproj)


def entry_for_path(path: str | os.PathLike[str], *, cache: HeaderCache | None = None) -> ModelEntry:
    """The model a single path names: a .gguf file (any shard of a split set, whose siblings
    are found beside it, with its mmproj) or a Hugging Face folder. Errors are on the entry."""
    p = os.fspath(path)
    if not os.path.lexists(p):
        return ModelEntry(
            id=p,
            path=p,
            name=os.path.basename(p) or p,
            format="hf" if p.endswith(("/", os.sep)) else "gguf",
            source="folder",
            size_bytes=0,
            error="not found: no file or folder at this path; check it, or run `qmgui scan` "
            "to list the models qmgui finds",
        )
    if os.path.isdir(p):
        found = _Found()
        _Walker(found, lambda: False).visit(p, MAX_DEPTH, _source_of(p))
        hf = next((f for f in found.hf_folders if f[0] == p), None)
        entry = _hf_entry(*hf) if hf else None
        if entry is None:
            return ModelEntry(
                id=p,
                path=p,
                name=os.path.basename(p),
                format="hf",
                source="folder",
                size_bytes=0,
                error="not a model: no .gguf file given and no Hugging Face "
                "config.json naming a causal LM beside *.safetensors",
            )
        return entry
    folder = os.path.dirname(p) or "."
    try:
        siblings = [
            (folder, f, _source_of(p)) for f in os.listdir(folder) if f.lower().endswith(".gguf")
        ]
    except OSError as e:
        siblings = []
        return ModelEntry(
            id=p,
            path=p,
            name=os.path.basename(p),
            format="gguf",
            source="folder",
            size_bytes=0,
            error=f"cannot read {folder} ({e.strerror or e})",
        )
    if os.path.basename(p) not in {f for _, f, _ in siblings}:
        siblings.append((folder, os.path.basename(p), _source_of(p)))
    reader = _HeaderReader(cache)
    for group in _group_ggufs(siblings):
        if p in group.shards.values() or group.first == p:
            return group.entry(reader, {})
    # the path is a projector: read it alone, so the caller sees what it is
    return _GgufGroup(folder, p, _source_of(p), shards={1: p}).entry(reader, {})


def entry_from_headers(
    location: str,
    file_name: str,
    shards: Sequence[str],
    headers: Sequence[GGUFHeader],
    *,
    source: str = "url",
) -> ModelEntry:
    """The model whose headers were read elsewhere (qmgui.remote reads a URL's): one GGUF, or a
    split set whose `headers` are its shards' in order from the first. `location` is what an
    engine would be given (the first shard's); the size is the sum the headers state. Errors
    (a header that is not a model's) are on the entry, as for a local file."""
    name = file_name
    m = SPLIT_RE.match(file_name)
    if m:
        name = m.group("base")
    elif file_name.lower().endswith(".gguf"):
        name = file_name[: -len(".gguf")]
    base = ModelEntry(
        id=location,
        path=location,
        name=name,
        format="gguf",
        source=source,
        size_bytes=sum(h.file_size for h in headers),
        shards=tuple(shards),
    )
    if not headers:
        return replace(base, error="no header was read")
    try:
        meta = meta_from_gguf(headers[0], file_name=file_name, more_shards=headers[1:])
    except ModelReadError as e:
        return replace(base, error=_sentence(e))
    return replace(base, meta=meta)
