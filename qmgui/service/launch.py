"""What the window and the command line both do to launch a model: find its engine (backend
registry, pin, ★ default, or the model's usual engine; a llama-server build's `--help` probed
once), apply the model's saved profile, emit its command and turn it into a supervisor spec.

`qmgui preview`, `serve`, `export`, `place` and the window's plan, Start and fleet all go
through here; `qmgui/ui` imports nothing from `qmgui/cli` (tests/test_layers.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from qmgui import notify
from qmgui.core import backends as registry
from qmgui.core.build_rules import build_number, rules_for
from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import Command, DevicePin, EmitError, flags_from_probe, skipped
from qmgui.core.emit import custom as emit_custom
from qmgui.core.emit import llama as emit_llama
from qmgui.core.emit import sd as emit_sd
from qmgui.core.emit import vllm as emit_vllm
from qmgui.core.emit import whisper as emit_whisper
from qmgui.core.errors import SizingError
from qmgui.core.export import footprint_comment, vllm_comment, vllm_reasons
from qmgui.core.fit import Budget, check
from qmgui.core.footprint import Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelClass
from qmgui.core.profile import Profile, apply_profile, extra_args_of, vllm_pins
from qmgui.core.vllm import VllmPlan, budget_per_gpu, plan_vllm
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import EngineSpec
from qmgui.service.disk import disk_advice
from qmgui.service.profile import profile_of
from qmgui.settings import LoadResult, ModelOverride, load_settings

__all__ = ["EmitError"]

DEFAULT_PORT = 8080
# what each kind is called when nothing names its executable
DEFAULT_EXECUTABLES = {
    "llama": "llama-server",
    "vllm": "vllm",
    "sd": "sd-server",
    "whisper": "whisper-server",
}
HEALTH = {
    "llama": emit_llama.HEALTH_PATH,
    "vllm": emit_vllm.HEALTH_PATH,
    "sd": emit_sd.HEALTH_PATH,
    "whisper": emit_whisper.HEALTH_PATH,
    "custom": emit_custom.HEALTH_PATH,
}
PROBE_TIMEOUT_S = 10.0


class UsageError(Exception):
    """A sentence for the user: the command line (or the registry) cannot be used as given."""


@dataclass(frozen=True)
class Target:
    """The engine one model runs on: its kind, executable and what its build knows."""

    kind: str
    executable: str
    backend_id: str | None
    reason: str
    supported: frozenset[str] | None = None
    valueless: frozenset[str] = frozenset()
    variant: str | None = None
    template: str | None = None  # a custom backend's command template
    notes: tuple[str, ...] = ()
    build: int | None = None  # the llama.cpp build (bNNNN) its --version names; None: unknown

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.backend_id,
            "kind": self.kind,
            "executable": self.executable,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Emitted:
    """One model's command and what an export writes beside it."""

    command: Command
    target: Target
    health: str
    comments: tuple[str, ...] = ()
    vllm: VllmPlan | None = None  # a vLLM launch's plan (the window draws its bars)


