"""Read a remote GGUF's header over HTTP(S) with range requests, without downloading the model.

`qmgui plan URL` plans a model before it is downloaded: the header reader of qmgui.core asks
this module's `RemoteFile` for windows of bytes, and each window the local cache lacks is one
`Range: bytes=a-b` request. Windows grow geometrically (1 MiB, 2, 4 ... 16 MiB per request) as
the reader asks for more, so a header without a tokenizer costs one small request and a
150k-token vocabulary a handful; no file costs more than `MAX_HEADER_BYTES`, and no plan (all
shards of a split set together) more than `MAX_TOTAL_BYTES`.

- Redirects are followed (Hugging Face's resolve URLs redirect to a CDN) with the Range header
  re-sent; the `Authorization: Bearer $HF_TOKEN` header is sent only to the host named in the
  URL, never to a host a redirect leads to, and the token is never printed.
- A server that ignores Range (a 200 with the whole body) is read as a stream: the header's
  bytes are taken from the front of the body and the connection is closed, still within
  `MAX_HEADER_BYTES`; nothing past the header is downloaded.
- Every failure is a ModelReadError naming the URL with a sentence saying what to do: 404,
  401/403 (HF_TOKEN), a refused connection, no network, a timeout, a response shorter than it
  announced, a file that changed between requests.

Standard library only (urllib); this module is imported only when a URL is planned, so the
local plan path loads no network code.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse
from typing import Any

from qmgui import __version__
from qmgui.core.discovery import SPLIT_RE, ModelEntry, entry_from_headers
from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import GGUFHeader, read_gguf_header_from
from qmgui.core.textsafe import printable

SCHEMES = ("http", "https")
FIRST_WINDOW = 1 << 20  # the first request: the reader asks for 1 MiB windows anyway
MAX_REQUEST = 16 << 20  # the window stops growing here
MAX_HEADER_BYTES = 64 << 20  # per file: real headers (150k-260k vocabularies) are 3-12 MiB
MAX_TOTAL_BYTES = 256 << 20  # per plan, every shard of a split set together
MAX_SHARDS = 1024  # gguf-split sets of the largest models have tens of shards
TIMEOUT_S = 30.0
TOKEN_ENV = "HF_TOKEN"
_STREAM_CHUNK = 1 << 20

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d{1,19})-(\d{1,19})/(\d{1,19}|\*)\s*$", re.IGNORECASE)
_TOKEN_OK = re.compile(r"^[\x21-\x7e]{1,4096}$")


def is_url(text: str) -> bool:
    """Whether `text` is written as a URL (`scheme://...`) rather than a path."""
    return bool(_URL.match(text))


def url_scheme(text: str) -> str:
    return text.split("://", 1)[0].lower()


@dataclass
class Transfer:
    """The bytes received for one plan, across every file it reads, and the cap on them."""

    limit: int = MAX_TOTAL_BYTES
    bytes: int = 0
    requests: int = 0


@dataclass(frozen=True)
class RemoteRead:
    """What reading a URL gave: the model entry (an error on it when it could not be read),
    the bytes transferred, and the remote size of the whole model (0 when unknown)."""

    entry: ModelEntry
    transferred_bytes: int
    size_bytes: int
    requests: int


def _host(url: str) -> str:
    try:
        return urllib.parse.urlsplit(url).netloc.rpartition("@")[2].lower()
    except ValueError:
        return ""


def _token_from_env() -> str | None:
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow http(s) redirects only, re-sending the Range header (urllib copies the request's
    headers); the Authorization header goes only to the host the user named."""

    def __init__(self, auth_host: str) -> None:
        super().__init__()
        self.auth_host = auth_host

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in SCHEMES:
            raise urllib.error.HTTPError(
                req.full_url, code, f"redirect to a non-HTTP URL {newurl!r}", headers, fp
            )
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _host(new.full_url) != self.auth_host:
            new.remove_header("Authorization")
        return new


