"""What an engine binary says about itself: `--version`, `--help` and `--list-devices`, parsed.

`qmgui.engines.probe` runs the binary (bounded) and hands the captured outputs here as
`RunOutput` values; this module never starts a process. `build_probe` turns them into one
frozen `ProbeResult`:

- the version: llama.cpp prints ``version: 0.1.0-dev (build 1, commit 7e4c0a9)`` (since the
  0.x versioning) or ``version: 4500 (adc5dd92)`` (older builds, reported as ``b4500``), then
  ``built with <compiler> for <target>``; a bare ``0.6.3.post1`` (vLLM) is read too, anything
  else leaves the version ``None``;
- the options from ``--help``, kept as alias groups (``-ngl, --gpu-layers, --n-gpu-layers N``
  is one group) so an emitter can find the spelling a build understands (`flag_spelling`); an
  option llama.cpp lists as "has been removed" is kept as a group but is not a supported flag;
- the devices from ``--list-devices`` (``  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB
  free)``), for every ggml backend (CUDA, ROCm, MUSA, Vulkan, SYCL, Metal, RPC…);
- llama-server's ``system_info:`` line (``CPU : AVX2 = 1 | ... | REPACK = 1``): the CPU
  features of the variant this build runs on this machine, which CPU weight repacking follows
  (`qmgui.core.repack`). It is printed at start-up, so the probe starts the server on a model
  that does not exist (`SYSTEM_INFO_ARGS`): it prints the line and exits at once.

A probe that could not run is a value too: `ProbeResult.failure` says, in a sentence, whether
the executable is missing, not executable, timed out or crashed (with its exit status and the
last lines it printed). Output formats this module does not know (whisper.cpp, vLLM, a custom
script) give what can be read and ``None`` for the rest, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from qmgui.core.footprint import Gpu
from qmgui.core.repack import CpuTarget, parse_system_info
from qmgui.core.textsafe import printable

__all__ = [
    "ARG_HELP",
    "ARG_LIST_DEVICES",
    "ARG_VERSION",
    "EQUIVALENT_FLAGS",
    "SYSTEM_INFO_ARGS",
    "EngineDevice",
    "FailureKind",
    "FlagGroup",
    "ProbeFailure",
    "ProbeResult",
    "RunOutput",
    "StartError",
    "VersionInfo",
    "build_probe",
    "find_group",
    "flag_spelling",
    "parse_devices",
    "parse_help",
    "parse_version",
    "probe_commands",
    "renamed_or_missing",
]

ARG_VERSION = "--version"
ARG_HELP = "--help"
ARG_LIST_DEVICES = "--list-devices"
# a llama-server start that only prints its system_info line: a model that does not exist (it
# exits with status 1 before loading anything), info logs, an ephemeral loopback port. A build
# that does not know `-lv` refuses the option and prints no line: the features stay unknown.
NO_MODEL = "qmgui-probe-no-such-model.gguf"
SYSTEM_INFO_ARGS = ("-m", NO_MODEL, "-lv", "4", "--host", "127.0.0.1", "--port", "0")

TAIL_LINES = 8  # lines of output quoted when a run crashed: enough for a loader or CUDA error

# --- the runs ------------------------------------------------------------------------------


def probe_commands(kind: str = "llama") -> tuple[tuple[str, ...], ...]:
    """The argument lists a probe runs for a backend of `kind` (settings' `BackendKind`).

    vLLM's options belong to its `serve` subcommand and it has no device listing (and every
    call imports torch, seconds each), so it gets two runs; every other kind gets the three
    llama.cpp-style runs, which a binary that does not know them answers harmlessly.
    """
    if kind == "vllm":
        return ((ARG_VERSION,), ("serve", ARG_HELP))
    if kind == "llama":  # llama-server: and its CPU features (SYSTEM_INFO_ARGS)
        return ((ARG_VERSION,), (ARG_HELP,), (ARG_LIST_DEVICES,), SYSTEM_INFO_ARGS)
    return ((ARG_VERSION,), (ARG_HELP,), (ARG_LIST_DEVICES,))


class StartError(Enum):
    """Why a run never started."""

    MISSING = "missing"  # no such file (or not on PATH)
    NOT_EXECUTABLE = "not-executable"  # no execute permission, a folder, not a program
    NOT_STARTED = "not-started"  # the OS refused for another reason (out of memory, …)


@dataclass(frozen=True)
class RunOutput:
    """One bounded run of the binary: its output (stdout and stderr interleaved, decoded) and
    how it ended. ``returncode`` is negative for a signal (POSIX) and ``None`` when the run
    was stopped by the prober or never started."""

    argv: tuple[str, ...]
    output: str = ""
    returncode: int | None = None
    timed_out: bool = False
    truncated: bool = False  # more output than the prober keeps: the middle was left out
    unreaped: bool = False  # still not reaped after SIGKILL and the reap timeout
    wall_s: float = 0.0
    timeout_s: float | None = None
    start_error: StartError | None = None
    start_detail: str | None = None  # the OS's words for start_error

    @property
    def args(self) -> tuple[str, ...]:
        """The arguments after the executable."""
        return self.argv[1:]

    @property
    def started(self) -> bool:
        return self.start_error is None


# --- failures ------------------------------------------------------------------------------


class FailureKind(Enum):
    MISSING = "missing"
    NOT_EXECUTABLE = "not-executable"
    NOT_STARTED = "not-started"
    TIMED_OUT = "timed-out"
    CRASHED = "crashed"  # killed by a signal, or a non-zero exit that was not "unknown option"


@dataclass(frozen=True)
class ProbeFailure:
    """Why a run (or the whole probe) failed, as a sentence a user can act on (``str()``)."""

    kind: FailureKind
    executable: str
    args: tuple[str, ...]
    message: str
    returncode: int | None = None
    tail: tuple[str, ...] = ()  # the last lines the binary printed

    def __str__(self) -> str:
        return self.message


_SIGNALS = {
    1: "SIGHUP",
    2: "SIGINT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}  # fixed numbers on Linux and macOS for these; named here so the core imports no `signal`

# a binary that does not know an option says so and exits (whisper.cpp, ggml-rpc-server,
# argparse's "unrecognized arguments"): that is an answer, not a crash
_UNKNOWN_OPTION = re.compile(
    r"\b(unknown|invalid|unrecognized|unrecognised|unsupported)\s+(argument|option|flag)s?\b",
    re.IGNORECASE,
)


_MISSING_LIBRARY = (
    " A library it needs is missing (a CUDA/ROCm build on a machine without that runtime, or "
    "the engine's own .so/.dll files moved away from it)."
)
_ILLEGAL_INSTRUCTION = (
    ". It was built for CPU features this machine lacks (AVX2, AVX-512…): use a build for this CPU."
)
_NTSTATUS = {
    0xC0000135: ("DLL not found", _MISSING_LIBRARY),
    0xC0000005: ("access violation", ""),
    0xC000001D: ("illegal instruction", _ILLEGAL_INSTRUCTION.removeprefix(".")),
    0xC0000409: ("stack buffer overrun or abort", ""),
}


def _says_unknown_option(output: str) -> bool:
    """Whether the output opens or ends with an unknown-option complaint (whisper.cpp and
    ggml print it first, argparse last, after the usage); a word in the middle of a long log
    does not count."""
    lines = [ln for ln in _clean(output).splitlines() if ln.strip()]
    return any(_UNKNOWN_OPTION.search(ln) for ln in (*lines[:3], *lines[-3:]))


def _tail(output: str, n: int = TAIL_LINES) -> tuple[str, ...]:
    lines = [ln.rstrip() for ln in _clean(output).splitlines() if ln.strip()]
    return tuple(lines[-n:])


def _quote_tail(tail: Sequence[str]) -> str:
    return " | ".join(tail) if tail else "(no output)"


def _start_failure(exe: str, run: RunOutput) -> ProbeFailure:
    detail = f" ({run.start_detail})" if run.start_detail else ""
    if run.start_error is StartError.MISSING:
        return ProbeFailure(
            FailureKind.MISSING,
            exe,
            run.args,
            f"{exe} was not found{detail}: check the executable's path in the backend "
            "settings, or install the engine.",
        )
    if run.start_error is StartError.NOT_EXECUTABLE:
        return ProbeFailure(
            FailureKind.NOT_EXECUTABLE,
            exe,
            run.args,
            f"{exe} is not an executable program{detail}: point the backend at the engine's "
            f"binary itself, or make it executable (chmod +x {exe}).",
        )
    return ProbeFailure(
        FailureKind.NOT_STARTED,
        exe,
        run.args,
        f"{exe} could not be started{detail}; try running it by hand to see why.",
    )


def _without_system_info(runs: Sequence[RunOutput]) -> list[RunOutput]:
    return [r for r in runs if r.args != SYSTEM_INFO_ARGS]


def _system_info(
    exe: str, runs: Sequence[RunOutput]
) -> tuple[CpuTarget | None, list[ProbeFailure]]:
    """The CPU features of the SYSTEM_INFO_ARGS run; it exits non-zero by design (no model),
    so only a hang is a problem."""
    for run in runs:
        if run.args != SYSTEM_INFO_ARGS or not run.started:
            continue
        problem = _run_failure(exe, run) if run.timed_out else None
        return parse_system_info(run.output), [problem] if problem is not None else []
    return None, []


def _run_failure(exe: str, run: RunOutput) -> ProbeFailure | None:
    """What went wrong with one run that started; None when it answered."""
    what = " ".join([exe, *run.args])
    tail = _tail(run.output)
    if run.timed_out:
        limit = f"{run.timeout_s:g} s" if run.timeout_s is not None else "its time limit"
        reaped = (
            " and could not be reaped afterwards (it may be stuck in the kernel)"
            if run.unreaped
            else " and was stopped"
        )
        return ProbeFailure(
            FailureKind.TIMED_OUT,
            exe,
            run.args,
            f"`{what}` did not finish within {limit}{reaped}; last output: {_quote_tail(tail)}",
            None,
            tail,
        )
    code = run.returncode
    if code is None or code == 0:
        return None
    if code < 0:
        sig = _SIGNALS.get(-code, f"signal {-code}")
        hint = _ILLEGAL_INSTRUCTION if sig == "SIGILL" else ""
        return ProbeFailure(
            FailureKind.CRASHED,
            exe,
            run.args,
            f"`{what}` crashed ({sig}); last output: {_quote_tail(tail)}{hint}",
            code,
            tail,
        )
    if _says_unknown_option(run.output):
        return None  # "error: unknown argument: --list-devices": this build lacks the option
    status = str(code)
    hint = ""
    if code in _NTSTATUS:  # Windows reports a crash as an NTSTATUS exit code
        name, hint = _NTSTATUS[code]
        status = f"0x{code:08X} ({name})"
    elif code == 127 or "error while loading shared libraries" in run.output:
        hint = _MISSING_LIBRARY
    return ProbeFailure(
        FailureKind.CRASHED,
        exe,
        run.args,
        f"`{what}` exited with status {status}; last output: {_quote_tail(tail)}.{hint}",
        code,
        tail,
    )


# --- version ---------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# llama.cpp since the 0.x versioning: llama_print_build_info() in common/build-info.cpp.in
_VERSION_NEW = re.compile(
    r"^version:\s*(?P<version>\S+)\s*\(build\s+(?P<build>\d+),\s*commit\s+(?P<commit>[^\s)]+)\)"
)
# older llama.cpp: "version: 4500 (adc5dd92)"; the number is the build (release tag b4500)
_VERSION_OLD = re.compile(r"^version:\s*(?P<build>\d+)\s*\((?P<commit>[^\s)]+)\)")
_BUILT_WITH = re.compile(r"^built with (?P<compiler>.+?) for (?P<target>.+?)\s*$")
# a program that prints only its version: vLLM "0.6.3.post1", "v1.7.4"
_BARE_VERSION = re.compile(r"^v?(?P<version>\d+(?:\.\d+)+[\w.+-]*)$")


def _clean(text: str) -> str:
    """Drop colour codes and carriage returns (progress bars), so lines compare as printed."""
    return _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True)
class VersionInfo:
    """What a `--version` output says; every field None when the format is unknown."""

    version: str | None = None
    build: int | None = None
    commit: str | None = None
    compiler: str | None = None
    target: str | None = None
    built_with: str | None = None  # the whole "built with … for …" line


def parse_version(text: str) -> VersionInfo:
    """Read llama.cpp's two `--version` formats, or a bare version line; see the module doc."""
    lines = [ln.strip() for ln in _clean(text).splitlines() if ln.strip()]
    version = commit = compiler = target = built = None
    build: int | None = None
    for line in lines:
        if version is None:
            if m := _VERSION_NEW.match(line):
                version, build, commit = m["version"], int(m["build"]), m["commit"]
                continue
            if m := _VERSION_OLD.match(line):
                build, commit = int(m["build"]), m["commit"]
                version = f"b{build}"
                continue
        if built is None and (m := _BUILT_WITH.match(line)):
            compiler, target, built = m["compiler"], m["target"], line
    if version is None and lines and (m := _BARE_VERSION.match(lines[-1])):
        version = m["version"]
    if commit in ("unknown", ""):
        commit = None
    return VersionInfo(version, build, commit, compiler, target, built)


