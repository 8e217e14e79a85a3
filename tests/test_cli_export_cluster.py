"""`qmgui export vllm-cluster`: one model on several machines, as a script with a role per
node, from the command line."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.synth.factory import write_hf_folder
from tests.test_cli_export import run


def test_vllm_cluster_script_is_written_and_says_how_to_run_it(tmp_path: Path) -> None:
    model = write_hf_folder(tmp_path / "hf-llama")
    out = tmp_path / "cluster.sh"
    code, _, err = run(
        "vllm-cluster", str(model), "--node", "10.0.0.1=2x3090", "--node", "10.0.0.2=3x4090",
        "--port", "9000", "--out", str(out), "--no-probe",
    )  # fmt: skip
    assert code == 0, err
    assert "wrote" in err
    assert os.stat(out).st_mode & stat.S_IXUSR
    text = out.read_text(encoding="utf-8")
    assert "tensor parallel 2 per node, pipeline parallel 2" in text
    assert "GPUs left idle on 10.0.0.2 (1)" in text
    assert "--pipeline-parallel-size 2" in text
    assert "./cluster.sh worker 10.0.0.2" in text
    syntax = subprocess.run(["bash", "-n", str(out)], check=False, capture_output=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr


def test_vllm_cluster_needs_nodes_and_one_model(tmp_path: Path) -> None:
    model = write_hf_folder(tmp_path / "hf-llama")
    code, _, err = run("vllm-cluster", str(model), "--no-probe")
    assert code == 2 and "--node ADDRESS=GPUS" in err
    code, _, err = run("vllm-cluster", str(model), "--node", "10.0.0.1", "--no-probe")
    assert code == 2 and "give ADDRESS=GPUS" in err
    code, _, err = run("vllm-cluster", str(model), str(model), "--node", "a=4090", "--no-probe")
    assert code == 2 and "exactly one MODEL" in err
