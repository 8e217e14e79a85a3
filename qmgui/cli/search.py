"""`qmgui search`: GGUF repositories on Hugging Face (qmgui.hub)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from qmgui.core.textsafe import printable

EXIT_OK = 0
EXIT_FAILED = 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "search",
        help="find GGUF repositories on Hugging Face",
        description="Search Hugging Face ($HF_ENDPOINT, if set) for repositories with GGUF "
        "files, most downloaded first; `qmgui get OWNER/REPO` lists one's models and their fit.",
    )
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_search)


def cmd_search(args: argparse.Namespace, out: TextIO) -> int:
    from qmgui import hub, notify  # noqa: PLC0415 - huggingface_hub only for this command
    from qmgui.core.errors import DownloadError  # noqa: PLC0415

    try:
        hits = hub.search(args.query, limit=max(1, min(args.limit, 1000)))
    except DownloadError as e:
        notify.error(str(e), source="search")
        return EXIT_FAILED
    if args.json:
        rows = [
            {"repo": h.repo_id, "downloads": h.downloads, "likes": h.likes, "gated": h.gated}
            for h in hits
        ]
        out.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    if not hits:
        out.write(f"no GGUF repositories match {printable(args.query)!r}\n")
        return EXIT_OK
    width = max(len(h.repo_id) for h in hits)
    for h in hits:
        gated = "  (gated: needs HF_TOKEN)" if h.gated else ""
        out.write(
            f"{h.repo_id:<{width}}  {h.downloads:>10,} downloads  {h.likes:>6,} likes{gated}\n"
        )
    out.write("qmgui get OWNER/REPO lists a repository's models, their sizes and fit\n")
    return EXIT_OK
