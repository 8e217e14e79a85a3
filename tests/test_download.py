"""`qmgui get URL --to DIR` and qmgui.download (issue 16, item 3).

A test server on 127.0.0.1 serves random bytes with byte ranges, ETags and If-Range; it can
cut the connection after N bytes, refuse ranges, ask for a token, redirect like Hugging Face's
resolve URLs (the SHA-256 in X-Linked-Etag, to another host name), answer slowly (for a process
killed mid-download), or 404. A small tmpfs (when this runs as root and may mount) is a real
full disk; elsewhere the free space comes in through `download_url`'s `disk_usage` seam.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from qmgui import download, remote
from qmgui.cli import main
from qmgui.core.discovery import scan
from qmgui.core.errors import DownloadError

TOKEN = "hf_test_secret_token_1234"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
SIZE = (1 << 20) + 12345  # a little over 1 MiB


@dataclass
class Served:
    root: Path
    requests: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0
    cut_at: int | None = None  # mode "cut": the next response stops after this many bytes
    cut_skip: int = 0  # mode "norangecut": requests let through whole before the cut
    sha_override: str | None = None  # mode "lfs": a wrong X-Linked-Etag
    other_host: str = ""  # where "lfs" redirects (localhost: another host name)
    slow_s: float = 0.0
    lfs_to: str = "ranged"  # the mode of the URL "lfs" redirects to
    lock: threading.Lock = field(default_factory=threading.Lock)


def _etag(path: Path) -> str:
    st = path.stat()
    return f'"v-{st.st_size}-{st.st_mtime_ns}"'


class _Handler(BaseHTTPRequestHandler):
    served: Served
    skip_cut = False  # this request is one of the `cut_skip` let through whole

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        s = self.served
        mode, _, name = self.path.lstrip("/").partition("/")
        with s.lock:
            s.requests.append(
                {
                    "path": self.path,
                    "range": self.headers.get("Range"),
                    "if_range": self.headers.get("If-Range"),
                    "auth": self.headers.get("Authorization"),
                    "host": self.headers.get("Host"),
                }
            )
            # responses let through whole are counted as the requests arrive: the client's
            # probe closes its connection at once, and its handler may still be running when
            # the download's request comes in (a CI run cut the wrong one)
            self.skip_cut = mode == "norangecut" and s.cut_skip > 0
            if self.skip_cut:
                s.cut_skip -= 1
        name = name.split("?", 1)[0]
        if mode == "auth" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._status(401)
            return
        path = s.root / name
        if "/" in name or not name or not path.is_file():
            self._status(404)
            return
        if mode == "lfs":
            sha = s.sha_override or hashlib.sha256(path.read_bytes()).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"{s.other_host}/{s.lfs_to}/{name}")
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(path.stat().st_size))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._serve(path, ranges=mode not in ("norange", "norangecut"), mode=mode)

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, path: Path, *, ranges: bool, mode: str) -> None:
        data = path.read_bytes()
        size = len(data)
        etag = _etag(path)
        m = _RANGE.match(self.headers.get("Range", "")) if ranges else None
        if_range = self.headers.get("If-Range")
        if m and if_range is not None and if_range != etag:
            m = None  # the file changed: the whole of it, as RFC 9110 says
        if m:
            first = int(m.group(1))
            last = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if first >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        else:
            first, last = 0, size - 1
            self.send_response(200)
        body = data[first : last + 1]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes" if ranges else "none")
        self.end_headers()
        cut = None
        if mode in ("cut", "norangecut") and len(body) > 1 and not self.skip_cut:
            with self.served.lock:
                cut, self.served.cut_at = self.served.cut_at, None
        if cut is not None:
            body = body[: max(cut - first, 0)]
        step = 32 << 10
        for i in range(0, len(body), step):
            self.wfile.write(body[i : i + step])
            with self.served.lock:
                self.served.sent += len(body[i : i + step])
            if mode == "slow":
                time.sleep(self.served.slow_s)
        if cut is not None:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True


@dataclass
class Server:
    url: str
    served: Served


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(remote.TOKEN_ENV, raising=False)
    root = tmp_path / "www"
    root.mkdir()
    served = Served(root)
    handler = type("Handler", (_Handler,), {"served": served})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    served.other_host = f"http://localhost:{port}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{port}", served)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _model(root: Path, name: str = "model-Q4_K_M.gguf", size: int = SIZE) -> Path:
    path = root / name
    path.write_bytes(os.urandom(size))
    return path


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    return d


def _fast(**kw: Any) -> dict[str, Any]:
    return {"retry_delay": 0.0, "chunk": 64 << 10, **kw}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# --- resume --------------------------------------------------------------------------------


def test_a_download_cut_at_40_percent_resumes_to_the_exact_bytes(
    server: Server, dest: Path
) -> None:
    src = _model(server.served.root)
    server.served.cut_at = int(SIZE * 0.4)
    result = download.download_url(f"{server.url}/cut/{src.name}", str(dest), **_fast())
    got = dest / src.name
    assert got.read_bytes() == src.read_bytes()
    assert result.files[0].fetched == SIZE  # 40% before the cut, 60% after: no byte twice
    assert any("connection broke at" in n and "resumed" in n for n in result.notes)
    ranges = [r["range"] for r in server.served.requests]
    assert ranges == ["bytes=0-0", None, f"bytes={int(SIZE * 0.4)}-"]
    assert server.served.requests[-1]["if_range"] == _etag(src)
    assert sorted(os.listdir(dest)) == [src.name]  # no .part, .part.json or lock left


def test_a_cut_without_retries_ends_with_a_sentence_and_the_next_run_resumes(
    server: Server, dest: Path
) -> None:
    src = _model(server.served.root)
    server.served.cut_at = int(SIZE * 0.4)
    url = f"{server.url}/cut/{src.name}"
    with pytest.raises(DownloadError, match="run the same command again to resume") as e:
        download.download_url(url, str(dest), **_fast(retries=0))
    assert "connection broke after" in str(e.value)
    part = dest / (src.name + download.PART_SUFFIX)
    assert part.stat().st_size == int(SIZE * 0.4)
    assert not (dest / src.name).exists()
    assert scan([str(dest)]).models == ()  # a partial file is never listed as a model
    result = download.download_url(url, str(dest), **_fast())
    assert result.files[0].resumed_from == int(SIZE * 0.4)
    assert result.files[0].fetched == SIZE - int(SIZE * 0.4)
    assert (dest / src.name).read_bytes() == src.read_bytes()
    assert len(scan([str(dest)]).models) == 1


def test_cancel_and_resume(server: Server, dest: Path) -> None:
    src = _model(server.served.root)
    cancel = download.CancelToken()
    seen: list[download.Progress] = []

    def progress(p: download.Progress) -> None:
        seen.append(p)
        if p.done >= SIZE * 0.4:
            cancel.cancel()

    monkey = pytest.MonkeyPatch()
    monkey.setattr(download, "PROGRESS_EVERY_S", 0.0)
    try:
        with pytest.raises(download.DownloadCancelled, match="resume"):
            download.download_url(
                f"{server.url}/ranged/{src.name}",
                str(dest),
                progress=progress,
                cancel=cancel,
                **_fast(),
            )
    finally:
        monkey.undo()
    have = (dest / (src.name + download.PART_SUFFIX)).stat().st_size
    assert SIZE * 0.4 <= have < SIZE
    assert seen and seen[-1].total == SIZE
    result = download.download_url(f"{server.url}/ranged/{src.name}", str(dest), **_fast())
    assert result.files[0].resumed_from == have
    assert (dest / src.name).read_bytes() == src.read_bytes()


def test_a_file_that_changed_on_the_server_starts_over(server: Server, dest: Path) -> None:
    src = _model(server.served.root)
    server.served.cut_at = SIZE // 2
    url = f"{server.url}/cut/{src.name}"
    with pytest.raises(DownloadError):
        download.download_url(url, str(dest), **_fast(retries=0))
    new = os.urandom(SIZE)  # same size, other bytes: only the ETag tells
    src.write_bytes(new)
    os.utime(src, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    result = download.download_url(url, str(dest), **_fast())
    assert (dest / src.name).read_bytes() == new
    assert result.files[0].resumed_from == 0
    assert any("another file or version" in n for n in result.notes)


def test_a_file_that_changes_between_the_cut_and_the_resume_starts_over(
    server: Server, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If-Range: the resume names the ETag the download began with; the server, whose file
    changed meanwhile, sends the whole new file, which replaces the part instead of being
    spliced onto it."""
    src = _model(server.served.root)
    server.served.cut_at = int(SIZE * 0.4)
    new = os.urandom(SIZE)
    monkeypatch.setattr(download, "PROGRESS_EVERY_S", 0.0)

    def progress(p: download.Progress) -> None:
        if p.done >= SIZE * 0.3 and src.read_bytes() != new:
            src.write_bytes(new)
            os.utime(src, ns=(time.time_ns(), time.time_ns() + 10_000_000))

    result = download.download_url(
        f"{server.url}/cut/{src.name}", str(dest), progress=progress, **_fast()
    )
    assert (dest / src.name).read_bytes() == new
    assert any("started over" in n for n in result.notes)
    assert server.served.requests[-1]["if_range"] is not None