# --- help ----------------------------------------------------------------------------------

# An option line starts with a dash after a small indent: 0 (llama.cpp), 2 (argparse, whisper)
# or 13 (whisper.cpp's "             --prompt PROMPT"). Help text continues at 20 or more.
_OPTION_LINE = re.compile(r"^(?P<indent> {0,16})-{1,2}[A-Za-z]")
_MAX_OPTION_INDENT = 16
_SEGMENTS = re.compile(r" {2,}|\t+")
# a flag token: one or two dashes, a letter, then letters, digits, dots, dashes, underscores
_FLAG = re.compile(r"(?<![^\s,|])-{1,2}[A-Za-z][\w.\-]*")
_ENV = re.compile(r"\(env:\s*(?P<env>[A-Z_][A-Z0-9_]*)\)")
_REMOVED = re.compile(r"\bhas been removed\b", re.IGNORECASE)
_DEPRECATED = re.compile(r"\bdeprecated\b", re.IGNORECASE)
_DANGLING_DEFAULT = re.compile(r"\s*\[[^\]]*$")


@dataclass(frozen=True)
class FlagGroup:
    """One option as `--help` lists it: every spelling of it (``-ngl``, ``--gpu-layers``,
    ``--n-gpu-layers``), the value it takes (``N``; None for a switch), the environment
    variable llama.cpp reads for it, and whether the help calls it deprecated or removed.
    A llama.cpp line that lists an option with its negation (``--mmap, --no-mmap``) becomes
    two groups, the second ``negated``."""

    spellings: tuple[str, ...]
    value_hint: str | None = None
    env: str | None = None
    negated: bool = False
    deprecated: bool = False
    removed: bool = False
    help: str = ""  # the description, lines joined

    @property
    def takes_value(self) -> bool:
        return self.value_hint is not None

    def to_json(self) -> dict[str, object]:
        return {
            "spellings": list(self.spellings),
            "value": self.value_hint,
            "env": self.env,
            "negated": self.negated,
            "deprecated": self.deprecated,
            "removed": self.removed,
        }


