"""One endpoint for several models: llama.cpp's router (`llama-server --models-preset`).

`plan_router` turns models into a preset file through the same path as each model's own
launch: the model's engine is resolved (`Resolver.target`), its command is emitted with its
saved profile (`emit_model`: a model whose own launch could not run is left out, with the
reason), and the same settings, device pin and arguments become its section
(`core.export.models_ini`, which keeps every name as data). A section is named by the model's
stable id, its name (`tiny-llama`; a second model of the same name gets `-2`); clients ask
for that name. The router loads a model on its first request and unloads the least recently
used one beyond `--models-max`, which comes from the memory budget
(`core.router.models_max`: the largest k such that the k largest models fit together).

`qmgui serve --router` and the window's "Serve through one endpoint" both call this; the
preset is written (0600) under the state folder at every start, so it always reflects the
profiles as they are then. The router is one engine for the supervisor: the models it spawns
are its children, in its process group and carrying its token, so stopping it (or
`qmgui engines stop`, detached or not) stops them all.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from qmgui.core.build_rules import rules_for
from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import DevicePin, EmitError
from qmgui.core.errors import SizingError
from qmgui.core.export.models_ini import PresetModel, render_models_ini
from qmgui.core.fit import Budget
from qmgui.core.footprint import estimate
from qmgui.core.profile import extra_args_of
from qmgui.core.router import Sized, models_max
from qmgui.engines.registry import state_dir
from qmgui.engines.supervisor import EngineSpec
from qmgui.service.launch import Request, Resolver, Target, UsageError, emit_model, with_override
from qmgui.service.profile import profile_of
from qmgui.settings import ModelOverride

ROUTER_DIR = "routers"
PRESET_MODE = 0o600
HEALTH_PATH = "/health"


@dataclass(frozen=True)
class RouterPlan:
    """A router's preset and what it serves."""

    router_id: str  # stable for the same models: names its preset file and its port
    name: str  # for the Engines panel and logs
    executable: str
    preset: str  # the models.ini text
    models: tuple[str, ...]  # the section names: what clients ask for
    models_max: int
    warnings: tuple[str, ...] = ()


def preset_model(
    entry: ModelEntry, target: Target, req: Request, ov: ModelOverride | None
) -> PresetModel:
    """One model's preset section from the values its own launch gets (`emit_model`'s rules:
    profile under the command line, saved mmproj, device pin, saved then given arguments)."""
    model = replace(entry, mmproj=ov.mmproj) if ov is not None and ov.mmproj else entry
    profile = profile_of(ov)
    devices = req.devices
    if not devices and "devices" not in req.given:
        devices = tuple(profile.get("devices") or ())
    saved_extra = () if "extra_args" in req.given else extra_args_of(profile)
    return PresetModel(
        name=entry.name,
        model=model,
        settings=with_override(req.settings, ov, given=req.given),
        devices=DevicePin(target.variant or "cuda", devices) if devices else None,
        extra_args=(*saved_extra, *req.extra),
    )


def router_id(entries: Sequence[ModelEntry]) -> str:
    """The same for the same set of models, in any order."""
    digest = hashlib.sha256("\0".join(sorted(e.id for e in entries)).encode("utf-8", "replace"))
    return f"router-{digest.hexdigest()[:12]}"


def _sections(text: str) -> tuple[str, ...]:
    # render_models_ini writes a section header only as a whole `[name]` line
    return tuple(ln[1:-1] for ln in text.splitlines() if ln.startswith("[") and ln.endswith("]"))


