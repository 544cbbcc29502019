"""The chaos checker on hand-made histories: it must see every kind of violation it
exists for, excuse exactly the documented SIGSTOP exception, and classify duplicates."""

from __future__ import annotations

import itertools

import orjson

from tests.chaos.checker import (
    RESUMED_RUN_SLACK,
    Acked,
    DeadLetter,
    FaultWindow,
    Run,
    Subscription,
    check,
    parse_log,
)

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
        token: int | None = None,
    ) -> int:
        seq = next(self.seq)
        head = {"m": member, "p": pid or (1 if member == A else 2), "s": shard, "e": entry}
        body = {**head, "i": event, "k": key, "a": attempt, "ev": "start", "t": t}
        if token is not None:
            body["f"] = token  # ctx.fencing_token
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


def test_a_fencing_token_going_down_on_a_shard_is_reported() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence=f"7:{A}", token=7000)
    h.run(B, "2-0", "e2", fence=f"8:{B}", token=8000)
    h.run(B, "3-0", "e3", fence=f"8:{B}", token=8000)  # equal: the same grant
    h.run(A, "1-0", "e4", fence=f"9:{A}", token=6000, shard="s/1@0")  # another shard
    h.run(A, "4-0", "e5", fence=f"9:{A}", token=7500)  # the owner's token went down
    published = [*acked("e1", "e2", "e3"), *acked("e4", shard="s/1@0")]
    published.append(Acked("e5", "k1", "s/0@0", "4-0"))
    report = check(h.runs(), published, [], [])
    assert [v.split()[0] for v in report.token_decreases] == ["e5"]
    assert report.tokens_checked == 5
    assert report.failures() == [f for f in report.failures() if "fencing token" in f]
    assert not report.ok


def test_a_token_read_by_a_run_the_sigstop_exception_excuses_is_not_a_decrease() -> None:
    h = History()
    pause = FaultWindow("worker-pause", "w0", start=10.0, end=14.0, pids=(1,))
    h.run(B, "1-0", "e1", fence=f"8:{B}", token=8000, t=12.0)
    # A, frozen meanwhile, enters its first handler after SIGCONT under its old grant.
    h.run(A, "2-0", "e2", fence=f"8:{B}", token=7000, t=14.01)
    report = check(h.runs(), acked("e1", "e2"), [], [pause])
    assert report.excused_first_after_resume == 1
    assert report.token_decreases == []


def test_a_run_that_could_not_read_its_fence_is_no_overlap_but_is_the_first_run() -> None:
    h = History()
    h.run(A, "1-0", "e1", fence="?", key="k")  # raised at once: its fence read failed
    h.run(A, "2-0", "e2", fence=f"3:{A}", key="k")
    h.run(A, "1-0", "e1", fence=f"3:{A}", key="k", attempt=2)  # the retry: not a first run
    report = check(h.runs(), acked("e1", "e2"), [], [])
    assert report.ok, report.failures()
    assert report.unread_fences == 1 and report.overlap_violations == []


def test_an_unread_fence_in_flight_at_a_sigstop_is_excused_like_any_other() -> None:
    """A stale member frozen just after entering: its fence read fails after the
    resume; its lower token is the documented SIGSTOP case, not a decrease."""
    h = History()
    pause = FaultWindow("worker-pause", "w0", start=10.0, end=14.0, pids=(1,))
    h.run(B, "1-0", "e1", fence=f"8:{B}", token=8000, t=9.0)
    h.run(A, "2-0", "e2", fence="?", token=7000, t=9.99)  # entered, then frozen
    h.run(A, "3-0", "e3", fence="?", token=7000, t=20.0)  # not excused: a decrease
    report = check(h.runs(), acked("e1", "e2", "e3"), [], [pause])
    assert report.excused_in_flight == 1 and report.unread_fences == 1
    assert [v.split()[0] for v in report.token_decreases] == ["e3"]


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


def _line(body: dict[str, object], seq: int, fence: str = "") -> bytes:
    return orjson.dumps(body) + f"|{seq}|{fence}".encode()


def _start(
    member: str,
    pid: int,
    entry: str,
    t: float,
    fence: str,
    *,
    run: str,
    seq: int,
    group: str = "chaos",
    shard: str = "s/0@0",
) -> bytes:
    body = {
        "g": group,
        "m": member,
        "p": pid,
        "s": shard,
        "e": entry,
        "i": f"e{entry}",
        "k": "k1",
        "a": 1,
        "r": run,
        "ev": "start",
        "t": t,
    }
    return _line(body, seq, fence)