def _spec_and_help(line: str) -> tuple[str, str]:
    """Split an option line into the spellings part and the description on its right.

    The description starts at the first run of two spaces that is followed by text which is
    neither another spelling (``-t N,      --threads N``) nor the tail of a value hint that
    ends with a comma (whisper.cpp's ``-d  N,     --duration N``).
    """
    parts = _SEGMENTS.split(line.strip())
    spec = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("-") or (part.endswith(",") and " " not in part and part[0] != "["):
            spec.append(part)
            continue
        return " ".join(spec), "  ".join(parts[i:])
    return " ".join(spec), ""


def _split_negation(spellings: list[str]) -> tuple[list[str], list[str]]:
    """``-kvo, --kv-offload, -nkvo, --no-kv-offload`` -> the option and its negation.

    llama.cpp prints an option's spellings, then its negated ones. A line whose first long
    spelling already starts with ``--no-`` (an old-style ``--no-mmap``) is one option.
    """
    longs = [i for i, s in enumerate(spellings) if s.startswith("--")]
    first_no = next((i for i in longs if spellings[i].startswith("--no-")), None)
    if first_no is None:
        return spellings, []
    positive = [i for i in longs if i < first_no]
    if not positive:
        return spellings, []
    cut = positive[-1] + 1
    return spellings[:cut], spellings[cut:]