class RemoteFile:
    """A remote file as the header reader's byte source (`seek`, `readinto`): bytes come from
    range requests whose window doubles per request, within the caps of `transfer`."""

    def __init__(
        self,
        url: str,
        transfer: Transfer,
        *,
        window: int = FIRST_WINDOW,
        token: str | None = None,
        timeout: float = TIMEOUT_S,
        max_bytes: int = MAX_HEADER_BYTES,
    ) -> None:
        self.url = url  # as given: what errors name
        self.at = url  # where requests go: the final URL once a redirect was followed
        self.transfer = transfer
        self.window = window
        self.token = token
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.auth_host = _host(url)
        self.opener = urllib.request.build_opener(_Redirects(self.auth_host))
        self.size = -1
        self.read_bytes = 0  # received for this file
        self.pos = 0
        self.block = b""
        self.block_start = 0
        self.stream: HTTPResponse | None = None  # a server without Range: its one response
        self.stream_pos = 0

    # --- the byte source -------------------------------------------------------------------

    def open(self) -> RemoteFile:
        """Fetch the first window, which also tells the file's size."""
        self.block = self._take(0, self.window)
        self.block_start = 0
        self.window = min(self.window * 2, MAX_REQUEST)
        return self

    def seek(self, offset: int, /) -> int:
        self.pos = offset
        return offset

    def readinto(self, buffer: memoryview, /) -> int:
        n = len(buffer)
        done = 0
        while done < n and self.pos < self.size:
            rel = self.pos - self.block_start
            if 0 <= rel < len(self.block):
                k = min(n - done, len(self.block) - rel)
                buffer[done : done + k] = self.block[rel : rel + k]
                done += k
                self.pos += k
                continue
            want = min(max(n - done, self.window), MAX_REQUEST, self.size - self.pos)
            self.block = b""  # the old window is not needed again: the reader goes forward
            self.block = self._take(self.pos, want)
            self.block_start = self.pos
            self.window = min(self.window * 2, MAX_REQUEST)
            if not self.block:
                break
        return done

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    # --- requests ----------------------------------------------------------------------------

    def _fail(self, reason: str) -> ModelReadError:
        return ModelReadError(self.url, reason)

    def _take(self, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer if the server sends a shorter range), counted
        against the caps."""
        skip = start - self.stream_pos if self.stream is not None else 0
        cost = skip + length
        if self.read_bytes + cost > self.max_bytes:
            length = self.max_bytes - self.read_bytes - skip
            if length <= 0:
                raise self._fail(
                    f"the header is larger than the {self.max_bytes >> 20} MiB qmgui reads of "
                    "a remote file; download the file and plan it locally"
                )
        if self.transfer.bytes + skip + length > self.transfer.limit:
            length = self.transfer.limit - self.transfer.bytes - skip
            if length <= 0:
                raise self._fail(
                    f"the headers of this model exceed the {self.transfer.limit >> 20} MiB "
                    "qmgui reads for one remote plan; download the files and plan them locally"
                )
        if self.stream is not None:
            return self._from_stream(start, length)
        return self._fetch(start, length)

    def _count(self, n: int) -> None:
        self.read_bytes += n
        self.transfer.bytes += n

    def _fetch(self, start: int, length: int) -> bytes:
        resp = self._request(start, length)
        try:
            status = resp.status
            if status == 200:
                if start != 0 or self.size >= 0:
                    raise self._fail(
                        "the server stopped honouring byte ranges between two requests; "
                        "try again, or download the file and plan it locally"
                    )
                return self._start_stream(resp, length)
            if status != 206:
                raise self._fail(
                    f"the server answered HTTP {status} to a byte-range request; download the "
                    "file and plan it locally"
                )
            first, last, _ = self._content_range(resp, start)
            n = min(length, last - first + 1)
            data = self._read(resp, n)
        finally:
            if self.stream is not resp:
                resp.close()
        if len(data) < n:
            raise self._fail(
                f"the server sent {len(data)} of the {n} bytes it announced at byte {start}; "
                "the connection may have dropped: try again"
            )
        return data

    def _content_range(self, resp: HTTPResponse, start: int) -> tuple[int, int, int]:
        m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
        if not m or m.group(3) == "*":
            raise self._fail(
                "the server's answer to a byte-range request gives no usable Content-Range "
                "(the file's size); download the file and plan it locally"
            )
        first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if first != start or last < first or last >= total:
            raise self._fail(
                f"the server sent bytes {first}-{last} of {total} when asked for bytes from "
                f"{start}; download the file and plan it locally"
            )
        if self.size < 0:
            self.size = total
        elif total != self.size:
            raise self._fail(
                f"the file changed on the server while it was read ({self.size} bytes, then "
                f"{total}); try again"
            )
        return first, last, total

    def _start_stream(self, resp: HTTPResponse, length: int) -> bytes:
        """A 200 to the first range request: the server sends the whole file. Keep the
        response and read the header from its front, as far as the reader goes."""
        declared = resp.headers.get("Content-Length", "")
        if not declared.isdigit() or len(declared) > 19:
            raise self._fail(
                "the server supports no byte ranges and does not say the file's size; "
                "download the file and plan it locally"
            )
        self.size = int(declared)
        self.stream = resp
        self.stream_pos = 0
        return self._from_stream(0, min(length, self.size))

    def _from_stream(self, start: int, length: int) -> bytes:
        stream = self.stream
        assert stream is not None
        if start < self.stream_pos:
            raise self._fail(
                "the server supports no byte ranges and the reader went back; download the "
                "file and plan it locally"
            )
        while self.stream_pos < start:  # skipped bytes still cross the network
            k = min(start - self.stream_pos, _STREAM_CHUNK)
            got = self._read(stream, k)
            self.stream_pos += len(got)
            if len(got) < k:
                raise self._short(start)
        data = self._read(stream, length)
        self.stream_pos += len(data)
        if len(data) < min(length, self.size - start):
            raise self._short(start)
        return data

    def _short(self, start: int) -> ModelReadError:
        return self._fail(
            f"the server's answer ended before byte {start} of {self.size}; the connection "
            "may have dropped: try again"
        )

    def _read(self, resp: HTTPResponse, n: int) -> bytes:
        try:
            data = resp.read(n)
        except (OSError, HTTPException) as e:
            raise self._fail(
                f"the connection to {_host(self.at)} broke while reading "
                f"({printable(str(e))[:120] or type(e).__name__}); try again"
            ) from e
        self._count(len(data))
        return data

    def _request(self, start: int, length: int) -> HTTPResponse:
        headers = {
            "Range": f"bytes={start}-{start + length - 1}",
            "Accept-Encoding": "identity",
            "User-Agent": f"qmgui/{__version__}",
        }
        if self.token and _host(self.at) == self.auth_host:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            req = urllib.request.Request(self.at, headers=headers)
            self.transfer.requests += 1
            resp = self.opener.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            e.close()
            raise self._fail(self._http_sentence(e.code, str(e.reason))) from None
        except urllib.error.URLError as e:
            raise self._fail(self._network_sentence(e.reason)) from None
        except (OSError, HTTPException, ValueError) as e:
            raise self._fail(self._network_sentence(e)) from None
        self.at = resp.geturl() or self.at
        return resp  # type: ignore[no-any-return]

    def _http_sentence(self, code: int, reason: str) -> str:
        said = f"HTTP {code}"
        if code in (404, 410):
            return (
                f"not found on the server ({said}); check the URL (a Hugging Face file is "
                "https://huggingface.co/OWNER/REPO/resolve/main/FILE.gguf)"
            )
        if code in (401, 403):
            if self.token:
                return (
                    f"the server refused the token in {TOKEN_ENV} ({said}); check that it is "
                    "valid and may read this repository (for a gated model, accept its terms "
                    "on the model's page first)"
                )
            return (
                f"the server asks for authorisation ({said}): a gated or private model needs "
                f"an access token; set {TOKEN_ENV} to one "
                "(https://huggingface.co/settings/tokens) and try again"
            )
        if code == 416:
            return f"the server refused the byte range ({said}); the file may be empty"
        if code == 429:
            return f"the server is rate-limiting requests ({said}); wait a minute and try again"
        if 300 <= code < 400:
            return (
                f"the server's redirects could not be followed ({said}: {printable(reason)[:80]})"
            )
        if code >= 500:
            return f"the server failed ({said}); try again later"
        return f"the server answered {said} {printable(reason)[:120]}".rstrip()

    def _network_sentence(self, reason: object) -> str:
        host = printable(_host(self.at)) or printable(self.at)[:120]
        if isinstance(reason, ConnectionRefusedError):
            return (
                f"connection refused by {host}; check the address and port, and that the "
                "server is running"
            )
        if isinstance(reason, socket.gaierror):
            return f"cannot resolve {host}; check the host name and that this machine is online"
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return (
                f"no answer from {host} within {self.timeout:g} s; check the connection and "
                "try again"
            )
        if isinstance(reason, ssl.SSLError):
            return (
                f"the secure connection to {host} failed ({printable(str(reason))[:120]}); "
                "check the URL and the system's certificates"
            )
        if isinstance(reason, ValueError):
            return f"not a URL qmgui can request ({printable(str(reason))[:120]})"
        return (
            f"cannot reach {host} ({printable(str(reason))[:120]}); check the connection and "
            "try again"
        )


def shard_urls(url: str) -> list[str]:
    """The URLs of a split set's shards, in order, from any shard's URL (the index substituted
    in the file name, the query kept); `[url]` for a single file. ValueError for a set that
    claims more shards than `MAX_SHARDS`."""
    parts = urllib.parse.urlsplit(url)
    folder, _, raw_name = parts.path.rpartition("/")
    m = SPLIT_RE.match(raw_name)
    if not m:
        return [url]
    count = int(m.group("count"))
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"a split set of {count} shards; qmgui reads at most {MAX_SHARDS}")
    return [
        urllib.parse.urlunsplit(
            parts._replace(path=f"{folder}/{m.group('base')}-{i:05d}-of-{m.group('count')}.gguf")
        )
        for i in range(1, count + 1)
    ]


def file_name_of(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rpartition("/")[2])


def read_url(
    url: str,
    *,
    token: str | None = None,
    timeout: float = TIMEOUT_S,
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    on_shard: Callable[[int, int], None] | None = None,
) -> RemoteRead:
    """Read the header(s) of the GGUF at `url` (http or https; a split set's shards from any
    shard's URL) and build its model entry. Errors are on the entry, as for a local file.
    `token` defaults to $HF_TOKEN."""
    if token is None:
        token = _token_from_env()
    transfer = Transfer(limit=max_total_bytes)

    def failed(reason: str, location: str = url) -> RemoteRead:
        entry = ModelEntry(
            id=location,
            path=location,
            name=file_name_of(url) or url,
            format="gguf",
            source="url",
            size_bytes=0,
            error=reason,
        )
        return RemoteRead(entry, transfer.bytes, 0, transfer.requests)

    if url_scheme(url) not in SCHEMES:
        return failed(
            f"only http:// and https:// URLs can be read, not "
            f"{printable(url_scheme(url))[:20]}://; give the URL of a .gguf file, or a local path"
        )
    if token is not None and not _TOKEN_OK.match(token):
        return failed(f"{TOKEN_ENV} holds characters no access token has; set it again")
    try:
        urls = shard_urls(url)
    except ValueError as e:
        return failed(str(e))
    headers: list[GGUFHeader] = []
    for i, shard in enumerate(urls):
        if on_shard is not None:
            on_shard(i + 1, len(urls))
        f = RemoteFile(
            shard,
            transfer,
            token=token,
            timeout=timeout,
            max_bytes=max_header_bytes,
        )
        try:
            f.open()
            headers.append(read_gguf_header_from(f, shard, f.size))
        except ModelReadError as e:
            where = f" (at byte {e.offset})" if e.offset is not None else ""
            which = f"shard {i + 1} of {len(urls)} ({shard}): " if len(urls) > 1 else ""
            hint = ""
            if "/blob/" in shard and "not a GGUF file" in e.reason:
                hint = "; this is a web page: use the file's /resolve/ URL instead of /blob/"
            return failed(f"{which}{e.reason}{where}{hint}", urls[0])
        finally:
            f.close()
    entry = entry_from_headers(urls[0], file_name_of(urls[0]), urls, headers)
    return RemoteRead(entry, transfer.bytes, entry.size_bytes, transfer.requests)