@dataclass
class Resolver:
    """Finds each model's engine; probes each llama-server build once."""

    loaded: LoadResult
    backend_arg: str | None = None
    engine: str | None = None
    probe: bool = True
    _probed: dict[
        str, tuple[frozenset[str] | None, frozenset[str], tuple[str, ...], int | None]
    ] = field(default_factory=dict)

    @property
    def backends(self) -> tuple[registry.Backend, ...]:
        return tuple(e.to_core() for e in self.loaded.settings.backends)

    def override(self, entry: ModelEntry) -> ModelOverride | None:
        """The model's saved profile: under its id, or its absolute path (the key a command
        line given a relative path saves under)."""
        overrides = self.loaded.settings.model_overrides
        found = overrides.get(entry.id)
        if found is None and entry.source == "folder" and not os.path.isabs(entry.id):
            found = overrides.get(os.path.abspath(entry.id))
        return found

    def target(self, entry: ModelEntry) -> Target | str:
        """The engine for `entry`, or a sentence saying why there is none."""
        backends = self.backends
        if self.backend_arg:
            named = registry.find_backend(backends, self.backend_arg)
            if named is not None:
                return self._from_backend(named, "named with --backend")
            return self._from_path(entry, self.backend_arg, backends)
        if all(b.registry_only for b in backends):
            # none, or only engines that run no model file (an upscaler): the usual engine,
            # so adding an upscale entry never changes a command or an export (reference 001)
            kind = self.engine or kind_for(entry)
            exe = default_executable(kind)
            return self._probed_target(Target(kind, exe, None, f"no backends registered: {exe}"))
        if self.engine:
            return self._of_kind(entry, self.engine, backends)
        ov = self.override(entry)
        choice = registry.resolve_backend(entry, backends, pin=ov.backend_id if ov else None)
        if choice.backend is None:
            cls = entry.model_class.value if entry.model_class else None
            if (
                cls is not None
                and entry.meta is not None
                and not entry.error
                and not any(b.serves(cls) and not b.registry_only for b in backends)
            ):
                # no entry for this class: its usual engine, as with an empty registry
                # (reference 001: the engine found the old way stays the fallback)
                kind = kind_for(entry)
                exe = default_executable(kind)
                why = f"no {cls} backend registered: {exe}"
                return self._probed_target(Target(kind, exe, None, why))
            return f"{entry.name}: {choice.reason}"
        return self._from_backend(choice.backend, choice.reason)

    def _of_kind(
        self, entry: ModelEntry, kind: str, backends: Sequence[registry.Backend]
    ) -> Target:
        """`--engine KIND`: that kind's ★ default for the class, its first entry, or the kind's
        usual executable when the registry has none."""
        cls = entry.model_class.value if entry.model_class else "llm"
        of_kind = [b for b in backends if b.kind == kind and b.serves(cls)]
        star = registry.default_for_class(of_kind, cls)
        if star is not None:
            return self._from_backend(star, f"★ default {kind} backend for {cls}")
        if of_kind:
            return self._from_backend(of_kind[0], f"first {kind} backend for {cls}")
        exe = default_executable(kind)
        return self._probed_target(Target(kind, exe, None, f"no {kind} backend registered: {exe}"))

    def _from_backend(self, b: registry.Backend, reason: str) -> Target:
        template = b.capabilities.get("template")
        target = Target(
            kind=b.kind,
            executable=b.executable,
            backend_id=b.id,
            reason=reason,
            supported=b.flags or None,
            variant=b.variant,
            template=template if isinstance(template, str) else None,
        )
        return self._probed_target(target)

    def _from_path(
        self, entry: ModelEntry, value: str, backends: Sequence[registry.Backend]
    ) -> Target:
        path = os.path.expanduser(value)
        looks_like_path = os.sep in path or bool(os.altsep and os.altsep in path)
        if not looks_like_path and not os.path.exists(path) and shutil.which(path) is None:
            ids = ", ".join(b.id for b in backends) or "none registered"
            raise UsageError(
                f"--backend {value}: no backend has that id ({ids}) and no executable of "
                "that name is on PATH; give a registered id or the engine's path"
            )
        kind = self.engine or kind_for(entry, executable=path)
        notes = () if os.path.exists(path) or shutil.which(path) else (f"{path} does not exist",)
        return self._probed_target(Target(kind, path, None, "named with --backend", notes=notes))

    def _probed_target(self, target: Target) -> Target:
        """Probe a llama-server build's `--help` (other kinds print help qmgui cannot read)."""
        if not self.probe or target.kind != "llama":
            return target
        exe = target.executable
        if exe not in self._probed:
            from qmgui.engines.probe import probe  # noqa: PLC0415 - only when probing

            result = probe(
                exe, kind="llama", commands=[("--version",), ("--help",)],
                timeout_s=PROBE_TIMEOUT_S,
            )  # fmt: skip
            supported, valueless = flags_from_probe(result)
            notes: tuple[str, ...] = ()
            if supported is None:
                why = str(result.failure) if result.failure else "it listed no options"
                notes = (f"could not read {exe} --help ({why}); assuming it knows every flag",)
            build = build_number(result.build, result.commit)
            self._probed[exe] = (supported, valueless, notes, build)
        supported, valueless, notes, build = self._probed[exe]
        if supported is None:
            return replace(target, notes=(*target.notes, *notes), build=build)
        return replace(target, supported=supported, valueless=valueless, build=build)


def backend_build(
    backend_arg: str, entry: ModelEntry, *, probe: bool = True, source: str = "plan"
) -> int | None:
    """The llama.cpp build of the backend `--backend ID|PATH` names (its --version, probed
    once), whose rules size `entry`'s plan; ValueError with a sentence when it names nothing
    runnable here. None (said) when the build does not say which it is; without probing
    (`place --no-probe`: commands for another machine) None, unsaid: the default rules."""
    target = Resolver(load_quietly(), backend_arg=backend_arg, engine="llama", probe=probe).target(
        entry
    )
    if isinstance(target, str):
        raise ValueError(f"--backend {backend_arg}: {target}")
    if probe and shutil.which(target.executable) is None:  # unprobed: commands for elsewhere
        raise ValueError(
            f"--backend {backend_arg}: {target.executable} is not an executable here; give a "
            "registry id (qmgui backends list) or the engine's path, or --build N"
        )
    if target.build is None and probe:
        notify.warning(
            f"{target.executable} does not say which llama.cpp build it is; sized by the "
            "default rules",
            source=source,
        )
    return target.build


