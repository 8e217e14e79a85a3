"""`qmgui search` and `qmgui get OWNER/REPO` through huggingface_hub (issue 16, item 2).

A local server answers what huggingface_hub and qmgui ask of the hub (HF_ENDPOINT points at
it): the model search, model info with its files (sizes, LFS SHA-256), `resolve` with a redirect
to a "CDN" under another host name (X-Repo-Commit, X-Linked-Etag, X-Linked-Size), HEAD, and
byte ranges; a gated repository (403 GatedRepo) and a missing one (401 RepoNotFound).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q

from qmgui.cli import main
from qmgui.core.hub_files import RepoFile, group_repo_files, quant_of
from tests.synth.factory import PRESETS, write_gguf, write_split

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/Tiny-GGUF"
GATED = "acme/Gated-GGUF"
TOKEN = "hf_hub_test_token"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Hub:
    root: Path  # the repository's files
    base: str = ""  # http://127.0.0.1:PORT
    cdn: str = ""  # http://localhost:PORT
    requests: list[dict[str, Any]] = field(default_factory=list)
    slow_s: float = 0.0  # a pause after each 32 KiB the "CDN" sends
    lock: threading.Lock = field(default_factory=threading.Lock)

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def sha(self, p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: Hub

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _json(self, data: object, code: int = 200, **headers: str) -> None:
        body = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, error_code: str) -> None:
        self._json({"error": error_code}, code, X_Error_Code=error_code)

    def _route(self, *, head: bool) -> None:
        h = self.hub
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        with h.lock:
            h.requests.append(
                {"path": self.path, "auth": self.headers.get("Authorization"),
                 "host": self.headers.get("Host"), "range": self.headers.get("Range")}
            )  # fmt: skip
        if path == "/api/models":
            q = urllib.parse.parse_qs(url.query)
            assert q.get("filter") == ["gguf"]
            hits = [
                {"id": REPO, "downloads": 1234, "likes": 5},
                {"id": GATED, "downloads": 99, "likes": 1, "gated": "auto"},
                {"id": "../../etc", "downloads": 1, "likes": 0},  # never passed on
            ]
            query = q.get("search", [""])[0].lower()
            self._json([m for m in hits if query in str(m["id"]).lower()])
            return
        if path.startswith("/api/models/"):
            repo = path[len("/api/models/") :].split("/revision/")[0]
            if repo == GATED and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._error(403, "GatedRepo")
                return
            if repo not in (REPO, GATED):
                self._error(401, "RepoNotFound")
                return
            siblings = [{"rfilename": "README.md", "size": 10}]
            for p in h.files():
                size = p.stat().st_size
                siblings.append(
                    {
                        "rfilename": p.relative_to(h.root).as_posix(),
                        "size": size,
                        "blobId": "b" * 40,
                        "lfs": {"size": size, "sha256": h.sha(p), "pointerSize": 130},
                    }
                )
            self._json(
                {"id": repo, "sha": COMMIT, "private": False, "gated": False, "siblings": siblings}
            )
            return
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            repo, _, name = m.groups()
            file = h.root / name
            if repo not in (REPO, GATED) or not file.is_file():
                self._error(404, "EntryNotFound")
                return
            sha = h.sha(file)
            self.send_response(302)
            self.send_header("Location", f"{h.cdn}/cdn/{urllib.parse.quote(name)}")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(file.stat().st_size))
            self.send_header("ETag", f'"{sha}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path.startswith("/cdn/"):
            file = h.root / path[len("/cdn/") :]
            self._bytes(file.read_bytes(), h.sha(file), head=head)
            return
        self._error(404, "EntryNotFound")

    def _bytes(self, data: bytes, sha: str, *, head: bool) -> None:
        m = _RANGE.match(self.headers.get("Range", ""))
        first, last = 0, len(data) - 1
        if m:
            first = int(m.group(1))
            last = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("ETag", f'"{sha}"')
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not head:
            body = data[first : last + 1]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for i in range(0, len(body), 32 << 10):
                    self.wfile.write(body[i : i + (32 << 10)])
                    if self.hub.slow_s:
                        self.wfile.flush()
                        time.sleep(self.hub.slow_s)


def start_hub(folder: Path) -> tuple[Hub, ThreadingHTTPServer, threading.Thread]:
    """A stand-in for the Hugging Face API on 127.0.0.1 serving one repository (three GGUF
    models: Q4_K_M, Q8_0 and a two-shard F16) from `folder`/repo; running until shut down
    (also `scripts/guide_shots.py`'s, for the guide's picture)."""
    root = folder / "repo"
    root.mkdir()
    spec = PRESETS["llama"]
    write_gguf(root / "Tiny-Q4_K_M.gguf", replace(spec, weight_type=Q.Q4_0))
    write_gguf(root / "Tiny-Q8_0.gguf", replace(spec, weight_type=Q.Q8_0))
    split_dir = folder / "split"
    split_dir.mkdir()
    for i, p in enumerate(write_split(split_dir, spec, n_shards=2), start=1):
        p.rename(root / f"Tiny-F16-{i:05d}-of-00002.gguf")
    state = Hub(root)
    handler = type("Handler", (_Handler,), {"hub": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    state.base, state.cdn = f"http://127.0.0.1:{port}", f"http://localhost:{port}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    return state, httpd, thread


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    state, httpd, thread = start_hub(tmp_path)
    (state.root / "mmproj-Tiny-F16.gguf").write_bytes(b"GGUF" + bytes(2000))
    monkeypatch.setenv("HF_ENDPOINT", state.base)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# --- pure grouping ---------------------------------------------------------------------------


def test_files_group_into_models_with_split_sets_and_projectors() -> None:
    files = [
        RepoFile("big/M-Q8_0-00002-of-00002.gguf", 200),
        RepoFile("big/M-Q8_0-00001-of-00002.gguf", 300),
        RepoFile("big/mmproj-M-f16.gguf", 9),
        RepoFile("M-Q4_K_M.gguf", 100),
        RepoFile("M-IQ2_XXS-00001-of-00003.gguf", 50),  # incomplete: 1 of 3
        RepoFile("README.md", 1),
        RepoFile("../evil-Q4_0.gguf", 1),  # hostile paths are never models
        RepoFile("/abs-Q4_0.gguf", 1),
        RepoFile("a\\b-Q4_0.gguf", 1),
        RepoFile("x/./y-Q4_0.gguf", 1),
        RepoFile("bad\nname-Q4_0.gguf", 1),
    ]
    models = group_repo_files(files)
    assert [(m.name, m.quant, m.size, m.complete) for m in models] == [
        ("M-IQ2_XXS", "IQ2_XXS", 50, False),
        ("M-Q4_K_M.gguf", "Q4_K_M", 100, True),
        ("M-Q8_0", "Q8_0", 500, True),
    ]
    assert [f.path for f in models[2].files] == [
        "big/M-Q8_0-00001-of-00002.gguf",
        "big/M-Q8_0-00002-of-00002.gguf",
    ]
    assert [p.path for p in models[2].projectors] == ["big/mmproj-M-f16.gguf"]
    assert models[1].projectors == ()


def test_quant_names() -> None:
    assert quant_of("Qwen3-8B-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("x/gemma-3-4b-it-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert quant_of("m-bf16-00001-of-00002.gguf") == "BF16"
    assert quant_of("model.gguf") == ""


# --- search ----------------------------------------------------------------------------------


def test_search(hub: Hub) -> None:
    code, out, err = run("search", "gguf", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["repo"] for r in rows] == [REPO, GATED]  # the hostile id is left out
    assert rows[1]["gated"] is True
    code, out, _ = run("search", "tiny")
    assert code == 0
    assert REPO in out and "1,234 downloads" in out


def test_search_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code, _, err = run("search", "x")
    assert code == 1
    assert "cannot reach 127.0.0.1" in err
    assert "Traceback" not in err
    code, _, err = run("get", REPO)
    assert code == 1
    assert "cannot reach 127.0.0.1" in err


# --- a repository's models and their fit -----------------------------------------------------


def test_a_repository_lists_its_models_the_best_that_fits_first(hub: Hub) -> None:
    code, out, err = run("get", REPO, "--gpu", "24GiB", "-c", "4096", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["commit"] == COMMIT
    names = [m["name"] for m in data["models"]]
    assert set(names) == {"Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf", "Tiny-F16"}
    assert all(m["fits"] for m in data["models"])
    assert data["models"][0]["name"] == "Tiny-F16"  # the largest that fits: the best quant
    assert data["best"] == "Tiny-F16"
    f16 = data["models"][0]
    assert len(f16["files"]) == 2 and f16["projectors"][0]["path"] == "mmproj-Tiny-F16.gguf"
    assert "context 4096 on GPU0" in data["fit_at"]
    # the headers were read once: a second listing is served from the header cache
    before = sum(1 for r in hub.requests if r["path"].startswith("/cdn/"))
    code, out, err = run("get", REPO, "--gpu", "24GiB")
    assert code == 0, err
    assert sum(1 for r in hub.requests if r["path"].startswith("/cdn/")) == before
    assert out.splitlines()[2].startswith("* F16")
    assert f"qmgui get {REPO} --quant F16 --to DIR" in out


def test_nothing_fits_a_tiny_gpu(hub: Hub) -> None:
    code, out, err = run("get", REPO, "--gpu", "520MiB", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["best"] is None
    assert not any(m["fits"] for m in data["models"])


def test_get_a_quant_into_a_folder(hub: Hub, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    dest.mkdir()
    hub_token_free = [r for r in hub.requests if r["auth"]]
    assert hub_token_free == []
    code, out, err = run("get", REPO, "--quant", "q8_0", "--to", str(dest))
    assert code == 0, err
    assert (dest / "Tiny-Q8_0.gguf").read_bytes() == (hub.root / "Tiny-Q8_0.gguf").read_bytes()
    assert "size and SHA-256 verified" in out
    # the split set, with its projector
    code, out, err = run("get", REPO, "--quant", "F16", "--to", str(dest))
    assert code == 0, err
    for name in (
        "Tiny-F16-00001-of-00002.gguf",
        "Tiny-F16-00002-of-00002.gguf",
        "mmproj-Tiny-F16.gguf",
    ):
        assert (dest / name).read_bytes() == (hub.root / name).read_bytes()
    # URLs were pinned to the commit
    assert all(f"/resolve/{COMMIT}/" in r["path"] for r in hub.requests if "/resolve/" in r["path"])


def test_get_into_the_hub_cache(hub: Hub, tmp_path: Path) -> None:
    code, out, err = run("get", REPO, "--file", "Tiny-Q4_K_M.gguf")
    assert code == 0, err
    snap = tmp_path / "hub-cache" / "models--acme--Tiny-GGUF" / "snapshots" / COMMIT
    assert (snap / "Tiny-Q4_K_M.gguf").read_bytes() == (hub.root / "Tiny-Q4_K_M.gguf").read_bytes()
    assert "in the Hugging Face cache" in out


def test_a_quant_the_repository_lacks(hub: Hub, tmp_path: Path) -> None:
    code, _, err = run("get", REPO, "--quant", "Q2_K", "--to", str(tmp_path))
    assert code == 2
    assert "has no quant Q2_K" in err and "F16, Q4_K_M, Q8_0" in err


def test_gated_and_missing_repositories_say_hf_token(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run("get", GATED, "--no-fit")
    assert code == 1
    assert "is gated" in err and "HF_TOKEN" in err
    assert "Traceback" not in err
    code, _, err = run("get", "acme/Nothing-Here", "--no-fit")
    assert code == 1
    assert "was not found" in err and "HF_TOKEN" in err
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, out, err = run("get", GATED, "--no-fit")
    assert code == 0, err
    assert "Tiny-Q8_0.gguf" in out
    # the token went to the hub, never to the CDN host
    for r in hub.requests:
        if r["host"].startswith("localhost"):
            assert r["auth"] is None