def plan_router(
    entries: Sequence[ModelEntry],
    resolver: Resolver,
    req: Request,
    *,
    host_bytes: int | None = None,
    max_models: int | None = None,
) -> RouterPlan:
    """The router's preset for `entries` (UsageError when none can be served by llama-server).
    `max_models` overrides the budget's `--models-max`."""
    presets: list[PresetModel] = []
    sized: list[Sized] = []
    warnings: list[str] = []
    executables: list[str] = []
    builds: set[frozenset[str] | None] = set()
    for entry in entries:
        if entry.meta is None:
            warnings.append(f"{entry.name}: left out: {entry.error or 'not a model'}")
            continue
        if entry.source == "url":
            warnings.append(f"{entry.name}: left out: not downloaded yet (Start downloads it)")
            continue
        target = resolver.target(entry)
        if isinstance(target, str):
            warnings.append(f"{entry.name}: left out: {target}")
            continue
        if target.kind != "llama":
            warnings.append(f"{entry.name}: left out: the router serves llama-server models only")
            continue
        ov = resolver.override(entry)
        try:
            own = emit_model(entry, target, req, ov).command  # the launch it would get alone
        except (EmitError, SizingError) as e:
            warnings.append(f"{entry.name}: left out: {e}")
            continue
        if not own.runnable:
            warnings.append(f"{entry.name}: left out: {'; '.join(own.warnings)}")
            continue
        item = preset_model(entry, target, req, ov)
        presets.append(item)
        executables.append(target.executable)
        builds.add(target.supported)
        try:
            fp = estimate(entry.meta, item.settings, req.gpus, rules=rules_for(target.build)[0])
        except SizingError:
            fp = None
        sized.append(Sized(entry.name, item.settings, fp))
    if not presets:
        raise UsageError(
            "no model can be served through the router: " + "; ".join(warnings or ["none given"])
        )
    if len(set(executables)) > 1:
        warnings.append(
            f"the models resolve to different llama-server builds; the router runs {executables[0]}"
        )
    rendered = render_models_ini(
        presets,
        supported_flags=next(iter(builds)) if len(builds) == 1 else None,
        header=("llama.cpp router presets written by qmgui (regenerated at every start)",),
    )
    models = _sections(rendered.text)
    if not models:
        raise UsageError(
            "no model can be served through the router: " + "; ".join(rendered.warnings)
        )
    budget = Budget(gpus=req.gpus, gpu_reserve=req.reserve, host_bytes=host_bytes)
    limit = models_max(sized, budget) if max_models is None else max_models
    rid = router_id(entries)
    return RouterPlan(
        router_id=rid,
        name=f"router ({', '.join(models)})",
        executable=executables[0],
        preset=rendered.text,
        models=models,
        models_max=max(1, min(limit, len(models))),
        warnings=(*warnings, *rendered.warnings),
    )


def preset_path(plan: RouterPlan) -> Path:
    return state_dir() / ROUTER_DIR / f"{plan.router_id}.ini"


def write_preset(plan: RouterPlan) -> Path:
    """Write the preset (atomically, 0600) where the router reads it; its path."""
    path = preset_path(plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".preset-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(plan.preset)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, PRESET_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def refresh_preset(plan: RouterPlan, url: str | None, argv: Sequence[str] = ()) -> str:
    """Bring a running router (at `url`, started with `argv`) to `plan`: the preset written
    when it differs from its file, and read again by the router (`GET /models?reload=1`: a
    loaded model whose section changed is unloaded and loads with its new arguments at its
    next request). What happened, in words; "" when the preset is unchanged."""
    from qmgui.engines.router import reload_presets  # noqa: PLC0415 - HTTP, for a refresh only

    path = preset_path(plan)
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == plan.preset:
            return ""
    write_preset(plan)
    if url is None or not reload_presets(url):
        return f"{plan.name}: preset written; the router reads it when restarted"
    args = list(argv)
    at = args.index("--models-max") + 1 if "--models-max" in args[:-1] else None
    more = ""
    if at is not None and args[at] != str(plan.models_max):
        more = f"; --models-max {plan.models_max} applies after a restart"
    return (
        f"{plan.name}: preset updated; a loaded model whose settings changed loads again "
        f"with them at its next request{more}"
    )


def router_spec(
    plan: RouterPlan, preset: Path, *, port: int | None, extra: Sequence[str] = ()
) -> EngineSpec:
    """The supervisor's spec: one llama-server in router mode on `port` (`extra`: router
    arguments such as `--host`, `--api-key-file`)."""
    argv = (
        plan.executable,
        "--models-preset",
        str(preset),
        "--models-max",
        str(plan.models_max),
        *extra,
    )
    return EngineSpec(argv=argv, name=plan.name, kind="llama", health_path=HEALTH_PATH, port=port)
