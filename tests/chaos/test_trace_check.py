"""The trace check on hand-written histories: the good ones pass, each bad one fails on
its first offending step, with the invariant it breaks (docs/protocol-model.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streamworks.protocol import history
from streamworks.testing.history import ENV, HistoryRecorder, install_from_environment
from tests.chaos.trace_check import TraceViolation, check_history, main

G = "billing"
S = "orders/0@0"
S1 = "orders/1@0"


class Run:
    """Writes a history the way the hooks would, with explicit times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rec = HistoryRecorder(path)

    def beat(
        self,
        at: float,
        member: str,
        assigned: dict[str, int],
        *,
        lease: float,
        revoke: tuple[str, ...] = (),
        status: str = "OK",
        epoch: int = 1,
    ) -> None:
        self.rec.heartbeat(
            group=G,
            member=member,
            status=status,
            member_epoch=epoch,
            group_epoch=epoch,
            assigned=assigned,
            revoke=revoke,
            lease_until=lease,
            seq=None,
            at=at,
        )

    def fence(self, at: float, shard: str, token: int, member: str, written: bool = True) -> None:
        self.rec.fence(group=G, shard=shard, token=token, member=member, written=written, at=at)

    def read(self, at: float, member: str, shard: str, token: int) -> None:
        self.rec.read(group=G, member=member, shard=shard, token=token, entries=1, at=at)

    def ack(self, at: float, member: str, shard: str, token: int, entry: str = "1-0") -> None:
        self.rec.ack(group=G, member=member, shard=shard, token=token, entry=entry, at=at)

    def release(self, at: float, member: str, shard: str, token: int) -> None:
        self.rec.release(group=G, member=member, shard=shard, token=token, reason="drained", at=at)

    def line_of(self, needle: str) -> int:
        """The 1-based line of the first step containing ``needle``."""
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            if needle in line:
                return number
        raise AssertionError(f"{needle!r} not in the history")


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path / "history.jsonl")


def handover(run: Run) -> None:
    """A grants-reads-revokes-drains-releases cycle from a to b, fenced each time."""
    run.rec.commit(group=G, revision="1:7", replica="r1", at=0.5)
    run.fence(0.9, S, 1, "a")
    run.beat(1.0, "a", {S: 1, S1: 1}, lease=10.0)
    run.read(1.5, "a", S, 1)
    run.ack(1.7, "a", S, 1)
    run.beat(3.0, "b", {}, lease=12.0, epoch=2)
    run.beat(3.5, "a", {S1: 1}, lease=12.5, revoke=(S,), epoch=1)
    run.ack(3.8, "a", S, 1, entry="2-0")  # in flight when told to drain: finished
    run.release(4.0, "a", S, 1)
    run.fence(4.4, S, 2, "b")
    run.beat(4.5, "b", {S: 2}, lease=14.0, epoch=2)
    run.read(5.0, "b", S, 2)
    run.ack(5.2, "b", S, 2)
    run.rec.migration(stream="orders", phase="NONE", at=6.0)


# ---------------------------------------------------------------- histories that pass


def test_a_handover_with_revocation_passes(run: Run) -> None:
    handover(run)
    summary = check_history([run.path])
    assert summary.steps == 14
    assert summary.kinds["read"] == 2 and summary.kinds["heartbeat"] == 4
    assert summary.members == {(G, "a"), (G, "b")}


def test_a_handover_after_the_lease_ran_out_passes(run: Run) -> None:
    # a stops heartbeating (paused, crashed): its shard moves only after its lease.
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.read(2.0, "a", S, 1)
    run.beat(10.5, "b", {S: 2}, lease=20.0, epoch=2)
    run.read(11.0, "b", S, 2)
    check_history([run.path])


def test_a_fence_repair_for_the_same_member_passes(run: Run) -> None:
    run.fence(0.9, S, 1, "a")
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.fence(2.0, S, 3, "a")  # the member reported its fenced read refused
    run.beat(2.1, "a", {S: 3}, lease=11.0, epoch=3)
    run.read(2.5, "a", S, 3)
    run.ack(2.6, "a", S, 1)  # read before the repair, settled after it: same owner
    check_history([run.path])


