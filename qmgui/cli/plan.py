"""`qmgui plan`: what one launch allocates, per GPU and in host memory."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import replace
from typing import Any, TextIO

from qmgui import notify
from qmgui.cli.profiles import (
    add_profile_flags,
    add_vllm_flags,
    given_fields,
    handle_profile_flags,
    saved_profile,
    track_given,
    vllm_values,
)
from qmgui.core.build_rules import rules_for
from qmgui.core.devices import Machine
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.errors import SizingError
from qmgui.core.fit import (
    Budget,
    FitResult,
    check,
    nearest_fit,
    noted,
)
from qmgui.core.footprint import CPU, DeviceFootprint, Footprint, Gpu
from qmgui.core.launch import (
    CACHE_TYPES,
    DEFAULT_BATCH,
    DEFAULT_UBATCH,
    MAX_SEQ,
    LaunchSettings,
)
from qmgui.core.meta import MAX_CONTEXT, ModelClass
from qmgui.core.profile import apply_profile, vllm_pins
from qmgui.core.repack import WHAT_IF_FEATURES, CpuTarget, target_from_capabilities
from qmgui.core.units import format_bytes, parse_size
from qmgui.hw.host import cpu_target, read_ram
from qmgui.hw.profiles import lookup
from qmgui.service.devices import read_machine, registered_engine
from qmgui.service.disk import disk_advice
from qmgui.service.projector import projector_meta

EXIT_OK = 0  # the launch fits
EXIT_NO_FIT = 1  # it does not fit (the nearest setting that fits is printed, when one does)
EXIT_USAGE = 2  # a usage error, or a model that cannot be planned (missing, broken, a projector)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="predict what one llama-server launch allocates, per GPU and in host memory",
        description="Predict every buffer llama-server allocates for MODEL with these "
        "settings (flag names as llama-server spells them). --gpu SIZE plans for a card that "
        "need not exist; with no --gpu the GPUs the registered llama-server lists are used "
        "(--list-devices; free memory from NVML and amdgpu), and with none the plan is "
        "CPU-only. The model's saved profile (--save, qmgui import, the window) fills "
        "the settings not given here.",
        epilog="exit status: 0 the launch fits; 1 it does not fit (the nearest setting that "
        'fits is printed, and is the "nearest" object of --json); 2 a usage error or a model '
        "that cannot be planned (missing, broken, incomplete, a vision projector)",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a .gguf file (any shard of a split set), or its http(s):// URL: only the header "
        "is read, with HTTP range requests ($HF_TOKEN is sent for gated models)",
    )
    add_plan_flags(p)
    p.add_argument(
        "--cpu-features",
        dest="cpu_features",
        default="host",
        metavar="LIST",
        help="the CPU features weight repacking follows, as llama-server's system_info line "
        "names them (AVX2, AVX512, AVX512_VNNI, AMX_INT8, NEON, DOTPROD, MATMUL_INT8, SVE), "
        "comma-separated, for a CPU that is not this one; 'host' (default): --backend's "
        "probed features, else this machine's; 'unknown': charge only an upper bound",
    )
    add_rpc_flag(p)
    add_profile_flags(p)
    p.add_argument("--json", action="store_true", help="print the plan as a JSON object")
    add_rules_flags(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="also run llama-server's own projection of this launch (-fit on, stopped before "
        "it loads any weight) and show it beside the plan per device",
    )
    p.set_defaults(func=cmd_plan)


def add_rules_flags(p: argparse.ArgumentParser) -> None:
    """`--backend ID|PATH` or `--build N`: whose allocation rules size the plan (`plan`)."""
    rules = p.add_mutually_exclusive_group()
    rules.add_argument(
        "--backend",
        metavar="ID|PATH",
        help="size by the allocation rules of this llama-server build (a registry id or the "
        "executable; its --version names the build)",
    )
    rules.add_argument(
        "--build",
        type=int,
        metavar="N",
        help="size by the rules of llama.cpp build bN (a build that need not be installed)",
    )


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    """The launch settings (llama-server's flag names), the GPUs to plan for and the engine:
    shared by `plan`, `preview` and `export`."""
    p.add_argument(
        "-c",
        "--ctx-size",
        "--ctx",
        "--max-model-len",
        dest="ctx",
        type=int,
        default=None,
        help="context size in tokens across all slots (default: the trained one)",
    )
    p.add_argument(
        "-np",
        "--parallel",
        dest="parallel",
        type=int,
        default=None,
        help="slots (default: auto = 4 with a unified KV cache)",
    )
    uni = p.add_mutually_exclusive_group()
    uni.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=None)
    uni.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false")
    p.add_argument("-b", "--batch-size", "--batch", dest="batch", type=int, default=DEFAULT_BATCH)
    p.add_argument(
        "-ub", "--ubatch-size", "--ubatch", dest="ubatch", type=int, default=DEFAULT_UBATCH
    )
    p.add_argument("-ctk", "--cache-type-k", dest="ctk", default="f16", choices=CACHE_TYPES)
    p.add_argument("-ctv", "--cache-type-v", dest="ctv", default="f16", choices=CACHE_TYPES)
    p.add_argument("-fa", "--flash-attn", dest="fa", default="auto", choices=("on", "off", "auto"))
    p.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="ngl",
        type=int,
        default=None,
        help="layers on the GPU, the output layer counted (default: all)",
    )
    p.add_argument("-ncmoe", "--n-cpu-moe", dest="n_cpu_moe", type=int, default=0)
    p.add_argument("-cmoe", "--cpu-moe", dest="cpu_moe", action="store_true")
    p.add_argument("--swa-full", action="store_true")
    p.add_argument("-nkvo", "--no-kv-offload", dest="no_kv_offload", action="store_true")
    p.add_argument(
        "-ts",
        "--tensor-split",
        dest="tensor_split",
        default=None,
        help="fractions per GPU, e.g. 3,1",
    )
    p.add_argument("--no-mmap", action="store_true")
    p.add_argument(
        "-nr",
        "--no-repack",
        dest="no_repack",
        action="store_true",
        help="no CPU weight repacking (the plan then charges no repacked copies)",
    )
    p.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="SIZE",
        help="plan for a GPU that need not exist: a size (24GiB, 80GB) or a card (4090, "
        "2x3090, a100 80gb); repeat for several",
    )
    add_reserve_flag(p)
    add_host_memory_flag(p)
    p.add_argument(
        "--engine",
        choices=("llama", "vllm"),
        default=None,
        help="plan for llama-server or vLLM (default: llama-server for GGUF, vLLM "
        "for Hugging Face folders)",
    )
    add_vllm_flags(p)
    track_given(p)


def add_reserve_flag(p: argparse.ArgumentParser) -> None:
    """`--reserve SIZE`: the headroom left free on every GPU (`plan`, `place`)."""
    p.add_argument(
        "--reserve",
        default="512MiB",
        metavar="SIZE",
        help="headroom left free on every GPU (default 512MiB)",
    )


def add_host_memory_flag(p: argparse.ArgumentParser) -> None:
    """`--host-memory SIZE|none`: the host RAM a plan's CPU part may use (`plan`, `preview`)."""
    p.add_argument(
        "--host-memory",
        default=None,
        metavar="SIZE",
        help="host RAM the CPU part of a plan may use (default: this machine's RAM; "
        "'none' does not check it)",
    )


def host_memory_from(args: argparse.Namespace) -> int | None:
    """`--host-memory`: a size, 'none' (not checked), or this machine's total RAM (None when
    it cannot be read: then host memory is not checked, as before)."""
    text = getattr(args, "host_memory", None)
    if text is not None:
        return None if text.strip().lower() == "none" else parse_size(text)
    total, _ = read_ram()
    return total


def add_rpc_flag(p: argparse.ArgumentParser) -> None:
    """`--rpc HOST:PORT=SIZE`: llama.cpp rpc-servers as devices (`plan`, `place`)."""
    p.add_argument(
        "--rpc",
        action="append",
        default=[],
        metavar="HOST:PORT=SIZE",
        help="a llama.cpp rpc-server as a device: its address and memory (a size or a card, "
        "like --gpu), optionally /BACKEND for the remote build's allocation rules (cuda, "
        "vulkan, metal, cpu; default: the card's, else cuda), e.g. 10.0.0.2:50052=24GiB or "
        "10.0.0.3:50052=3090 or 127.0.0.1:50052=16GiB/cpu; repeat for several. llama.cpp "
        "lists remote devices before the local GPUs",
    )


RPC_BACKENDS = ("cuda", "vulkan", "metal", "cpu")


def rpc_gpus(texts: list[str]) -> tuple[Gpu, ...]:
    """`--rpc` values as devices, named as llama.cpp names their buffers: `RPC0[host:port]`
    (device 0 of that server). ValueError with a sentence for anything unreadable."""
    gpus: list[Gpu] = []
    for text in texts:
        addr, sep, what = text.strip().partition("=")
        host, _, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not what:
            raise ValueError(
                f"--rpc {text}: give the rpc-server's HOST:PORT=SIZE, e.g. 192.168.1.20:50052=24GiB"
            )
        what, _, backend = what.partition("/")
        cards = lookup(what)
        if len(cards) != 1:
            raise ValueError(f"--rpc {text}: one device per --rpc (repeat the flag for more)")
        backend = backend.strip().lower() or cards[0].backend
        if backend not in RPC_BACKENDS:
            raise ValueError(f"--rpc {text}: the backend is one of {', '.join(RPC_BACKENDS)}")
        if any(g.endpoint == addr for g in gpus):
            raise ValueError(f"--rpc {addr} is given twice")
        gpus.append(Gpu(f"RPC0[{addr}]", cards[0].total_bytes, backend=backend, endpoint=addr))
    return tuple(gpus)


def gpus_from(args: argparse.Namespace) -> tuple[Gpu, ...]:
    """The devices to plan for: `--rpc` servers first (llama.cpp's order), then the `--gpu`
    sizes, else this machine's (`local_machine`; none and no `--rpc`: CPU only)."""
    remote = rpc_gpus(getattr(args, "rpc", None) or [])
    return (*remote, *_local_gpus(args))


def _local_gpus(args: argparse.Namespace) -> tuple[Gpu, ...]:
    if args.gpu:
        # cards ("4090", "2x3090") keep their name beside the index; plain sizes are GPUi
        gpus: list[Gpu] = []
        for text in args.gpu:
            plain = _is_size(text)
            for g in lookup(text):
                card = "" if plain else g.name[g.name.index(" ") :]
                gpus.append(replace(g, name=f"GPU{len(gpus)}{card}"))
        return tuple(gpus)
    # the registered build's --list-devices, free memory from NVML / amdgpu sysfs; without
    # a build that answers, NVIDIA (NVML) then AMD (sysfs) as GPU0, GPU1…
    return local_machine(args).gpus


def local_machine(args: argparse.Namespace) -> Machine:
    """This machine's devices for `args` (`service.devices`): the build `--backend` names or
    the registry's llama-server, listed once per run (kept on `args`); what is worth saying
    (a GPU it did not list, every GPU refused) is said once, as a warning."""
    kept = getattr(args, "_machine", None)
    if isinstance(kept, Machine):
        return kept
    engine = registered_engine(getattr(args, "backend", None))
    machine = read_machine(engine, probe_engine=not getattr(args, "no_probe", False))
    for note in machine.notes:
        notify.warning(note, source=getattr(args, "command", None) or "plan")
    args._machine = machine
    return machine


def _is_size(text: str) -> bool:
    """A size with its unit ("24GiB", "80GB"); a bare number is a card ("4090")."""
    if not text.strip()[-1:].isalpha():
        return False
    try:
        parse_size(text)
    except ValueError:
        return False
    return True


def _in_range(flag: str, value: int | None, lo: int, hi: int, sentence: str) -> None:
    if value is not None and not lo <= value <= hi:
        raise ValueError(f"{flag} {value}: {sentence}")


def check_ranges(args: argparse.Namespace) -> None:
    """Refuse launch flags outside the range the engine takes, with a sentence giving the
    range (ValueError): a negative or zero context, slot count or batch, -ngl below -1."""
    _in_range(
        "-c/--ctx-size",
        args.ctx,
        1,
        MAX_CONTEXT,
        f"give a context of 1 to {MAX_CONTEXT:,} tokens, or leave -c out for the model's "
        "trained context",
    )
    if args.parallel is not None and args.parallel != -1:
        _in_range(
            "-np/--parallel",
            args.parallel,
            1,
            MAX_SEQ,
            f"give 1 to {MAX_SEQ} slots, or -1 (auto)",
        )
    for flag, value in (("-b/--batch-size", args.batch), ("-ub/--ubatch-size", args.ubatch)):
        _in_range(flag, value, 1, MAX_CONTEXT, f"give 1 to {MAX_CONTEXT:,} tokens")
    _in_range(
        "-ngl/--n-gpu-layers",
        args.ngl,
        -1,
        1 << 31,
        "give the number of layers on the GPU (0 or more), or -1 for all",
    )
    _in_range("-ncmoe/--n-cpu-moe", args.n_cpu_moe, 0, 1 << 31, "give 0 or more layers")


def tensor_split_of(text: str) -> tuple[float, ...]:
    try:
        split = tuple(float(x) for x in text.replace("/", ",").split(","))
    except ValueError:
        split = ()
    if not split or not all(math.isfinite(x) and x >= 0 for x in split) or not any(split):
        raise ValueError(
            f"-ts/--tensor-split {text}: give a share per GPU, numbers of 0 or more (not all "
            "0), e.g. 3,1"
        )
    return split


def launch_settings_from(args: argparse.Namespace) -> LaunchSettings:
    """The LaunchSettings the flags of `add_plan_flags` describe (ValueError with a sentence
    giving the valid range when a flag is malformed or out of range)."""
    check_ranges(args)
    split: tuple[float, ...] = ()
    if args.tensor_split:
        split = tensor_split_of(args.tensor_split)
    return LaunchSettings(
        ctx_size=args.ctx,
        parallel=args.parallel,
        kv_unified=args.kv_unified,
        batch_size=args.batch,
        ubatch_size=args.ubatch,
        cache_type_k=args.ctk,
        cache_type_v=args.ctv,
        flash_attn=args.fa,
        n_gpu_layers=args.ngl,
        n_cpu_moe=args.n_cpu_moe,
        cpu_moe=args.cpu_moe,
        swa_full=args.swa_full,
        kv_offload=not args.no_kv_offload,
        tensor_split=split,
        mmap=not args.no_mmap,
        repack=not args.no_repack,
    )


def cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    try:
        gpus = gpus_from(args)
        reserve = parse_size(args.reserve, allow_zero=True)
        host = host_memory_from(args)
        settings = launch_settings_from(args)
    except ValueError as e:
        notify.error(str(e), source="plan")
        return EXIT_USAGE
    remote: dict[str, int] = {}
    if _URL.match(args.model):  # other schemes than http(s) are an error on the entry
        entry, remote = _read_remote(args.model)
    else:
        entry = entry_for_path(args.model)
    if entry.meta is None or entry.error:
        notify.error(f"{args.model}: {entry.error or 'not a model'}", source="plan")
        return EXIT_USAGE
    if entry.model_class == ModelClass.PROJECTOR:
        notify.error(
            f"{args.model}: a vision projector (mmproj), not a model of its own; plan the "
            "language model it belongs with"
            if remote
            else projector_sentence(args.model),
            source="plan",
        )
        return EXIT_USAGE
    code = handle_profile_flags(args, entry, source="plan")
    if code is not None:
        return code
    profile = saved_profile(entry)
    given = given_fields(args)
    settings = apply_profile(settings, profile, given=given)
    # a model on a network filesystem is read into RAM once (--no-mmap) when it fits
    settings, disk = disk_advice(entry, settings, given, ram_bytes=host)
    engine = args.engine or ("llama" if entry.format == "gguf" else "vllm")
    if engine == "vllm":
        return _cmd_plan_vllm(entry, gpus, args, out, profile, reserve=reserve, remote=remote)
    if entry.format != "gguf":
        notify.error(
            f"{args.model}: llama-server plans need a GGUF file; this is a "
            f"{entry.format} model (plan it for vLLM: --engine vllm)",
            source="plan",
        )
        return EXIT_USAGE
    try:
        rules, rules_note = rules_for(
            args.build if args.build is not None else _backend_build(args, entry)
        )
        rules = replace(rules, cpu=cpu_target_from(args, rules.build))
        budget = Budget(gpus=gpus, gpu_reserve=reserve, host_bytes=host, rules=rules)
        proj = projector_meta(entry)
        result = check(entry.meta, settings, budget, mmproj=proj)
        result = noted(result, disk.note, disk.warning)
        result = noted(result, rules_note)
        near = None if result.fits else nearest_fit(entry.meta, settings, budget, mmproj=proj)
    except (SizingError, ValueError) as e:  # ValueError: a --backend that cannot be used
        notify.error(str(e), source="plan")
        return EXIT_USAGE
    near_json = _nearest_json(result, near)
    checked = _engine_check(args, entry, result, gpus, reserve) if args.check else None
    if args.json:
        extra = {"check": checked} if checked is not None else {}
        json.dump({**_plan_json(result), "nearest": near_json, **remote, **extra}, out, indent=2)
        out.write("\n")
    else:
        _print_plan(entry, result, out)
        if not result.fits:
            print(_nearest_line(near_json), file=out)
        _print_transfer(remote, out)
        if checked is not None:
            _print_check(checked, out)
    return EXIT_OK if result.fits else EXIT_NO_FIT


def cpu_target_from(args: argparse.Namespace, build: int | None) -> CpuTarget | None:
    """`--cpu-features`: this machine's CPU (host), none known (unknown), or a what-if list
    of system_info names (REPACK, compiled in by default, is implied)."""
    text = str(getattr(args, "cpu_features", "host") or "host").strip()
    if text.lower() == "host":
        return _probed_cpu(args, build) or cpu_target(build)
    if text.lower() in ("unknown", "none"):
        return None
    names = {f.strip().upper() for f in text.split(",") if f.strip()}
    unknown = names - WHAT_IF_FEATURES
    if unknown:
        raise ValueError(
            f"--cpu-features: {', '.join(sorted(unknown))} not known (use "
            f"{', '.join(sorted(WHAT_IF_FEATURES))}, 'host' or 'unknown')"
        )
    return CpuTarget(frozenset(names | {"REPACK"}), source="what-if", build=build)


def _probed_cpu(args: argparse.Namespace, build: int | None) -> CpuTarget | None:
    """The CPU features `--backend`'s registered build printed when it was probed (its
    system_info line), None without them."""
    backend = getattr(args, "backend", None)
    if not backend:
        return None
    from qmgui.core.backends import find_backend  # noqa: PLC0415 - --backend only
    from qmgui.service.launch import load_quietly  # noqa: PLC0415 - --backend only

    named = find_backend([e.to_core() for e in load_quietly().settings.backends], backend)
    return None if named is None else target_from_capabilities(named.capabilities, build)


def _engine_check(
    args: argparse.Namespace, entry: ModelEntry, result: FitResult, gpus: tuple[Gpu, ...],
    reserve: int,
) -> dict[str, Any]:  # fmt: skip
    """`--check`: the engine's own projection of this launch (llama-server -fit on, stopped
    before it loads), beside the plan per device, recorded in the residual store as an
    engine check (apart from a launch's readbacks)."""
    from qmgui.engines.fit_check import check_launch  # noqa: PLC0415 - --check only
    from qmgui.service.launch import Request, Resolver, emit_model, load_quietly  # noqa: PLC0415

    resolver = Resolver(load_quietly(), backend_arg=getattr(args, "backend", None))
    target = resolver.target(entry)
    if isinstance(target, str) or target.kind != "llama":
        why = target if isinstance(target, str) else f"{target.kind} has no -fit projection"
        return {"devices": [], "error": why}
    req = Request(settings=result.settings, gpus=gpus, reserve=reserve, port=8080, extra=())
    command = emit_model(entry, target, req, resolver.override(entry)).command
    if not command.runnable:
        return {"devices": [], "error": "; ".join(command.warnings)}
    checked = check_launch(command.argv, result.footprint, meta=entry.meta)
    return {
        "engine": target.executable,
        "build": checked.build,
        "devices": [row.to_json() for row in checked.rows],
        "residuals_mib": checked.residuals_mib() if checked.comparable else None,
        "error": checked.error or None,
    }


def _print_check(checked: dict[str, Any], out: TextIO) -> None:
    print("\nthe engine's own projection (llama-server -fit on, stopped before it loads; whole"
          " MiB):", file=out)  # fmt: skip
    if checked.get("error"):
        print(f"  no projection: {checked['error']}", file=out)
    for row in checked["devices"]:
        ours = "/".join(f"{x:.2f}" for x in row["planned_mib"])
        theirs = "/".join(str(x) for x in row["engine_mib"])
        verdict = "agrees" if row["agrees"] else "differs"
        print(
            f"  {row['device']} ({row['engine_device']}): weights/context/compute "
            f"planned {ours} MiB, engine {theirs} MiB: {verdict}",
            file=out,
        )
    if checked["devices"]:
        print("  recorded with the memory residuals as an engine check (a projection, not an "
              "allocation)", file=out)  # fmt: skip


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # MODEL written as a URL, not a path


def _backend_build(args: argparse.Namespace, entry: ModelEntry) -> int | None:
    """The build of `--backend` (probed once: its --version and --help), None without it."""
    if not getattr(args, "backend", None):
        return None
    from qmgui.service.launch import backend_build  # noqa: PLC0415 - --backend only

    return backend_build(args.backend, entry)


def _read_remote(url: str) -> tuple[ModelEntry, dict[str, int]]:
    """The entry of the GGUF at `url`, its header read over HTTP (qmgui.remote, imported only
    here so a local plan loads no network code), with the bytes that took."""
    from qmgui import remote as net  # noqa: PLC0415

    read = net.read_url(url)
    return read.entry, {
        "transferred_bytes": read.transferred_bytes,
        "remote_size_bytes": read.size_bytes,
        "requests": read.requests,
    }


def _print_transfer(remote: dict[str, int], out: TextIO) -> None:
    """The line saying what reading a remote header cost (nothing for a local file)."""
    if not remote:
        return
    moved, size = remote["transferred_bytes"], remote["remote_size_bytes"]
    share = f", {moved / size:.3%} of {format_bytes(size)}" if size else ""
    n = remote["requests"]
    print(
        f"header read over HTTP: {format_bytes(moved)} transferred ({moved:,} bytes{share}) "
        f"in {n} request{'s' if n != 1 else ''}",
        file=out,
    )


def _nearest_line(near: dict[str, Any] | None) -> str:
    if near is None:
        return "nearest fit: none (not even the smallest context with every layer on the CPU fits)"
    return f"nearest fit: {' '.join(near['args'])}  ({near['summary']})"


def projector_sentence(path: str) -> str:
    """Why a vision projector (mmproj) is not planned as a model, naming the models of its
    folder it belongs with (as a scan pairs them), if any."""
    owners = projector_owners(path)
    if owners:
        names = ", ".join(owners[:3]) + (f" and {len(owners) - 3} more" if len(owners) > 3 else "")
        belongs = f"it belongs with {names}: plan that model (its projector is added to it)"
    else:
        belongs = "plan the language model it belongs with (no model beside it uses it)"
    return f"{path}: a vision projector (mmproj), not a model of its own; {belongs}"


def projector_owners(path: str, most: int = 32) -> list[str]:
    """The models beside the projector `path` that a scan pairs it with."""
    folder = os.path.dirname(path) or "."
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    target = os.path.realpath(path)
    owners: list[str] = []
    models = [n for n in names if n.lower().endswith(".gguf") and "mmproj" not in n.lower()]
    for name in models[:most]:  # headers only, but a folder of hundreds is not read whole
        entry = entry_for_path(os.path.join(folder, name))
        if entry.mmproj and os.path.realpath(entry.mmproj) == target and entry.path.endswith(name):
            owners.append(entry.name)
    return owners


def _nearest_json(result: FitResult, near: LaunchSettings | None) -> dict[str, Any] | None:
    """What the nearest setting changes, as llama-server flags and resolved numbers."""
    if near is None:
        return None
    asked = result.footprint.settings  # the request as the engine resolves it
    args: list[str] = []
    changes: list[str] = []
    if near.ctx_size is not None and near.ctx_size != asked.n_ctx:
        args += ["-c", str(near.ctx_size)]
        changes.append(f"context {near.ctx_size:,} instead of {asked.n_ctx:,}")
    if near.n_gpu_layers is not None and near.n_gpu_layers != result.footprint.n_gpu_layers:
        args += ["-ngl", str(near.n_gpu_layers)]
        changes.append(f"{near.n_gpu_layers} GPU layers instead of {result.footprint.n_gpu_layers}")
    if near.n_cpu_moe != result.settings.n_cpu_moe:
        args += ["-ncmoe", str(near.n_cpu_moe)]
        layers = "layer" if near.n_cpu_moe == 1 else "layers"
        changes.append(f"experts of {near.n_cpu_moe} {layers} on the CPU")
    return {
        "ctx_size": near.ctx_size if near.ctx_size is not None else asked.n_ctx,
        "n_gpu_layers": (
            near.n_gpu_layers if near.n_gpu_layers is not None else result.footprint.n_gpu_layers
        ),
        "n_cpu_moe": near.n_cpu_moe,
        "args": args,
        "summary": ", ".join(changes) or "the same settings",
    }


def _plan_json(result: FitResult) -> dict[str, object]:
    r = result.footprint.settings
    return {
        "settings": {
            "n_ctx": r.n_ctx,
            "n_ctx_seq": r.n_ctx_seq,
            "n_seq": r.n_seq,
            "kv_unified": r.kv_unified,
            "n_batch": r.n_batch,
            "n_ubatch": r.n_ubatch,
            "cache_type_k": r.cache_type_k,
            "cache_type_v": r.cache_type_v,
            "flash_attn": r.flash_attn,
            "swa_full": r.swa_full,
            "n_gpu_layers": result.footprint.n_gpu_layers,
        },
        "devices": [d.to_json() for d in result.footprint.devices],
        "fits": result.fits,
        "verdict": result.verdict,
        "reason": result.reason,
        "warnings": list(result.warnings),
        "notes": list(result.footprint.notes),
        # buffers charged as upper bounds (no exact model): part, device, bytes, why
        "bounds": [b.to_json() for b in result.footprint.bounds],
    }


def _print_plan(entry: ModelEntry, result: FitResult, out: TextIO) -> None:
    fp = result.footprint
    r = fp.settings
    print(
        f"{entry.name}  ({entry.meta.architecture if entry.meta else '?'}, "
        f"{format_bytes(entry.size_bytes)})",
        file=out,
    )
    print(
        f"context {r.n_ctx} ({r.n_seq} slots, {r.n_ctx_seq} per slot, "
        f"{'unified' if r.kv_unified else 'separate'} KV), batch {r.n_batch}/{r.n_ubatch}, "
        f"KV {r.cache_type_k}/{r.cache_type_v}, flash attention "
        f"{'on' if r.flash_attn else 'off'}, {fp.n_gpu_layers} GPU layers",
        file=out,
    )
    cols = ("DEVICE", "WEIGHTS", "REPACK", "KV", "STATE", "COMPUTE", "OUTPUT", "OTHER", "TOTAL")
    rows = [cols] + [
        (
            d.name,
            format_bytes(d.weights),
            _repack_cell(d),
            format_bytes(d.kv),
            format_bytes(d.recurrent),
            _bounded(fp, d.name, d.compute),
            format_bytes(d.output),
            format_bytes(d.other),
            _bounded(fp, d.name, d.total),
        )
        for d in fp.devices
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    for row in rows:
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ),
            file=out,
        )
    if fp.host.mapped:
        print(
            f"host: {format_bytes(fp.host.resident)} resident + {format_bytes(fp.host.mapped)} "
            "mapped (the model file, reclaimable)",
            file=out,
        )
    print(result.verdict if result.fits else f"does not fit: {result.reason}", file=out)
    for b in fp.bounds:
        print(f"bound: {b.device} {b.part} {_bound_text(b.bytes)}: {b.why}", file=out)
    for warning in result.warnings:
        print(f"warning: {warning}", file=out)
    for note in fp.notes:
        print(f"note: {note}", file=out)


