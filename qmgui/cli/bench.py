"""`qmgui bench`: how fast a model runs here, measured by its engine.

The model's engine is the one the run registry lists as running it (it is measured as it is,
and left running), else the command `qmgui serve` runs (the same flags, the model's saved
profile and port), started under the supervisor for the measurement and stopped afterwards.
One request of a fixed prompt of `--prompt-tokens` tokens generating `--gen-tokens` tokens
(`qmgui.core.bench`) gives the engine's own prompt and generation tokens per second. The
result is printed (`--json`: the model, settings, build, devices and
`prompt_tokens_per_s` / `generation_tokens_per_s`) and kept per (machine, model, settings);
the window shows the latest beside the plan. llama-server engines only. `--llama-bench` runs
the build's own llama-bench instead (beside its llama-server; with the command's GPU layers,
KV types, threads, batch sizes, split and flash attention) and reads its table.

Ctrl-C, SIGTERM or SIGHUP stop an engine the benchmark started; one it found is left alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
from types import FrameType
from typing import Any, NoReturn, TextIO

from qmgui import notify
from qmgui.cli.plan import add_plan_flags
from qmgui.cli.preview import add_target_flags
from qmgui.cli.serve import STOP_SIGNALS, launch_spec
from qmgui.core.bench import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, result_line
from qmgui.core.errors import EngineError
from qmgui.engines.bench import BenchStore, bench_model, run_llama_bench
from qmgui.engines.registry import RunRegistry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SOURCE = "bench"


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n <= 0:
        raise argparse.ArgumentTypeError("give at least 1")
    return n


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measure a model's prompt and generation tokens per second on this machine",
        description="Measure MODEL's speed: its running engine, or the command `qmgui serve` "
        "runs, started for the measurement and stopped afterwards. One fixed prompt of N "
        "tokens generating M tokens; the figures are the engine's own timings. The result is "
        "kept per machine, model and settings, and the window shows it beside the plan.",
    )
    p.add_argument("model", metavar="MODEL", help="a .gguf file")
    add_plan_flags(p)
    add_target_flags(p)
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="default: the model's saved port (chosen from settings' range at its first start)",
    )
    p.add_argument(
        "--prompt-tokens",
        type=_positive,
        default=DEFAULT_PROMPT_TOKENS,
        metavar="N",
        help=f"tokens in the prompt (default {DEFAULT_PROMPT_TOKENS})",
    )
    p.add_argument(
        "--gen-tokens",
        type=_positive,
        default=DEFAULT_GEN_TOKENS,
        metavar="M",
        help=f"tokens to generate (default {DEFAULT_GEN_TOKENS})",
    )
    p.add_argument(
        "--llama-bench",
        action="store_true",
        help="run the build's own llama-bench (beside its llama-server) with the command's "
        "speed settings instead of measuring a server, and read its table",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_bench)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    prepared = launch_spec(args, source=SOURCE, downshift=False)
    if isinstance(prepared, int):
        return prepared
    spec, entry, _req = prepared

    def on_ready(url: str, started: bool) -> None:
        how = "started for the benchmark" if started else "already running; it is left running"
        notify.info(f"measuring {entry.name} at {url} ({how})", source=SOURCE)

    handlers = {s: signal.signal(s, _interrupt) for s in STOP_SIGNALS if s != signal.SIGINT}
    try:
        if args.llama_bench:
            if spec.kind != "llama":
                raise EngineError(f"{entry.name} runs on {spec.kind}: llama-bench measures GGUFs")
            result = run_llama_bench(
                spec, entry, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens
            )
        else:
            result = bench_model(
                spec,
                entry,
                prompt_tokens=args.prompt_tokens,
                gen_tokens=args.gen_tokens,
                registry=RunRegistry(),
                on_ready=on_ready,
            )
    except EngineError as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_FAILED
    except KeyboardInterrupt:
        notify.info("the benchmark was stopped", source=SOURCE)
        return EXIT_FAILED
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    if result.grammar:
        notify.warning(
            f"{entry.name}'s output is not text: it was held to printable text to be measured",
            source=SOURCE,
        )
    try:
        BenchStore().record(result)
    except OSError as e:
        notify.warning(f"the result could not be kept: {e}", source=SOURCE)
    with contextlib.suppress(OSError):
        if args.json:
            json.dump(result.to_json(), out, indent=2)
            out.write("\n")
        else:
            print(result_line(result), file=out)
    return EXIT_OK
