"""`qmgui plan URL`: a remote GGUF's header read with HTTP range requests (issue 16, item 1).

A test server on 127.0.0.1 serves synthetic GGUFs (and a full-size sparse one of ~8.5 GB)
with Range support, without it, behind a 401, as a 404, through a redirect to another host
and port, and with a response shorter than it announces. A remote plan must equal the local
plan of the same file and transfer a small fraction of it.
"""

from __future__ import annotations

import io
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from qmgui import remote
from qmgui.cli import main
from tests.synth.factory import (
    FULL_SIZE_PRESETS,
    PRESETS,
    write_gguf,
    write_sparse_gguf,
    write_split,
)

TOKEN = "hf_test_secret_token_1234"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Served:
    """What one test server saw: (path, Range, Authorization) per request, and bytes sent."""

    root: Path
    requests: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    sent: int = 0
    redirect_to: str = ""  # base URL the /redirect/ prefix sends to
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    served: Served

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        s = self.served
        with s.lock:
            s.requests.append(
                (self.path, self.headers.get("Range"), self.headers.get("Authorization"))
            )
        mode, _, name = self.path.lstrip("/").partition("/")
        name = name.split("?", 1)[0]
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", f"{s.redirect_to}/ranged/{name}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "auth" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._status(401)
            return
        path = s.root / name
        if "/" in name or not name or not path.is_file():
            self._status(404)
            return
        size = path.stat().st_size
        try:
            with path.open("rb") as f:
                if mode == "norange":
                    self._send(f, 200, 0, size, size)
                else:
                    self._ranged(f, size, short=mode == "short", liar=mode == "liar")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client had what it needed and closed the connection

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _ranged(self, f: io.BufferedReader, size: int, *, short: bool, liar: bool) -> None:
        m = _RANGE.match(self.headers.get("Range", ""))
        if not m:
            self._send(f, 200, 0, size, size)
            return
        first = int(m.group(1))
        last = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        if first >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return
        n = last - first + 1
        self.send_response(206)
        said = first + 1 if liar else first  # a liar labels the bytes it sends wrongly
        self.send_header("Content-Range", f"bytes {said}-{last}/{size}")
        self._send(f, None, first, n, n // 2 if short else n)

    def _send(self, f: io.BufferedReader, code: int | None, start: int, n: int, body: int) -> None:
        """Announce `n` bytes from `start`, send `body` of them."""
        if code is not None:
            self.send_response(code)
        self.send_header("Content-Length", str(n))
        self.send_header("Accept-Ranges", "none" if code == 200 else "bytes")
        self.end_headers()
        f.seek(start)
        left = body
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            self.wfile.write(chunk)
            with self.served.lock:
                self.served.sent += len(chunk)
            left -= len(chunk)


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    served: Served


def _start(root: Path) -> tuple[ThreadingHTTPServer, threading.Thread, Served]:
    served = Served(root)
    handler = type("Handler", (_Handler,), {"served": served})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    return httpd, thread, served


@pytest.fixture
def servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, Server]]:
    """Two servers over one folder: the second is where the first's /redirect/ leads (another
    port, and another host name: `localhost`)."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(remote.TOKEN_ENV, raising=False)
    root = tmp_path / "www"
    root.mkdir()
    started = [_start(root), _start(root)]
    (a, _, sa), (b, _, sb) = started
    sa.redirect_to = f"http://localhost:{b.server_address[1]}"
    try:
        yield (
            Server(f"http://127.0.0.1:{a.server_address[1]}", sa),
            Server(f"http://127.0.0.1:{b.server_address[1]}", sb),
        )
    finally:
        for httpd, thread, _ in started:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


PLAN = ("--gpu", "24GiB", "--host-memory", "none", "-c", "8192")
REMOTE_KEYS = ("transferred_bytes", "remote_size_bytes", "requests")


def plan_json(model: str, *extra: str) -> tuple[int, dict[str, object], str]:
    code, out, err = run("plan", model, *PLAN, *extra, "--json")
    return code, (json.loads(out) if out else {}), err


def without_remote(plan: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in plan.items() if k not in REMOTE_KEYS}


@pytest.fixture
def tiny(servers: tuple[Server, Server]) -> Path:
    return write_gguf(servers[0].served.root / "tiny-llama.gguf", PRESETS["llama"])


def test_a_remote_plan_equals_the_local_plan(servers: tuple[Server, Server], tiny: Path) -> None:
    srv, _ = servers
    local_code, local, _ = plan_json(str(tiny))
    code, plan, err = plan_json(f"{srv.url}/ranged/{tiny.name}")
    assert (code, err) == (local_code, "")
    assert without_remote(plan) == local
    size = tiny.stat().st_size
    assert plan["remote_size_bytes"] == size
    assert 0 < plan["transferred_bytes"] <= size  # type: ignore[operator]
    assert all(rng and rng.startswith("bytes=") for _, rng, _ in srv.served.requests)


def test_an_8gb_model_is_planned_from_under_1_percent_of_it(
    servers: tuple[Server, Server],
) -> None:
    srv, _ = servers
    spec = replace(FULL_SIZE_PRESETS["llama3-8b"], weight_type=Q.Q8_0)  # ~8.5 GB, 128k vocab
    model = write_sparse_gguf(srv.served.root / "llama3-8b-q8_0.gguf", spec)
    size = model.stat().st_size
    assert size > 8_000_000_000
    local_code, local, _ = plan_json(str(model))
    code, plan, err = plan_json(f"{srv.url}/ranged/{model.name}")
    assert (code, err) == (local_code, "")
    assert without_remote(plan) == local
    moved = plan["transferred_bytes"]
    assert isinstance(moved, int)
    assert moved == srv.served.sent
    assert moved < size / 100
    assert plan["remote_size_bytes"] == size
    # the human form says what it cost
    code, out, _ = run("plan", f"{srv.url}/ranged/{model.name}", *PLAN)
    assert code == local_code
    assert f"({moved:,} bytes, " in out
    assert "header read over HTTP" in out


def test_a_split_set_is_planned_from_any_shard_url(servers: tuple[Server, Server]) -> None:
    srv, _ = servers
    shards = write_split(srv.served.root, PRESETS["llama"], n_shards=3)
    local_code, local, _ = plan_json(str(shards[0]))
    code, plan, err = plan_json(f"{srv.url}/ranged/{shards[1].name}?download=true")
    assert (code, err) == (local_code, "")
    assert without_remote(plan) == local
    assert plan["remote_size_bytes"] == sum(p.stat().st_size for p in shards)
    asked = {path for path, _, _ in srv.served.requests}
    assert asked == {f"/ranged/{p.name}?download=true" for p in shards}


def test_a_split_set_missing_a_shard_says_which(servers: tuple[Server, Server]) -> None:
    srv, _ = servers
    shards = write_split(srv.served.root, PRESETS["llama"], n_shards=3)
    shards[2].unlink()
    code, _, err = plan_json(f"{srv.url}/ranged/{shards[0].name}")
    assert code == 2
    assert "shard 3 of 3" in err
    assert "not found on the server (HTTP 404)" in err


def test_a_server_without_range_support_is_read_as_a_bounded_stream(
    servers: tuple[Server, Server], tiny: Path
) -> None:
    srv, _ = servers
    big = write_sparse_gguf(
        srv.served.root / "big.gguf", replace(FULL_SIZE_PRESETS["llama3-8b"], weight_type=Q.Q8_0)
    )
    _, local, _ = plan_json(str(big))
    code, plan, err = plan_json(f"{srv.url}/norange/{big.name}")
    assert err == ""
    assert without_remote(plan) == local
    moved = plan["transferred_bytes"]
    assert isinstance(moved, int)
    assert moved <= remote.MAX_HEADER_BYTES
    assert moved < big.stat().st_size / 100
    assert code in (0, 1)


def test_a_header_over_the_cap_is_refused_with_a_sentence(
    servers: tuple[Server, Server], tiny: Path
) -> None:
    srv, _ = servers
    for mode in ("ranged", "norange"):
        read = remote.read_url(f"{srv.url}/{mode}/{tiny.name}", max_header_bytes=2048)
        assert read.entry.error is not None
        assert "larger than" in read.entry.error
        assert "plan it locally" in read.entry.error
        assert read.transferred_bytes <= 2048


def test_404_is_a_usage_error_naming_the_url(servers: tuple[Server, Server]) -> None:
    srv, _ = servers
    url = f"{srv.url}/ranged/nothing-here.gguf"
    code, out, err = run("plan", url, *PLAN)
    assert code == 2
    assert out == ""
    assert url in err
    assert "not found on the server (HTTP 404)" in err


def test_401_asks_for_hf_token_and_sends_it_when_set(
    servers: tuple[Server, Server], tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, _ = servers
    url = f"{srv.url}/auth/{tiny.name}"
    code, _, err = plan_json(url)
    assert code == 2
    assert "HTTP 401" in err
    assert "set HF_TOKEN" in err
    monkeypatch.setenv("HF_TOKEN", "wrong-token")
    code, _, err = plan_json(url)
    assert code == 2
    assert "refused the token in HF_TOKEN" in err
    assert "wrong-token" not in err
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    _, local, _ = plan_json(str(tiny))
    code, plan, err = plan_json(url)
    assert err == ""
    assert without_remote(plan) == local
    assert srv.served.requests[-1][2] == f"Bearer {TOKEN}"


def test_a_redirect_to_another_host_resends_range_but_not_the_token(
    servers: tuple[Server, Server], tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = servers
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    _, local, _ = plan_json(str(tiny))
    _, plan, err = plan_json(f"{first.url}/redirect/{tiny.name}")
    assert err == ""
    assert without_remote(plan) == local
    assert first.served.requests[0][1:] == ("bytes=0-1048575", f"Bearer {TOKEN}")
    assert second.served.requests, "the redirect was not followed"
    for _, rng, auth in second.served.requests:
        assert rng and rng.startswith("bytes=")
        assert auth is None  # the token stays with the host the user named


def test_a_response_shorter_than_announced_is_an_error(
    servers: tuple[Server, Server], tiny: Path
) -> None:
    srv, _ = servers
    code, _, err = plan_json(f"{srv.url}/short/{tiny.name}")
    assert code == 2
    assert "the connection may have dropped: try again" in err or "broke while reading" in err


def test_a_wrong_content_range_is_an_error(servers: tuple[Server, Server], tiny: Path) -> None:
    srv, _ = servers
    code, _, err = plan_json(f"{srv.url}/liar/{tiny.name}")
    assert code == 2
    assert "the server sent bytes 1-" in err
    assert "when asked for bytes from 0" in err


def test_connection_refused_is_a_sentence() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the request: nothing listens there
    code, _, err = plan_json(f"http://127.0.0.1:{port}/m.gguf")
    assert code == 2
    assert f"connection refused by 127.0.0.1:{port}" in err


@pytest.mark.parametrize("url", ["ftp://example.org/m.gguf", "file:///etc/passwd"])
def test_other_schemes_are_usage_errors(url: str) -> None:
    code, out, err = run("plan", url, *PLAN)
    assert code == 2
    assert out == ""
    assert "only http:// and https:// URLs" in err


def test_shard_urls_substitute_the_index_and_keep_the_query() -> None:
    urls = remote.shard_urls("https://h.example/o/r/resolve/main/M-Q4-00002-of-00003.gguf?x=1")
    assert urls == [
        f"https://h.example/o/r/resolve/main/M-Q4-0000{i}-of-00003.gguf?x=1" for i in (1, 2, 3)
    ]
    assert remote.shard_urls("https://h.example/m.gguf") == ["https://h.example/m.gguf"]
    with pytest.raises(ValueError, match="at most"):
        remote.shard_urls("https://h.example/m-00001-of-99999.gguf")


def test_a_profile_is_saved_under_the_url(servers: tuple[Server, Server], tiny: Path) -> None:
    srv, _ = servers
    url = f"{srv.url}/ranged/{tiny.name}"
    code, _, err = run(
        "plan", url, "--gpu", "24GiB", "--host-memory", "none", "-c", "4096", "--save"
    )
    assert code == 0, err
    code, out, err = run("plan", url, "--gpu", "24GiB", "--host-memory", "none", "--json")
    assert code == 0, err
    assert json.loads(out)["settings"]["n_ctx"] == 4096
