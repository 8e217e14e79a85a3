"""Hugging Face: search repositories, list a repository's GGUF models, size them remotely.

Through `huggingface_hub` (imported here, on first use, so neither `qmgui plan` nor the window
loads it): it honours `HF_ENDPOINT` (read per call here, so a mirror or a test server works)
and `HF_TOKEN`. Every failure is a `DownloadError` with one sentence: a missing repository, a
gated or private one (set `HF_TOKEN`), no network.

Sizing reads each model's header with HTTP range requests (qmgui.remote) from the URL pinned to
the repository's commit, so the header cache (qmgui.cache, keyed by that URL and the file's
size) never needs to ask again.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qmgui.core.errors import DownloadError, ModelReadError
from qmgui.core.hub_files import RepoFile, RepoModel, group_repo_files
from qmgui.core.textsafe import printable

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RepoHit:
    repo_id: str
    downloads: int
    likes: int
    gated: bool


@dataclass(frozen=True)
class Listing:
    repo_id: str
    commit: str  # the revision's commit (file URLs are pinned to it)
    models: list[RepoModel]
    gated: bool
    private: bool


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN", "").strip() or None


def is_repo_id(text: str) -> bool:
    """`owner/repo` as Hugging Face spells repository ids."""
    return bool(REPO_ID.match(text)) and ".." not in text and "--" not in text


def _reachable() -> None:
    """Fail at once, with a sentence, when the hub cannot be reached: huggingface_hub retries a
    failed connection with backoff for some 20 s before it gives up."""
    parts = urllib.parse.urlsplit(endpoint())
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((host, port), timeout=TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        raise DownloadError(
            f"cannot reach {printable(parts.netloc)} ({printable(str(e))[:120]}); check the "
            "connection (and HF_ENDPOINT, if set) and try again"
        ) from None


def _api() -> Any:
    from huggingface_hub import HfApi  # noqa: PLC0415 - only search and get load it

    _reachable()

    return HfApi(endpoint=endpoint(), token=_token())


def _sentence(e: Exception, what: str) -> DownloadError:
    """A huggingface_hub (or network) failure as one sentence."""
    from huggingface_hub import errors  # noqa: PLC0415

    if isinstance(e, errors.GatedRepoError):
        return DownloadError(
            f"{what} is gated: accept its terms on its page ({endpoint()}/{what}) and set HF_TOKEN "
            "to an access token of that account (https://huggingface.co/settings/tokens)"
        )
    if isinstance(e, errors.RepositoryNotFoundError):
        told = " (with the token in HF_TOKEN)" if _token() else ""
        return DownloadError(
            f"{what} was not found{told}: check the name; a private repository needs HF_TOKEN set "
            "to a token that may read it (https://huggingface.co/settings/tokens)"
        )
    sentences: list[tuple[type[BaseException], str]] = [
        (
            errors.LocalEntryNotFoundError,
            "the file is neither in the Hugging Face cache nor reachable on the hub; check the "
            "connection and try again",
        ),
        (errors.EntryNotFoundError, "the file is not in the repository (any more); list it again"),
        (errors.RevisionNotFoundError, "no such revision (branch, tag or commit)"),
    ]
    for kind, sentence in sentences:
        if isinstance(e, kind):
            return DownloadError(f"{what}: {sentence}")
    if isinstance(e, errors.HfHubHTTPError):
        return _http_sentence(e, what)
    host = urllib.parse.urlsplit(endpoint()).netloc
    return DownloadError(
        f"cannot reach {printable(host)} ({type(e).__name__}: {printable(str(e))[:120]}); check "
        "the connection (and HF_ENDPOINT, if set) and try again"
    )


def _http_sentence(e: Exception, what: str) -> DownloadError:
    code = getattr(getattr(e, "response", None), "status_code", None)
    if code in (401, 403):
        return DownloadError(
            f"{what}: the hub refused access (HTTP {code}); set HF_TOKEN to a token that may "
            "read it (https://huggingface.co/settings/tokens)"
        )
    if code == 429:
        return DownloadError(f"{what}: the hub is rate-limiting requests; wait a minute")
    return DownloadError(f"{what}: the hub answered HTTP {code or '?'}; try again later")


def search(query: str, *, limit: int = 20) -> list[RepoHit]:
    """GGUF repositories matching `query`, most downloaded first."""
    api = _api()
    try:
        found = list(api.list_models(search=query, filter="gguf", sort="downloads", limit=limit))
    except Exception as e:  # the boundary: every failure becomes a sentence
        raise _sentence(e, f"search {query!r}") from None
    hits = []
    for m in found:
        repo = str(getattr(m, "id", "") or "")
        if not is_repo_id(repo):
            continue  # a name qmgui could not pass on safely
        hits.append(
            RepoHit(
                repo,
                int(getattr(m, "downloads", 0) or 0),
                int(getattr(m, "likes", 0) or 0),
                bool(getattr(m, "gated", False)),
            )
        )
    return hits


def listing(repo_id: str, *, revision: str | None = None) -> Listing:
    """The repository's GGUF models (split sets and projectors grouped), each with its size
    and the SHA-256 of each file when the hub gives it."""
    if not is_repo_id(repo_id):
        raise DownloadError(f"{printable(repo_id)[:120]!r} is not a repository id (owner/repo)")
    api = _api()
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as e:  # the boundary: every failure becomes a sentence
        raise _sentence(e, repo_id) from None
    commit = str(getattr(info, "sha", "") or "")
    if not _SHA.match(commit):
        raise DownloadError(f"{repo_id}: the hub gave no commit for this revision; try again")
    files = []
    for s in getattr(info, "siblings", None) or []:
        lfs = getattr(s, "lfs", None)
        size = getattr(s, "size", None)
        if size is None and lfs is not None:
            size = lfs.size
        sha = str(lfs.sha256).lower() if lfs is not None and lfs.sha256 else None
        if not isinstance(size, int) or size < 0:
            continue
        files.append(RepoFile(str(s.rfilename), size, sha if sha and _SHA256.match(sha) else None))
    return Listing(
        repo_id,
        commit,
        group_repo_files(files),
        bool(getattr(info, "gated", False)),
        bool(getattr(info, "private", False)),
    )


def file_url(repo_id: str, commit: str, path: str) -> str:
    """The resolve URL of a file, pinned to a commit (so what is sized is what downloads)."""
    return f"{endpoint()}/{repo_id}/resolve/{commit}/{urllib.parse.quote(path)}"


@dataclass(frozen=True)
class Sized:
    model: RepoModel
    meta: Any  # the ModelMeta, None when the header could not be read
    error: str


def size_models(
    found: Listing,
    *,
    on_model: Callable[[int, int], None] | None = None,
) -> list[Sized]:
    """Each complete model's metadata from its remote header(s), through the header cache."""
    from qmgui.cache import SqliteHeaderCache  # noqa: PLC0415
    from qmgui.core.discovery import entry_from_headers  # noqa: PLC0415
    from qmgui.core.gguf_header import read_gguf_header_from  # noqa: PLC0415
    from qmgui.remote import RemoteFile, Transfer  # noqa: PLC0415

    out: list[Sized] = []
    with SqliteHeaderCache() as cache:
        for i, model in enumerate(found.models):
            if on_model is not None:
                on_model(i + 1, len(found.models))
            if not model.complete:
                out.append(
                    Sized(model, None, f"{model.shard_count - len(model.files)} shards missing")
                )
                continue
            urls = [file_url(found.repo_id, found.commit, f.path) for f in model.files]
            headers = []
            error = ""
            for url, f in zip(urls, model.files, strict=True):
                hit = cache.get(url, f.size, 0)
                if hit is None:
                    remote = RemoteFile(url, Transfer(), token=_token())
                    try:
                        remote.open()
                        hit = read_gguf_header_from(remote, url, remote.size)
                    except ModelReadError as e:
                        hit = e  # not cached: a network failure may pass
                    finally:
                        remote.close()
                    if not isinstance(hit, ModelReadError):
                        cache.put(url, f.size, 0, hit)
                if isinstance(hit, ModelReadError):
                    error = hit.reason
                    break
                headers.append(hit)
            if error:
                out.append(Sized(model, None, error))
                continue
            entry = entry_from_headers(urls[0], model.name, urls, headers)
            out.append(Sized(model, entry.meta, entry.error or ""))
    return out