def kind_for(entry: ModelEntry, *, executable: str | None = None) -> str:
    """The engine kind for a model: from the executable's name when it says, else the model."""
    if executable:
        name = os.path.basename(executable).lower()
        for needle, kind in (("vllm", "vllm"), ("whisper", "whisper"), ("sd-server", "sd")):
            if needle in name:
                return kind
        if "llama" in name:
            return "llama"
    if entry.format == "hf":
        return "vllm"
    if entry.model_class == ModelClass.IMAGE:
        return "sd"
    if entry.model_class == ModelClass.ASR:
        return "whisper"
    return "llama"


def default_executable(kind: str) -> str:
    if kind == "llama":
        return find_llama_server() or DEFAULT_EXECUTABLES["llama"]
    return DEFAULT_EXECUTABLES.get(kind, kind)


def with_override(
    s: LaunchSettings, ov: ModelOverride | None, *, given: Collection[str] = ()
) -> LaunchSettings:
    """The model's saved profile fills what the command line left at its default (and did
    not give explicitly: `given`, LaunchSettings field names)."""
    return apply_profile(s, profile_of(ov), given=given)


@dataclass(frozen=True)
class Request:
    """What the command line asked for, shared by every model of one run."""

    settings: LaunchSettings
    gpus: tuple[Gpu, ...]
    reserve: int
    port: int | str
    extra: tuple[str, ...]
    devices: tuple[int, ...] = ()
    estimate: bool = False  # compute the VRAM comment (exports)
    # what was set explicitly (profile field names): the saved profile does not replace it
    given: frozenset[str] = frozenset()
    # vLLM values given explicitly (profile field names: gpu_memory_utilization, …)
    vllm: Mapping[str, object] = field(default_factory=dict)
    build: int | None = None  # the llama.cpp build that runs it, once resolved (its rules)


METRICS_FLAG = "--metrics"
_VERBOSITY_FLAGS = frozenset(a for names in emit_llama.F_VERBOSITY.spellings for a in names)


def engine_spec(
    command: Command,
    kind: str,
    entry: ModelEntry,
    *,
    port: int | None = None,
    downshift: bool = False,
) -> EngineSpec:
    """The supervisor's spec for an emitted command (`qmgui serve` and the window's Start).

    llama-server also gets `-lv 4` (its buffer lines are what the plan is compared with)
    unless the command already sets a verbosity: the flag appears once; and `--metrics` (its
    `/metrics` counters give the live tokens/s the Engines panel shows)."""
    argv = command.argv
    if kind == "llama" and not any(a.split("=", 1)[0] in _VERBOSITY_FLAGS for a in argv[1:]):
        argv = (*argv, "-lv", str(emit_llama.READBACK_VERBOSITY))
    if kind == "llama" and METRICS_FLAG not in argv[1:]:
        argv = (*argv, METRICS_FLAG)  # live tokens/s in the Engines panel
    return EngineSpec(
        argv=argv,
        name=entry.name,
        kind=kind,
        health_path=HEALTH.get(kind, emit_custom.HEALTH_PATH),
        port=port,
        env=dict(command.env) or None,
        model_bytes=entry.size_bytes,
        downshift=downshift,
        default_ctx=entry.meta.context_length if entry.meta else None,
    )


def emit_model(
    entry: ModelEntry, target: Target, req: Request, ov: ModelOverride | None
) -> Emitted:
    """Emit one model's command on `target` with the model's saved profile `ov` applied
    (EmitError / SizingError for bad input)."""
    profile = profile_of(ov)
    settings = apply_profile(req.settings, profile, given=req.given)
    settings, disk = disk_advice(entry, settings, req.given)  # a network disk: --no-mmap
    if ov is not None and ov.mmproj:
        entry = replace(entry, mmproj=ov.mmproj)
    saved_extra = () if "extra_args" in req.given else extra_args_of(profile)
    extra = (*saved_extra, *req.extra)
    devices = req.devices
    if not devices and "devices" not in req.given:
        devices = tuple(profile.get("devices") or ())
    pin = DevicePin(target.variant or "cuda", devices) if devices else None
    health = HEALTH.get(target.kind, "/health")
    common: dict[str, Any] = {"executable": target.executable, "port": req.port}
    comments: list[str] = []
    vllm_plan: VllmPlan | None = None
    if target.kind == "llama":
        cmd = emit_llama.emit_llama(
            entry,
            settings,
            supported_flags=target.supported,
            valueless_flags=target.valueless,
            devices=pin,
            extra_args=extra,
            **common,
        )
        if req.estimate and entry.meta is not None and cmd.runnable:
            comments = _llama_estimate(entry, settings, req, target.build)
    elif target.kind == "vllm":
        pins = {**profile, **req.vllm, "ctx_size": settings.ctx_size}
        cmd, comments, vllm_plan = _vllm(
            entry, target, req, pins, extra=extra, pin=pin, common=common
        )
    elif target.kind == "sd":
        cmd = emit_sd.emit_sd(entry, devices=pin, extra_args=extra, **common)
    elif target.kind == "whisper":
        cmd = emit_whisper.emit_whisper(entry, devices=pin, extra_args=extra, **common)
    elif target.kind == "custom":
        if not target.template:
            raise EmitError(
                f"custom backend {target.backend_id!r} has no command template "
                "(capabilities.template)"
            )
        cmd = emit_custom.emit_custom(
            entry, target.template, settings, env=pin.env() if pin else None,
            extra_args=extra, **common,
        )  # fmt: skip
    else:
        cmd = skipped(f"{entry.name}: qmgui writes no commands for {target.kind} backends yet")
    if target.notes:
        cmd = replace(cmd, warnings=(*target.notes, *cmd.warnings))
    if disk.note and target.kind == "llama":
        comments = [*comments, disk.note]
    return Emitted(cmd, target, health, tuple(comments), vllm_plan)


