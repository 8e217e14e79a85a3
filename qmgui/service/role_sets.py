"""Role sets for this machine or a what-if one: `ROLE=MODEL[:KEY=VALUE,...]` lines
(`core.roles`) read into models, placed together on the GPUs (`core.placement`: search roles
first, chat last, idle cards widening) and turned into each instance's llama-server command.

`qmgui place --role ...` and the window's role sets (a `RunSet` with `roles`) both come here,
so the terminal and the window run the same plan: `RoleSet` is the whole of it, step by step
(the CLI prints and exports from it); `plan_role_set` is the one call the window makes on a
worker thread, returning each instance's name, role, replica, port and argv.

A model is named by a library id (the window's `find`) or a path; a role whose model cannot be
read, or cannot take the role, is listed as not placed with the reason; a vision model without
its projector is skipped with a warning. A role routed elsewhere (`ROLE=remote:ENDPOINT`)
gets no local server: it is listed as remote (`RemoteRole`), never placed, started or
exported. A role whose model is not installed (neither a library id nor a path that exists)
is left out and reported apart from those that do not fit (`NotInstalled`): the rest of the
set is planned and started without it. Where no card is placed for an instance and every GPU
the engine offered was refused (`RoleSetOptions.device_none`), its command gets
`--device none`, as a plain `qmgui place` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from qmgui import notify
from qmgui.core.build_rules import rules_for
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import Command, DevicePin, skipped
from qmgui.core.emit.llama import emit_llama
from qmgui.core.export import unique_name
from qmgui.core.footprint import Footprint, Gpu, estimate
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelMeta
from qmgui.core.placement import Estimator, Placement, Unplaced, place_stages
from qmgui.core.roles import (
    Instance,
    Role,
    RoleError,
    RoleLaunch,
    RoleSpec,
    grounded_refusal,
    parse_role,
    role_instances,
    role_launch,
    role_stages,
    shortfalls,
    trade_layers,
)
from qmgui.service.launch import Resolver, Target, backend_build, load_quietly
from qmgui.settings import LoadResult

__all__ = [
    "NotInstalled",
    "PlannedInstance",
    "RemoteRole",
    "RoleModel",
    "RoleSet",
    "RoleSetOptions",
    "RoleSetPlan",
    "check_roles",
    "plan_role_set",
]

SOURCE = "place"
Find = Callable[[str], ModelEntry | None]  # a library id to its entry (None: not one)
Port = Callable[[int], int | str]  # the n-th placed instance's port (or a mark for exports)


def check_roles(lines: Sequence[str]) -> list[RoleSpec]:
    """Each `ROLE=MODEL[:KEY=VALUE,...]` line read (blank lines left out); RoleError naming
    the bad line and its bad part, or saying that there is none."""
    specs = [parse_role(line.strip()) for line in lines if line.strip()]
    if not specs:
        raise RoleError("a role set needs at least one role, e.g. chat=MODEL")
    return specs


@dataclass(frozen=True)
class RoleSetOptions:
    """What a role set is planned for: the devices, the reserve kept free on each card and
    the host memory (None: not checked), the every-model settings, the engine."""

    gpus: tuple[Gpu, ...] = ()
    reserve: int = 0
    host_bytes: int | None = None
    base: LaunchSettings = field(default_factory=LaunchSettings)
    fa: str | None = None  # every role's flash attention (None: per role and backend)
    backend: str | None = None  # a registry id or an engine's path (`--backend`)
    probe: bool = True  # run the engine's --version/--help (False: commands for elsewhere)
    device_none: bool = False  # every GPU the engine offered was refused: `--device none`
    source: str = SOURCE  # whose messages (notify's source)


@dataclass(frozen=True)
class RemoteRole:
    """A role served elsewhere (`ROLE=remote:ENDPOINT`): no local server."""

    name: str
    role: str
    endpoint: str


@dataclass(frozen=True)
class NotInstalled:
    """A role whose model is not installed: no library id and no file at the path named."""

    name: str
    role: str
    model: str

    @property
    def sentence(self) -> str:
        return (
            f"{self.name}: {self.model} is not installed (no library model or file by that "
            "name): left out; download it or correct the role's model"
        )


def installed(model: str, find: Find | None = None) -> bool:
    """Whether `model` names a library model (`find`) or an existing path."""
    if find is not None and find(model) is not None:
        return True
    return os.path.lexists(os.path.expanduser(model))


@dataclass(frozen=True)
class RoleModel:
    """A role's model as read from disk, with its launch (or why it takes no part)."""

    spec: RoleSpec
    entry: ModelEntry
    launch: RoleLaunch | None
    refused: str | None = None  # not placed: the reason
    skipped: str | None = None  # left out with a warning (vision without a projector)


