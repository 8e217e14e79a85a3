"""`qmgui plan` shows CPU weight repacking (issue 17, item 1): the REPACK column, `--json`'s
`repack`/`mapped`/`resident`, the "resident + mapped" host line, and `--cpu-features` for a CPU
that is not this one."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from qmgui.cli import main
from qmgui.core.footprint import cpu_weights
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import meta_from_gguf
from qmgui.core.repack import TENSOR_ALIGNMENT, CpuTarget, place
from qmgui.core.units import format_bytes
from tests.synth.factory import PRESETS, Q, write_gguf


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _q4_0(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "q4.gguf", replace(PRESETS["llama"], weight_type=Q.Q4_0))


def _host(out: str) -> dict[str, int]:
    return next(d for d in json.loads(out)["devices"] if d["name"] == "CPU")


def test_json_has_the_copies_and_the_mapped_span(tmp_path: Path) -> None:
    model = _q4_0(tmp_path)
    code, out, err = run("plan", str(model), "-c", "512", "--cpu-features", "AVX2", "--json")
    assert code == 0, err
    host = _host(out)
    meta = meta_from_gguf(read_gguf_header(model), file_name=model.name)
    layers = ("CPU",) * (meta.n_layer + 1)
    avx2 = CpuTarget(frozenset({"AVX2", "REPACK"}))
    want = place(cpu_weights(meta, layers, LaunchSettings(ctx_size=512)), avx2)
    assert host["repack"] == want.total > 0 and want.total % TENSOR_ALIGNMENT == 0
    assert host["mapped"] == host["weights"] and host["resident"] == host["total"] - host["mapped"]
    assert host["repack_bound"] == host["repack"]
    # -nr: no copies, and the weights stay in the span
    code, out, _ = run("plan", str(model), "-c", "512", "--cpu-features", "AVX2", "-nr", "--json")
    assert _host(out)["repack"] == 0 and _host(out)["weights"] > host["weights"]


def test_table_and_host_line(tmp_path: Path) -> None:
    model = _q4_0(tmp_path)
    code, out, _ = run("plan", str(model), "-c", "512", "--cpu-features", "AVX2")
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("DEVICE"))
    assert header.split()[:3] == ["DEVICE", "WEIGHTS", "REPACK"]
    code, js, _ = run("plan", str(model), "-c", "512", "--cpu-features", "AVX2", "--json")
    host = _host(js)
    cpu_row = next(line for line in out.splitlines() if line.startswith("CPU "))
    assert cpu_row.split()[3:5] == format_bytes(host["repack"]).split()
    assert (
        f"{format_bytes(host['resident'])} resident + {format_bytes(host['mapped'])} mapped" in out
    )


def test_unknown_cpu_is_only_bounded_and_q8_0_needs_arm(tmp_path: Path) -> None:
    model = _q4_0(tmp_path)
    _, out, _ = run("plan", str(model), "-c", "512", "--cpu-features", "unknown", "--json")
    host = _host(out)
    assert host["repack"] == 0 and host["repack_bound"] > 0
    q8 = write_gguf(tmp_path / "q8.gguf", replace(PRESETS["llama"], weight_type=Q.Q8_0))
    _, x86, _ = run("plan", str(q8), "-c", "512", "--cpu-features", "AVX2,AVX512", "--json")
    _, arm, _ = run("plan", str(q8), "-c", "512", "--cpu-features", "NEON,DOTPROD", "--json")
    assert _host(x86)["repack"] == 0 and _host(arm)["repack"] > 0


def test_a_feature_nobody_spells_is_refused(tmp_path: Path) -> None:
    code, _, err = run("plan", str(_q4_0(tmp_path)), "--cpu-features", "AVX3")
    assert code != 0 and "AVX3" in err


def test_a_registered_build_plans_with_the_features_its_probe_printed(tmp_path: Path) -> None:
    """`--backend ID`: the CPU features the build's probe stored (its system_info line) win
    over this machine's flags: an ARM build's NEON rules repack Q8_0, which x86 never does."""
    import stat

    from qmgui.settings import settings_path

    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n", encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    code, _, err = run("backends", "add", "arm", "--kind", "llama", "--exe", str(exe), "--no-probe")
    assert code == 0, err
    data = json.loads(settings_path().read_text(encoding="utf-8"))
    data["backends"][0]["capabilities"] = {"cpu_features": ["NEON", "DOTPROD", "REPACK"]}
    settings_path().write_text(json.dumps(data), encoding="utf-8")
    q8 = write_gguf(tmp_path / "q8.gguf", replace(PRESETS["llama"], weight_type=Q.Q8_0))
    code, out, err = run("plan", str(q8), "-c", "512", "--backend", "arm", "--json")
    assert code == 0, err
    assert _host(out)["repack"] > 0
    _, host_out, _ = run("plan", str(q8), "-c", "512", "--cpu-features", "AVX2", "--json")
    assert _host(host_out)["repack"] == 0
