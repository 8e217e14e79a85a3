"""vLLM on several machines: a Ray cluster, tensor parallelism within a node and pipeline
parallelism across nodes, sized by the same vLLM planner (`core.vllm.plan_vllm`).

vLLM's multi-node recipe (its "distributed serving" docs): start a Ray head on one node and
join a Ray worker on every other node (each with `VLLM_HOST_IP` set to the address the others
reach it at, the same address given to Ray as `--node-ip-address`), then run `vllm serve` on
the head with `--tensor-parallel-size` = GPUs per node, `--pipeline-parallel-size` = nodes and
`--distributed-executor-backend ray`. Every node needs the model at the same path.

Sizing: each GPU holds weights / (TP × PP) and the KV of its pipeline stage's layers, plus
vLLM's flat reserve; the plan is made for the smallest card of the cluster (its total and its
budget), and vLLM's start-up check (free memory ≥ utilization × total on every GPU) is then
made on each card, since one utilization applies to cards of different sizes. Nodes with
different GPU counts run TP = the smallest count; the other GPUs stay idle (said in a note).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType

from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import Command, skipped
from qmgui.core.emit.vllm import emit_vllm
from qmgui.core.errors import SizingError
from qmgui.core.footprint import Gpu
from qmgui.core.units import format_bytes
from qmgui.core.vllm import VllmPins, VllmPlan, plan_vllm

RAY = "ray"
RAY_PORT = 6379  # Ray's default GCS port
ENV_HOST_IP = "VLLM_HOST_IP"  # the address vLLM on this node announces to the others
FLAG_EXECUTOR = "--distributed-executor-backend"
DEFAULT_SERVE_PORT = 8000  # vllm serve's default


@dataclass(frozen=True)
class Node:
    """One machine of the cluster: the address the others reach it at, and its GPUs."""

    address: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class NodeCommand:
    """What to run on one node: argv and its environment."""

    node: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


@dataclass(frozen=True)
class ClusterPlan:
    """A multi-node vLLM launch: Ray head and workers, the serve command, and the sizing."""

    plan: VllmPlan  # per GPU, as for one node
    head: NodeCommand
    workers: tuple[NodeCommand, ...]
    serve: Command  # run on the head once every worker has joined
    tensor_parallel: int
    pipeline_parallel: int
    fits: bool
    reason: str | None
    notes: tuple[str, ...] = ()

    @property
    def nodes(self) -> int:
        return self.pipeline_parallel


def _check(nodes: Sequence[Node]) -> None:
    if not nodes:
        raise SizingError("a cluster needs at least one node")
    addresses = [n.address for n in nodes]
    if len(set(addresses)) != len(addresses):
        raise SizingError("two nodes have the same address; each node needs its own")
    for n in nodes:
        if not n.address.strip() or any(c.isspace() for c in n.address):
            raise SizingError(f"not a node address: {n.address!r}")
        if not n.gpus:
            raise SizingError(f"node {n.address} has no GPU; vLLM runs on GPUs")


def _startup_problem(plan: VllmPlan, nodes: Sequence[Node], tp: int, reserve: int) -> str | None:
    """vLLM refuses to start on a GPU with less free memory than utilization × its total."""
    util = Fraction(str(plan.gpu_memory_utilization))
    for n in nodes:
        for g in n.gpus[:tp]:
            claim = int(g.total_bytes * util)
            if claim > g.available - reserve:
                return (
                    f"vLLM takes {plan.gpu_memory_utilization:g} of every card: "
                    f"{format_bytes(claim)} of {g.name} on {n.address}, which has "
                    f"{format_bytes(max(g.available - reserve, 0))} to give"
                )
    return None


def plan_cluster(
    entry: ModelEntry,
    nodes: Sequence[Node],
    *,
    reserve: int = 0,
    pins: VllmPins = VllmPins(),  # noqa: B008 - frozen, shared safely
    executable: str = "vllm",
    port: int | str = DEFAULT_SERVE_PORT,
    ray_port: int = RAY_PORT,
) -> ClusterPlan:
    """Ray head (the first node), workers (the others) and `vllm serve` for `entry`.

    `reserve` is kept free on every GPU. Raises SizingError for inconsistent inputs (no
    nodes, duplicate addresses, a node without GPUs); "does not fit" is `fits=False`."""
    if entry.meta is None:
        raise SizingError(f"{entry.name}: {entry.error or 'not a model'}")
    _check(nodes)
    tp = min(len(n.gpus) for n in nodes)
    pp = len(nodes)
    cards = [g for n in nodes for g in n.gpus[:tp]]
    smallest = min(cards, key=lambda g: g.total_bytes)
    budget = min(g.available for g in cards) - reserve
    if budget <= 0:
        raise SizingError(f"the reserve ({format_bytes(reserve)}) leaves a GPU no memory")
    extra = (*pins.extra_args, FLAG_EXECUTOR, RAY) if pp > 1 else pins.extra_args
    pins = replace(pins, extra_args=extra, tensor_parallel_size=None)
    plan = plan_vllm(
        entry.meta,
        gpu_total_bytes=smallest.total_bytes,
        budget_bytes=budget,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        pins=pins,
        is_split_gguf=len(entry.shards) > 1,
    )
    notes = list(plan.notes)
    idle = [f"{n.address} ({len(n.gpus) - tp})" for n in nodes if len(n.gpus) > tp]
    if idle:
        notes.append(
            f"tensor parallel {tp} (the fewest GPUs on a node): GPUs left idle on {', '.join(idle)}"
        )
    head = nodes[0].address
    if plan.skipped:
        serve = skipped(f"{entry.name}: {plan.reason}")
    else:
        serve = emit_vllm(entry, plan, executable=executable, port=port, extra_args=extra)
        serve = replace(serve, env={**serve.env, ENV_HOST_IP: head})
    reason = plan.reason if not plan.fits else _startup_problem(plan, nodes, tp, reserve)
    return ClusterPlan(
        plan=plan,
        head=NodeCommand(
            head,
            (RAY, "start", "--head", f"--node-ip-address={head}", f"--port={ray_port}",
             f"--num-gpus={tp}", "--block"),
            {ENV_HOST_IP: head},
        ),
        workers=tuple(
            NodeCommand(
                n.address,
                (RAY, "start", f"--address={head}:{ray_port}", f"--node-ip-address={n.address}",
                 f"--num-gpus={tp}", "--block"),
                {ENV_HOST_IP: n.address},
            )
            for n in nodes[1:]
        ),
        serve=serve,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        fits=reason is None,
        reason=reason,
        notes=tuple(notes),
    )  # fmt: skip
