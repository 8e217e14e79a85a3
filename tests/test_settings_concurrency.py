"""Settings written by several processes at once: no change is lost, and a lock that is not had
in time is a sentence, not a hang or a lost write.

Real processes, not threads: each writer is a Python process running the real CLI code path
(`qmgui backends add`), started together on a signal so they overlap.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmgui.core.errors import SettingsError
from qmgui.settings import Settings, lock_path, save_settings, settings_path, update_settings

WRITERS = 8
EACH = 20  # 160 adds: main kept 55 of 200 at 8 × 25, 90 of 400 at 8 × 50

# One writer: imports, says "ready", waits for "go" on stdin, then adds `count` backends through
# the CLI, one command at a time (each loads, locks, re-reads, writes), and prints how many
# commands said "added".
WRITER = """
import io, sys
from qmgui.cli import main
worker, count, exe = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
sys.stdin.readline()
added = 0
for i in range(count):
    out, err = io.StringIO(), io.StringIO()
    argv = ["backends", "add", f"w{worker}-{i}", "--kind", "llama", "--exe", exe, "--no-probe"]
    code = main(argv, out=out, err=err)
    if code == 0 and out.getvalue().startswith("added "):
        added += 1
    else:
        print(f"command {i} exited {code}: {err.getvalue()}", file=sys.stderr)
print(added, flush=True)
"""

# Holds the settings lock until told to let go on stdin.
HOLDER = """
import sys
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; any still running at the end are killed and reaped."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def spawn(procs: list[subprocess.Popen[str]], script: str, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    return p


def start_together(writers: list[subprocess.Popen[str]]) -> None:
    """Wait until every writer has imported, then let them all go at once."""
    for w in writers:
        assert w.stdout is not None
        assert w.stdout.readline().strip() == "ready"
    for w in writers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()


@pytest.mark.slow
def test_concurrent_cli_adds_keep_every_backend(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """8 processes × 20 `backends add` at once: all 160 entries are in the file, and every
    command that said "added" did add (on main every command said "added" and most entries
    were lost: 55 of 200 kept at 8 × 25)."""
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n", encoding="utf-8")
    exe.chmod(0o755)
    writers = [spawn(procs, WRITER, str(w), str(EACH), str(exe)) for w in range(WRITERS)]
    start_together(writers)
    said_added = 0
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        assert err == ""
        said_added += int(out.strip())
    data = json.loads(settings_path().read_text(encoding="utf-8"))
    ids = [b["id"] for b in data["backends"]]
    expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(EACH)}
    assert said_added == WRITERS * EACH
    assert len(ids) == len(set(ids))
    assert set(ids) == expected


def test_the_same_id_added_twice_at_once_is_one_entry_and_one_refusal(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Both commands check the id against the file as it is under the lock: one adds it, the
    other is refused, and neither says "added" for an entry that is not there."""
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n", encoding="utf-8")
    exe.chmod(0o755)
    # each writer adds w0-0 .. w0-9: the same 10 ids
    writers = [spawn(procs, WRITER, "0", "10", str(exe)) for _ in range(2)]
    start_together(writers)
    said_added = 0
    for w in writers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0
        said_added += int(out.strip())
        assert err.count("already exists") == 10 - int(out.strip())
    ids = [b["id"] for b in json.loads(settings_path().read_text(encoding="utf-8"))["backends"]]
    assert sorted(ids) == sorted(f"w0-{i}" for i in range(10))
    assert said_added == 10


def test_a_lock_held_too_long_is_a_sentence_and_nothing_is_written(
    procs: list[subprocess.Popen[str]],
) -> None:
    path = save_settings(Settings(model_roots=["/before"]))
    before = path.read_bytes()
    holder = spawn(procs, HOLDER, str(lock_path(path)))
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with pytest.raises(SettingsError) as caught:
        update_settings(lambda s: s.model_copy(update={"model_roots": ["/after"]}), timeout_s=0.3)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"Settings were not saved to {path}" in message
    assert str(lock_path(path)) in message
    assert "nothing was changed" in message
    assert path.read_bytes() == before
    holder.communicate("done\n", timeout=10)
    # once it is let go, the same change goes through
    saved = update_settings(lambda s: s.model_copy(update={"model_roots": ["/after"]}))
    assert saved.settings.model_roots == ["/after"]
    assert json.loads(path.read_text("utf-8"))["model_roots"] == ["/after"]
