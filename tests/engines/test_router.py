"""`qmgui serve --router`: three small models behind one llama.cpp router, with the real
llama-server on the CPU: every model listed, loaded on demand, a chat completion from each,
the least recently used unloaded beyond `--models-max`, Ctrl-C leaving no process, and a
detached router stopped (with the models it loaded) by a later qmgui. Every process a test
starts is stopped by the `registry` fixture.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from qmgui.engines.adopt import Adopted
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.registry import RunRegistry
from qmgui.engines.supervisor import OutcomeKind
from qmgui.service.exposure import exposure, key_path

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")

ROOT = Path(__file__).resolve().parents[2]
LLAMA = find_llama_server()
READY_S = 60.0
NAMES = ("tiny-a", "tiny-b", "tiny-c")


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunRegistry]:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("QMGUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("QMGUI_CACHE_DIR", str(tmp_path / "cache"))
    reg = RunRegistry()
    yield reg
    for e in reg.entries():
        reg.stop(e, grace_s=2)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from tests.synth.factory import PRESETS, write_gguf

    d = tmp_path_factory.mktemp("router-models")
    return [write_gguf(d / f"{n}.gguf", PRESETS["llama"]) for n in NAMES]


@pytest.fixture(scope="module")
def llama() -> str:
    if LLAMA is None:
        pytest.skip("llama-server not found")
    help_text = subprocess.run(
        [LLAMA, "--help"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    if "--models-preset" not in help_text:
        pytest.skip("this llama-server has no router mode")
    return LLAMA


def _env(binary: str) -> dict[str, str]:
    return {**os.environ, "QMGUI_TEST_LLAMA_SERVER": binary, "PYTHONPATH": str(ROOT)}


def _argv(models: list[Path], *extra: str) -> list[str]:
    # --no-jinja: a tiny model's random tokens rarely parse as a jinja template's output
    return [
        sys.executable, "-m", "qmgui", "serve", "--router", *map(str, models), "-c", "512",
        "--no-probe", "--extra=--no-warmup", "--extra=--no-jinja", *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def serving(models: list[Path], llama: str, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """`qmgui serve --router MODELS… EXTRA` in the foreground, killed at the end if still up."""
    proc = subprocess.Popen(
        _argv(models, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(llama), cwd=ROOT,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def get(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def chat(url: str, model: str) -> dict[str, Any]:
    """A chat completion from `model`; random weights write bytes that are not always text,
    which the server refuses (500), so a few seeds are tried."""
    last: Exception | None = None
    for seed in range(12):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "seed": seed,
        }
        try:
            out: dict[str, Any] = get(url, "/v1/chat/completions", body)
            return out
        except urllib.error.HTTPError as e:
            last = e
    raise AssertionError(f"{model} gave no completion: {last}")


def loaded(url: str) -> set[str]:
    return {m["id"] for m in get(url, "/models")["data"] if m["status"]["value"] == "loaded"}


def group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, ProcessLookupError):
            continue
    return out


def wait_gone(pgid: int, timeout: float = 15) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def read_ready(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready http://127.0.0.1:"), line + (
        proc.stderr.read() if proc.stderr else ""
    )
    return line.split()[1]


def test_router_over_three_models(registry: RunRegistry, models: list[Path], llama: str) -> None:
    with serving(models, llama, "--models-max", "2") as proc:
        url = read_ready(proc)
        [entry] = registry.running()
        assert entry.pgid == entry.pid
        preset = Path(entry.argv[entry.argv.index("--models-preset") + 1])
        assert stat.S_IMODE(preset.stat().st_mode) == 0o600
        text = preset.read_text()
        for name, path in zip(NAMES, models, strict=True):
            assert f"[{name}]\nmodel = {path}\nctx-size = 512\n" in text
        assert entry.argv[entry.argv.index("--models-max") + 1] == "2"
        # every model listed, none loaded yet
        assert [m["id"] for m in get(url, "/v1/models")["data"]] == list(NAMES)
        assert loaded(url) == set()
        # a request for a model not loaded loads it; the third unloads the least recent
        for name in NAMES:
            out = chat(url, name)
            assert out["model"] == name and out["choices"][0]["message"]["role"] == "assistant"
        assert loaded(url) == {"tiny-b", "tiny-c"}
        # the models are the router's children, in its group, with its token
        children = psutil.Process(entry.pid).children(recursive=True)
        assert len(children) == 2
        assert all(os.getpgid(c.pid) == entry.pgid for c in children)
        assert all(c.environ().get("QMGUI_ENGINE_TOKEN") == entry.token for c in children)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert wait_gone(entry.pgid) == []
        assert not any(psutil.pid_exists(c.pid) and c.status() != "zombie" for c in children)
        assert registry.running() == []


def test_a_serving_router_follows_a_saved_profile(
    registry: RunRegistry, models: list[Path], llama: str
) -> None:
    """`qmgui plan MODEL -np 2 --save` while `qmgui serve --router` serves it: the preset is
    written again and read by the router; the loaded model unloads and its next request
    loads it with two slots."""
    from qmgui.cli import main

    with serving(models[:2], llama) as proc:
        url = read_ready(proc)
        [entry] = registry.running()
        preset = Path(entry.argv[entry.argv.index("--models-preset") + 1])
        assert "parallel = 2" not in preset.read_text()
        chat(url, "tiny-a")
        assert loaded(url) == {"tiny-a"}
        out, err = io.StringIO(), io.StringIO()
        assert main(["plan", str(models[0]), "-np", "2", "--save"], out=out, err=err) in (0, 1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            "parallel = 2" not in preset.read_text() or "tiny-a" in loaded(url)
        ):
            time.sleep(0.2)
        text = preset.read_text()
        section = text[text.index("[tiny-a]") : text.index("[tiny-b]")]
        assert "parallel = 2" in section and "parallel = 2" not in text[text.index("[tiny-b]") :]
        assert "tiny-a" not in loaded(url)
        chat(url, "tiny-a")  # loads again, with its new arguments
        children = psutil.Process(entry.pid).children()
        argv = [" ".join(c.cmdline()) for c in children]
        assert any("tiny-a" in a and "--parallel 2" in a for a in argv), argv
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        assert "preset updated" in proc.stderr.read()


def test_a_detached_router_is_adopted_and_stopped_with_its_models(
    registry: RunRegistry, models: list[Path], llama: str
) -> None:
    done = subprocess.run(
        [*_argv(models[:2]), "--detach"],
        capture_output=True,
        text=True,
        env=_env(llama),
        cwd=ROOT,
        timeout=READY_S + 30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    url = lines[0].split()[1]
    assert lines[1:] == ["model tiny-a", "model tiny-b", "models loaded at once: at most 2"]
    chat(url, "tiny-a")
    from qmgui.cli import main

    out = io.StringIO()
    assert main(["engines", "list", "--json"], out=out, err=io.StringIO()) == 0
    [listed] = json.loads(out.getvalue())
    models = {m["name"]: m for m in listed["router_models"]}
    assert {n: m["status"] for n, m in models.items()} == {"tiny-a": "loaded", "tiny-b": "unloaded"}
    children = [c.pid for c in psutil.Process(listed["pid"]).children()]
    assert models["tiny-a"]["pid"] in children and models["tiny-a"]["rss_bytes"] > 0
    assert models["tiny-a"]["buffer_bytes"] > 0  # read back from the child's relayed log
    [entry] = registry.adoptable()
    assert entry.detached and entry.model and entry.model.startswith("router (tiny-a, tiny-b)")
    assert len(psutil.Process(entry.pid).children(recursive=True)) == 1
    adopted = Adopted(entry, registry=registry, poll_s=0.1)  # a new qmgui takes it over
    adopted.start()
    assert adopted.wait_ready(10) and adopted.url == url
    assert adopted.stop(2).kind == OutcomeKind.STOPPED
    assert wait_gone(entry.pgid or entry.pid) == []
    assert registry.entries() == []


def test_exposure_needs_a_key(registry: RunRegistry) -> None:
    assert exposure("127.0.0.1").extra == () and exposure("localhost").warning is None
    first = exposure("0.0.0.0")
    assert first.new_key and first.extra == ("--api-key-file", str(key_path()))
    assert "0.0.0.0" in (first.warning or "")
    assert stat.S_IMODE(key_path().stat().st_mode) == 0o600
    again = exposure("192.168.1.20")
    assert again.new_key is None and again.extra == first.extra  # shown once
    assert "192.168.1.20" in (again.warning or "")
    given = exposure("0.0.0.0", ("llama-server", "--api-key", "k"))
    assert given.extra == () and given.new_key is None and given.warning


def test_a_router_beyond_loopback_needs_the_key(
    registry: RunRegistry, models: list[Path], llama: str
) -> None:
    done = subprocess.run(
        [*_argv(models[:1]), "--host", "0.0.0.0", "--detach"],
        capture_output=True,
        text=True,
        env=_env(llama),
        cwd=ROOT,
        timeout=READY_S + 30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.splitlines()[0].split()[1]  # `ready URL` stays the first line
    assert "listening on 0.0.0.0" in done.stderr and "API key (shown once): " in done.stderr
    key = key_path().read_text().strip()
    assert key in done.stderr and stat.S_IMODE(key_path().stat().st_mode) == 0o600
    body = json.dumps({"model": "tiny-a", "prompt": "hi", "n_predict": 1}).encode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url + "/completion", data=body), timeout=30)
    assert refused.value.code == 401
    authed = urllib.request.Request(
        url + "/completion", data=body, headers={"Authorization": f"Bearer {key}"}
    )
    try:
        urllib.request.urlopen(authed, timeout=60).close()
    except urllib.error.HTTPError as e:  # random weights may write bytes that are not text
        assert e.code == 500
