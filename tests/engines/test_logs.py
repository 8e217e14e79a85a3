"""Best-effort engine logs: a full disk (a small tmpfs, or /dev/full) never stops the engine
nor the supervisor, write failures are counted and said once; files are 0600, pruned, and
carry no secret."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmgui.core.textsafe import REDACTED
from qmgui.engines.logs import LogSink, log_name, prune_logs, secret_values
from qmgui.engines.supervisor import EngineSpec, OutcomeKind, State, Supervisor
from qmgui.notify import Notifier

CHILD = str(Path(__file__).with_name("supervisor_child.py"))
LOG_WORDS = "could not be written"


def chatty(*extra: str, env: dict[str, str] | None = None) -> EngineSpec:
    return EngineSpec(argv=(sys.executable, CHILD, "chatty", *extra), name="chatty", env=env)


def fill(folder: Path) -> None:
    """Fill the file system of `folder` to the last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only; skipped elsewhere), unmounted after the test."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _run_chatty_on_a_full_log(sup: Supervisor, notes: Notifier) -> None:
    sup.start()
    try:
        assert sup.wait_ready(20), sup.outcome  # 400 KB of output before it serves
        time.sleep(0.5)  # it keeps talking while it serves: the pipe keeps being drained
        assert sup.state == State.READY
        assert sup.log_errors > 0
        assert any(ln.startswith("serving ") for ln in sup.log.tail(5))
    finally:
        out = sup.stop(2)
    assert out.kind == OutcomeKind.STOPPED, out  # its real end: stopped, not "exited 1"
    assert out.log_errors == sup.log_errors > 0
    assert LOG_WORDS in str(out)
    said = [m for m in notes.history if LOG_WORDS in m.text]
    assert len(said) == 1, [m.text for m in notes.history]  # said once, not per line


def test_a_full_log_disk_stops_nothing(tiny_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tiny_fs))
    fill(tiny_fs)  # full before the first line: even "# qmgui: argv" cannot be written
    notes = Notifier()
    sup = Supervisor(chatty(), notifier=notes)
    assert sup.log.path is not None and sup.log.path.parent == tiny_fs
    _run_chatty_on_a_full_log(sup, notes)


def test_a_disk_that_fills_mid_run_stops_nothing(
    tiny_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tiny_fs))
    notes = Notifier()
    sup = Supervisor(chatty("--lines", "1000"), notifier=notes)  # 100 KB into 64 KiB
    _run_chatty_on_a_full_log(sup, notes)
    assert sup.log.path is not None and sup.log.path.stat().st_size > 30_000


