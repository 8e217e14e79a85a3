"""`qmgui scan`: find models under folders and print what each one is.

The table shows names, paths and metadata strings with control characters as visible escapes
(`textsafe.printable`): a file name holding ESC sequences or line breaks cannot recolour the
terminal or add a row. `--json` writes them as JSON strings (escaped by `json`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any, TextIO

from qmgui import notify
from qmgui.cache import SqliteHeaderCache
from qmgui.core.discovery import ModelEntry, ScanResult, scan
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.settings import load_settings
from qmgui.stores import default_store_roots

EXIT_OK = 0


def register(sub: Any) -> None:
    s = sub.add_parser(
        "scan",
        help="find models under folders and read their headers",
        description="Find every model under PATH... (default: the configured model roots and "
        "the LM Studio, Ollama and Hugging Face stores that exist) and print what each one is.",
    )
    s.add_argument("paths", nargs="*", metavar="PATH", help="a folder or a .gguf file")
    s.add_argument("--json", action="store_true", help="print a JSON list, one object a model")
    s.add_argument("--no-cache", action="store_true", help="read every header from disk")
    s.set_defaults(func=cmd_scan)


def _scan_roots(paths: Sequence[str]) -> list[str]:
    if paths:
        return list(paths)
    loaded = load_settings()
    for message in loaded.messages:
        notify.warning(message, source="settings")
    roots = list(loaded.settings.model_roots)
    roots += [str(p) for p in default_store_roots() if str(p) not in roots]
    return roots


def cmd_scan(args: argparse.Namespace, out: TextIO) -> int:
    roots = _scan_roots(args.paths)
    if not roots:
        notify.info(
            "no model folders configured and no LM Studio, Ollama or Hugging Face store "
            "found; pass a folder: qmgui scan ~/models",
            source="scan",
        )
        return EXIT_OK
    if args.no_cache:
        result = scan(roots)
    else:
        with SqliteHeaderCache() as cache:
            result = scan(roots, cache=cache)
            if cache.disabled_reason:
                notify.warning(f"header cache off: {cache.disabled_reason}", source="cache")
    for problem in result.problems:
        notify.warning(f"{problem.path}: {problem.reason}", source="scan")
    if args.json:
        json.dump([m.to_json() for m in result.models], out, indent=2)
        out.write("\n")
    else:
        _print_table(result, out)
    return EXIT_OK


def _print_table(result: ScanResult, out: TextIO) -> None:
    if not result.models:
        print("No models found.", file=out)
        return
    header = ("NAME", "CLASS", "ARCH", "QUANT", "SIZE", "CONTEXT", "SOURCE")
    rows = [_row(m) for m in result.models]
    widths = [min(max(len(r[i]) for r in [header, *rows]), 48) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c[:48].ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
    for m in result.models:
        if m.error:
            print(f"! {printable(m.name)}: {printable(m.error)} [{printable(m.path)}]", file=out)
    n_err = sum(1 for m in result.models if m.error)
    summary = f"{len(result.models)} models"
    if n_err:
        summary += f", {n_err} with errors"
    print(summary, file=out)


def _row(m: ModelEntry) -> tuple[str, ...]:
    meta = m.meta
    name = m.name + (" [+mmproj]" if m.mmproj else "")
    if len(m.shards) > 1:
        name += f" [{len(m.shards)} shards]"
    cells = (
        ("! " if m.error else "") + name,
        meta.model_class.value if meta else "-",
        meta.architecture if meta else "-",
        (meta.quant or "-") if meta else "-",
        format_bytes(m.size_bytes),
        str(meta.context_length) if meta and meta.context_length else "-",
        m.source,
    )
    return tuple(printable(c) for c in cells)
