"""``python -m tests.chaos`` — a chaos run from the command line (``make chaos``).

    .venv/bin/python -m tests.chaos                      # 30 minutes of faults, new seed
    .venv/bin/python -m tests.chaos --seed 1234 --duration 120

Prints the seed, the replay command and the fault schedule first, progress while it
runs, and the figures at the end (also in ``<workdir>/report.md`` and
``report.json``). Every worker and coordinator records its protocol steps
(``<workdir>/history/``) and the trace check replays them at the end
(``docs/protocol-model.md``). Exit status 0 when the checker and the trace check
passed, 1 when one did not.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import anyio

from tests.chaos.harness import ChaosConfig, run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="fault schedule seed (random)")
    parser.add_argument("--duration", type=float, default=1800, help="seconds of faults")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=40, help="messages/s, all producers")
    parser.add_argument("--gap", default="3,8", help="min,max seconds between fault starts")
    parser.add_argument("--cover-all", action="store_true", help="begin with every fault kind")
    parser.add_argument("--long-work", type=float, default=4.0, help="longest handler run (s)")
    parser.add_argument("--long-share", type=float, default=0.01, help="share of long runs")
    parser.add_argument("--delay-share", type=float, default=0.1, help="share with delay=")
    parser.add_argument("--max-delay", type=float, default=5.0, help="longest delay= (s)")
    parser.add_argument("--settle-timeout", type=float, default=240)
    parser.add_argument("--workdir", type=Path, default=None, help="logs and report (temp dir)")
    parser.add_argument("--acl", action="store_true", help="processes as role ACL users")
    parser.add_argument(
        "--replica", action="store_true", help="a primary+replica pair, failovers after lag"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    low, high = (float(x) for x in args.gap.split(","))
    config = ChaosConfig(
        seed=seed,
        duration=args.duration,
        workers=args.workers,
        producers=args.producers,
        rate=args.rate,
        gap=(low, high),
        cover_all=args.cover_all,
        long_work=args.long_work,
        long_share=args.long_share,
        delay_share=args.delay_share,
        max_delay=args.max_delay,
        settle_timeout=args.settle_timeout,
        workdir=args.workdir,
        acl=args.acl,
        replica=args.replica,
    )
    result = anyio.run(run_chaos, config, backend="asyncio")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