def _groups_from_entry(spec: str, help_lines: list[str]) -> list[FlagGroup]:
    matches = list(_FLAG.finditer(spec))
    if not matches:
        return []
    spellings: list[str] = []
    for m in matches:
        flag = m.group(0).rstrip(".-")
        if flag not in spellings:
            spellings.append(flag)
    hint = spec[matches[-1].end() :].strip().strip(",").strip()
    # whisper.cpp prints a default right after the hint ("DNAME [CPU    ]"), cut by the split
    hint = _DANGLING_DEFAULT.sub("", hint)
    # argparse repeats the hint after each spelling ("--tp TP, -tp TP"): the last one is it
    text = " ".join(h.strip() for h in help_lines if h.strip())
    env_m = _ENV.search(text)
    env = env_m["env"] if env_m else None
    removed = _REMOVED.search(text) is not None
    deprecated = _DEPRECATED.search(text) is not None
    positive, negative = _split_negation(spellings)
    groups = [
        FlagGroup(
            tuple(positive),
            hint or None,
            env,
            negated=False,
            deprecated=deprecated,
            removed=removed,
            help=text,
        )
    ]
    if negative:
        groups.append(
            FlagGroup(
                tuple(negative),
                None,
                env,
                negated=True,
                deprecated=deprecated,
                removed=removed,
                help=text,
            )
        )
    return groups