def _entry(model: str, find: Find | None) -> ModelEntry:
    """The library's entry for an id (when it has read the model), else the path's."""
    found = find(model) if find is not None else None
    if found is not None and found.meta is not None and not found.error:
        return found
    return entry_for_path(found.path if found is not None else model)


def role_model(
    spec: RoleSpec,
    gpus: tuple[Gpu, ...],
    base: LaunchSettings,
    fa: str | None,
    find: Find | None = None,
) -> RoleModel:
    entry = _entry(spec.model, find)
    meta = entry.meta
    if meta is None or entry.error:
        return RoleModel(spec, entry, None, refused=entry.error or "not a model")
    if entry.format != "gguf":
        why = "roles place llama-server launches of GGUF files"
        return RoleModel(spec, entry, None, refused=why)
    if spec.role is Role.VISION and not entry.mmproj:
        why = f"{entry.name} has no projector (mmproj*.gguf beside it): vision skipped"
        return RoleModel(spec, entry, None, skipped=why)
    if spec.role is not Role.VISION:
        entry = replace(entry, mmproj=None)  # chat of a multimodal model: text only
    if fa is not None and spec.fa is None:
        spec = replace(spec, fa=fa)
    try:
        launch = role_launch(spec, meta, backends=[g.backend for g in gpus], base=base)
    except RoleError as e:
        return RoleModel(spec, entry, None, refused=str(e))
    return RoleModel(spec, entry, launch)


def with_projectors(sizing: Estimator, projectors: dict[int, ModelMeta]) -> Estimator:
    """`sizing` charging a vision model's projector (by the identity of its metadata)."""

    def sized(meta: ModelMeta, s: LaunchSettings, gpus: Sequence[Gpu]) -> Footprint:
        mmproj = projectors.get(id(meta))
        if mmproj is None:
            return sizing(meta, s, gpus)
        return sizing(meta, s, gpus, mmproj=mmproj)  # type: ignore[call-arg]

    return sized