def test_the_files_of_several_processes_are_merged_by_time(tmp_path: Path) -> None:
    coordinator = Run(tmp_path / "coordinator.jsonl")
    a = Run(tmp_path / "a.jsonl")
    b = Run(tmp_path / "b.jsonl")
    coordinator.fence(0.9, S, 1, "a")
    a.beat(1.0, "a", {S: 1}, lease=10.0)
    a.read(1.5, "a", S, 1)
    a.beat(3.5, "a", {}, lease=12.5, revoke=(S,))
    a.release(4.0, "a", S, 1)
    coordinator.fence(4.4, S, 2, "b")
    b.beat(4.5, "b", {S: 2}, lease=14.0, epoch=2)
    b.read(5.0, "b", S, 2)
    summary = check_history([coordinator.path, a.path, b.path])
    assert summary.steps == 8
    # Without a's release (before b's grant in time), the merge order matters.
    a.path.write_text("\n".join(a.path.read_text().splitlines()[:3]) + "\n")
    with pytest.raises(TraceViolation, match="one valid holder"):
        check_history([coordinator.path, a.path, b.path])


# ---------------------------------------------------------------- histories that fail


def test_a_grant_while_another_member_drains_fails(run: Run) -> None:
    # The stale-heartbeat finding (b): b is given the shard a was told to drain and
    # still drains (no release), under a's valid lease.
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.read(1.5, "a", S, 1)
    run.beat(3.5, "a", {}, lease=12.5, revoke=(S,))
    run.beat(4.5, "b", {S: 2}, lease=14.0, epoch=2)
    run.ack(5.0, "a", S, 1)
    with pytest.raises(TraceViolation) as caught:
        check_history([run.path])
    assert caught.value.invariant == "one valid holder"
    b_line = run.line_of('"member":"b"')
    assert caught.value.step.where == f"{run.path}:{b_line}"
    assert "b is given orders/0@0 (token 2) while a still holds it" in caught.value.why


def test_a_lease_renewal_that_overlaps_a_new_owner_fails(run: Run) -> None:
    # a's lease ran out and b took the shard; an answer that renews a's lease with the
    # shard still listed gives a back a shard b holds.
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.beat(10.5, "b", {S: 2}, lease=20.0, epoch=2)
    run.beat(11.0, "a", {S: 1}, lease=21.0)
    with pytest.raises(TraceViolation, match="a is given orders/0@0 \\(token 1\\) while b"):
        check_history([run.path])


def test_a_read_under_an_older_token_fails(run: Run) -> None:
    # The failover finding (c): b read under token 2; a resumes under its pre-loss
    # grant, token 1, after b's lease ran out.
    run.beat(1.0, "b", {S: 2}, lease=10.0, epoch=2)
    run.read(2.0, "b", S, 2)
    run.beat(10.5, "a", {S: 1}, lease=20.0, status="SYNC_METADATA")
    run.read(11.0, "a", S, 1)
    with pytest.raises(TraceViolation) as caught:
        check_history([run.path])
    # The grant is the first offending step: a valid grant below the newest one.
    assert caught.value.invariant == "tokens never decrease"
    assert caught.value.step.kind == "heartbeat"
    assert "a is given orders/0@0 under token 1 after token 2 was granted to b" in (
        caught.value.why
    )


def test_a_read_under_an_older_token_fails_without_its_grant_recorded(run: Run) -> None:
    # Only the reads tell: b read under token 2 (its grant not in the history, e.g. a
    # process whose file was lost), then a under token 1 it holds.
    run.beat(1.0, "a", {S: 1}, lease=20.0)
    run.rec.read(group=G, member="b", shard=S, token=2, entries=1, at=2.0)
    run.read(3.0, "a", S, 1)
    with pytest.raises(TraceViolation) as caught:
        check_history([run.path])
    assert caught.value.invariant in ("reads under the valid grant", "tokens never decrease")
    assert caught.value.step.kind == "read"


def test_a_read_under_a_grant_that_is_not_the_newest_fails(run: Run) -> None:
    # b is answered a newer grant of the shard (applied too late to use it: its lease
    # had already ended), so a's grant is not the valid one any more.
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.beat(5.0, "b", {S: 2}, lease=4.5, epoch=2)
    run.read(6.0, "a", S, 1)
    with pytest.raises(TraceViolation, match="the newest grant is token 2 to b"):
        check_history([run.path])