def parse_help(text: str) -> tuple[FlagGroup, ...]:
    """Every option a `--help` output lists, as alias groups in the order printed.

    Works for llama.cpp (``-c,    --ctx-size N`` with the description at column 40),
    argparse (vLLM: ``  --max-model-len MAX_MODEL_LEN``) and whisper.cpp
    (``  -t N,      --threads N         [4      ] …``). Lines that are not options (usage,
    section headers, prose) are skipped.
    """
    groups: list[FlagGroup] = []
    spec: str | None = None
    help_lines: list[str] = []

    def flush() -> None:
        if spec is not None:
            groups.extend(_groups_from_entry(spec, help_lines))

    for raw in _clean(text).splitlines():
        line = raw.rstrip()
        m = _OPTION_LINE.match(line)
        if m and len(m["indent"]) <= _MAX_OPTION_INDENT:
            flush()
            spec, first_help = _spec_and_help(line)
            help_lines = [first_help] if first_help else []
        elif spec is not None and line[:1].isspace() and line.strip():
            help_lines.append(line)
        else:  # a blank line or a section header ends the current option
            flush()
            spec, help_lines = None, []
    flush()
    return tuple(groups)


# --- devices -------------------------------------------------------------------------------

_DEVICES_HEADER = re.compile(r"^\s*Available devices:\s*$")
# common_print_available_devices(): "  %s: %s (%zu MiB, %zu MiB free)"; the description may
# itself hold parentheses ("Intel(R) UHD Graphics 770 (ADL-S GT1)"), so anchor at the end
_DEVICE_LINE = re.compile(
    r"^\s+(?P<name>[^\s:]{1,64}):\s+(?P<desc>.{0,512}?)\s+\((?P<total>\d{1,12})\s+MiB,\s+"
    r"(?P<free>\d{1,12})\s+MiB\s+free\)\s*$"
)
# more lines than any machine has devices: the rest of a hostile listing is dropped
MAX_DEVICES = 64
MAX_DEVICE_LINE = 1024  # longer lines are not a device line (and are not matched at all)
# ggml backend device names -> the backend, by name prefix (ggml's GGML_*_NAME constants)
_DEVICE_BACKENDS = (
    ("CUDA", "cuda"),
    ("ROCm", "rocm"),
    ("MUSA", "musa"),
    ("Vulkan", "vulkan"),
    ("SYCL", "sycl"),
    ("MTL", "metal"),
    ("Metal", "metal"),
    ("RPC", "rpc"),
    ("CANN", "cann"),
    ("OpenCL", "opencl"),
    ("BLAS", "blas"),
)
# whose allocation rules the sizing core applies (`Gpu.backend`): ROCm and MUSA builds are
# ggml's CUDA backend compiled with HIP/MUSA, so they follow the CUDA rules
_FOOTPRINT_BACKEND = {"cuda": "cuda", "rocm": "cuda", "musa": "cuda", "metal": "metal"}
_MIB = 1024 * 1024