class RoleSet:
    """One role set: the role models, their instances and, from `place`, the placement.
    RoleError from the constructor when a line cannot be read."""

    def __init__(
        self, roles: Sequence[str], opts: RoleSetOptions, *, find: Find | None = None
    ) -> None:
        self.opts = opts
        self.gpus = opts.gpus
        specs = [parse_role(text) for text in roles]
        taken: set[str] = set()
        self.remote = [
            RemoteRole(unique_name(s.name or s.role.value, taken), s.role.value, s.remote)
            for s in specs
            if s.remote is not None
        ]
        self.not_installed = [
            NotInstalled(unique_name(s.name or s.role.value, taken), s.role.value, s.model)
            for s in specs
            if s.remote is None and not installed(s.model, find)
        ]
        local = [s for s in specs if s.remote is None and installed(s.model, find)]
        self.models = [role_model(s, opts.gpus, opts.base, opts.fa, find) for s in local]
        self.skipped = [m for m in self.models if m.skipped]
        self.refused: list[Unplaced] = []
        self.refused_specs: dict[str, RoleSpec] = {}
        for m in self.models:
            if m.refused:
                name = unique_name(m.spec.name or m.spec.role.value, taken)
                self.refused.append(Unplaced(name, m.refused))
                self.refused_specs[name] = m.spec
        ready = [m for m in self.models if m.launch is not None]
        launches = [(m.spec, m.launch) for m in ready if m.launch is not None]
        self.instances = role_instances(launches, len(opts.gpus), taken)
        self.by_name: dict[str, Instance] = {i.name: i for i in self.instances}
        by_spec = {id(m.spec): m for m in ready}
        self.entries = {i.name: by_spec[id(i.spec)].entry for i in self.instances}
        self.projectors: dict[int, ModelMeta] = {}
        for m in ready:
            if m.spec.role is Role.VISION and m.entry.mmproj and m.launch is not None:
                proj = entry_for_path(m.entry.mmproj).meta
                if proj is not None:
                    self.projectors[id(m.launch.meta)] = proj

    def _build(self) -> int | None:
        """The llama.cpp build of the backend named (probed), None without one."""
        if not self.opts.backend or not self.entries:
            return None
        entry = next(iter(self.entries.values()))
        return backend_build(
            self.opts.backend, entry, probe=self.opts.probe, source=self.opts.source
        )

    def place(self) -> tuple[Placement, list[str]]:
        """The placement (search roles first, chat last, idle cards widening) and the
        warnings: chat below what was asked, auto replicas without a card, role notes.
        SizingError, or ValueError for a backend that cannot be used."""
        rules, rules_note = rules_for(self._build())
        if rules_note:
            notify.info(rules_note, source=self.opts.source)
        sizing = with_projectors(partial(estimate, rules=rules), self.projectors)
        stages = role_stages(self.instances)
        p = place_stages(stages, self.gpus, reserve=self.opts.reserve,
                         host_bytes=self.opts.host_bytes, estimate=sizing,
                         widen_idle=True)  # fmt: skip
        free = {d.device: d.free for d in p.gpus}
        traded = {
            u.name: t
            for u in p.unplaced
            if u.name in self.by_name
            and (t := trade_layers(self.by_name[u.name], u, free)) is not None
        }
        if traded:  # chat buys its minimum window with layers in system memory
            stages = [
                [replace(r, settings=traded[r.name][0]) if r.name in traded else r for r in st]
                for st in stages
            ]
            p = place_stages(stages, self.gpus, reserve=self.opts.reserve,
                             host_bytes=self.opts.host_bytes, estimate=sizing,
                             widen_idle=True)  # fmt: skip
        p, warnings = self._auto_replicas_left(p)
        warnings += [f"{x.name}: {traded[x.name][1]}" for x in p.placed if x.name in traded]
        short = tuple(
            grounded_refusal(self.by_name[u.name], u) if u.name in self.by_name else u
            for u in p.unplaced
        )
        p = replace(p, unplaced=(*short, *self.refused))
        for x in p.placed:
            warnings.extend(shortfalls(self.by_name[x.name], x))
        warnings += [
            f"{i.name}: {n}" for i in self.instances if i.replica == 0 for n in i.launch.notes
        ]
        return p, warnings

    def _auto_replicas_left(self, p: Placement) -> tuple[Placement, list[str]]:
        """Auto replicas that found no card are dropped with a note (auto is one per card
        that holds it), as long as their role has one placed."""
        placed = {x.name for x in p.placed}
        notes: list[str] = []
        kept: list[Unplaced] = []
        for u in p.unplaced:
            inst = self.by_name.get(u.name)
            auto = inst is not None and inst.spec.replicas is None
            if (
                auto
                and inst is not None
                and any(i.spec is inst.spec and i.name in placed for i in self.instances)
            ):
                notes.append(f"{u.name}: no card left for another {inst.spec.role.value} replica")
                continue
            kept.append(u)
        return replace(p, unplaced=tuple(kept)), notes

    def _pin(self, devices: Sequence[str], target: Target) -> DevicePin | None:
        """The cards an instance runs on; `--device none` for one in host memory when every
        GPU the engine offered was refused (as the plain placement's `_cpu_pin`)."""
        pin = DevicePin.for_devices(devices, self.gpus, target.variant)
        if pin is None and self.opts.device_none:
            return DevicePin.none(target.variant)
        return pin

    def commands(
        self, p: Placement, port: Port, *, loaded: LoadResult | None = None
    ) -> dict[str, Command]:
        """Each placed instance's command: its role's model, settings, cards and arguments
        (`loaded`: the settings whose registry finds the engine; None: read them now)."""
        resolver = Resolver(
            loaded if loaded is not None else load_quietly(),
            backend_arg=self.opts.backend,
            engine="llama",
            probe=self.opts.probe,
        )
        commands: dict[str, Command] = {}
        for i, x in enumerate(p.placed):
            inst, entry = self.by_name[x.name], self.entries[x.name]
            target = resolver.target(entry)
            if isinstance(target, str):
                commands[x.name] = skipped(target)
                continue
            commands[x.name] = emit_llama(
                replace(entry, meta=inst.launch.meta),
                x.settings,
                executable=target.executable,
                port=port(i),
                supported_flags=target.supported,
                valueless_flags=target.valueless,
                devices=self._pin(x.devices, target),
                extra_args=inst.launch.args,
            )
        return commands

    def annotate(
        self, doc: dict[str, Any], commands: dict[str, Command], ports: dict[str, int]
    ) -> None:
        """`doc` (the placement as JSON) with each row's role, replica, model and, placed,
        its port and argv."""
        for row in doc["models"]:
            inst = self.by_name.get(row["name"])
            if inst is None:
                spec = self.refused_specs.get(row["name"])
                if spec is not None:
                    row.update(role=spec.role.value, replica=0, replicas=0, model=spec.model)
                continue
            row.update(
                role=inst.spec.role.value,
                replica=inst.replica,
                replicas=inst.replicas,
                model=inst.spec.model,
                rerank_mode=inst.launch.mode.value if inst.launch.mode else None,
                context_asked=inst.launch.ctx_asked,
                slots_asked=inst.launch.slots_asked,
            )
            if row["placed"]:
                cmd = commands[row["name"]]
                row.update(port=ports[row["name"]], argv=list(cmd.argv), env=dict(cmd.env),
                           command_warnings=list(cmd.warnings))  # fmt: skip
        doc["skipped"] = [
            {"role": m.spec.role.value, "model": m.spec.model, "reason": m.skipped}
            for m in self.skipped
        ]
        doc["remote"] = [{"name": r.name, "role": r.role, "endpoint": r.endpoint}
                         for r in self.remote]  # fmt: skip
        doc["not_installed"] = [{"name": m.name, "role": m.role, "model": m.model}
                                for m in self.not_installed]  # fmt: skip


