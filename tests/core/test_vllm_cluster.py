"""vLLM on several nodes through Ray: tensor parallel within a node, pipeline parallel across
nodes, sized per GPU by the vLLM planner; the commands, and the bash script run for real with
stand-ins for `ray` and `vllm` that print what they were given.

The model is test_vllm's Llama-8B-like one: 32 layers, 8 KV heads of 128 dims, 16-bit KV, so
128 KiB of KV per token over all layers, 4 KiB per layer, and 15 GiB of weights.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry
from qmgui.core.errors import SizingError
from qmgui.core.export.scripts import render_cluster_script
from qmgui.core.footprint import Gpu
from qmgui.core.units import GIB, KIB
from qmgui.core.vllm import VllmPins, plan_vllm, pp_stages
from qmgui.core.vllm_cluster import Node, plan_cluster
from tests.core.test_vllm import meta

LLAMA = meta()


def entry(m: object = LLAMA) -> ModelEntry:
    return ModelEntry(
        id="/models/llama", path="/models/llama", name="llama", format="hf", source="folder",
        size_bytes=LLAMA.weight_bytes, meta=m,  # type: ignore[arg-type]
    )  # fmt: skip


def node(address: str, *sizes: float, free: float | None = None) -> Node:
    return Node(
        address,
        tuple(
            Gpu(f"GPU{i}", int(g * GIB), None if free is None else int(free * GIB))
            for i, g in enumerate(sizes)
        ),
    )


def test_pipeline_stages_follow_vllm() -> None:
    # 10 layers on 4 stages: 2 each, the remainder to the stages before the last
    assert pp_stages(10, 4) == (range(0, 2), range(2, 5), range(5, 8), range(8, 10))
    assert pp_stages(32, 2) == (range(0, 16), range(16, 32))
    assert pp_stages(3, 3) == (range(0, 1), range(1, 2), range(2, 3))


def test_each_gpu_holds_a_share_of_the_weights_and_its_stage_s_kv() -> None:
    one = plan_vllm(LLAMA, gpu_total_bytes=24 * GIB, budget_bytes=23 * GIB, tensor_parallel=2)
    two = plan_vllm(
        LLAMA,
        gpu_total_bytes=24 * GIB,
        budget_bytes=23 * GIB,
        tensor_parallel=2,
        pipeline_parallel=2,
    )
    assert one.breakdown is not None and two.breakdown is not None
    assert two.breakdown.weights.nbytes == 15 * GIB // 4
    # 16 of 32 layers per stage, 4 of 8 KV heads per rank: 16 x 2 x 4 x 128 x 2 B
    assert two.breakdown.kv_per_token.nbytes == 32 * KIB
    assert one.breakdown.kv_per_token.nbytes == 64 * KIB
    assert "--pipeline-parallel-size" in two.args
    assert two.args[two.args.index("--pipeline-parallel-size") + 1] == "2"
    assert two.charge_total_bytes == two.charge_bytes * 4
    assert two.max_model_len >= one.max_model_len  # less per GPU, at least as long a context
    with pytest.raises(SizingError, match="pipeline stages for 32 layers"):
        plan_vllm(LLAMA, gpu_total_bytes=None, budget_bytes=None, pipeline_parallel=33)


def test_two_nodes_make_a_ray_head_a_worker_and_a_serve_command() -> None:
    c = plan_cluster(entry(), [node("10.0.0.1", 24, 24), node("10.0.0.2", 24, 24)], port=8000)
    assert c.fits, c.reason
    assert (c.tensor_parallel, c.pipeline_parallel) == (2, 2)
    assert c.head.argv[:3] == ("ray", "start", "--head")
    assert "--node-ip-address=10.0.0.1" in c.head.argv
    assert c.head.env == {"VLLM_HOST_IP": "10.0.0.1"}
    (w,) = c.workers
    assert "--address=10.0.0.1:6379" in w.argv
    assert w.env == {"VLLM_HOST_IP": "10.0.0.2"}
    argv = list(c.serve.argv)
    assert argv[:3] == ["vllm", "serve", "/models/llama"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert c.serve.env["VLLM_HOST_IP"] == "10.0.0.1"
    # the per-GPU check is the plan's, made for four GPUs
    assert c.plan.breakdown is not None
    assert c.plan.breakdown.weights.nbytes == 15 * GIB // 4


def test_the_fewest_gpus_on_a_node_set_tensor_parallel_and_the_smallest_card_the_plan() -> None:
    c = plan_cluster(entry(), [node("a", 24, 24, 24), node("b", 16, 16)])
    assert c.tensor_parallel == 2
    assert any("GPUs left idle on a (1)" in n for n in c.notes)
    assert c.plan.breakdown is not None and c.plan.breakdown.budget is not None
    # sized for a 16 GiB card: its 0.95 ceiling
    assert c.plan.breakdown.budget.nbytes == 16 * GIB * 95 // 100


def test_one_utilization_on_cards_of_different_sizes_must_fit_each() -> None:
    """vLLM takes utilization × total on every GPU and refuses to start where less is free:
    sized for the 24 GiB cards, the fraction asks more of a 48 GiB card with 12 GiB free."""
    ok = plan_cluster(entry(), [node("a", 24, 24), node("b", 24, 24)])
    busy = plan_cluster(entry(), [node("a", 24, 24), node("b", 48, 48, free=12)])
    assert ok.fits
    assert not busy.fits
    assert busy.reason is not None and "GPU0 on b" in busy.reason
    with pytest.raises(SizingError, match="same address"):
        plan_cluster(entry(), [node("a", 24), node("a", 24)])
    with pytest.raises(SizingError, match="has no GPU"):
        plan_cluster(entry(), [node("a", 24), Node("b", ())])


def test_too_little_memory_is_a_result_with_the_reason() -> None:
    big = plan_cluster(entry(meta(weights=200 * GIB)), [node("a", 24, 24), node("b", 24, 24)])
    assert not big.fits
    assert big.reason is not None and "budget" in big.reason


def test_the_cluster_script_runs_each_role(tmp_path: Path) -> None:
    """The script, run with stand-ins for ray and vllm on PATH that print their arguments
    and VLLM_HOST_IP: each role execs the planned command."""
    c = plan_cluster(
        entry(),
        [node("10.0.0.1", 24, 24), node("10.0.0.2", 24, 24)],
        port="${PORT}",
        pins=VllmPins(max_model_len=8192),
    )
    script = render_cluster_script(c, title="test cluster", default_port=9000)
    path = tmp_path / "cluster.sh"
    path.write_text(script.text, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ray", "vllm"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} VLLM_HOST_IP=$VLLM_HOST_IP $*"\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def role(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(path), *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )

    head = role("head")
    assert head.returncode == 0, head.stderr
    assert head.stdout.startswith("ray VLLM_HOST_IP=10.0.0.1 start --head")
    worker = role("worker", "10.0.0.2")
    assert "VLLM_HOST_IP=10.0.0.2 start --address=10.0.0.1:6379" in worker.stdout
    serve = role("serve", "--seed", "1")
    assert serve.stdout.startswith("vllm VLLM_HOST_IP=10.0.0.1 serve /models/llama")
    assert "--port 9000" in serve.stdout and serve.stdout.rstrip().endswith("--seed 1")
    assert "--max-model-len 8192" in serve.stdout
    assert role("worker", "10.0.0.9").returncode == 2
    assert role().returncode == 2