def _llama_estimate(
    entry: ModelEntry, settings: LaunchSettings, req: Request, build: int | None
) -> list[str]:
    assert entry.meta is not None
    rules, _ = rules_for(build)  # the rules of the build the command runs
    budget = Budget(gpus=req.gpus, gpu_reserve=req.reserve, rules=rules)
    from qmgui.service.projector import projector_meta  # noqa: PLC0415 - exports only

    try:  # with the projector the command loads (--mmproj), as every plan
        result = check(entry.meta, settings, budget, mmproj=projector_meta(entry))
    except SizingError as e:
        return [f"VRAM not estimated: {e}"]
    lines = [footprint_comment(result.footprint)]
    if not result.fits:
        lines.append(f"does not fit: {result.reason}")
    return lines


def _vllm(
    entry: ModelEntry,
    target: Target,
    req: Request,
    profile: Profile,
    *,
    extra: tuple[str, ...],
    pin: DevicePin | None,
    common: dict[str, Any],
) -> tuple[Command, list[str], VllmPlan | None]:
    if entry.meta is None:
        return skipped(f"{entry.name}: {entry.error or 'not a model'}"), [], None
    gpu = req.gpus[0] if req.gpus else None
    plan = plan_vllm(
        entry.meta,
        gpu_total_bytes=gpu.total_bytes if gpu else None,
        budget_bytes=budget_per_gpu(
            profile.get("vllm_budget_bytes"),
            available=gpu.available if gpu else None,
            reserve=req.reserve,
        ),
        tensor_parallel=max(len(req.gpus), 1),
        pins=vllm_pins(profile, extra_args=extra),
        is_split_gguf=len(entry.shards) > 1,
    )
    cmd = emit_vllm.emit_vllm(
        entry, plan, supported_flags=target.supported, devices=pin, extra_args=extra, **common
    )
    comments = [vllm_comment(plan)] if cmd.runnable else []
    if cmd.runnable and not plan.fits:
        comments.append(f"does not fit: {plan.reason}")
    if cmd.runnable:
        comments += vllm_reasons(plan, entry.meta)
    return cmd, comments, plan


# what to install when a kind's engine is missing (the window's Start and preview say it)
INSTALL_HINTS = {
    "llama": "download a llama.cpp release (github.com/ggml-org/llama.cpp/releases) or build "
    "it, then add its llama-server under Backends…",
    "vllm": "install it with `pip install vllm` (Linux, with an NVIDIA or AMD GPU), then add "
    "its `vllm` under Backends… or put it on PATH",
    "sd": "download a stable-diffusion.cpp release (github.com/leejet/stable-diffusion.cpp/"
    "releases), then add its sd-server under Backends…",
    "whisper": "download a whisper.cpp release (github.com/ggml-org/whisper.cpp/releases), "
    "then add its whisper-server under Backends…",
}


def missing_engine(target: Target) -> str | None:
    """A sentence when `target`'s executable is not installed (a path that is not there, or a
    name not on PATH), saying what to install; None when it is there."""
    exe = os.path.expanduser(target.executable)
    if os.sep in exe or (os.altsep and os.altsep in exe):
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return None
        where = f"{exe} is not there (or not executable)"
    elif shutil.which(exe) is not None:
        return None
    else:
        where = f"{exe} was not found on PATH"
    hint = INSTALL_HINTS.get(target.kind, "install it, or give its path under Backends…")
    return f"{where}: {hint}"


def load_quietly() -> LoadResult:
    loaded = load_settings()
    for message in loaded.messages:
        notify.warning(message, source="settings")
    return loaded
