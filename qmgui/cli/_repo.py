"""`qmgui get OWNER/REPO`: a Hugging Face repository's GGUF models, their fit, and a download
(into a folder through qmgui.download, or into the hub cache through huggingface_hub)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any, TextIO

from qmgui import notify
from qmgui.core.errors import DownloadError
from qmgui.core.hub_files import RepoFile, RepoModel, find_model
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes, parse_size

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130
RESERVE = "512MiB"


def cmd_get_repo(args: argparse.Namespace, out: TextIO) -> int:
    from qmgui import hub  # noqa: PLC0415

    repo = args.urls[0]
    if args.sha256:
        notify.error("--sha256 is for a URL; a repository's files carry their own", source="get")
        return EXIT_USAGE
    try:
        found = hub.listing(repo, revision=args.revision)
    except DownloadError as e:
        notify.error(str(e), source="get")
        return EXIT_FAILED
    if not found.models:
        notify.error(f"{repo} has no GGUF model files", source="get")
        return EXIT_FAILED
    if args.quant is None and args.file is None:
        return _list(found, args, out)
    model, code = _choose(found, args)
    if model is None:
        return code
    if args.to is None:
        projector = None if args.no_mmproj else hub.projector_for(model)
        return _to_hub_cache(found, [*model.files, *([projector] if projector else [])], out)
    from qmgui.cli.get import download_jobs  # noqa: PLC0415

    jobs = hub.download_jobs(found, model, projector=not args.no_mmproj)
    return download_jobs(jobs, args.to, args.json, out)


def _choose(found: Any, args: argparse.Namespace) -> tuple[RepoModel | None, int]:
    """The model `--quant`/`--file` names, or None and the exit status (said why)."""
    chosen = find_model(found.models, quant=args.quant, file=args.file)
    quants = ", ".join(sorted({m.quant for m in found.models if m.quant})) or "none named"
    if not chosen:
        asked = f"quant {args.quant}" if args.quant else f"file {args.file}"
        notify.error(
            f"{found.repo_id} has no {printable(asked)} (its quants: {quants})", source="get"
        )
        return None, EXIT_USAGE
    if len(chosen) > 1:
        names = ", ".join(m.files[0].path for m in chosen)
        notify.error(
            f"several models match; choose one with --file: {printable(names)}", source="get"
        )
        return None, EXIT_USAGE
    model = chosen[0]
    if not model.complete:
        notify.error(
            f"{model.name}: the repository lists {len(model.files)} of its {model.shard_count} "
            "shards; it cannot be downloaded whole",
            source="get",
        )
        return None, EXIT_FAILED
    return model, EXIT_OK


def _fits(sized: list[Any], args: argparse.Namespace) -> tuple[list[Any], str]:
    """(model, fits or None, note) per model, the best that fits first, and where it was judged."""
    from qmgui import hub  # noqa: PLC0415
    from qmgui.cli.plan import gpus_from  # noqa: PLC0415

    gpus = gpus_from(args)
    where = ", ".join(f"{g.name} ({format_bytes(g.available)})" for g in gpus) or "CPU only"
    fits = hub.fit_models(sized, gpus, args.ctx, reserve=parse_size(RESERVE))
    return [(f.model, f.fits, f.note) for f in fits], f"context {args.ctx} on {where}"


def _list(found: Any, args: argparse.Namespace, out: TextIO) -> int:
    from qmgui import hub  # noqa: PLC0415

    if args.no_fit:
        rows = [(m, None, "") for m in found.models]
        where = ""
    else:
        try:
            rows, where = _fits(hub.size_models(found), args)
        except ValueError as e:
            notify.error(str(e), source="get")
            return EXIT_USAGE
    best = next((m for m, fits, _ in rows if fits), None)
    if args.json:
        out.write(json.dumps(_listing_json(found, rows, where, best), indent=2) + "\n")
        return EXIT_OK
    lock = " (gated: needs HF_TOKEN)" if found.gated else ""
    out.write(f"{found.repo_id} @ {found.commit[:12]}{lock}: {len(found.models)} GGUF models\n")
    if where:
        out.write(f"fit judged at {where}\n")
    width = max(len(m.quant or "-") for m, _, _ in rows)
    for m, fits, note in rows:
        mark = "*" if m is best else " "
        fit = "" if args.no_fit else ("fits" if fits else "?" if fits is None else "no fit")
        shards = f" ({len(m.files)} shards)" if m.shard_count > 1 else ""
        proj = f" + {m.projectors[0].path.rsplit('/', 1)[-1]}" if m.projectors else ""
        out.write(
            f"{mark} {m.quant or '-':<{width}}  {format_bytes(m.size):>10}  {fit:<6}  "
            f"{printable(m.files[0].path)}{shards}{printable(proj)}\n"
        )
        if note and fits is not True:
            out.write(f"      {printable(note)[:160]}\n")
    if best is not None:
        out.write(
            f"best that fits: {best.quant or best.name}; qmgui get {found.repo_id} "
            f"--quant {best.quant or '?'} --to DIR\n"
            if best.quant
            else f"best that fits: qmgui get {found.repo_id} --file {best.files[0].path} --to DIR\n"
        )
    elif not args.no_fit:
        out.write("none fits; try a smaller context (-c) or another --gpu\n")
    return EXIT_OK


def _listing_json(
    found: Any, rows: list[Any], where: str, best: RepoModel | None
) -> dict[str, Any]:
    return {
        "repo": found.repo_id,
        "commit": found.commit,
        "gated": found.gated,
        "fit_at": where,
        "best": best.name if best else None,
        "models": [
            {
                "name": m.name,
                "quant": m.quant,
                "size": m.size,
                "complete": m.complete,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in m.files],
                "projectors": [{"path": p.path, "size": p.size} for p in m.projectors],
                "fits": fits,
                "note": note,
            }
            for m, fits, note in rows
        ],
    }


def _to_hub_cache(found: Any, files: list[RepoFile], out: TextIO) -> int:
    """Download through huggingface_hub into its cache (resumable; its own progress bar)."""
    from qmgui import hub  # noqa: PLC0415
    from qmgui.stores import hf_cache_dirs  # noqa: PLC0415

    cache = hf_cache_dirs()[0]
    probe = str(cache)
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    need = sum(f.size for f in files)
    free = shutil.disk_usage(probe).free
    if need > free:
        notify.error(
            f"not enough room for the Hugging Face cache ({printable(str(cache))}): the download "
            f"needs up to {format_bytes(need)} and {format_bytes(free)} is free; free "
            f"{format_bytes(need - free)} or download into another folder with --to DIR",
            source="get",
        )
        return EXIT_FAILED
    try:
        from huggingface_hub import hf_hub_download  # noqa: PLC0415

        for f in files:
            path = hf_hub_download(
                found.repo_id,
                f.path,
                revision=found.commit,
                cache_dir=str(cache),
                endpoint=hub.endpoint(),
                token=hub._token(),
            )
            out.write(f"{printable(path)}: in the Hugging Face cache ({format_bytes(f.size)})\n")
    except KeyboardInterrupt:
        notify.warning("cancelled; run the same command again to resume", source="get")
        return EXIT_CANCELLED
    except Exception as e:  # the boundary: every failure becomes a sentence
        notify.error(str(hub._sentence(e, found.repo_id)), source="get")
        return EXIT_FAILED
    return EXIT_OK