@dataclass(frozen=True)
class EngineDevice:
    """One device an engine build can offload to, as its `--list-devices` reports it."""

    name: str  # CUDA0, ROCm1, Vulkan0, SYCL0, MTL0, RPC0…
    description: str  # NVIDIA GeForce RTX 4090
    total_mib: int
    free_mib: int

    @property
    def backend(self) -> str:
        """cuda, rocm, musa, vulkan, sycl, metal, rpc… ("unknown" for a name ggml did not
        have when this was written)."""
        for prefix, backend in _DEVICE_BACKENDS:
            if self.name.startswith(prefix):
                return backend
        return "unknown"

    @property
    def total_bytes(self) -> int:
        return self.total_mib * _MIB

    @property
    def free_bytes(self) -> int:
        return self.free_mib * _MIB

    def to_gpu(self) -> Gpu:
        """This device as a GPU to plan for (free memory as the engine saw it). Backends
        without rules of their own in the sizing core are sized like Vulkan (no CUDA
        padding)."""
        return Gpu(
            name=self.name,
            total_bytes=self.total_bytes,
            free_bytes=self.free_bytes,
            backend=_FOOTPRINT_BACKEND.get(self.backend, "vulkan"),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "backend": self.backend,
            "total_mib": self.total_mib,
            "free_mib": self.free_mib,
        }


def parse_devices(text: str) -> tuple[EngineDevice, ...] | None:
    """The devices after llama.cpp's ``Available devices:`` header; ``()`` for ``(none)``
    and None when the output has no such header (the binary has no `--list-devices`).

    Lines before the header are ignored: CUDA builds log ``  Device 0: …, compute capability
    8.9`` while initialising, which is not the listing.
    """
    devices: list[EngineDevice] = []
    seen_header = False
    for line in _clean(text).splitlines():
        if _DEVICES_HEADER.match(line):
            seen_header = True
            continue
        if len(line) > MAX_DEVICE_LINE or len(devices) >= MAX_DEVICES:
            continue
        if seen_header and (m := _DEVICE_LINE.match(line)):
            devices.append(
                EngineDevice(
                    printable(m["name"]),
                    printable(m["desc"].strip()),
                    int(m["total"]),
                    int(m["free"]),
                )
            )
    return tuple(devices) if seen_header else None


