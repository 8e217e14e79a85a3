# ruff: noqa: PLC0415 - qmgui is imported once the settings folders are set
"""The user guide's pictures of live work, made by driving the window in this process:

- `endpoint-and-speed.png`: two models served through one endpoint (llama.cpp's router, both
  answered once), one more engine with its live tokens/s after a request, and the selected
  model's "last measured" figures from `qmgui bench` (run first, with the real engine);
- `open-url.png`: a model planned from its URL before downloading (a full-size 8B header served
  with byte ranges by a local test server);
- `get-models.png`: the Get models dialog against a local stand-in for the Hugging Face API
  (tests/test_hub.py's), a repository listed with its fit.

scripts/screenshots.py runs this with a display and throwaway settings folders; alone:

    QMGUI_CONFIG_DIR=/tmp/x/config QMGUI_STATE_DIR=/tmp/x/state DISPLAY=:97 \\
        .venv/bin/python scripts/guide_shots.py --out docs/screenshots
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
for _var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    os.environ.pop(_var, None)

SIZE = (1280, 800)
WAIT_S = 120.0


def spin(ms: int = 20) -> None:
    """Run the event loop for `ms` (not `processEvents`: PySide6 6.12 drops a reference to
    None at every call of it, and a few thousand calls end the interpreter)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_until(app: Any, ok: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"guide_shots: timed out waiting for {what}")
        spin()