def test_a_read_under_a_superseded_fence_fails(run: Run) -> None:
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.fence(2.0, S, 2, "b")  # written for another grant, never answered to b
    run.read(2.5, "a", S, 1)
    with pytest.raises(TraceViolation, match="newest fence written is 2:b"):
        check_history([run.path])


def test_a_read_without_a_grant_or_past_the_lease_fails(run: Run) -> None:
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.read(10.0, "a", S, 1)
    with pytest.raises(TraceViolation, match=r"lease until 10\.0"):
        check_history([run.path])
    run.path.unlink()
    fresh = Run(run.path)
    fresh.read(1.0, "a", S, 1)
    with pytest.raises(TraceViolation, match="holds nothing there"):
        check_history([fresh.path])


def test_an_ack_after_fenced_past_the_old_lease_or_by_a_former_owner_fails(run: Run) -> None:
    run.beat(1.0, "a", {S: 1}, lease=10.0)
    run.beat(2.0, "a", {}, lease=10.0, status="FENCED")
    # A sync run in flight at the answer settles within the lease a held (the runtime
    # keeps its expiry: nobody else is granted the shard before).
    run.ack(2.5, "a", S, 1)
    run.ack(10.5, "a", S, 1, entry="2-0")
    with pytest.raises(TraceViolation, match="a acked 2-0 of orders/0@0 without holding it"):
        check_history([run.path])


def test_an_ack_after_fenced_and_a_new_grant_fails(run: Run) -> None:
    run.beat(1.0, "a", {S: 1}, lease=3.0)
    run.beat(2.0, "a", {}, lease=3.0, status="UNKNOWN_MEMBER")
    run.beat(3.5, "b", {S: 2}, lease=10.0, epoch=2)
    run.ack(3.6, "a", S, 1)  # past a's lease, and b holds it
    with pytest.raises(TraceViolation, match="a acked 1-0 of orders/0@0"):
        check_history([run.path])


def test_a_fence_written_below_an_earlier_one_fails(run: Run) -> None:
    run.fence(1.0, S, 2, "b")
    run.fence(2.0, S, 1, "a", written=False)  # refused: fine
    run.fence(3.0, S, 1, "a")  # written: the fence went back (a lost write)
    with pytest.raises(TraceViolation) as caught:
        check_history([run.path])
    assert caught.value.invariant == "tokens never decrease"
    assert caught.value.step.where.endswith(":3")


def test_a_malformed_line_or_time_going_back_fails(run: Run) -> None:
    run.beat(2.0, "a", {S: 1}, lease=10.0)
    with run.path.open("ab") as f:
        f.write(orjson.dumps({"t": 1.0, "kind": "read"}) + b"\n")
    with pytest.raises(TraceViolation, match="time goes back within its file"):
        check_history([run.path])
    run.path.write_text('{"t": 1.0, "kind": "read"}\nnot json\n')
    with pytest.raises(TraceViolation, match="not JSON") as caught:
        check_history([run.path])
    assert caught.value.step.where.endswith(":2")  # every line is parsed before the replay
    run.path.write_text('{"t": 1.0, "kind": "read"}\n')
    with pytest.raises(TraceViolation, match="well-formed") as caught:
        check_history([run.path])
    assert caught.value.step.where.endswith(":1")  # the read lacks its fields


def test_a_commit_below_an_earlier_revision_fails(run: Run) -> None:
    run.rec.commit(group=G, revision=(5 << 128) | 3, at=1.0)
    run.rec.commit(stream="orders", revision=(2 << 128) | 1, at=1.5)  # another entity
    run.rec.commit(group=G, revision=(6 << 128) | 9, at=2.0)
    run.rec.commit(group=G, revision=(6 << 128) | 9, at=3.0)  # the same one again
    with pytest.raises(TraceViolation) as caught:
        check_history([run.path])
    assert caught.value.invariant == "revisions only grow"
    assert caught.value.step.where.endswith(":4")


