"""`qmgui doctor`: what qmgui finds on this machine, what is missing, and how to fix each.

It looks, in order, at: qmgui and Python, Qt (PySide6 imports; a display to open the window
on), the NVIDIA driver and GPUs (NVML), the host (RAM, CPU), the settings file, the configured
backends (each executable checked and probed with a short timeout), a llama-server on PATH or
the test engine, the config and cache folders, the model roots, and the memory residuals
(what launches allocated against the plan; the engine's own projections, `qmgui plan
--check`, apart: a projection is not an allocation).

Each finding has a status: ``ok``; ``missing`` (absent, and fine: no GPU, no models, no
backends is a normal machine to plan on); ``warning`` (works, but worth a look); ``broken``
(something set up that does not work). Only ``broken`` changes the exit status.

Exit status: 0 nothing is broken, 1 something is broken (each says how to fix it), 2 a usage
error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from qmgui import __version__
from qmgui.cache import cache_dir
from qmgui.core.devices import HostGpu, Machine, merge, unseen_warning
from qmgui.core.probe import FailureKind, ProbeResult
from qmgui.core.units import format_bytes
from qmgui.engines import llama_run
from qmgui.engines.probe import probe, resolve_executable
from qmgui.hw.gpus import host_gpus
from qmgui.hw.host import HostInfo, read_host
from qmgui.hw.nvml import NvmlReading, read_nvml
from qmgui.settings import BackendEntry, LoadResult, config_dir, load_settings
from qmgui.stores import default_store_roots

EXIT_OK = 0
EXIT_BROKEN = 1
EXIT_USAGE = 2

PROBE_TIMEOUT_S = 5.0  # per command: a healthy engine answers --help in well under a second
# kinds whose executables are asked --version/--help/--list-devices; a "custom" entry may be
# any program (one that starts serving on unknown arguments), so it is only checked to exist
PROBED_KINDS = ("llama", "vllm", "whisper", "sd", "parakeet", "tts", "kokoro", "audiocpp")

OK, MISSING, WARNING, BROKEN = "ok", "missing", "warning", "broken"


@dataclass(frozen=True)
class Finding:
    """One line of the report: a status, a sentence, and how to fix it when not ok."""

    section: str
    status: str
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "section": self.section,
            "status": self.status,
            "message": self.message,
            "fix": self.fix,
        }


Section = tuple[Any, list[Finding]]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine: Qt, GPUs, host, backends, engines, folders, model roots",
        description="Print what qmgui finds on this machine and what is missing, each with a "
        "fix. No GPU, no models and no backends are fine: only something set up that does "
        "not work counts as broken.",
        epilog="exit status: 0 nothing is broken, 1 something is broken (see the 'broken' "
        "lines and their fixes), 2 a usage error",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with every section")
    p.add_argument(
        "--timeout",
        type=float,
        default=PROBE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time limit for each engine command probed (default {PROBE_TIMEOUT_S:g})",
    )
    p.set_defaults(func=cmd_doctor)


# --- sections ----------------------------------------------------------------------------------


def _qmgui() -> Section:
    data = {
        "version": __version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
    }
    msg = f"qmgui {__version__}, Python {data['python']} ({sys.executable}), {data['platform']}"
    return data, [Finding("qmgui", OK, msg)]


def _qt() -> Section:
    findings: list[Finding] = []
    data: dict[str, Any] = {"pyside6": None, "error": None}
    try:
        # the package only: importing the widget modules would need a display
        pyside = importlib.import_module("PySide6")
        data["pyside6"] = str(getattr(pyside, "__version__", "unknown"))
        findings.append(Finding("qt", OK, f"PySide6 {data['pyside6']} imports"))
    except Exception as e:
        data["error"] = f"{type(e).__name__}: {e}"
        findings.append(
            Finding(
                "qt",
                BROKEN,
                f"PySide6 does not import ({data['error']}), so the window cannot start",
                "reinstall qmgui's dependencies (pip install PySide6-Essentials); on Linux "
                "scripts/setup installs the system libraries Qt needs",
            )
        )
    env = {k: os.environ.get(k) for k in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    data.update({k.lower(): v for k, v in env.items()})
    if env["QT_QPA_PLATFORM"]:
        findings.append(
            Finding("qt", OK, f"Qt platform {env['QT_QPA_PLATFORM']} (from QT_QPA_PLATFORM)")
        )
    elif not sys.platform.startswith("linux"):
        findings.append(Finding("qt", OK, f"Qt uses the {sys.platform} desktop"))
    elif env["WAYLAND_DISPLAY"] or env["DISPLAY"]:
        which = "Wayland" if env["WAYLAND_DISPLAY"] else "X11"
        shown = env["WAYLAND_DISPLAY"] or env["DISPLAY"]
        findings.append(Finding("qt", OK, f"{which} display {shown}"))
    else:
        findings.append(
            Finding(
                "qt",
                MISSING,
                "no display (DISPLAY and WAYLAND_DISPLAY are unset): the window cannot open "
                "here; the command line works without one",
                "run qmgui in a desktop session (or ssh -X); for a window nobody sees, set "
                "QT_QPA_PLATFORM=offscreen",
            )
        )
    return data, findings


def _nvidia(reading: NvmlReading) -> Section:
    if reading.ok:
        findings = [Finding("nvidia", OK, reading.message)]
        for g in reading.gpus:
            procs = ", ".join(
                f"{p.name or 'pid'} {p.pid}"
                + (f" {format_bytes(p.used_bytes)}" if p.used_bytes is not None else "")
                for p in g.processes
            )
            findings.append(
                Finding(
                    "nvidia",
                    OK,
                    f"GPU {g.index} {g.name}: {format_bytes(g.total_bytes)} total, "
                    f"{format_bytes(g.free_bytes)} free"
                    + (f"; in use by {procs}" if procs else ""),
                )
            )
        findings += [Finding("nvidia", WARNING, p) for p in reading.problems]
        return reading.to_json(), findings
    status = BROKEN if reading.broken else MISSING
    return reading.to_json(), [Finding("nvidia", status, reading.message, reading.fix)]


def _host(host: HostInfo) -> Section:
    parts = []
    if host.ram_total_bytes is not None:
        parts.append(
            f"RAM {format_bytes(host.ram_total_bytes)} total, "
            f"{format_bytes(host.ram_available_bytes)} available"
        )
    cores = [
        f"{n} {what}"
        for n, what in ((host.physical_cores, "cores"), (host.logical_cores, "threads"))
        if n is not None
    ]
    cpu = host.cpu_model or host.machine or "unknown CPU"
    parts.append(f"CPU {cpu}" + (f" ({', '.join(cores)})" if cores else ""))
    if host.simd:
        parts.append("features " + " ".join(host.simd))
    findings = [Finding("host", OK, "; ".join(parts))]
    findings += [Finding("host", WARNING, p) for p in host.problems]
    return host.to_json(), findings


def _settings(loaded: LoadResult) -> Section:
    data = {
        "path": str(loaded.path) if loaded.path else None,
        "messages": list(loaded.messages),
        "read_only": loaded.read_only,
    }
    if loaded.messages:
        fix = (
            "fix, move or delete that file"
            if loaded.read_only
            else "repair the moved file and rename it back, or set the settings again"
        )
        return data, [Finding("settings", BROKEN, m, fix) for m in loaded.messages]
    exists = loaded.path is not None and loaded.path.exists()
    where = f"{loaded.path}" if exists else f"none yet ({loaded.path} is made on first save)"
    return data, [Finding("settings", OK, f"settings file {where}")]


_PROBE_FIXES = {
    FailureKind.MISSING: "fix the executable's path (qmgui backends), or install the engine",
    FailureKind.NOT_EXECUTABLE: "point the entry at the engine's binary and make it executable",
    FailureKind.NOT_STARTED: "run it by hand to see why the system refuses to start it",
    FailureKind.TIMED_OUT: "run it by hand: a build that hangs at start-up usually waits on a "
    "GPU driver that does not answer; try a CPU or Vulkan build",
    FailureKind.CRASHED: "run it by hand to see the whole error; install a build made for this "
    "machine's GPU runtime (CUDA, ROCm, Vulkan) or a CPU build",
}


def _probe_finding(section: str, label: str, result: ProbeResult) -> Finding:
    if result.failure is not None:
        return Finding(
            section, BROKEN, f"{label}: {result.failure}", _PROBE_FIXES[result.failure.kind]
        )
    status = WARNING if result.problems else OK
    text = f"{label}: {result.summary()}"
    if result.problems:
        text += "; " + " ".join(result.problems)
    return Finding(section, status, text)


def _devices_findings(
    label: str, entry: BackendEntry, result: ProbeResult, host: Sequence[HostGpu]
) -> list[Finding]:
    """The engine's device list against the host's GPUs: a GPU it did not list (named with
    the vendor's visibility variable), every GPU it offered refused."""
    if entry.kind != "llama" or not result.devices_listed:
        return []
    machine = Machine("engine", merge(result.devices, host), tuple(host), entry.executable)
    findings = []
    unseen = unseen_warning(machine, os.environ, vulkan=entry.variant == "vulkan")
    if unseen:
        findings.append(
            Finding(
                "backends",
                WARNING,
                f"{label}: {unseen}",
                "unset the variable, or register a build for that GPU's API",
            )
        )
    if machine.refused_all:
        findings.append(
            Finding(
                "backends",
                WARNING,
                f"{label}: every GPU it lists is refused ("
                + "; ".join(d.refused or "" for d in machine.devices)
                + "): its models are planned for the CPU and run with --device none",
            )
        )
    return findings


def _backend(
    entry: BackendEntry,
    timeout_s: float,
    prober: Callable[..., ProbeResult],
    host: Sequence[HostGpu] = (),
) -> Section:
    label = f"{entry.id} ({entry.kind})"
    data: dict[str, Any] = {
        "id": entry.id,
        "kind": entry.kind,
        "executable": entry.executable,
        "resolved": resolve_executable(entry.executable),
        "probe": None,
    }
    if entry.kind not in PROBED_KINDS:
        path = data["resolved"]
        runnable = path is not None and os.path.isfile(path) and os.access(path, os.X_OK)
        status = OK if runnable else BROKEN
        text = f"{label}: {entry.executable} " + ("is runnable (not probed)" if runnable else "")
        if not runnable:
            text += "is missing or not executable"
        fix = None if runnable else "fix the executable's path in the backend registry"
        data["status"] = status
        return data, [Finding("backends", status, text.strip(), fix)]
    result = prober(entry.executable, kind=entry.kind, timeout_s=timeout_s)
    if entry.kind == "llama":  # the fresh answer replaces the one plan and place keep
        from qmgui.service.devices import remember  # noqa: PLC0415 - llama entries only

        remember(entry.executable, result, host=host)
    data["probe"] = result.to_json()
    finding = _probe_finding("backends", label, result)
    findings = [finding, *_devices_findings(label, entry, result, host)]
    if result.ok and entry.version and result.version and entry.version != result.version:
        findings.append(
            Finding(
                "backends",
                WARNING,
                f"{label}: the registry says version {entry.version}, the executable says "
                f"{result.version}",
                "probe it again in the Backends dialog so its flags and devices are current",
            )
        )
    data["status"] = max((f.status for f in findings), key=_SEVERITY.index)
    return data, findings


def _backends(
    loaded: LoadResult,
    timeout_s: float,
    prober: Callable[..., ProbeResult],
    host: Sequence[HostGpu] = (),
) -> Section:
    entries = loaded.settings.backends
    if not entries:
        return [], [
            Finding(
                "backends",
                MISSING,
                "no backends configured",
                "add one: qmgui backends add llama --kind llama --exe /path/to/llama-server "
                "--default llm (or in the window's Backends dialog)",
            )
        ]
    data, findings = [], []
    for entry in entries:
        d, f = _backend(entry, timeout_s, prober, host)
        data.append(d)
        findings += f
    return data, findings


def _llama_server(timeout_s: float, prober: Callable[..., ProbeResult]) -> Section:
    on_path = shutil.which(llama_run.BINARY_NAME)
    path = on_path or llama_run.find_llama_server()
    if path is None:
        return {"path": None, "source": None, "probe": None}, [
            Finding(
                "llama_server",
                MISSING,
                "no llama-server on PATH and no test engine installed",
                "install llama.cpp (github.com/ggml-org/llama.cpp/releases) and put "
                "llama-server on PATH, or register it as a backend",
            )
        ]
    if on_path:
        source, where = "PATH", "on PATH"
    elif os.environ.get(llama_run.ENV_BINARY):
        source = where = f"${llama_run.ENV_BINARY}"
    else:
        source, where = "test-engine", "the test engine's pip package"
    result = prober(path, kind="llama", timeout_s=timeout_s)
    data = {"path": path, "source": source, "probe": result.to_json()}
    return data, [_probe_finding("llama_server", f"{path} ({where})", result)]


def _writable(folder: Path) -> tuple[bool, bool]:
    """(exists, can be written): an existing folder is tested by creating a temp file in it;
    a missing one can be written when its nearest existing parent can."""
    if folder.is_dir():
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError:
            return True, False
        return True, True
    parent = folder
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return False, parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def _folders() -> Section:
    data: dict[str, Any] = {}
    findings = []
    for name, folder, env in (
        ("config", config_dir(), "QMGUI_CONFIG_DIR"),
        ("cache", cache_dir(), "QMGUI_CACHE_DIR"),
    ):
        exists, writable = _writable(folder)
        data[name] = {"path": str(folder), "exists": exists, "writable": writable}
        if writable:
            state = "writable" if exists else "will be made on first use"
            findings.append(Finding("folders", OK, f"{name} folder {folder} ({state})"))
        else:
            findings.append(
                Finding(
                    "folders",
                    BROKEN,
                    f"{name} folder {folder} cannot be written",
                    f"fix its permissions, or set {env} to a folder you can write to",
                )
            )
    return data, findings


def _root_state(path: str) -> tuple[str, str]:
    p = Path(path).expanduser()
    try:
        if not p.exists():
            return MISSING, "not found (an offline drive, or moved)"
        if not p.is_dir():
            return WARNING, "is a file, not a folder"
        if not os.access(p, os.R_OK | os.X_OK):
            return WARNING, "cannot be read (permissions)"
    except OSError as e:
        return WARNING, f"cannot be checked ({e.strerror or e})"
    return OK, "found"


def _model_roots(loaded: LoadResult) -> Section:
    data, findings = [], []
    roots = [(r, "settings") for r in loaded.settings.model_roots]
    roots += [(str(p), "store") for p in default_store_roots() if str(p) not in dict(roots)]
    for root, source in roots:
        status, state = _root_state(root)
        data.append({"path": root, "source": source, "status": status, "state": state})
        fix = None
        if status == MISSING:
            fix = "reconnect the drive, or remove the folder from the model roots"
        elif status == WARNING:
            fix = "fix its permissions, or remove it from the model roots"
        kind = "model root" if source == "settings" else "model store"
        findings.append(Finding("model_roots", status, f"{kind} {root}: {state}", fix))
    if not roots:
        findings.append(
            Finding(
                "model_roots",
                MISSING,
                "no model roots configured and no LM Studio, Ollama or Hugging Face store found",
                "scan a folder (qmgui scan ~/models) or drop one on the window",
            )
        )
    return data, findings


def _residuals() -> Section:
    """The residual store in a line per kind: the launches' readbacks (bytes allocated
    against the plan; one beyond it is a warning) and, apart, the engine checks."""
    from qmgui.engines.residuals import CHECK, LAUNCH, ResidualStore  # noqa: PLC0415

    store = ResidualStore()
    summary = store.summary()
    launches, checks = summary[LAUNCH], summary[CHECK]
    data: dict[str, Any] = {"path": str(store.path), "launches": launches, "checks": checks}
    findings: list[Finding] = []
    if not launches and not checks:
        findings.append(
            Finding(
                "residuals", MISSING, "no launch readbacks or engine checks recorded yet",
                "qmgui serve records what a launch allocated against the plan; qmgui plan "
                "--check (or the window's 'Check with the engine') records llama-server's own "
                "projection beside it",
            )
        )  # fmt: skip
        return data, findings

    def key(e: dict[str, Any]) -> str:
        return f"{e.get('architecture') or 'unknown'} on {e.get('build') or 'an unknown build'}"

    if launches:
        n = sum(int(e.get("samples", 0)) for e in launches)
        over = [e for e in launches if int(e.get("overruns", 0))]
        msg = f"{n} launch readback(s) of {len(launches)} machine/build/architecture(s)"
        if over:
            where = ", ".join(key(e) for e in over[:3])
            findings.append(
                Finding(
                    "residuals", WARNING,
                    f"{msg}; the engine allocated beyond the plan in {len(over)}: {where}",
                    "qmgui serve --json shows the buffers per device; the plan's margin "
                    "(--reserve) covers the difference until the sizing does",
                )
            )  # fmt: skip
        else:
            findings.append(Finding("residuals", OK, f"{msg}, none beyond the plan"))
    for e in checks[:5]:
        mean = e.get("mean_mib") or {}
        parts = "/".join(f"{float(mean.get(k, 0)):+.2f}" for k in ("weights", "context", "compute"))
        findings.append(
            Finding(
                "residuals", OK,
                f"engine check (a projection, not an allocation) of {key(e)}: "
                f"{e.get('agreed', 0)} of {e.get('samples', 0)} agreed; engine − plan "
                f"weights/context/compute {parts} MiB on average",
            )
        )  # fmt: skip
    return data, findings


# --- the command -------------------------------------------------------------------------------

_SEVERITY = (OK, MISSING, WARNING, BROKEN)


_TITLES = {
    "qmgui": "qmgui",
    "qt": "Qt",
    "nvidia": "NVIDIA",
    "host": "Host",
    "settings": "Settings",
    "backends": "Backends",
    "llama_server": "llama-server",
    "folders": "Folders",
    "model_roots": "Model roots",
    "residuals": "Memory residuals",
}


def collect(
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
    nvml: Any = None,
    prober: Callable[..., ProbeResult] = probe,
) -> tuple[dict[str, Any], list[Finding]]:
    """Every section's data (for --json) and every finding, in report order. `nvml` and
    `prober` are the seams tests use (a recorded NVML, a fake probe)."""
    loaded = load_settings()
    reading = read_nvml(nvml)
    host = host_gpus(reading=reading)  # NVIDIA and AMD, to compare each engine's list with
    sections: list[tuple[str, Section]] = [
        ("qmgui", _qmgui()),
        ("qt", _qt()),
        ("nvidia", _nvidia(reading)),
        ("host", _host(read_host())),
        ("settings", _settings(loaded)),
        ("backends", _backends(loaded, timeout_s, prober, host)),
        ("llama_server", _llama_server(timeout_s, prober)),
        ("folders", _folders()),
        ("model_roots", _model_roots(loaded)),
        ("residuals", _residuals()),
    ]
    data = {name: section[0] for name, section in sections}
    findings = [f for _, section in sections for f in section[1]]
    return data, findings


def exit_status(findings: list[Finding]) -> int:
    return EXIT_BROKEN if any(f.status == BROKEN for f in findings) else EXIT_OK


def _print_report(findings: list[Finding], out: TextIO) -> None:
    width = max(len(s) for s in _SEVERITY)
    section = None
    for f in findings:
        if f.section != section:
            section = f.section
            print(_TITLES.get(section, section), file=out)
        print(f"  {f.status:<{width}}  {f.message}", file=out)
        if f.fix and f.status != OK:
            print(f"  {'':<{width}}  fix: {f.fix}", file=out)
    broken = [f for f in findings if f.status == BROKEN]
    missing = [f for f in findings if f.status == MISSING]
    if broken:
        counts: dict[str, int] = {}
        for f in broken:
            counts[f.section] = counts.get(f.section, 0) + 1
        where = ", ".join(f"{s} ({n})" if n > 1 else s for s, n in counts.items())
        print(f"\n{len(broken)} broken: {where}", file=out)
    else:
        tail = f" ({len(missing)} missing, which is fine)" if missing else ""
        print(f"\nNothing is broken{tail}.", file=out)


def cmd_doctor(args: argparse.Namespace, out: TextIO) -> int:
    if args.timeout <= 0:
        print("qmgui doctor: --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    data, findings = collect(timeout_s=args.timeout)
    status = exit_status(findings)
    if args.json:
        data["findings"] = [f.to_json() for f in findings]
        data["exit_status"] = status
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        _print_report(findings, out)
    return status