def test_a_log_on_dev_full_stops_nothing(tmp_path: Path) -> None:
    """The same without root: the log's descriptor is pointed at /dev/full (ENOSPC)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    notes = Notifier()
    sup = Supervisor(chatty(), notifier=notes, logs=tmp_path)
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        fd = sup.log._fd
        assert fd is not None
        os.dup2(full, fd)
    finally:
        os.close(full)
    _run_chatty_on_a_full_log(sup, notes)
    assert "No space left on device" in str(sup.outcome)


def test_logs_are_0600_in_a_0700_folder_and_carry_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, token, in_file = (f"sk-{uuid.uuid4().hex}" for _ in range(3))
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"{in_file}\n")
    monkeypatch.setenv("OTHER_API_KEY", "ambient-secret-value")
    folder = tmp_path / "logs"
    spec = chatty(
        "--lines",
        "3",
        "--api-key",
        key,
        f"--api-key-file={key_file}",
        "--echo",
        in_file,
        "--ambient",
        "ambient-secret-value",
        env={"CHILD_SECRET_TOKEN": token},
    )
    sup = Supervisor(spec, logs=folder)
    sup.start()
    assert sup.wait_ready(10), sup.outcome
    sup.stop()
    assert sup.log.path is not None
    assert stat.S_IMODE(sup.log.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    text = sup.log.path.read_text()
    assert "argv: " in text and "token: " in text  # the engine echoed them
    for secret in (key, token, in_file, "ambient-secret-value"):
        assert secret not in text
        assert secret not in sup.log.text()  # nor in the ring (the outcome's tail, the UI)
    assert f"--api-key {REDACTED}" in text
    assert f"--api-key-file={REDACTED}" in text
    assert f"# qmgui: environment: CHILD_SECRET_TOKEN={REDACTED}" in text
    assert f"token: {REDACTED}" in text


def test_secret_values() -> None:
    argv = ("srv", "--api-key", "abcd1234", "--hf-token=hf_xyz123", "--api-key", "ab")
    assert set(secret_values(argv, {"HF_TOKEN": "tok-5678", "PLAIN": "not-a-secret"})) >= {
        "abcd1234",
        "hf_xyz123",
        "tok-5678",
    }
    assert "ab" not in secret_values(argv)  # too short to redact without mangling text
    assert "not-a-secret" not in secret_values(argv, {"PLAIN": "not-a-secret"})


def _log(folder: Path, model: str, n: int, size: int, age_s: float) -> Path:
    path = folder / f"{model}-20250101-0000{n:02d}-1.log"
    path.write_bytes(b"x" * size)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_logs_are_pruned_per_model_and_in_total(tmp_path: Path) -> None:
    old = [_log(tmp_path, "big-model", n, 100, 1000 - n) for n in range(14)]  # oldest first
    rotated = old[0].with_name(old[0].name + ".1")
    rotated.write_bytes(b"r")
    os.utime(rotated, (time.time() - 2000, time.time() - 2000))  # rotated away before it
    other = [_log(tmp_path, "other", n, 3000, 500 - n) for n in range(2)]
    stranger = tmp_path / "notes.txt"
    stranger.write_text("not a log")
    deleted = prune_logs(tmp_path, keep_per_model=10, max_total_bytes=10_000)
    assert set(deleted) == {*old[:4], rotated}  # the 4 oldest, with the rotated part
    assert all(p.exists() for p in [*old[4:], *other, stranger])
    # the total bound goes oldest first, whatever the model
    deleted = prune_logs(tmp_path, keep_per_model=10, max_total_bytes=6_500)
    assert set(deleted) == set(old[4:9])
    assert all(p.exists() for p in [*old[9:], *other])


def test_a_start_prunes_old_logs_but_never_an_open_one(tmp_path: Path) -> None:
    old = [_log(tmp_path, "chatty", n, 10, 1000 - n) for n in range(12)]
    sink = LogSink(tmp_path / "chatty-20991231-235959-1.log")  # open in this process
    assert sink.path is not None
    os.utime(sink.path, (0, 0))  # looks oldest of all
    sup = Supervisor(chatty(), logs=tmp_path)  # makes its own log, then prunes
    logs = sorted(tmp_path.glob("chatty-*.log"))
    assert len(logs) == 11  # 10 kept + the open one
    assert sink.path.exists()
    assert sup.log.path is not None and sup.log.path.exists()
    assert not old[0].exists() and not old[1].exists() and not old[2].exists()
    assert old[3].exists()
    sink.close()
    sup.log.close()


def test_log_names_are_safe() -> None:
    assert log_name("../../etc/passwd") == "etc_passwd"
    assert log_name("org/model\x1b[31m\n") == "org_model_31m"
    assert log_name("") == "engine"
    assert len(log_name("x" * 500)) == 80


def test_two_sinks_never_share_a_file(tmp_path: Path) -> None:
    a = LogSink(tmp_path / "m-20250101-000000-1.log")
    b = LogSink(tmp_path / "m-20250101-000000-1.log")
    assert a.path != b.path
    (tmp_path / "target").write_text("keep")
    (tmp_path / "m-20250101-000000-9.log").symlink_to(tmp_path / "target")
    c = LogSink(tmp_path / "m-20250101-000000-9.log")  # a link there is never followed
    c.write_line("hello")
    assert (tmp_path / "target").read_text() == "keep"
    for s in (a, b, c):
        s.close()