SLOW_GET = """
import sys
from qmgui.cli import main
sys.exit(main(["get", sys.argv[1], "--to", sys.argv[2]]))
"""


def test_a_restart_mid_download(server: Server, dest: Path) -> None:
    """A qmgui process killed mid-download (power cut, kill -9): the next one resumes."""
    src = _model(server.served.root, size=2 << 20)
    server.served.slow_s = 0.02
    url = f"{server.url}/slow/{src.name}"
    part = dest / (src.name + download.PART_SUFFIX)
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_GET, url, str(dest)],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if part.exists() and part.stat().st_size >= (512 << 10):
                break
            time.sleep(0.01)
        proc.kill()
    finally:
        proc.wait(timeout=10)
    have = part.stat().st_size
    assert 0 < have < (2 << 20)
    assert not (dest / src.name).exists()
    server.served.slow_s = 0.0
    code, out, err = run("get", url, "--to", str(dest))
    assert code == 0, err
    assert "resumed at" in out
    assert (dest / src.name).read_bytes() == src.read_bytes()


def test_ctrl_c_cancels_with_a_sentence_and_the_next_run_resumes(
    server: Server, dest: Path
) -> None:
    """`qmgui get` interrupted with Ctrl-C: exit 130 and a sentence, the part and its record
    kept, no lock file left (a join interrupted by Ctrl-C once lost the result: a traceback)."""
    import signal

    src = _model(server.served.root, size=2 << 20)
    server.served.slow_s = 0.02
    url = f"{server.url}/slow/{src.name}"
    part = dest / (src.name + download.PART_SUFFIX)
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgui", "get", url, "--to", str(dest)],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a suite started in the background (no job control) has SIGINT
        # ignored, which its children inherit, and a program started so keeps ignoring it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (part.exists() and part.stat().st_size):
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err
    assert "cancelled after" in err and "Traceback" not in err
    assert part.stat().st_size > 0 and not (dest / src.name).exists()
    assert not list(dest.glob("*.lock"))
    server.served.slow_s = 0.0
    code, out, err = run("get", url, "--to", str(dest))
    assert code == 0 and "resumed at" in out, err
    assert (dest / src.name).read_bytes() == src.read_bytes()