def _repack_cell(d: DeviceFootprint) -> str:
    """The repacked copies: exact, a bound (not in the total) where the CPU is not known, or
    '-' on a GPU."""
    if d.repack:
        return format_bytes(d.repack)
    if d.repack_bound:
        return f"≤ {format_bytes(d.repack_bound)}"
    return format_bytes(0) if d.name == CPU else "-"


def _bound_text(n: int) -> str:
    return f"≤ {format_bytes(n)} (bound)"


def _bounded(fp: Footprint, device: str, n: int) -> str:
    """A figure of the plan's table: marked "≤ … (bound)" where part of it is an upper bound
    (Footprint.bounds), plain where every part is an estimate."""
    return _bound_text(n) if fp.bounded(device) else format_bytes(n)


def _cmd_plan_vllm(
    entry: ModelEntry,
    gpus: tuple[Gpu, ...],
    args: argparse.Namespace,
    out: TextIO,
    profile: dict[str, Any],
    *,
    reserve: int = 0,
    remote: dict[str, int] | None = None,
) -> int:
    # GGUF plans never need these
    from qmgui.core.vllm import budget_per_gpu, plan_vllm  # noqa: PLC0415

    assert entry.meta is not None
    remote = remote or {}
    gpu = gpus[0] if gpus else None
    try:
        values = {**profile, **vllm_values(args)}
        if args.ctx is not None:
            values["ctx_size"] = args.ctx
        plan = plan_vllm(
            entry.meta,
            gpu_total_bytes=gpu.total_bytes if gpu else None,
            # --reserve as `preview` applies it: the card's free memory less the headroom
            budget_bytes=budget_per_gpu(
                values.get("vllm_budget_bytes"),
                available=gpu.available if gpu else None,
                reserve=reserve,
            ),
            tensor_parallel=max(len(gpus), 1),
            pins=vllm_pins(values),
            is_split_gguf=len(entry.shards) > 1,
        )
    except (SizingError, ValueError) as e:
        notify.error(str(e), source="plan")
        return EXIT_USAGE
    if args.json:
        json.dump(
            {
                "engine": "vllm",
                "max_model_len": plan.max_model_len,
                "gpu_memory_utilization": plan.gpu_memory_utilization,
                "kv_cache_memory_bytes": plan.kv_cache_memory_bytes,
                "charge_bytes": plan.charge_bytes,
                "tensor_parallel": plan.tensor_parallel,
                "args": list(plan.args),
                "fits": plan.fits,
                "reason": plan.reason,
                "skipped": plan.skipped,
                "notes": list(plan.notes),
                "nearest": None,  # vLLM chooses its own context and memory share
                **remote,
            },
            out,
            indent=2,
        )
        out.write("\n")
        return _vllm_status(plan.skipped, plan.fits)
    print(f"{entry.name}  (vLLM, {entry.meta.architecture})", file=out)
    if plan.skipped:
        print(f"skipped: {plan.reason}", file=out)
        return _vllm_status(plan.skipped, plan.fits)
    print(
        f"max-model-len {plan.max_model_len}, gpu-memory-utilization "
        f"{plan.gpu_memory_utilization}, charge {format_bytes(plan.charge_bytes)} per GPU",
        file=out,
    )
    print("vllm serve " + entry.path + " " + " ".join(plan.args), file=out)
    print("fits" if plan.fits else f"does not fit: {plan.reason}", file=out)
    for note in plan.notes:
        print(f"note: {note}", file=out)
    _print_transfer(remote, out)
    return _vllm_status(plan.skipped, plan.fits)


def _vllm_status(skipped: bool, fits: bool) -> int:
    """vLLM cannot serve the model at all: as a model that cannot be planned (2)."""
    if skipped:
        return EXIT_USAGE
    return EXIT_OK if fits else EXIT_NO_FIT