# --- the result ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """Everything one probe of an engine binary learned; see the module docstring.

    ``failure`` is set when the probe learned nothing usable (the binary is missing, not
    executable, hung or crashed on every run); ``problems`` holds a sentence for every run that
    failed even when others answered (a build that crashes only in ``--list-devices``).
    ``devices`` is meaningful only when ``devices_listed`` (the build printed a listing).
    """

    executable: str
    version: str | None = None
    build: int | None = None
    commit: str | None = None
    compiler: str | None = None
    target: str | None = None
    built_with: str | None = None
    flag_groups: tuple[FlagGroup, ...] = ()
    devices: tuple[EngineDevice, ...] = ()
    devices_listed: bool = False
    # the CPU features its system_info line printed (None: no such line, or not asked)
    cpu: CpuTarget | None = None
    failure: ProbeFailure | None = None
    problems: tuple[str, ...] = ()
    runs: tuple[RunOutput, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def flags(self) -> frozenset[str]:
        """Every spelling this build accepts (options the help marks removed are left out)."""
        return frozenset(s for g in self.flag_groups if not g.removed for s in g.spellings)

    @property
    def variant(self) -> str | None:
        """The GPU backend of the build as its devices show it (cuda, rocm, vulkan…); None
        without devices (a Vulkan build on a machine with no GPU cannot be told from a CPU
        build this way)."""
        backends = sorted({d.backend for d in self.devices if d.backend != "rpc"})
        return ",".join(backends) if backends else None

    @property
    def label(self) -> str:
        """A short name for the build: "b4500", "0.1.0-dev (build 1, commit 7e4c0a9)"."""
        if self.version is None:
            return "unknown version"
        if self.build is not None and not self.version.startswith("b"):
            commit = f", commit {self.commit}" if self.commit else ""
            return f"{self.version} (build {self.build}{commit})"
        if self.commit and self.version.startswith("b"):
            return f"{self.version} ({self.commit})"
        return self.version

    def summary(self) -> str:
        """One line for a status bar or `qmgui doctor`."""
        if self.failure is not None:
            return str(self.failure)
        parts = [f"version {self.label}" if self.version else "version unknown"]
        n = len([g for g in self.flag_groups if not g.removed])
        parts.append(f"{n} options" if n else "no options listed by --help")
        if self.devices_listed:
            if self.devices:
                parts.append(
                    "devices: "
                    + ", ".join(
                        f"{d.name} {d.description} ({d.total_mib} MiB, {d.free_mib} MiB free)"
                        for d in self.devices
                    )
                )
            else:
                parts.append("no GPU devices")
        return ", ".join(parts)

    def capabilities(self) -> dict[str, object]:
        """Plain JSON for `BackendEntry.capabilities`: flags, alias groups and devices."""
        return {
            "flags": sorted(self.flags),
            "flag_groups": [list(g.spellings) for g in self.flag_groups if not g.removed],
            "devices": [d.to_json() for d in self.devices],
            "devices_listed": self.devices_listed,
            **self._cpu_json(),
        }

    def _cpu_json(self) -> dict[str, object]:
        if self.cpu is None:
            return {}
        return {"cpu_features": sorted(self.cpu.features), "sve_cnt": self.cpu.sve_cnt}

    def to_json(self) -> dict[str, object]:
        return {
            "executable": self.executable,
            "ok": self.ok,
            "version": self.version,
            "build": self.build,
            "commit": self.commit,
            "compiler": self.compiler,
            "target": self.target,
            "variant": self.variant,
            "options": len([g for g in self.flag_groups if not g.removed]),
            "devices_listed": self.devices_listed,
            "devices": [d.to_json() for d in self.devices],
            **self._cpu_json(),
            "failure": None
            if self.failure is None
            else {
                "kind": self.failure.kind.value,
                "message": self.failure.message,
                "returncode": self.failure.returncode,
                "args": list(self.failure.args),
            },
            "problems": list(self.problems),
        }


def build_probe(executable: str, runs: Sequence[RunOutput]) -> ProbeResult:
    """Classify and parse the runs of one probe (in the order `probe_commands` gives)."""
    failures: list[ProbeFailure] = []
    answered = False  # some run ended normally (exit 0, or "unknown option")
    info = VersionInfo()
    groups: tuple[FlagGroup, ...] = ()
    devices: tuple[EngineDevice, ...] | None = None
    cpu, info_failures = _system_info(executable, runs)
    for run in _without_system_info(runs):
        if not run.started:
            start = _start_failure(executable, run)
            return ProbeResult(executable, failure=start, problems=(str(start),), runs=tuple(runs))
        problem = _run_failure(executable, run)
        parsed = False
        if not run.timed_out:  # a partial answer from a hung run is not trusted
            args = run.args
            if ARG_VERSION in args and info.version is None:
                info = parse_version(run.output)
                parsed = info.version is not None
            elif ARG_HELP in args and not groups:
                groups = parse_help(run.output)
                parsed = bool(groups)
            elif ARG_LIST_DEVICES in args and devices is None:
                devices = parse_devices(run.output)
                parsed = devices is not None
        if problem is not None and parsed and run.returncode is not None and run.returncode > 0:
            # it answered, then exited non-zero (some tools do after --help): an answer. A
            # signal after a full answer (a driver crashing at exit) stays a problem.
            problem = None
        if problem is not None:
            failures.append(problem)
        else:
            answered = True
    learned = info.version is not None or bool(groups) or devices is not None
    failure = None
    if failures and not learned and not answered:
        failure = failures[0]
    failures += info_failures
    return ProbeResult(
        executable=executable,
        version=info.version,
        build=info.build,
        commit=info.commit,
        compiler=info.compiler,
        target=info.target,
        built_with=info.built_with,
        flag_groups=groups,
        devices=devices or (),
        devices_listed=devices is not None,
        cpu=cpu,
        failure=failure,
        problems=tuple(str(f) for f in failures),
        runs=tuple(runs),
    )


# --- flags across builds -------------------------------------------------------------------

# Spellings of one option across llama.cpp builds, current name first. A build's own --help
# already groups the aliases it knows; this table bridges renames between builds (an old
# build lacks the new name, a new one dropped the old). From llama.cpp's common/arg.cpp
# history and the fixtures in tests/fixtures/engines.
EQUIVALENT_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--n-gpu-layers", "--gpu-layers", "-ngl"),
    ("--spec-draft-ngl", "--n-gpu-layers-draft", "--gpu-layers-draft", "-ngld"),
    ("--spec-draft-model", "--model-draft", "-md"),
    ("--spec-draft-device", "--device-draft", "-devd"),
    ("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n"),
    ("--spec-draft-n-min", "--draft-min", "--draft-n-min"),
    ("--ctx-size", "-c"),
    ("--parallel", "-np"),
    ("--batch-size", "-b"),
    ("--ubatch-size", "-ub"),
    ("--flash-attn", "-fa"),
    ("--cache-type-k", "-ctk"),
    ("--cache-type-v", "-ctv"),
    ("--tensor-split", "-ts"),
    ("--split-mode", "-sm"),
    ("--main-gpu", "-mg"),
    ("--device", "-dev"),
    ("--n-cpu-moe", "-ncmoe"),
    ("--cpu-moe", "-cmoe"),
    ("--no-kv-offload", "-nkvo"),
    ("--kv-unified", "-kvu"),
    ("--no-kv-unified", "-no-kvu"),
    ("--cont-batching", "-cb"),
    ("--no-cont-batching", "-nocb"),
    ("--override-tensor", "-ot"),
    ("--model", "-m"),
    ("--threads", "-t"),
    ("--mmproj", "-mm"),
    ("--webui", "--ui"),
    ("--no-webui", "--no-ui"),
)
_EQUIVALENTS: dict[str, tuple[str, ...]] = {s: cls for cls in EQUIVALENT_FLAGS for s in cls}


def find_group(probe: ProbeResult, spelling: str) -> FlagGroup | None:
    """The alias group of `spelling` in this build's help (a removed option's group too)."""
    return next((g for g in probe.flag_groups if spelling in g.spellings), None)


def flag_spelling(probe: ProbeResult, canonical: str) -> str | None:
    """The spelling of `canonical` that this build accepts, or None when it has none.

    `canonical` itself when the build knows it; else another spelling from the build's own
    alias group for it, else one from `EQUIVALENT_FLAGS` (renames between builds). Long
    spellings are preferred, in the table's order (current name first).
    """
    flags = probe.flags
    if canonical in flags:
        return canonical
    candidates: list[str] = []
    group = find_group(probe, canonical)
    if group is not None and not group.removed:
        candidates += group.spellings
    candidates += _EQUIVALENTS.get(canonical, ())
    present = [c for c in dict.fromkeys(candidates) if c in flags and c != canonical]
    longs = [c for c in present if c.startswith("--")]
    if longs:
        return longs[0]
    return present[0] if present else None


def renamed_or_missing(probe: ProbeResult, wanted_flags: Iterable[str]) -> list[str]:
    """A sentence for each flag in `wanted_flags` this build does not accept as spelled:
    renamed (with the spelling to use), removed (with the help's advice) or unknown. Empty
    when every flag is fine."""
    wanted = list(dict.fromkeys(wanted_flags))
    name = probe.executable
    if probe.failure is not None:
        return [f"{', '.join(wanted)} could not be checked: {probe.failure}"] if wanted else []
    if not probe.flag_groups:
        if not wanted:
            return []
        return [
            f"{name} --help lists no options qmgui can read, so {', '.join(wanted)} could not "
            "be checked."
        ]
    where = f" ({probe.label})" if probe.version else ""
    out: list[str] = []
    for flag in wanted:
        if flag in probe.flags:
            continue
        alt = flag_spelling(probe, flag)
        group = find_group(probe, flag)
        if group is not None and group.removed:
            advice = f"; use {alt}" if alt else ""
            out.append(f"{flag} has been removed from this build of {name}{where}{advice}.")
        elif alt is not None:
            out.append(f"{flag} is spelled {alt} in this build of {name}{where}.")
        else:
            out.append(
                f"{flag} is not supported by this build of {name}{where}; leave it out or "
                "use a newer build."
            )
    return out