def pause(app: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin()


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def answer(url: str, model: str | None, n: int = 24) -> None:
    """One completion (random weights may write bytes that are not text: a few seeds)."""
    from qmgui.core.bench import TEXT_GRAMMAR

    for seed in range(16):
        body: dict[str, Any] = {
            "prompt": "Once upon a time",
            "n_predict": n,
            "seed": seed,
            "grammar": TEXT_GRAMMAR,  # random weights: held to printable text
        }
        if model:
            body["model"] = model
        try:
            post(url, "/completion", body)
            return
        except urllib.error.HTTPError:
            continue
    raise SystemExit(f"guide_shots: {model or url} gave no completion")


def in_thread(app: Any, work: Callable[[], None], what: str) -> None:
    """HTTP off the GUI thread, the window painting meanwhile."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # carried to the caller
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(app, lambda: not t.is_alive(), what)
    if box:
        raise box[0]


def window(app: Any, roots: list[str], **kw: Any) -> Any:
    from qmgui.settings import load_settings
    from qmgui.ui.main_window import MainWindow

    w = MainWindow(load_settings(), roots=roots, persist=False, tray=False, **kw)
    w.resize(*SIZE)
    w.show()
    w.start()
    wait_until(app, w.is_settled, "the scan")
    return w


def save(widget: Any, path: Path) -> None:
    if not widget.grab().save(str(path), "PNG"):
        raise SystemExit(f"guide_shots: could not write {path}")
    print(f"ok  {path.name}", flush=True)


def endpoint_and_speed(app: Any, tmp: Path, out: Path) -> None:
    from qmgui.engines.llama_run import find_llama_server
    from qmgui.engines.supervisor import State
    from tests.synth.factory import PRESETS, write_gguf

    exe = find_llama_server()
    if exe is None:
        print("skipped endpoint-and-speed.png: no llama-server", flush=True)
        return
    d = tmp / "serving"
    for name in ("tiny-chat", "tiny-code", "tiny-llama"):
        write_gguf(d / f"{name}.gguf", PRESETS["llama"])
    bench = [sys.executable, "-m", "qmgui", "bench", str(d / "tiny-llama.gguf"), "--json"]
    subprocess.run(bench, cwd=ROOT, check=True, timeout=300, stdout=subprocess.DEVNULL)
    w = window(app, [str(d)])
    w.table.select_name("tiny-llama")
    wait_until(app, w.is_settled, "the plan")
    eid = w.start_engine()
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    wait_until(app, lambda: engine.state == State.READY or engine.state.final, "the engine")
    url = engine.url
    assert url is not None
    ids = [e.id for e in w.table.model.entries if e.name in ("tiny-chat", "tiny-code")]
    rid = w.fleet.serve_router(ids)
    assert rid is not None
    router = w.engine_runner.engines[rid]
    wait_until(app, lambda: router.state == State.READY or router.state.final, "the router")
    rurl = router.url
    assert rurl is not None
    in_thread(app, lambda: [answer(rurl, m) for m in ("tiny-chat", "tiny-code")], "the router")
    pause(app, 4.5)  # two /metrics readings before the completion: the Speed column's base
    in_thread(app, lambda: answer(url, None, 200), "a completion")
    panel = w.engines_panel
    panel.poll_routers()
    wait_until(app, lambda: "loaded tiny-chat, tiny-code" in router.label, "the router's models")
    w.table.select_name("tiny-llama")
    wait_until(app, w.is_settled, "the plan")
    wait_until(app, lambda: "t/s" in panel.speed_words(eid), "the Speed column", 20)
    panel.select(rid)
    save(w, out / "endpoint-and-speed.png")
    w.close()
    w.shutdown()


def open_url(app: Any, tmp: Path, out: Path) -> None:
    from qmgui.ui.remote_models import is_remote
    from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf
    from tests.test_remote_plan import _start

    www = tmp / "www"
    www.mkdir()
    write_gguf(www / "Llama-3-8B-Instruct-Q4_K_M.gguf", FULL_SIZE_PRESETS["llama3-8b"],
               sparse=True)  # fmt: skip
    httpd, thread, _ = _start(www)
    try:
        here = tmp / "here"
        write_gguf(here / "tiny-llama.gguf", PRESETS["llama"])
        w = window(app, [str(here)], hardware_choice="RTX 4090")
        w.remote.open(f"http://127.0.0.1:{httpd.server_address[1]}/ranged/"
                      "Llama-3-8B-Instruct-Q4_K_M.gguf")  # fmt: skip
        wait_until(app, lambda: any(is_remote(e) for e in w.table.model.entries), "the header")
        wait_until(app, w.is_settled, "the plan")
        pause(app, 0.5)
        save(w, out / "open-url.png")
        w.close()
        w.shutdown()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def get_models(app: Any, tmp: Path, out: Path) -> None:
    from qmgui.ui.get_models import GetModelsDialog
    from tests.test_hub import start_hub

    state, httpd, thread = start_hub(tmp)
    os.environ["HF_ENDPOINT"] = state.base
    try:
        dest = tmp / "downloads"
        dest.mkdir()
        dialog = GetModelsDialog(None, folder=str(dest))
        dialog.resize(900, 560)
        dialog.show()
        dialog.query.setText("tiny")
        dialog.search()
        wait_until(app, lambda: dialog.repos.count() > 0, "the search")
        dialog.repos.setCurrentRow(0)
        wait_until(app, lambda: dialog.models.topLevelItemCount() > 0, "the listing")
        pause(app, 0.5)
        save(dialog, out / "get-models.png")
        dialog.wait()
        dialog.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


SHOTS = {"endpoint-and-speed": endpoint_and_speed, "open-url": open_url, "get-models": get_models}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    ap.add_argument("--only", action="append", choices=sorted(SHOTS))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for var, sub in (("QMGUI_CONFIG_DIR", "config"), ("QMGUI_STATE_DIR", "state"),
                         ("QMGUI_LOG_DIR", "logs"), ("XDG_CACHE_HOME", "cache"),
                         ("HF_HUB_CACHE", "hub")):  # fmt: skip
            os.environ.setdefault(var, str(base / sub))
        from qmgui.app import apply_theme, make_application

        app = make_application()
        apply_theme(app, "light")
        for name, shot in SHOTS.items():
            if a.only and name not in a.only:
                continue
            work = base / name
            work.mkdir()
            shot(app, work, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
