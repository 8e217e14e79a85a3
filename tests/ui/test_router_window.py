"""The window's "Serve through one endpoint": two selected models behind one llama.cpp router
(the real llama-server on the CPU), one row in the Engines panel with its URL and the models
it has loaded, and Stop ending the router with every model it started."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from qmgui.core.discovery import entry_for_path
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import State
from qmgui.ui.main_window import MainWindow
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle

LLAMA_SERVER = find_llama_server()
READY_MS = 60_000


@pytest.fixture
def two_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    if LLAMA_SERVER is None:
        pytest.skip("llama-server not found")
    d = tmp_path / "two"
    write_gguf(d / "tiny-one.gguf", PRESETS["llama"])
    write_gguf(d / "tiny-two.gguf", PRESETS["llama"])
    return d


def post(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path}: {e.code} {e.read()[:400]!r}") from e


def complete(url: str, model: str) -> Any:
    """A completion from `model`; random weights write bytes that are not always text, which
    the server refuses (500), so a few seeds are tried."""
    last: AssertionError | None = None
    for seed in range(12):
        body = {"model": model, "prompt": "hi", "n_predict": 4, "seed": seed}
        try:
            return post(url, "/completion", body)
        except AssertionError as e:
            last = e
    raise AssertionError(f"{model} gave no completion: {last}")


def test_serve_two_models_through_one_endpoint(  # type: ignore[no-untyped-def]
    qtbot, make_window, two_models: Path
) -> None:
    w: MainWindow = make_window([str(two_models)])
    settle(qtbot, w)
    ids = [entry_for_path(str(two_models / f"{n}.gguf")).id for n in ("tiny-one", "tiny-two")]
    assert w.table.select_id(ids[0])
    assert w.table.select_ids(ids[1:]) == 1
    assert [e.name for e in w.table.selected_entries()] == ["tiny-one", "tiny-two"]
    eid = w.serve_selected_through_router()
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    panel = w.engines_panel
    try:
        qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
        sup = engine.supervisor
        assert sup is not None and engine.state == State.READY, sup.outcome if sup else engine.error
        assert engine.is_router and sup.url is not None
        assert [m["id"] for m in post(sup.url, "/v1/models")["data"]] == ["tiny-one", "tiny-two"]
        for name in ("tiny-one", "tiny-two"):  # a request for a model not loaded loads it
            assert "content" in complete(sup.url, name)
        # one row: the router's URL, the models loaded now, their memory from its children
        row = panel.table
        assert row.rowCount() == 1 and row.item(0, 2).text() == sup.url
        panel.poll_routers()
        qtbot.waitUntil(
            lambda: row.item(0, 0).text().endswith("loaded tiny-one, tiny-two"), timeout=10_000
        )
        assert row.item(0, 4).text().startswith("— / ")
        tip = row.item(0, 0).toolTip()
        assert "tiny-one: loaded" in tip and "allocated" in tip and "resident" in tip
        assert sup.pid is not None
        children = psutil.Process(sup.pid).children(recursive=True)
        pids = [sup.pid, *(c.pid for c in children)]
        assert len(children) == 2
        panel.select(eid)
        panel.stop_button.click()
        qtbot.waitUntil(lambda: panel.state_of(eid) == "stopped", timeout=30_000)
        w.engine_runner.wait()
        assert not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in pids
        )
    finally:
        w.engine_runner.stop_all()


def test_serve_a_run_set_through_one_endpoint(  # type: ignore[no-untyped-def]
    qtbot, make_window, two_models: Path
) -> None:
    from tests.ui.test_fleet import sub_menu

    w: MainWindow = make_window([str(two_models)])
    settle(qtbot, w)
    ids = [entry_for_path(str(two_models / f"{n}.gguf")).id for n in ("tiny-one", "tiny-two")]
    w.fleet.save_run_set("pair", ids)
    menu = w.run_sets_menu
    menu.rebuild()
    serve = next(
        a for a in sub_menu(menu, "run-set:pair").actions() if a.objectName() == "serve-router"
    )
    serve.trigger()
    qtbot.waitUntil(lambda: len(w.engine_runner.engines) == 1)
    (engine,) = w.engine_runner.engines.values()
    try:
        qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
        assert engine.state == State.READY and engine.url is not None
        assert engine.name == "router (tiny-one, tiny-two)"
        assert "content" in complete(engine.url, "tiny-two")
    finally:
        w.engine_runner.stop_all()
    assert not w.engine_runner.running()


def test_a_changed_profile_reaches_the_running_router(  # type: ignore[no-untyped-def]
    qtbot, make_window, two_models: Path
) -> None:
    """A profile saved while the router serves its model: the preset is written again and the
    router reads it (`GET /models?reload=1`); the loaded model is unloaded and its next
    request loads it with the new context."""
    from qmgui.service.router import ROUTER_DIR
    from qmgui.settings import ModelOverride

    w: MainWindow = make_window([str(two_models)])
    settle(qtbot, w)
    ids = [entry_for_path(str(two_models / f"{n}.gguf")).id for n in ("tiny-one", "tiny-two")]
    eid = w.fleet.serve_router(ids)
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    try:
        qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
        assert engine.state == State.READY and engine.url is not None
        url = engine.url
        assert "content" in complete(url, "tiny-one")
        (preset,) = (two_models.parent / "state" / ROUTER_DIR).glob("*.ini")
        before = preset.read_text()
        assert "ctx-size = 1536" not in before

        def status(name: str) -> str:
            (item,) = [m for m in post(url, "/models")["data"] if m["id"] == name]
            return str(item["status"]["value"])

        assert status("tiny-one") == "loaded"
        overrides = {**w.settings.model_overrides, ids[0]: ModelOverride(ctx_size=1536)}
        w._store(w.settings.model_copy(update={"model_overrides": overrides}))
        qtbot.waitUntil(lambda: "ctx-size = 1536" in preset.read_text(), timeout=10_000)
        qtbot.waitUntil(lambda: status("tiny-one") != "loaded", timeout=30_000)
        assert status("tiny-two") == "unloaded"  # never loaded; its section is unchanged
        assert "content" in complete(url, "tiny-one")  # loads again, with the new context
        sup = engine.supervisor
        assert sup is not None and sup.pid is not None
        argv = [" ".join(c.cmdline()) for c in psutil.Process(sup.pid).children()]
        assert any("tiny-one" in a and "1536" in a for a in argv), argv
    finally:
        w.engine_runner.stop_all()
