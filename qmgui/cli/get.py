"""`qmgui get`: download a model into a model root, resumably (qmgui.download)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any, TextIO

from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130  # as a shell reports Ctrl-C
BAR_WIDTH = 30


def register(sub: Any) -> None:
    p = sub.add_parser(
        "get",
        help="download a model (a GGUF's URL; a split set from any shard) into a folder",
        description="Download URL into DIR: written as NAME.part and renamed when complete and "
        "verified (its size, and its SHA-256 where the server gives one), so a partial file is "
        "never listed as a model. A cut connection is resumed (HTTP byte ranges); a cancelled "
        "or failed download resumes when the same command runs again. $HF_TOKEN is sent to "
        "the URL's host for gated models.",
        epilog="exit status: 0 downloaded (or there already); 1 the download failed (the "
        "sentence says why; what was downloaded is kept for a resume); 2 a usage error; "
        "130 cancelled (Ctrl-C)",
    )
    p.add_argument(
        "urls",
        nargs="+",
        metavar="URL|OWNER/REPO",
        help="an http(s):// URL of a .gguf file, or a Hugging Face repository: without --quant "
        "or --file its GGUF models are listed with their size and fit, the best that fits first",
    )
    p.add_argument(
        "--to",
        default=None,
        metavar="DIR",
        help="the folder to download into (a repository's files go to the Hugging Face cache "
        "without it)",
    )
    p.add_argument("--sha256", default=None, metavar="HEX", help="the SHA-256 the file must have")
    pick = p.add_mutually_exclusive_group()
    pick.add_argument(
        "--quant", default=None, metavar="Q", help="the repository's model of this quant (Q4_K_M)"
    )
    pick.add_argument(
        "--file", default=None, metavar="NAME", help="the repository's model with this file"
    )
    p.add_argument("--revision", default=None, help="a branch, tag or commit (default: main)")
    p.add_argument("--no-mmproj", action="store_true", help="leave the vision projector out")
    p.add_argument(
        "-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=8192,
        help="the context the fit of a repository's models is judged at (default 8192)",
    )  # fmt: skip
    p.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="SIZE",
        help="judge the fit for a GPU that need not exist (24GiB, 4090, 2x3090); repeat "
        "for several",
    )
    p.add_argument("--no-fit", action="store_true", help="list sizes only (no header reads)")
    p.add_argument("--json", action="store_true", help="print the result as a JSON object")
    p.set_defaults(func=cmd_get)


class _Bar:
    """A one-line progress bar on a terminal (stderr); nothing when stderr is not one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        try:
            self.on = stream.isatty()
        except (AttributeError, ValueError):
            self.on = False
        self.shown = False

    def __call__(self, p: Any) -> None:
        if not self.on:
            return
        total = max(p.all_total, 1)
        filled = int(BAR_WIDTH * p.all_done / total)
        which = f" ({p.index}/{p.count})" if p.count > 1 else ""
        line = (
            f"\r{printable(p.name)[:40]}{which} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
            f"{100 * p.all_done / total:5.1f}% {format_bytes(p.all_done)} / "
            f"{format_bytes(p.all_total)}"
        )
        self.stream.write(line + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def _run_one(url: str, folder: str, sha256: str | None, bar: _Bar, cancel: Any) -> tuple[Any, Any]:
    """Download one URL on a worker thread, so Ctrl-C cancels it between chunks (the part
    written so far is kept) instead of interrupting a write."""
    from qmgui import download  # noqa: PLC0415
    from qmgui.core.errors import DownloadError  # noqa: PLC0415

    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["result"] = download.download_url(
                url, folder, sha256=sha256, progress=bar, cancel=cancel
            )
        except DownloadError as e:
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name="qmgui-get", daemon=True)
    worker.start()
    # an Event, not Thread.join: a join that Ctrl-C interrupts can leave the thread marked
    # as ended while it still runs (CPython gh-90882), and the result would be lost
    try:
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        cancel.cancel()
        done.wait()
    bar.end()
    return box.get("result"), box.get("error")


def _print_files(result: Any, out: TextIO) -> None:
    for f in result.files:
        how = "already there" if f.already_there else "downloaded"
        if f.resumed_from and not f.already_there:
            how += f", resumed at {format_bytes(f.resumed_from)}"
        check = "size and SHA-256 verified" if f.sha256 else "size verified"
        out.write(f"{printable(f.path)}: {how} ({format_bytes(f.size)}, {check})\n")


def cmd_get(args: argparse.Namespace, out: TextIO) -> int:
    from qmgui import notify  # noqa: PLC0415 - network code only for this command
    from qmgui.hub import is_repo_id  # noqa: PLC0415
    from qmgui.remote import is_url  # noqa: PLC0415

    if len(args.urls) == 1 and not is_url(args.urls[0]) and is_repo_id(args.urls[0]):
        from qmgui.cli._repo import cmd_get_repo  # noqa: PLC0415

        return cmd_get_repo(args, out)
    for url in args.urls:
        if not is_url(url):
            notify.error(
                f"{printable(url)[:200]} is neither a URL nor a repository id; give the "
                "http(s):// URL of a .gguf file or OWNER/REPO",
                source="get",
            )
            return EXIT_USAGE
    if args.to is None or args.quant or args.file:
        notify.error(
            "a URL is downloaded into a folder: give --to DIR (and no --quant/--file)", source="get"
        )
        return EXIT_USAGE
    return download_jobs([(url, args.sha256) for url in args.urls], args.to, args.json, out)


def download_jobs(
    jobs: list[tuple[str, str | None]], folder: str, as_json: bool, out: TextIO
) -> int:
    """Download each (URL, SHA-256 or None) into `folder`, a bar on a terminal; the exit status."""
    from qmgui import download, notify  # noqa: PLC0415

    bar = _Bar(sys.stderr)
    cancel = download.CancelToken()
    results: list[Any] = []
    status = EXIT_OK
    for url, sha256 in jobs:
        result, error = _run_one(url, folder, sha256, bar, cancel)
        if isinstance(error, download.DownloadCancelled):
            notify.warning(str(error), source="get")
            return EXIT_CANCELLED
        if error is not None:
            notify.error(str(error), source="get")
            status = EXIT_FAILED
            continue
        for note in result.notes:
            notify.info(note, source="get")
        results.append(result)
        if not as_json:
            _print_files(result, out)
    if as_json:
        out.write(
            json.dumps(
                {
                    "files": [
                        {
                            "path": f.path,
                            "size": f.size,
                            "sha256": f.sha256,
                            "resumed_from": f.resumed_from,
                            "fetched": f.fetched,
                            "already_there": f.already_there,
                        }
                        for r in results
                        for f in r.files
                    ],
                    "notes": [n for r in results for n in r.notes],
                    "ok": status == EXIT_OK,
                },
                indent=2,
            )
            + "\n"
        )
    return status
