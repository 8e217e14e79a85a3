"""`qmgui backends`: list, add, remove and ★ the engines in the backend registry.

Every command loads the settings file, changes the registry through the pure core
(`qmgui.core.backends`) and saves it with `qmgui.settings.update_settings`: under the settings
lock, applied to the file as it is at that moment, so two commands (or a command and the
window) running at once never lose each other's entries; a check that another process made
false meanwhile (the id was taken) is a usage error, not a silent overwrite. A settings file
that could not be loaded (and could not be moved aside) is never written over: the command
says so and exits 1. `add` checks that the executable is there and runnable and probes it
before it takes the lock.

Exit status: 0 done, 1 the settings could not be read or written, 2 a usage error (an unknown
kind, class or id, a ★ for a class the kind does not serve, a duplicate id).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from qmgui import notify
from qmgui.core.backends import (
    CLASSES,
    KINDS,
    REGISTRY_ONLY_CLASSES,
    Backend,
    canonical_kind,
    classes_served,
    default_for_class,
    default_problem,
    find_backend,
    registry_problems,
    set_default,
    sort_classes,
)
from qmgui.core.errors import SettingsError
from qmgui.service.backends import (
    PROBE_TIMEOUT_S,
    executable_warning,
    new_backend_problem,
    stored_executable,
    with_probe,
)
from qmgui.settings import BackendEntry, LoadResult, Settings, load_settings, update_settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SOURCE = "backends"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "backends",
        help="list, add, remove and ★ the inference engines qmgui launches",
        description="The backend registry: each entry is an engine executable of one kind; "
        "the ★ default of a class serves that class's models unless a model is pinned to "
        "another entry.",
    )
    p.set_defaults(func=lambda _args, out: _usage(p, out))
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    ls = actions.add_parser("list", help="show the registered backends")
    ls.add_argument("--json", action="store_true", help="print the registry as a JSON array")
    ls.set_defaults(func=cmd_list)

    add = actions.add_parser(
        "add",
        help="register an engine executable",
        description="Register an engine executable. It is checked to exist and be runnable, "
        "then run with --version, --help and --list-devices to learn its version, the flags it "
        "understands and its devices (--no-probe skips that).",
    )
    add.add_argument("id", metavar="ID", help="a name for this entry, unique in the registry")
    add.add_argument(
        "--kind",
        required=True,
        help=f"one of {', '.join(KINDS)} (other spellings such as llama.cpp or tts.cpp, in any "
        "case, are read as the kind they name)",
    )
    add.add_argument("--exe", required=True, metavar="PATH", help="the engine's executable")
    add.add_argument(
        "--default",
        dest="default_for",
        action="extend",
        nargs="+",
        default=[],
        metavar="CLASS",
        help="make it the ★ default for these classes (moving the ★ from another entry)",
    )
    add.add_argument(
        "--class",
        dest="classes",
        action="extend",
        nargs="+",
        default=[],
        metavar="CLASS",
        help=f"the classes a custom backend serves: {', '.join(CLASSES)}",
    )
    add.add_argument("--variant", default=None, help="cuda, rocm, vulkan, sycl, cpu…")
    add.add_argument(
        "--family",
        default=None,
        help="the model families it serves (comma-separated), where engines of one class "
        "read different weights",
    )
    add.add_argument(
        "--no-probe",
        action="store_true",
        help="do not run the executable (--version, --help, --list-devices) to learn its "
        "version and the flags it understands",
    )
    add.set_defaults(func=cmd_add)

    rm = actions.add_parser("remove", help="remove an entry (pins naming it become stale)")
    rm.add_argument("id", metavar="ID")
    rm.set_defaults(func=cmd_remove)

    star = actions.add_parser("default", help="make an entry the ★ default of a class")
    star.add_argument("id", metavar="ID")
    star.add_argument("model_class", metavar="CLASS", help=", ".join(CLASSES))
    star.set_defaults(func=cmd_default)


def _usage(parser: argparse.ArgumentParser, out: TextIO) -> int:
    notify.error("say what to do with the backends: list, add, remove or default", source=SOURCE)
    parser.print_usage(out)
    return EXIT_USAGE


# --- loading and saving ---------------------------------------------------------------------


def _load() -> LoadResult:
    loaded = load_settings()
    for message in loaded.messages:
        notify.warning(message, source="settings")
    return loaded


def _load_for_change() -> LoadResult | None:
    """The settings to change, or None (after saying why) when saving them would overwrite a
    file that could not be loaded."""
    loaded = _load()
    if loaded.read_only:
        notify.error(
            f"The backends were not changed: {loaded.path} could not be loaded or moved aside,"
            " and saving would overwrite it; fix, move or delete that file first.",
            source=SOURCE,
        )
        return None
    return loaded


def _registry(loaded: LoadResult) -> tuple[Backend, ...]:
    return tuple(entry.to_core() for entry in loaded.settings.backends)


class _Refused(Exception):
    """A change that the registry as it is on disk now does not allow (a usage error)."""


def _save(
    change: Callable[[tuple[Backend, ...]], tuple[Backend, ...]],
) -> tuple[int, LoadResult | None]:
    """Apply `change` to the registry as it is in the file now, under the settings lock, and
    store the result; entries that already existed keep their unknown keys. `change` raises
    `_Refused` (its sentence is the usage error) when it cannot apply. Returns the exit status
    and, when it is EXIT_OK, the settings as saved."""

    def mutate(settings: Settings) -> Settings:
        cores = [entry.to_core() for entry in settings.backends]
        old = {entry.id: entry for entry in settings.backends}
        same = {id(core): entry for core, entry in zip(cores, settings.backends, strict=True)}
        backends = change(tuple(cores))
        # an entry `change` handed back untouched is stored as it was (no rebuild per entry)
        entries = [
            same.get(id(b)) or BackendEntry.from_core(b, base=old.get(b.id)) for b in backends
        ]
        return settings.model_copy(update={"backends": entries})

    try:
        saved = update_settings(mutate)
    except _Refused as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE, None
    except SettingsError as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_FAILED, None
    except ValueError as e:  # pydantic refused a value the checks above let through
        notify.error(f"The backends were not changed: {e}", source=SOURCE)
        return EXIT_USAGE, None
    for message in saved.messages:  # the file went bad since the first read: moved aside
        notify.warning(message, source="settings")
    return EXIT_OK, saved


# --- list -----------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    backends = _registry(_load())
    for problem in registry_problems(backends):
        notify.warning(problem, source=SOURCE)
    if args.json:
        json.dump([b.to_json() for b in backends], out, indent=2)
        out.write("\n")
        return EXIT_OK
    if not backends:
        print("No backends registered; add one with `qmgui backends add`.", file=out)
        return EXIT_OK
    _print_table(backends, out)
    # the registry-only classes (segment, upscale, 3d) serve no model file: not a gap
    served = classes_served(backends)
    missing = [c for c in CLASSES if c not in served and c not in REGISTRY_ONLY_CLASSES]
    if missing:
        print(f"no backend serves: {', '.join(missing)}", file=out)
    return EXIT_OK


def _print_table(backends: Sequence[Backend], out: TextIO) -> None:
    cols = ("ID", "KIND", "SERVES", "★ DEFAULT FOR", "VARIANT", "VERSION", "EXECUTABLE")
    rows = [cols] + [
        (
            b.id,
            b.kind,
            ",".join(sort_classes(b.served_classes)) or "-",
            ",".join(sort_classes(b.default_for)) or "-",
            b.variant or "-",
            b.version or "-",
            b.executable,
        )
        for b in backends
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    for row in rows:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        print(line.rstrip(), file=out)


# --- add ------------------------------------------------------------------------------------


def cmd_add(args: argparse.Namespace, out: TextIO) -> int:
    loaded = _load_for_change()
    if loaded is None:
        return EXIT_FAILED
    registry = _registry(loaded)
    kind = canonical_kind(args.kind)  # "llama.cpp", "TTS.cpp"… are stored as the kind
    problem = new_backend_problem(
        registry,
        backend_id=args.id,
        kind=kind,
        exe=args.exe,
        classes=args.classes,
        default_for=args.default_for,
    )
    if problem is not None:
        notify.error(problem, source=SOURCE)
        return EXIT_USAGE
    new = Backend(
        id=args.id,
        kind=kind,
        executable=stored_executable(args.exe),
        variant=args.variant or None,
        classes=frozenset(args.classes),
        family=(args.family or "").strip() or None,
    )
    stars = sort_classes(args.default_for)
    try:  # a ★ the kind cannot take is a usage error before the probe, not after
        _added(registry, new, stars, [])
    except _Refused as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    warning = executable_warning(new.executable)
    if warning is not None:
        notify.warning(warning, source=SOURCE)
    elif not args.no_probe:
        new = _probed(new)  # before the lock: a probe takes seconds
    moved: list[str] = []

    def change(backends: tuple[Backend, ...]) -> tuple[Backend, ...]:
        # checked again on the registry as it is now: another process may have added this id
        problem = new_backend_problem(
            backends,
            backend_id=args.id,
            kind=args.kind,
            exe=args.exe,
            classes=args.classes,
            default_for=args.default_for,
        )
        if problem is not None:
            raise _Refused(problem)
        moved.clear()
        return _added(backends, new, stars, moved)

    status, _saved = _save(change)
    if status == EXIT_OK:
        for note in moved:
            notify.info(note, source=SOURCE)
        serves = ", ".join(sort_classes(new.served_classes))
        print(f"added {new.id} ({new.kind}: {serves}) -> {new.executable}", file=out)
    return status


def _added(
    backends: tuple[Backend, ...], new: Backend, stars: Sequence[str], moved: list[str]
) -> tuple[Backend, ...]:
    """`backends` with `new` appended and made the ★ of `stars`; each ★ taken from another
    entry is said in `moved`. Raises `_Refused` for a ★ that cannot be given."""
    updated = (*backends, new)
    for model_class in stars:
        problem = default_problem(updated, new.id, model_class)
        if problem is not None:
            raise _Refused(problem)
        before = default_for_class(updated, model_class)
        updated = set_default(updated, new.id, model_class)
        if before is not None:
            moved.append(f"★ for {model_class} moved from {before.id!r} to {new.id!r}")
    return updated


def _probed(b: Backend) -> Backend:
    """`b` with what a bounded probe of its executable says: version, build, variant, flags
    and devices. A probe that fails is reported and the entry kept as it was."""
    from qmgui.engines.probe import probe  # noqa: PLC0415 - runs the binary: only when asked

    result = probe(b.executable, kind=b.kind, timeout_s=PROBE_TIMEOUT_S)
    if b.kind == "llama":  # what plan and place keep of its --list-devices is this now
        from qmgui.service.devices import remember  # noqa: PLC0415 - after a probe only

        remember(b.executable, result)
    if not result.ok:
        notify.warning(f"probing {b.executable} failed: {result.summary()}", source=SOURCE)
        return b
    notify.info(f"{b.id}: {result.summary()}", source=SOURCE)
    return with_probe(b, result)


# --- remove ---------------------------------------------------------------------------------


def cmd_remove(args: argparse.Namespace, out: TextIO) -> int:
    if _load_for_change() is None:
        return EXIT_FAILED
    removed: list[Backend] = []

    def change(backends: tuple[Backend, ...]) -> tuple[Backend, ...]:
        gone = find_backend(backends, args.id)
        if gone is None:
            raise _Refused(f"no backend has the id {args.id!r}")
        removed[:] = [gone]
        return tuple(b for b in backends if b.id != args.id)

    status, saved = _save(change)
    if status != EXIT_OK or saved is None:
        return status
    gone, kept = removed[0], _registry(saved)
    print(f"removed {gone.id} ({gone.kind})", file=out)
    for model_class in sort_classes(gone.default_for):
        heir = next((b for b in kept if b.serves(model_class)), None)
        then = (
            f"its models use the first {model_class} backend, {heir.id!r}"
            if heir
            else (f"no backend serves {model_class} now")
        )
        notify.info(f"{model_class} has no ★ default now; {then}", source=SOURCE)
    pins = sum(1 for o in saved.settings.model_overrides.values() if o.backend_id == args.id)
    if pins:
        notify.warning(
            f"{pins} model pin(s) name {args.id!r}; those models use their class's ★ default"
            f" or first backend until a backend with that id is added again or another is"
            " picked",
            source=SOURCE,
        )
    return EXIT_OK


# --- default --------------------------------------------------------------------------------


def cmd_default(args: argparse.Namespace, out: TextIO) -> int:
    if _load_for_change() is None:
        return EXIT_FAILED
    was: list[Backend | None] = []

    def change(backends: tuple[Backend, ...]) -> tuple[Backend, ...]:
        problem = default_problem(backends, args.id, args.model_class)
        if problem is not None:
            raise _Refused(problem)
        before = default_for_class(backends, args.model_class)
        was[:] = [before]
        if before is not None and before.id == args.id:
            return backends  # nothing to write
        return set_default(backends, args.id, args.model_class)

    status, _saved = _save(change)
    if status != EXIT_OK:
        return status
    before = was[0]
    if before is not None and before.id == args.id:
        print(f"{args.id} is already the ★ default for {args.model_class}", file=out)
        return EXIT_OK
    was_text = f" (was {before.id})" if before is not None else ""
    print(f"★ {args.id} is now the default for {args.model_class}{was_text}", file=out)
    return EXIT_OK
