"""Delayed messages in what operators read: the coordinator's gauges per shard and the
``status`` table (from a status snapshot; the Redis reads are tested end to end in
tests/runtime/test_delays.py)."""

from __future__ import annotations

from prometheus_client import generate_latest
from rich.console import Console

from streamworks.cli.render import stream_table
from streamworks.coordinator.metrics import CoordinatorMetrics
from streamworks.protocol.control import ShardInfo, StatusResponse, StreamInfo


def reminders() -> StreamInfo:
    return StreamInfo(
        name="reminders",
        shard_count=1,
        routing_version=2,
        protocol="jump-xxh64-v1",
        shards=[
            ShardInfo(shard="reminders/0@0", state="ACTIVE", length=5, delayed=0),
            ShardInfo(
                shard="reminders/1@0",
                state="DRAINING",
                length=0,
                delayed=3,
                delayed_next_due_ms=1_767_261_600_000,
            ),
            ShardInfo(shard="reminders/2@0", state="RETIRED"),
        ],
    )


def test_the_coordinator_exports_delayed_counts_and_next_due_per_shard() -> None:
    metrics = CoordinatorMetrics()
    metrics.observe_status(StatusResponse(streams=[reminders()], groups=[]), {})
    text = generate_latest(metrics.registry).decode()
    assert 'streamworks_delayed{shard="reminders/0@0",stream="reminders"} 0.0' in text
    assert 'streamworks_delayed{shard="reminders/1@0",stream="reminders"} 3.0' in text
    assert (
        'streamworks_delayed_next_due_timestamp_seconds{shard="reminders/1@0",'
        'stream="reminders"} 1.7672616e+09'
    ) in text
    assert "reminders/2@0" not in text.split("streamworks_delayed{")[-1]  # retired: none
    metrics.observe_status(None, {})  # Redis unreadable: the series go away
    assert "streamworks_delayed{" not in generate_latest(metrics.registry).decode()


def test_status_shows_the_delayed_messages_beside_the_length() -> None:
    console = Console(width=200, record=True)
    console.print(stream_table(reminders()))
    rows = {
        line.split()[1]: line for line in console.export_text().splitlines() if "reminders/" in line
    }
    assert "+3 delayed" in rows["reminders/1@0"]
    assert "delayed" not in rows["reminders/0@0"]
