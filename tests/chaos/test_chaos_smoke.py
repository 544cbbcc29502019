"""Chaos smoke test: about two minutes of every fault kind, and the checker must pass.

The same harness and checker as ``make chaos`` (``tests/chaos/harness.py``), on a short
schedule that starts with one fault of every kind (``cover_all``): worker SIGKILL,
SIGSTOP/SIGCONT (shorter and longer than the member lease), SIGTERM, coordinator
SIGKILL, SIGSTOP with requests inside and rolling restart, a Redis restart (AOF),
a Redis failover after replication lag (Redis is a primary+replica pair: the
replication link held, the primary killed, the stale replica promoted, every proxy
repointed), heartbeats held, duplicated and reordered by the HTTP proxy in front of a
coordinator replica, network cuts and delays between a worker and Redis or the
coordinators, a cut between the producers and Redis, and a scale of the stream.
Handlers take up to 4 s now and then, half the workers run a
plain ``def`` handler (a sync run past its lease fail-stops its worker: exit 75,
restarted), and a second group subscribes mid-run, is unsubscribed through
``streamworks admin unsubscribe`` and subscribes again. The checker compares run
*intervals* across members per shard and group, and that ``ctx.fencing_token`` never
goes down per shard and group; the trace check replays the protocol steps every
process recorded against the model's invariants (``tests/chaos/trace_check.py``) and
prints the first offending step, if any. A share of the messages is published with
``delay=`` and the app runs a schedule every second (``catch_up="all"``): none of
either may be lost, early or twice (``tests/chaos/feature_checks.py``).
``CHAOS_SEED=<n>`` runs another schedule; the
seed and the replay command are printed either way (pytest shows them when the test
fails).

The server is the one ``find_server_binary()`` finds: the embedded Valkey 8.1, or
``STREAMWORKS_REDIS_SERVER`` (CI's second run: the machine's Redis 7.0, whose AOF
reload loses ``entries-read``; the coordinator repairs the lag on proof, so the final
"drained" check holds there too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosConfig, run_chaos

SEED = int(os.environ.get("CHAOS_SEED", "20241130"))
#: ``CHAOS_REPLICA=0``: one Redis server, without the pair and its failovers.
REPLICA = os.environ.get("CHAOS_REPLICA", "1") != "0"


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_chaos_smoke_every_fault_kind_nothing_lost(
    tmp_path: Path, streamworks_acl: bool
) -> None:
    config = ChaosConfig(
        seed=SEED,
        duration=75,
        workers=4,
        producers=2,
        rate=40,
        gap=(2.0, 3.5),
        cover_all=True,
        settle_timeout=90,
        workdir=tmp_path,
        progress_every=20,
        acl=streamworks_acl,  # --redis-acl: every process as its role's ACL user
        replica=REPLICA,  # a primary+replica pair: redis-failover faults
    )
    result = await run_chaos(config)
    # The recorded protocol history satisfies the model's invariants (trace_check.py).
    assert result.trace[0], result.trace[1]
    assert result.published > 1000, result.table()
    # Every kind of fault happened (and completed).
    assert not result.faults_failed, result.faults_failed
    missing = {k for k, n in result.faults.items() if n == 0} | (
        set(result.config_kinds()) - set(result.faults)
    )
    assert not missing, f"fault kinds not exercised: {missing}"
    # (a) nothing lost, (b) no overlapping ownership, (c) per-key order, final drain.
    assert result.ok, "\n".join([*result.failures(), result.table()])
    assert result.report.handled_ids + result.report.dead_lettered_poison >= result.published
    # The scenarios beyond the fault kinds ran: long runs and the late group's cycle.
    assert result.long_runs > 0 and result.unsubscribes == 1, result.table()
    assert result.report.group_checked.get("chaos-late", 0) > 0, result.table()
    # The new faults did what they are for: a failover lost writes the primary had
    # acknowledged, requests were held past their sender's patience, and the tokens
    # the handlers saw were checked.
    rows = dict(result.fault_rows)
    failovers = rows.get("Redis failovers: that lost writes / replication bytes lost", "")
    assert not REPLICA or not failovers.startswith("0 of"), result.table()
    assert result.report.tokens_checked == result.report.runs > 0, result.table()
    # Delayed messages and the schedule under the same faults (feature_checks.py):
    # every delayed message handled, none before its due time, none entered twice, no
    # delayed key left; every tick once, none missing, none early, ticking to the end.
    features = result.report.features
    assert features.ok, "\n".join([*features.failures(), result.table()])
    assert features.delayed > 100 and features.delayed_runs >= features.delayed, result.table()
    assert features.delayed_handled + features.delayed_dead_lettered == features.delayed
    assert not features.delayed_lost and not features.early_runs and not features.early_entries
    assert features.schedules == 1 and features.ticks >= 0.8 * config.duration, result.table()
    assert not features.duplicate_ticks and not features.tick_gaps and not features.early_ticks
