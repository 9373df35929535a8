"""``python -m bench``: every benchmark, each rewriting its own section of ``bench/RESULTS.md``.

``python -m bench turns coldstart`` runs only those. The sweep benchmark
(``bench/sweep.py``, when present) runs as its own ``__main__``.
"""

from __future__ import annotations

import argparse
import importlib.util
import runpy
import sys
import time
from collections.abc import Callable, Sequence

from bench import (
    approvals,
    coldstart,
    context,
    forks,
    live_streaming,
    mcp_tools,
    memory,
    openai_chat,
    openai_face,
    pins,
    providers,
    replays,
    streaming,
    turns,
)

BENCHMARKS: dict[str, Callable[[Sequence[str]], int]] = {
    "turns": turns.main,
    "coldstart": coldstart.main,
    "providers": providers.main,
    "context": context.main,
    "streaming": streaming.main,
    "approvals": approvals.main,
    "openai": openai_face.main,
    "chat": openai_chat.main,
    "forks": forks.main,
    "memory": memory.main,
    "replays": replays.main,
    "live-streaming": live_streaming.main,
    "pins": pins.main,
    "mcp": mcp_tools.main,
}
#: Benchmarks written by others, run through their own ``if __name__ == "__main__"``.
MODULES = {"sweep": "bench.sweep"}


def _run_module(module: str) -> int:
    argv, sys.argv = sys.argv, [module]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen benchmarks (all by default); the exit code is the first failure's."""
    names = [*BENCHMARKS, *MODULES]
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "only", nargs="*", metavar="BENCHMARK", help=f"any of {', '.join(names)} (default: all)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(names)}")
    chosen = args.only or names
    status = 0
    for name in chosen:
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        if name in BENCHMARKS:
            code = BENCHMARKS[name]([])
        elif importlib.util.find_spec(MODULES[name]) is None:
            print(f"   {MODULES[name]} does not exist yet; skipped")
            continue
        else:
            code = _run_module(MODULES[name])
        print(f"== {name}: exit {code} in {time.perf_counter() - started:.0f} s", flush=True)
        status = status or code
    return status


if __name__ == "__main__":
    raise SystemExit(main())