# --- verification ----------------------------------------------------------------------------


def test_the_hub_sha256_is_checked_and_the_token_stays_with_the_named_host(
    server: Server, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _model(server.served.root)
    monkeypatch.setenv(remote.TOKEN_ENV, TOKEN)
    result = download.download_url(f"{server.url}/lfs/{src.name}", str(dest), **_fast())
    assert result.files[0].sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert (dest / src.name).read_bytes() == src.read_bytes()
    for r in server.served.requests:
        if r["host"].startswith("localhost"):
            assert r["auth"] is None  # the CDN a redirect leads to never sees the token
        else:
            assert r["auth"] == f"Bearer {TOKEN}"


def test_a_checksum_mismatch_removes_the_partial_file(server: Server, dest: Path) -> None:
    src = _model(server.served.root)
    server.served.sha_override = "0" * 64
    with pytest.raises(DownloadError, match="does not match its SHA-256") as e:
        download.download_url(f"{server.url}/lfs/{src.name}", str(dest), **_fast())
    assert "0" * 64 in str(e.value)
    assert os.listdir(dest) == []


def test_a_given_sha256_is_checked(server: Server, dest: Path) -> None:
    src = _model(server.served.root)
    code, _, err = run(
        "get", f"{server.url}/ranged/{src.name}", "--to", str(dest), "--sha256", "a" * 64
    )
    assert code == 1
    assert "does not match its SHA-256" in err
    code, out, err = run(
        "get",
        f"{server.url}/ranged/{src.name}",
        "--to",
        str(dest),
        "--sha256",
        hashlib.sha256(src.read_bytes()).hexdigest(),
    )
    assert code == 0, err
    assert "size and SHA-256 verified" in out


# --- servers that cannot resume, and failures --------------------------------------------------


def test_a_server_without_range_support(server: Server, dest: Path) -> None:
    src = _model(server.served.root)
    result = download.download_url(f"{server.url}/norange/{src.name}", str(dest), **_fast())
    assert (dest / src.name).read_bytes() == src.read_bytes()
    assert result.files[0].fetched == SIZE
    server.served.cut_at = SIZE // 3
    server.served.cut_skip = 1  # the probe (a 200 with the whole body, closed at once)
    (dest / src.name).unlink()
    with pytest.raises(DownloadError, match="does not support byte ranges") as e:
        download.download_url(f"{server.url}/norangecut/{src.name}", str(dest), **_fast())
    assert "starts over" in str(e.value)
    # the next run starts over (nothing to resume from) and says so
    result = download.download_url(f"{server.url}/norange/{src.name}", str(dest), **_fast())
    assert (dest / src.name).read_bytes() == src.read_bytes()
    assert any("discarded" in n for n in result.notes)


def test_404(server: Server, dest: Path) -> None:
    code, _, err = run("get", f"{server.url}/ranged/missing.gguf", "--to", str(dest))
    assert code == 1
    assert "not found on the server (HTTP 404)" in err
    assert "Traceback" not in err
    assert os.listdir(dest) == []


def test_401_asks_for_hf_token_and_the_token_gets_in(
    server: Server, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _model(server.served.root)
    code, _, err = run("get", f"{server.url}/auth/{src.name}", "--to", str(dest))
    assert code == 1
    assert "HF_TOKEN" in err
    monkeypatch.setenv(remote.TOKEN_ENV, "hf_wrong")
    code, _, err = run("get", f"{server.url}/auth/{src.name}", "--to", str(dest))
    assert "refused the token in HF_TOKEN" in err
    assert "hf_wrong" not in err
    monkeypatch.setenv(remote.TOKEN_ENV, TOKEN)
    code, _, err = run("get", f"{server.url}/auth/{src.name}", "--to", str(dest))
    assert code == 0, err


def test_offline(dest: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code, _, err = run("get", f"http://127.0.0.1:{port}/m.gguf", "--to", str(dest))
    assert code == 1
    assert "connection refused" in err
    code, _, err = run("get", "http://no-such-host.invalid/m.gguf", "--to", str(dest))
    assert code == 1
    assert "cannot resolve no-such-host.invalid" in err


# --- room on the disk ------------------------------------------------------------------------


def test_too_little_room_refuses_before_the_first_byte(server: Server, dest: Path) -> None:
    src = _model(server.served.root)

    def small(_: str) -> Any:
        return shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20)

    with pytest.raises(DownloadError, match="not enough room") as e:
        download.download_url(
            f"{server.url}/ranged/{src.name}", str(dest), disk_usage=small, **_fast()
        )
    assert "needs 1.0 MiB more and 1.0 MiB is free" in str(e.value)
    assert os.listdir(dest) == []
    assert all(r["range"] == "bytes=0-0" for r in server.served.requests)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real disk that fills up (needs root and a kernel that lets it mount)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_full_disk_refuses_with_the_room_needed(server: Server, tmpfs: Path) -> None:
    src = _model(server.served.root, size=3 << 20)
    code, _, err = run("get", f"{server.url}/ranged/{src.name}", "--to", str(tmpfs))
    assert code == 1
    assert "not enough room" in err
    assert "needs 3.0 MiB more" in err
    assert os.listdir(tmpfs) == []


def test_a_disk_that_fills_during_the_download(server: Server, tmpfs: Path) -> None:
    """The free space looked enough (another writer filled the disk since): the write fails,
    the sentence says the disk is full and the part is kept for a resume."""
    src = _model(server.served.root, size=3 << 20)

    def roomy(_: str) -> Any:
        return shutil._ntuple_diskusage(1 << 40, 0, 1 << 40)

    with pytest.raises(DownloadError, match="is full after") as e:
        download.download_url(
            f"{server.url}/ranged/{src.name}", str(tmpfs), disk_usage=roomy, **_fast()
        )
    assert "run the same command again to resume" in str(e.value)
    assert (tmpfs / (src.name + download.PART_SUFFIX)).stat().st_size > 0


# --- split sets, names, the command ------------------------------------------------------------


def test_a_split_set_downloads_every_shard(server: Server, dest: Path) -> None:
    names = [f"big-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    srcs = [_model(server.served.root, n, size=200_000 + i) for i, n in enumerate(names)]
    code, out, err = run("get", f"{server.url}/ranged/{names[1]}", "--to", str(dest), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [Path(f["path"]).name for f in data["files"]] == names
    for s in srcs:
        assert (dest / s.name).read_bytes() == s.read_bytes()
    # again: every shard is there already, nothing is fetched
    code, out, err = run("get", f"{server.url}/ranged/{names[0]}", "--to", str(dest), "--json")
    assert code == 0, err
    assert all(f["already_there"] for f in json.loads(out)["files"])


@pytest.mark.parametrize(
    "name",
    [
        "..%2Fevil.gguf",
        "%2e%2e",
        "a%5Cb.gguf",
        "x%0Ay.gguf",
        ".hidden.gguf",
        "%00.gguf",
        "%2Fetc%2Fpasswd",
    ],
)
def test_a_hostile_file_name_never_leaves_the_folder(server: Server, dest: Path, name: str) -> None:
    code, _, err = run("get", f"{server.url}/ranged/{name}", "--to", str(dest))
    assert code == 1
    assert "refusing the file name" in err
    assert os.listdir(dest) == []
    assert server.served.requests == []  # refused before any request
    assert not (dest.parent / "evil.gguf").exists()


def test_an_existing_file_of_another_size_is_not_overwritten(server: Server, dest: Path) -> None:
    src = _model(server.served.root)
    (dest / src.name).write_bytes(b"mine")
    code, _, err = run("get", f"{server.url}/ranged/{src.name}", "--to", str(dest))
    assert code == 1
    assert "already exists with another size" in err
    assert (dest / src.name).read_bytes() == b"mine"


def test_a_symlinked_part_is_not_written_through(
    server: Server, dest: Path, tmp_path: Path
) -> None:
    src = _model(server.served.root)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (dest / (src.name + download.PART_SUFFIX)).symlink_to(victim)
    code, _, err = run("get", f"{server.url}/ranged/{src.name}", "--to", str(dest))
    assert code == 1
    assert "not a plain file" in err
    assert victim.read_bytes() == b"keep"


def test_usage_errors(dest: Path) -> None:
    code, _, err = run("get", "just-a-word", "--to", str(dest))
    assert code == 2
    assert "neither a URL nor a repository id" in err
    code, _, err = run("get", "http://127.0.0.1:9/m.gguf")
    assert code == 2
    assert "give --to DIR" in err
    code, _, err = run("get", "ftp://x/y.gguf", "--to", str(dest))
    assert code == 1
    assert "only http:// and https://" in err
    with contextlib.suppress(SystemExit):
        code, _, err = run("get", "http://x/y.gguf", "--to", str(dest / "nope"))
    assert "is not a folder" in err