def test_a_read_of_a_retired_shard_fails(run: Run) -> None:
    run.beat(1.0, "a", {S: 1, S1: 1}, lease=10.0)
    run.read(1.5, "a", S1, 1)
    run.rec.migration(stream="orders", phase="DRAINING", shards=[S1], at=2.0)
    run.read(2.5, "a", S1, 1)  # still draining: fine
    run.rec.migration(stream="orders", phase="NONE", shards=[S1], at=3.0)
    run.read(3.5, "a", S, 1)
    run.read(4.0, "a", S1, 1)
    with pytest.raises(TraceViolation) as caught:
        check_history([run.path])
    assert caught.value.invariant == "no entry after retirement"
    assert caught.value.step.where.endswith(":7")


def test_steps_timed_before_they_were_written_are_replayed_in_time_order(run: Run) -> None:
    # b's grant is written before a's read, but the read happened first: in order of
    # ``t`` a read under a's valid grant, then the handover.
    run.beat(1.0, "a", {S: 1}, lease=3.0)
    run.beat(4.0, "b", {S: 2}, lease=10.0)
    run.read(2.0, "a", S, 1)  # written last, happened at 2.0
    assert check_history([run.path]).steps == 3


# ---------------------------------------------------------------- the command line


def test_the_cli_prints_the_first_offending_step(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    handover(run)
    assert main([str(run.path)]) == 0
    assert capsys.readouterr().out.startswith("trace check: ok (14 steps: ack 3, commit 1,")
    run.beat(6.5, "c", {S: 7}, lease=9.0, epoch=3)  # b's lease is still valid
    run.beat(6.6, "d", {S: 8}, lease=9.0, epoch=3)  # a second offence: not reported
    assert main([str(run.path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"trace check FAILED at {run.path}:15 (t=6.5): one valid holder"
    assert "c is given orders/0@0 (token 7) while b still holds it" in out[1]
    assert out[2].startswith('  step: {"t":6.5,"w":')
    assert len(out) == 3


def test_the_cli_as_a_module(run: Run, tmp_path: Path) -> None:
    handover(run)
    ok = subprocess.run(
        [sys.executable, "-m", "tests.chaos.trace_check", str(run.path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("trace check: ok")
    missing = subprocess.run(
        [sys.executable, "-m", "tests.chaos.trace_check", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"trace check: no such file: {tmp_path / 'nope.jsonl'}"


# ---------------------------------------------------------------- the recorder


def test_the_library_records_nothing_until_a_sink_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert history.sink is None and history.now() is None  # the production default
    monkeypatch.setenv(ENV, str(tmp_path / "{pid}.jsonl"))
    recorder = install_from_environment()
    try:
        sink = history.sink
        assert recorder is not None and sink is recorder
        assert history.now() is not None
        sink.heartbeat(
            group=G, member="a", status="OK", member_epoch=1, group_epoch=1,
            assigned={S: history.token_of("7:a")}, lease_until=1e9,
        )  # fmt: skip
        sink.read(group=G, member="a", shard=S, token=7, entries=3)
        sink.ack(group=G, member="a", shard=S, token=7, entry="1-0", at=history.now())
    finally:
        history.install(None)
        assert recorder is not None
        recorder.close()
    (path,) = tmp_path.iterdir()
    assert path.name == f"{os.getpid()}.jsonl"
    summary = check_history([path])
    assert summary.kinds == {"heartbeat": 1, "read": 1, "ack": 1}


def test_a_disabled_recorder_writes_nothing(tmp_path: Path) -> None:
    rec = HistoryRecorder.disabled()
    assert not rec.enabled
    rec.read(group=G, member="a", shard=S, token=1, entries=1)
    rec.close()
    assert list(tmp_path.iterdir()) == []


def test_recorders_append_whole_lines_and_keep_wide_tokens_exact(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    wide = (5 << 128) | 7  # a revision-style token far beyond 64 bits
    with HistoryRecorder(path) as one, HistoryRecorder(path) as two:
        one.fence(group=G, shard=S, token=wide, member="a", written=True)
        two.heartbeat(
            group=G, member="a", status="OK", member_epoch=1, group_epoch=1,
            assigned={S: wide}, lease_until=1e9,
        )  # fmt: skip
        one.read(group=G, member="a", shard=S, token=wide, entries=2)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [line["kind"] for line in lines] == ["fence", "heartbeat", "read"]
    assert lines[0]["token"] == str(wide) and lines[1]["assigned"] == {S: str(wide)}
    assert lines[0]["t"] <= lines[1]["t"] <= lines[2]["t"]
    check_history([path])
