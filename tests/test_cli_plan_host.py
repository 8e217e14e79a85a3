"""`qmgui plan` checks host memory: this machine's RAM by default, `--host-memory SIZE`, or
`none`; mapped weights are not charged, what the engine allocates is."""

from __future__ import annotations

import json
from pathlib import Path

from tests.b11434 import b11434_server
from tests.synth.factory import PRESETS, write_gguf
from tests.test_cli import run


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-llama.gguf"
    write_gguf(path, PRESETS["llama"])
    return path


def test_cpu_plan_over_host_memory_does_not_fit(tmp_path: Path) -> None:
    code, out, _ = run(
        "plan", str(_model(tmp_path)), "-c", "4096", "--host-memory", "1MiB", "--json"
    )
    plan = json.loads(out)
    assert code == 1  # does not fit
    assert plan["fits"] is False
    assert "host memory" in plan["reason"]


def test_host_memory_none_is_not_checked(tmp_path: Path) -> None:
    code, out, _ = run(
        "plan", str(_model(tmp_path)), "-c", "4096", "--host-memory", "none", "--json"
    )
    assert code == 0
    assert json.loads(out)["fits"] is True


def test_default_is_this_machines_ram(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import qmgui.cli.plan as plan_mod

    monkeypatch.setattr(plan_mod, "read_ram", lambda: (2048, 1024))
    code, out, _ = run("plan", str(_model(tmp_path)), "-c", "4096", "--json")
    assert code == 1
    assert json.loads(out)["fits"] is False
    monkeypatch.setattr(plan_mod, "read_ram", lambda: (64 << 30, 32 << 30))
    code, out, _ = run("plan", str(_model(tmp_path)), "-c", "4096", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["fits"] is True
    assert plan["warnings"] == []


def test_the_build_is_an_input(tmp_path: Path) -> None:
    """`--build N` sizes by build N's rules (b11434 keeps the mixed-batch input branch: a larger
    compute buffer than the default rules); a build qmgui has not measured says whose rules;
    `--backend PATH` reads the build from the executable's --version."""
    import json as _json

    from qmgui.core.build_rules import MEASURED

    model = write_gguf(tmp_path / "m.gguf", PRESETS["llama"])

    def compute(*extra: str) -> tuple[int, list[str]]:
        code, out, err = run("plan", str(model), "-c", "1024", "--json", *extra)
        assert code == 0, err
        plan = _json.loads(out)
        (cpu,) = [d for d in plan["devices"] if d["name"] == "CPU"]
        return cpu["compute"], plan["notes"]

    base, _ = compute()
    new, notes = compute("--build", "11434")
    assert new > base and not any("sized by" in n for n in notes)
    newer, notes = compute("--build", str(MEASURED[-1] + 1000))
    assert newer == new and any("newer than any build qmgui measured" in n for n in notes)
    engine = b11434_server()
    if engine is not None:  # the rules of the build its --version names
        assert compute("--backend", str(engine))[0] == new


def test_check_shows_the_engines_own_projection(tmp_path: Path) -> None:
    """`plan --check` runs the real llama-server only as far as its -fit projection, stops it
    before it loads (nothing left running), and shows it beside the plan."""
    import psutil

    from qmgui.engines.llama_run import find_llama_server

    engine = find_llama_server()
    if engine is None:
        import pytest

        pytest.skip("llama-server not found")
    model = write_gguf(tmp_path / "m.gguf", PRESETS["llama"])
    code, out, err = run("plan", str(model), "-c", "1024", "--check", "--backend", engine,
                         "--json")  # fmt: skip
    assert code == 0, err
    check = json.loads(out)["check"]
    assert check["error"] is None and check["engine"] == engine
    (cpu,) = check["devices"]
    assert cpu["device"] == "CPU" and cpu["engine_device"] == "Host" and cpu["agrees"], cpu
    left = [p for p in psutil.process_iter(["cmdline"]) if str(model) in (p.info["cmdline"] or [])]
    assert left == []
