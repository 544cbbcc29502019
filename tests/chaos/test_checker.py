"""The chaos checker on hand-made histories: it must see every kind of violation it
exists for, excuse exactly the documented SIGSTOP exception, and classify duplicates."""

from __future__ import annotations

import itertools

import orjson

from tests.chaos.checker import Acked, DeadLetter, FaultWindow, Run, check, parse_log

A = "a" * 32
B = "b" * 32


class History:
    """Builds log lines the way the chaos app writes them (one shared sequence)."""

    def __init__(self) -> None:
        self.seq = itertools.count(1)
        self.lines: list[bytes] = []

    def start(
        self,
        member: str,
        entry: str,
        event: str,
        *,
        fence: str,
        key: str = "k1",
        shard: str = "s/0@0",
        pid: int = 0,
        t: float = 0.0,
        attempt: int = 1,
    ) -> int:
        seq = next(self.seq)
        head = {"m": member, "p": pid or (1 if member == A else 2), "s": shard, "e": entry}
        body = {**head, "i": event, "k": key, "a": attempt, "ev": "start", "t": t}
        self.lines.append(orjson.dumps(body) + f"|{seq}|{fence}".encode())
        return seq

    def end(self, start: int, ev: str = "end", t: float = 0.0) -> None:
        seq = next(self.seq)
        body = {"m": "", "p": 0, "s": "", "e": "", "i": "", "ev": ev, "start": start, "t": t}
        self.lines.append(orjson.dumps(body) + f"|{seq}|".encode())

    def run(self, member: str, entry: str, event: str, **kw: object) -> int:
        start = self.start(member, entry, event, **kw)  # type: ignore[arg-type]
        self.end(start)
        return start

    def runs(self) -> list[Run]:
        return parse_log(self.lines)


def acked(*ids: str, shard: str = "s/0@0", **kw: object) -> list[Acked]:
    return [Acked(i, "k1", shard, f"{n + 1}-0", **kw) for n, i in enumerate(ids)]  # type: ignore[arg-type]


def test_a_clean_hand_over_passes() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}")
    h.run(A, "2-0", "e2", fence=f"3:{A}")
    h.run(B, "3-0", "e3", fence=f"5:{B}")
    report = check(h.runs(), acked("e1", "e2", "e3"), [], [])
    assert report.ok, report.failures()
    assert report.handled_ids == 3 and report.periods == 2
    assert sum(report.duplicate_runs.values()) == 0


def test_an_acked_message_never_handled_is_lost_unless_dead_lettered() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}")
    started = h.start(A, "2-0", "e2", fence=f"3:{A}")  # started, never finished
    assert started
    report = check(h.runs(), acked("e1", "e2", "e3"), [], [])
    assert not report.ok
    assert [x.split()[0] for x in report.lost] == ["e2", "e3"]
    dead = [
        DeadLetter("e2", "s/0@0", "2-0", "max_attempts", 15),
        DeadLetter("e3", "s/0@0", "3-0", "poison", 1),
    ]
    assert check(h.runs(), acked("e1", "e2", "e3"), dead, []).ok


def test_an_entry_the_producer_reported_must_itself_be_handled() -> None:
    h = History()
    h.run(A, "9-0", "e1", fence=f"3:{A}")  # the event id was handled, but from another entry
    report = check(h.runs(), acked("e1"), [], [])
    assert report.lost_entries and not report.lost


def test_starting_under_another_members_fence_is_an_overlap() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}")
    h.run(A, "2-0", "e2", fence=f"4:{B}")  # B had been granted the shard
    h.run(A, "3-0", "e3", fence="")  # no fence at all
    report = check(h.runs(), acked("e1", "e2", "e3"), [], [])
    assert len(report.overlap_violations) == 2
    assert not report.ok


def test_only_the_documented_sigstop_exception_is_excused() -> None:
    h = History()
    pause = FaultWindow("worker-pause", "w0", start=10.0, end=14.0, pids=(1,))
    # Entered before the freeze, its first write (and fence read) after the resume.
    h.run(A, "1-0", "e1", fence=f"4:{B}", t=9.99)
    # The step frozen between the lease check and the handler: first one after SIGCONT.
    h.run(A, "2-0", "e2", fence=f"4:{B}", t=14.01)
    # Anything after that is a violation.
    h.run(A, "3-0", "e3", fence=f"4:{B}", t=14.02)
    # The same pattern in a process that was not paused is a violation too.
    h.run(B, "4-0", "e4", fence=f"5:{A}", t=9.99)
    report = check(h.runs(), acked("e1", "e2", "e3", "e4"), [], [pause])
    assert report.excused_in_flight == 1
    assert report.excused_first_after_resume == 1
    assert [v.split()[0] for v in report.overlap_violations] == ["e3", "e4"]