def _end(run: str, t: float, seq: int, ev: str = "end", **extra: object) -> bytes:
    return _line({"r": run, "ev": ev, "t": t, "i": "", **extra}, seq)


def test_run_intervals_of_two_members_on_one_shard_must_not_overlap() -> None:
    # A's run goes on (4.0 .. 9.0) while B, the next owner, starts at 6.0 (same fence
    # epoch ordering as a clean hand-over: the start check alone sees nothing).
    lines = [
        _start(A, 1, "1-0", 4.0, f"3:{A}", run="1-1", seq=1),
        _start(B, 2, "2-0", 6.0, f"4:{B}", run="2-1", seq=2),
        _end("2-1", 6.5, 3),
        _end("1-1", 9.0, 4, ev="exit"),  # cancelled late: an interval end all the same
    ]
    report = check(parse_log(lines), [], [], [])
    assert len(report.run_overlaps) == 1 and "by 3.000s" in report.run_overlaps[0]
    assert report.overlap_violations == []  # each started under its own fence
    assert not report.ok
    # The same history with A's run ended in time passes; other groups are separate.
    ok = [
        _start(A, 1, "1-0", 4.0, f"3:{A}", run="1-1", seq=1),
        _end("1-1", 5.9, 2),
        _start(B, 2, "2-0", 6.0, f"4:{B}", run="2-1", seq=3),
        _start(A, 1, "2-0", 6.1, f"5:{A}", run="1-2", seq=4, group="other"),
        _end("2-1", 6.5, 5),
        _end("1-2", 6.6, 6),
    ]
    assert check(parse_log(ok), [], [], []).run_overlaps == []


def test_a_run_without_end_lasts_until_its_process_died_and_a_lost_reply_still_ends() -> None:
    lines = [
        _start(A, 1, "1-0", 4.0, f"3:{A}", run="1-1", seq=1),  # no end record: pid 1 ...
        _start(B, 2, "1-0", 7.0, f"4:{B}", run="2-1", seq=2),
        _end("2-1", 7.5, 3),
    ]
    died_in_time = check(parse_log(lines), [], [], [], deaths={1: 6.0})
    assert died_in_time.run_overlaps == []
    died_late = check(parse_log(lines), [], [], [], deaths={1: 8.0})
    assert len(died_late.run_overlaps) == 1
    never_seen_dying = check(parse_log(lines), [], [], [], run_end=100.0)
    assert never_seen_dying.unbounded_runs == 1 and len(never_seen_dying.run_overlaps) == 1
    # An end record written later (late) names its run by id and gives the real end.
    lines.append(_end("1-1", 5.0, 4, ev="exit", late=1))
    runs = parse_log(lines)
    assert runs[0].closed_t == 5.0 and runs[0].late and runs[0].closed_seq is None
    assert check(runs, [], [], [], run_end=100.0).run_overlaps == []


def test_only_a_run_frozen_by_its_own_sigstop_and_ending_soon_after_is_excused() -> None:
    pause = FaultWindow("worker-pause", "w0", start=5.0, end=8.0, pids=(1,))

    def history(a_end: float) -> list[Run]:
        return parse_log(
            [
                _start(A, 1, "1-0", 4.9, f"3:{A}", run="1-1", seq=1),
                _start(B, 2, "1-0", 7.5, f"4:{B}", run="2-1", seq=2),
                _end("2-1", 7.6, 3),
                _end("1-1", a_end, 4, ev="exit"),
            ]
        )

    soon = check(history(8.2), [], [], [pause])
    assert soon.run_overlaps == [] and soon.excused_paused_runs == 1
    late = check(history(8.0 + RESUMED_RUN_SLACK + 1), [], [], [pause])
    assert len(late.run_overlaps) == 1 and late.excused_paused_runs == 0
    other_pid = FaultWindow("worker-pause", "w1", start=1.0, end=3.0, pids=(1, 2))
    # (a pause of the process before the run does not excuse the run)
    assert len(check(history(8.2), [], [], [other_pid]).run_overlaps) == 1


