"""The benchmark scripts run: each `bench/` script that `make bench` and
`docs/performance.md` rely on, with tiny counts, as a real subprocess on its own embedded
server, printing its ratio table. Not a measurement (the numbers of a smoke run mean
nothing): a script that raises, or stops printing its table, fails here and not in the
middle of a 5-minute `make bench`. The peers' rows (FastStream, taskiq) need
`bench/requirements.txt` and are left out (``--only``), or the script is skipped."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)

SCRIPTS: dict[str, tuple[list[str], str]] = {
    "batch": (["batch.py", "--quick", "--messages", "2000"], "batch_ratio="),
    "consume": (
        ["consume.py", "--rounds", "1", "--messages", "4000", "--slow-messages", "400",
         "--only", "raw-per-shard,raw-lean,raw-100,streamworks,streamworks-lib"],
        "× raw-per-shard",
    ),
    "delays": (["delays.py", "--rounds", "1", "--duration", "1"], "p99 × immediate"),
    "hotpath": (
        ["hotpath_profile.py", "--rounds", "1", "--messages", "4000",
         "--only", "raw-shard,raw-gate,streamworks,streamworks-cli"],
        "× raw-shard",
    ),
    "latency-load": (
        ["latency_load.py", "--rounds", "1", "--max-rate", "20000", "--duration", "1"],
        "p99 × raw",
    ),
    "publish": (
        ["publish.py", "--rounds", "1", "--messages", "2000", "--single-messages", "200"],
        "publish",
    ),
    "processes": (["processes.py", "--rounds", "1", "--messages", "4000"], "--processes"),
    "op-costs": (["op_costs.py", "--quick"], "server µs/op"),
    "status-scrape": (["status_scrape.py", "--quick"], "coordinator CPU"),
    "schedules": (["schedules.py", "--quick", "--rounds", "1"], "tick → in stream ms"),
    "throughput": (
        ["throughput.py", "--rounds", "1", "--messages", "4000", "--publish-messages", "1000"],
        "consume_ratio=",
    ),
}  # fmt: skip


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("STREAMWORKS_TEST_REDIS_URL", None)  # the scripts start their own server
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / args[0]), *args[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_bench_script_runs_and_prints_its_table(name: str, tmp_path: Path) -> None:
    args, expected = SCRIPTS[name]
    writes_json = name != "throughput"  # the one-line summary script writes none
    json_args = ["--json", str(tmp_path / "out.json")] if writes_json else []
    result = _run([*args, *json_args])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert expected in output, output[-4000:]
    if writes_json:
        assert (tmp_path / "out.json").stat().st_size > 0


@pytest.mark.skipif(
    importlib.util.find_spec("faststream") is None,
    reason="FastStream is a bench-only dependency (bench/requirements.txt)",
)
def test_the_latency_script_runs_with_its_peer(tmp_path: Path) -> None:
    result = _run(["latency.py", "--rounds", "1", "--duration", "1", "--json", str(tmp_path / "o")])
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "faststream" in result.stdout