# --- one call: the window ----------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedInstance:
    """One engine of a planned role set: what it is, where it listens, what runs it."""

    name: str
    role: str
    replica: int
    replicas: int
    model: str  # as the role line names it (an id or a path)
    entry: ModelEntry  # the model as it is served
    port: int
    command: Command
    footprint: Footprint
    devices: tuple[str, ...]

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command.argv


@dataclass(frozen=True)
class RoleSetPlan:
    """A role set planned: its instances in placement order, what was not placed (with the
    reason), the warnings (skipped roles, chat below what was asked, role notes)."""

    instances: tuple[PlannedInstance, ...]
    unplaced: tuple[Unplaced, ...]
    warnings: tuple[str, ...]
    placement: Placement
    remote: tuple[RemoteRole, ...] = ()  # served elsewhere: nothing to start
    not_installed: tuple[NotInstalled, ...] = ()  # left out: the model is not on this machine

    @property
    def fits(self) -> bool:
        return not self.unplaced and not self.not_installed


def plan_role_set(
    roles: Sequence[str],
    opts: RoleSetOptions,
    ports: Callable[[int], int],
    *,
    find: Find | None = None,
    loaded: LoadResult | None = None,
) -> RoleSetPlan:
    """Plan `roles` for `opts`'s devices and emit each placed instance's command on the port
    `ports(n)` gives the n-th. Blocking (reads model headers, may probe the engine): a
    worker thread's job. RoleError for a line that cannot be read; SizingError/ValueError
    when the plan cannot be made."""
    check_roles(roles)
    rs = RoleSet([r.strip() for r in roles if r.strip()], opts, find=find)
    p, warnings = rs.place()
    chosen = {x.name: ports(i) for i, x in enumerate(p.placed)}
    commands = rs.commands(p, lambda i: chosen[p.placed[i].name], loaded=loaded)
    instances = []
    for x in p.placed:
        inst = rs.by_name[x.name]
        instances.append(
            PlannedInstance(
                name=x.name,
                role=inst.spec.role.value,
                replica=inst.replica,
                replicas=inst.replicas,
                model=inst.spec.model,
                entry=replace(rs.entries[x.name], meta=inst.launch.meta),
                port=chosen[x.name],
                command=commands[x.name],
                footprint=x.footprint,
                devices=tuple(x.devices),
            )
        )
    skipped_words = [m.skipped or "" for m in rs.skipped]
    missing = [m.sentence for m in rs.not_installed]
    return RoleSetPlan(
        tuple(instances), p.unplaced, (*missing, *skipped_words, *warnings), p,
        tuple(rs.remote), tuple(rs.not_installed),
    )  # fmt: skip