def test_a_late_group_must_handle_what_was_published_in_its_periods() -> None:
    lines = [
        _start(A, 1, "1-0", 1.0, f"3:{A}", run="1-1", seq=1),
        _end("1-1", 1.1, 2),
        _start(B, 2, "1-0", 1.0, f"3:{B}", run="2-1", seq=3, group="late"),
        _end("2-1", 1.1, 4),
        _start(A, 1, "2-0", 2.0, f"3:{A}", run="1-2", seq=5),
        _end("1-2", 2.1, 6),
    ]
    published = [
        Acked("e1-0", "k1", "s/0@0", "1-0", t=10.0),
        Acked("e2-0", "k1", "s/0@0", "2-0", t=30.0),  # the late group never ran it
        Acked("e3-0", "k1", "s/0@0", "3-0", t=50.0, poison=True),
    ]
    runs = parse_log(lines)
    dead = [
        DeadLetter("e3-0", "s/0@0", "3-0", "max_attempts", 15, group="chaos"),
        DeadLetter("e3-0", "s/0@0", "3-0", "max_attempts", 15, group="late"),
    ]
    in_period = check(
        runs,
        published,
        dead,
        [],
        subscriptions=[Subscription("late", 5.0, 20.0), Subscription("late", 40.0)],
    )
    assert in_period.ok and in_period.group_checked == {"late": 2}
    missed = check(runs, published, dead, [], subscriptions=[Subscription("late", 5.0)])
    assert not missed.ok and len(missed.group_lost["late"]) == 1
    assert "e2-0" in missed.group_lost["late"][0]


def test_an_end_record_that_died_with_its_process_is_taken_from_the_local_file() -> None:
    # A's run ended at 5.0, but its Redis end record was lost with the SIGKILL at 8.0:
    # only the worker's local file knows (a torn last line is ignored).
    lines = [
        _start(A, 1, "1-0", 4.0, f"3:{A}", run="1-1", seq=1),
        _start(B, 2, "1-0", 7.0, f"4:{B}", run="2-1", seq=2),
        _end("2-1", 7.5, 3),
    ]
    assert len(check(parse_log(lines), [], [], [], deaths={1: 8.0}).run_overlaps) == 1
    local = [orjson.dumps({"r": "1-1", "ev": "end", "t": 5.0}), b'{"r": "1-2", "ev']
    runs = parse_log(lines, local)
    assert runs[0].closed_t == 5.0 and runs[0].local_end and runs[0].done
    assert runs[0].closed_seq is None  # its place in the sequence is unknown
    report = check(runs, [], [], [], deaths={1: 8.0})
    assert report.run_overlaps == [] and report.local_ends == 1
    # Redis's record wins where both exist; a local end past B's start is still caught.
    late_local = [orjson.dumps({"r": "1-1", "ev": "exit", "t": 7.2})]
    assert len(check(parse_log(lines, late_local), [], [], []).run_overlaps) == 1
    both = [*lines, _end("1-1", 5.0, 4)]
    assert parse_log(both, late_local)[0].closed_t == 5.0


def test_a_re_read_after_the_groups_resubscribe_is_put_down_to_it_not_to_other_faults() -> None:
    # e1 ran before its group was unsubscribed and again after the resubscribe at
    # earliest, with a Redis restart in between: the resubscribe is the cause. e2 ran
    # twice after it, with only the Redis restart to explain it.
    h = History()
    h.run(A, "1-0", "e1", fence=f"3:{A}", t=1.0)
    h.run(B, "1-0", "e1", fence=f"4:{B}", t=9.0)
    h.run(B, "2-0", "e2", fence=f"4:{B}", t=10.0)
    h.run(B, "2-0", "e2", fence=f"4:{B}", t=12.0)
    windows = [
        FaultWindow("unsubscribe", "chaos", start=2.0, end=3.0, pids=(1,)),
        FaultWindow("redis-restart", "redis", start=5.0, end=11.0, pids=()),
    ]
    report = check(h.runs(), acked("e1", "e2"), [], windows)
    assert report.duplicate_runs == {
        "group unsubscribed, then resubscribed at earliest (re-reads the stream)": 1,
        "Redis restarted before the ack": 1,
    }
    # Another group's unsubscribe explains nothing here.
    other = [FaultWindow("unsubscribe", "other", start=2.0, end=3.0, pids=()), windows[1]]
    assert check(h.runs(), acked("e1", "e2"), [], other).duplicate_runs == {
        "Redis restarted before the ack": 2
    }