@dataclass(frozen=True)
class Fit:
    model: RepoModel
    fits: bool | None  # None: could not be sized (the note says why)
    note: str


def fit_models(sized: list[Sized], gpus: tuple[Any, ...], ctx: int, *, reserve: int) -> list[Fit]:
    """Whether each model fits `gpus` (this machine's or a what-if profile) and this machine's
    RAM at context `ctx`: the best that fits (the largest) first, then the ones that could not
    be sized, then those that do not fit, smallest first."""
    from qmgui.core.errors import SizingError  # noqa: PLC0415
    from qmgui.core.fit import Budget, check  # noqa: PLC0415
    from qmgui.core.launch import LaunchSettings  # noqa: PLC0415
    from qmgui.hw.host import read_ram  # noqa: PLC0415

    budget = Budget(gpus=gpus, gpu_reserve=reserve, host_bytes=read_ram()[0])
    rows: list[Fit] = []
    for s in sized:
        if s.meta is None:
            rows.append(Fit(s.model, None, s.error or "not sized"))
            continue
        try:
            result = check(s.meta, LaunchSettings(ctx_size=ctx), budget)
        except SizingError as e:
            rows.append(Fit(s.model, None, str(e)))
            continue
        rows.append(Fit(s.model, result.fits, "" if result.fits else (result.reason or "")))

    def order(r: Fit) -> tuple[int, int]:
        if r.fits:
            return (0, -r.model.size)
        return (1, r.model.size) if r.fits is None else (2, r.model.size)

    rows.sort(key=order)
    return rows


def projector_for(model: RepoModel) -> RepoFile | None:
    """The vision projector to bring along with `model`: an F16 one when there are several."""
    for p in model.projectors:
        name = p.path.rsplit("/", 1)[-1].lower()
        if "f16" in name and "bf16" not in name:
            return p
    return model.projectors[0] if model.projectors else None


def download_jobs(
    found: Listing, model: RepoModel, *, projector: bool = True
) -> list[tuple[str, str | None]]:
    """(URL, SHA-256 or None) per `download_url` call that brings `model` (a split set's first
    shard brings every shard) and, unless told not to, its projector."""
    jobs: list[tuple[str, str | None]] = [
        (
            file_url(found.repo_id, found.commit, model.first.path),
            model.first.sha256 if model.shard_count == 1 else None,
        )
    ]
    extra = projector_for(model) if projector else None
    if extra is not None:
        jobs.append((file_url(found.repo_id, found.commit, extra.path), extra.sha256))
    return jobs
