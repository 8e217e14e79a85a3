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

A node's address is data written into a script: it must be a host name (letters, digits, `-`,
`_` and dots, no label starting or ending with `-`) or an IP address (IPv6 bare or in
brackets), optionally with `:PORT` (1-65535). The head's port is Ray's port (default 6379); a
worker takes none. Anything else is a SizingError naming the value.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType

from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import Command, skipped
from qmgui.core.emit.vllm import emit_vllm
from qmgui.core.errors import SizingError
from qmgui.core.footprint import Gpu
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.core.vllm import VllmPins, VllmPlan, plan_vllm

RAY = "ray"
RAY_PORT = 6379  # Ray's default GCS port
ENV_HOST_IP = "VLLM_HOST_IP"  # the address vLLM on this node announces to the others
FLAG_EXECUTOR = "--distributed-executor-backend"
DEFAULT_SERVE_PORT = 8000  # vllm serve's default
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
_ZONE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")  # an IPv6 scope: an interface name or number


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


def _bad_address(text: str) -> SizingError:
    return SizingError(
        f"not a node address: '{printable(text)}' (give a host name or an IP address, "
        "optionally with :PORT from 1 to 65535, e.g. 10.0.0.2 or gpu-2.lan)"
    )


def _host(text: str, whole: str) -> str:
    """`text` if it is a host name or an IP address (IPv6 without brackets), else SizingError."""
    if ":" in text:  # IPv6, perhaps with a scope (fe80::1%eth0)
        addr, pct, zone = text.partition("%")
        try:
            ipaddress.IPv6Address(addr)
        except ValueError:
            raise _bad_address(whole) from None
        if pct and not _ZONE.match(zone):
            raise _bad_address(whole)
        return text
    try:
        ipaddress.IPv4Address(text)
        return text
    except ValueError:
        pass
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    if (
        not text
        or len(text) > 253
        or not all(_LABEL.match(label) for label in labels)
        or all(c.isdigit() or c == "." for c in text)  # 999.1.1.1 is no address
    ):
        raise _bad_address(whole)
    return text


def parse_address(text: str) -> tuple[str, int | None]:
    """A node address as (host, port or None): `host`, `host:PORT`, `IPv4:PORT`, an IPv6
    address bare (no port) or in brackets (`[fe80::1]:6379`). SizingError with the value."""
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end > 0 else ""
        if end < 0 or ":" not in text[1:end] or (rest and not rest.startswith(":")):
            raise _bad_address(text)
        return _host(text[1:end], text), (_port(rest[1:], text) if rest else None)
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return _host(host, text), _port(port, text)
    return _host(text, text), None


def _port(text: str, whole: str) -> int:
    if not _PORT.match(text) or not 1 <= int(text) <= 65535:
        raise _bad_address(whole)
    return int(text)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _check(nodes: Sequence[Node]) -> list[tuple[str, int | None]]:
    """Each node's (host, port); SizingError for a bad address or a node without GPUs."""
    if not nodes:
        raise SizingError("a cluster needs at least one node")
    hosts = [parse_address(n.address) for n in nodes]
    names = [h for h, _ in hosts]
    if len(set(names)) != len(names):
        raise SizingError("two nodes have the same address; each node needs its own")
    for n, (_, port) in zip(nodes[1:], hosts[1:], strict=True):
        if port is not None:
            raise SizingError(
                f"node {n.address}: a worker's address takes no port (Ray's port is the "
                "head's, the first node's)"
            )
    for n in nodes:
        if not n.gpus:
            raise SizingError(f"node {n.address} has no GPU; vLLM runs on GPUs")
    return hosts


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
    hosts = _check(nodes)
    if hosts[0][1] is not None:
        ray_port = hosts[0][1]
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
    head = hosts[0][0]
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
                host,
                (RAY, "start", f"--address={_url_host(head)}:{ray_port}",
                 f"--node-ip-address={host}", f"--num-gpus={tp}", "--block"),
                {ENV_HOST_IP: host},
            )
            for host, _ in hosts[1:]
        ),
        serve=serve,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        fits=reason is None,
        reason=reason,
        notes=tuple(notes),
    )  # fmt: skip