def test_fence_epochs_going_backwards_on_a_shard_are_reported() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"7:{A}")
    h.run(B, "2-0", "e2", fence=f"6:{B}")
    report = check(h.runs(), acked("e1", "e2"), [], [])
    assert len(report.fence_regressions) == 1


def test_key_order_within_an_ownership_period() -> None:
    h = History()
    fence = f"3:{A}"
    h.run(A, "2-0", "e2", fence=fence)
    h.run(A, "1-0", "e1", fence=fence)  # an earlier entry of the key, first run after
    h.run(A, "3-0", "e3", fence=fence, key="k2")
    report = check(h.runs(), acked("e1", "e2", "e3"), [], [])
    assert len(report.order_violations) == 1 and "k1" in report.order_violations[0]


def test_retries_and_other_periods_are_not_order_violations() -> None:
    h = History()
    s1 = h.start(A, "1-0", "e1", fence=f"3:{A}")
    h.end(s1, "fail")
    h.run(A, "2-0", "e2", fence=f"3:{A}", key="k2")
    h.run(A, "1-0", "e1", fence=f"3:{A}", attempt=2)  # the retry of e1
    # Another owner (new period) re-runs an older entry after a newer one: fine.
    h.run(B, "3-0", "e3", fence=f"4:{B}")
    h.run(B, "1-0", "e1", fence=f"4:{B}")
    report = check(h.runs(), acked("e2", "e3"), [], [])
    assert not report.order_violations, report.order_violations


def test_two_entries_of_one_key_running_at_once_is_reported() -> None:
    h = History()
    fence = f"3:{A}"
    s1 = h.start(A, "1-0", "e1", fence=fence)
    s2 = h.start(A, "2-0", "e2", fence=fence)  # e1 still running
    h.end(s1)
    h.end(s2)
    s3 = h.start(A, "3-0", "e3", fence=fence, key="k9")  # other keys may overlap
    h.run(A, "4-0", "e4", fence=fence, key="k8")
    h.end(s3)
    report = check(h.runs(), acked("e1", "e2"), [], [])
    assert len(report.overlap_in_key) == 1 and "k1" in report.overlap_in_key[0]


def test_duplicates_are_classified_by_what_hit_the_earlier_member() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}", t=1.0)  # completed, ack lost: A was killed
    h.run(B, "1-0", "e1", fence=f"4:{B}", t=5.0)
    h.run(B, "2-0", "e2", fence=f"4:{B}", t=6.0)  # completed, re-run with no fault at all
    h.run(B, "2-0", "e2", fence=f"4:{B}", t=7.0)
    first = h.start(B, "3-0", "e3", fence=f"4:{B}", t=8.0)  # interrupted, then retried
    assert first
    h.run(B, "3-0", "e3", fence=f"4:{B}", t=9.0)
    kill = FaultWindow("worker-kill", "w0", start=2.0, end=3.0, pids=(1,))
    report = check(h.runs(), acked("e1", "e2", "e3"), [], [kill])
    assert report.ok
    assert report.duplicate_runs == {
        "worker SIGKILLed before its ack was flushed": 1,
        "unexplained": 1,
    }
    assert report.reruns_after_interrupt == {"unexplained": 1}
    assert any("no fault to explain" in a for a in report.anomalies)


def test_an_event_written_twice_is_a_duplicate_write() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}", shard="s/0@0")
    h.run(B, "1-0", "e1", fence=f"4:{B}", shard="s/1@1")  # retried publish, new layout
    h.run(A, "2-0", "e2", fence=f"3:{A}", shard="s/0@0")
    h.run(A, "3-0", "e2", fence=f"3:{A}", shard="s/0@0")  # twice on one shard: dedup missed
    published = [
        Acked("e1", "k1", "s/1@1", "1-0", retried=True),
        Acked("e2", "k1", "s/0@0", "2-0"),
    ]
    report = check(h.runs(), published, [], [])
    assert report.duplicate_writes == {
        "publish retried after an unknown outcome, landed on another shard (E18)": 1,
        "same event id twice on one shard (shard-level dedup missed it)": 1,
    }
    assert len(report.anomalies) == 1


def test_an_ack_lost_long_after_a_redis_restart_is_put_down_to_a_stale_connection() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}", t=1.0)
    h.run(A, "2-0", "e2", fence=f"3:{A}", t=60.0)  # its ack failed on a broken connection
    h.run(A, "2-0", "e2", fence=f"3:{A}", t=60.5)
    restart = FaultWindow("redis-restart", "redis", start=10.0, end=12.0)
    report = check(h.runs(), acked("e1", "e2"), [], [restart])
    assert set(report.duplicate_runs) == {
        "stale pooled connection broken by an earlier Redis restart/cut (ack failed)"
    }
