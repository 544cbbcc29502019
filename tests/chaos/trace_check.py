"""Check a recorded protocol history against the invariants of the Quint model.

    .venv/bin/python -m tests.chaos.trace_check HISTORY.jsonl [MORE.jsonl ...]

The history is what :class:`streamworks.testing.history.HistoryRecorder` writes (one
JSON object per line; the recorders of several processes may write one file each, or
share one). The steps of every file are merged by their time ``t`` (file order breaks
ties) and replayed in that order, keeping for each member of each group the shards it
holds, with their fencing tokens, and the end of its lease. These are the model's
invariants (``spec/properties.qnt``), checked step by step:

* **one valid holder** (ExclusiveGrant): when a member is given a shard, no other member
  of the group holds it under a lease that has not ended;
* **reads under the valid grant** (ProcessUnderValidGrant): a read is by a member that
  holds the shard under that token and a valid lease, under the newest grant answered
  for the shard and under the newest fence written for it; an ack is by the newest
  grant's member, under a valid lease, with a token no newer than that grant (a run
  in flight when an answer took its shard away — ``FENCED``, ``UNKNOWN_MEMBER``, not
  listed — may still settle under the lease held before that answer, as the runtime
  lets it: ``Lease.expire`` keeps the expiry, before which nobody else is granted it);
* **tokens never decrease** (FencingTokenMonotone, FenceNeverRegresses): no read of a
  shard uses a token below one an earlier read used, no fence is written below one
  written before, and no member is validly given a shard under a token below the
  newest one granted for it;
* **revisions only grow**: the compare-and-set commits of a group's (a stream's)
  metadata, in the order they were sent, have increasing revisions (a stale writer
  never overwrote a newer commit);
* **no entry after retirement** (NoEntryLost, in part): no read takes entries of a
  shard after a migration's commit recorded it retired.

The first offending step is printed with its file and line, and the exit status is 1;
a history that passes prints one summary line and exits with 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = (
    "Step",
    "TraceViolation",
    "check_directory",
    "check_history",
    "load_steps",
    "main",
    "record_history",
)

#: Answers after which a member holds nothing (it drops every shard and rejoins).
_DROP_ALL = frozenset({"FENCED", "UNKNOWN_MEMBER"})


class TraceViolation(Exception):
    """A step of the history breaks an invariant."""

    def __init__(self, step: Step, invariant: str, why: str) -> None:
        super().__init__(f"{invariant}: {why}")
        self.step = step
        self.invariant = invariant
        self.why = why

    def report(self) -> str:
        """The offending step, where it is, and what it breaks."""
        return (
            f"trace check FAILED at {self.step.where} (t={self.step.t}): {self.invariant}\n"
            f"  {self.why}\n"
            f"  step: {self.step.raw}"
        )


@dataclass(frozen=True, slots=True)
class Step:
    """One line of a history."""

    t: float
    kind: str
    fields: dict[str, Any]
    where: str  # "file:line"
    raw: str

    def token(self) -> int:
        return _int(self.fields["token"], self)

    def text(self, name: str) -> str:
        value = self.fields.get(name)
        if not isinstance(value, str):
            raise TraceViolation(self, "well-formed", f"field {name!r} must be a string")
        return value


def _int(value: object, step: Step) -> int:
    """A token as written (an int, or a decimal string when wider than 63 bits)."""
    if isinstance(value, bool):
        raise TraceViolation(step, "well-formed", f"a token must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise TraceViolation(step, "well-formed", f"a token must be an integer, not {value!r}")


def _revision(value: object, step: Step) -> int:
    """A revision as written: an integer (``rev << 128 | cid``, as the coordinator
    keeps it) or ``"<rev>:<cid>"`` (as its scripts compare it)."""
    if isinstance(value, str) and ":" in value:
        rev, _, cid = value.partition(":")
        return (_int(rev, step) << 128) | _int(cid, step)
    return _int(value, step)


def _parse(path: Path) -> Iterator[tuple[float, int, Step]]:
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            text = line.decode("utf-8", "replace").rstrip("\n")
            if not text.strip():
                continue
            step = Step(0.0, "?", {}, f"{path}:{number}", text)
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise TraceViolation(step, "well-formed", f"not JSON: {e}") from e
            if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
                raise TraceViolation(step, "well-formed", "a step is an object with a 'kind'")
            t, w = record.get("t"), record.get("w", record.get("t"))
            if any(isinstance(x, bool) or not isinstance(x, int | float) for x in (t, w)):
                raise TraceViolation(step, "well-formed", "a step needs a numeric time 't'")
            step = Step(float(t), record["kind"], record, step.where, text)
            yield float(w), number, step


def load_steps(paths: Sequence[Path]) -> Iterator[Step]:
    """The steps of every file, ordered by the time they happened (``t``; the files'
    order, then a file's own order, break ties).

    A file is written in order (``w``, the time a step was written, or ``t``); a step
    timed before it was written (a read, an ack, a commit: ``at``) may come after
    steps that happened later, so the files are sorted, not merged.

    Raises:
        TraceViolation: a line is not a well-formed step, or a file goes back in time.
    """
    keyed = [
        (step.t, index, n, step)
        for index, path in enumerate(paths)
        for _, n, step in _monotone(_parse(path))
    ]
    keyed.sort(key=lambda k: k[:3])
    for _, _, _, step in keyed:
        yield step


def _monotone(steps: Iterable[tuple[float, int, Step]]) -> Iterator[tuple[float, int, Step]]:
    last = float("-inf")
    for w, n, step in steps:
        if w < last:
            raise TraceViolation(
                step, "well-formed", f"time goes back within its file ({w} < {last})"
            )
        last = w
        yield w, n, step


@dataclass(slots=True)
class _Member:
    holds: dict[str, int] = field(default_factory=dict)  # shard -> token (reading or draining)
    draining: set[str] = field(default_factory=set)
    lease_until: float = float("-inf")
    # Shards an answer took away (FENCED, UNKNOWN_MEMBER, not listed): their runs in
    # flight may still settle until the lease the member held then (Lease.expire keeps
    # its expiry: the coordinator cannot hand the shard on before), reading nothing.
    settling: dict[str, tuple[int, float]] = field(default_factory=dict)

    def valid(self, shard: str, t: float) -> bool:
        return shard in self.holds and t < self.lease_until

    def may_settle(self, shard: str, token: int, t: float) -> bool:
        if self.valid(shard, t):
            return True
        kept = self.settling.get(shard)
        return kept is not None and kept[0] == token and t < kept[1]

    def took_away(self, before: dict[str, int], lease: float) -> None:
        for shard, token in before.items():
            if shard not in self.holds:
                self.settling[shard] = (token, lease)


@dataclass(slots=True)
class _Shard:
    grant: tuple[int, str] | None = None  # newest grant answered: (token, member)
    fence: tuple[int, str] | None = None  # newest fence written
    read_high: int | None = None  # highest token a read used


@dataclass(slots=True)
class Summary:
    """What a passing history contained."""

    steps: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    members: set[tuple[str, str]] = field(default_factory=set)
    shards: set[tuple[str, str]] = field(default_factory=set)

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        return (
            f"trace check: ok ({self.steps} steps: {kinds}; "
            f"{len(self.members)} members, {len(self.shards)} shards)"
        )


class _Replay:
    def __init__(self) -> None:
        self.members: dict[tuple[str, str], _Member] = {}
        self.shards: dict[tuple[str, str], _Shard] = {}
        self.revisions: dict[tuple[str, str], int] = {}  # (group|stream, name) -> newest
        self.retired: dict[str, set[str]] = {}  # stream -> shards a migration retired
        self.summary = Summary()

    def member(self, group: str, member: str) -> _Member:
        self.summary.members.add((group, member))
        return self.members.setdefault((group, member), _Member())

    def shard(self, group: str, shard: str) -> _Shard:
        self.summary.shards.add((group, shard))
        return self.shards.setdefault((group, shard), _Shard())

    def apply(self, step: Step) -> None:
        self.summary.steps += 1
        self.summary.kinds[step.kind] = self.summary.kinds.get(step.kind, 0) + 1
        handler = getattr(self, f"_on_{step.kind}", None)
        if handler is None:
            raise TraceViolation(step, "well-formed", f"unknown kind {step.kind!r}")
        try:
            handler(step)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise TraceViolation(step, "well-formed", f"missing or bad field ({e!r})") from e

    # -- member steps ---------------------------------------------------------------

    def _on_heartbeat(self, step: Step) -> None:
        group, name = step.text("group"), step.text("member")
        me = self.member(group, name)
        status = step.text("status")
        held, lease = dict(me.holds), me.lease_until
        if status in _DROP_ALL:
            me.holds.clear()
            me.draining.clear()
            me.lease_until = min(me.lease_until, step.t)
            me.took_away(held, lease)
            return
        assigned = {shard: _int(token, step) for shard, token in step.fields["assigned"].items()}
        revoke = set(step.fields.get("revoke") or ())
        # What the member could already process before this answer: a shard whose
        # validity starts (or restarts, after its lease had run out) with this answer
        # must not be validly held by anyone else now.
        before = {s: tok for s, tok in me.holds.items() if me.valid(s, step.t)}
        # As the member applies an answer (runtime/membership.py, member.qnt): revoked
        # shards drain, draining ones stay until released, unlisted ones are dropped.
        kept = {
            s: tok
            for s, tok in me.holds.items()
            if s in assigned or s in revoke or s in me.draining
        }
        me.draining = {s for s in kept if s in revoke or s in me.draining}
        kept.update({s: tok for s, tok in assigned.items() if s not in me.draining})
        lease_until = step.fields.get("lease_until")
        if lease_until is not None:
            me.lease_until = float(lease_until)
        me.holds = kept
        me.took_away(held, lease)
        for shard in sorted(kept):
            token = kept[shard]
            if before.get(shard) == token:
                continue  # held under a valid lease before this answer too
            state = self.shard(group, shard)
            newest = state.grant
            if newest is None or token >= newest[0]:
                state.grant = (token, name)
            if me.valid(shard, step.t):
                self._check_exclusive(step, group, name, shard, token)
                if newest is not None and token < newest[0]:
                    raise TraceViolation(
                        step,
                        "tokens never decrease",
                        f"{name} is given {shard} under token {token} after token "
                        f"{newest[0]} was granted to {newest[1]}",
                    )

    def _check_exclusive(self, step: Step, group: str, name: str, shard: str, token: int) -> None:
        for (g, other), them in self.members.items():
            if g == group and other != name and them.valid(shard, step.t):
                raise TraceViolation(
                    step,
                    "one valid holder",
                    f"{name} is given {shard} (token {token}) while {other} still holds it "
                    f"(token {them.holds[shard]}, lease until {them.lease_until})",
                )

    def _on_release(self, step: Step) -> None:
        me = self.member(step.text("group"), step.text("member"))
        shard = step.text("shard")
        if me.holds.get(shard) == step.token():
            del me.holds[shard]
            me.draining.discard(shard)
        me.settling.pop(shard, None)  # its last run ended: nothing more to settle

    def _on_read(self, step: Step) -> None:
        group, name, shard, token = (
            step.text("group"), step.text("member"), step.text("shard"), step.token(),
        )  # fmt: skip
        me = self.member(group, name)
        state = self.shard(group, shard)
        if shard in self.retired.get(shard.partition("/")[0], ()):
            raise TraceViolation(
                step,
                "no entry after retirement",
                f"{name} read {step.fields.get('entries')} entries of {shard} after a "
                "migration retired it (its drain evidence was wrong)",
            )
        if not me.valid(shard, step.t) or me.holds[shard] != token:
            held = me.holds.get(shard)
            raise TraceViolation(
                step,
                "reads under the valid grant",
                f"{name} read {shard} under token {token} but holds "
                + (f"token {held}" if held is not None else "nothing there")
                + f" with its lease until {me.lease_until}",
            )
        if state.read_high is not None and token < state.read_high:
            raise TraceViolation(
                step,
                "tokens never decrease",
                f"{name} read {shard} under token {token} after a read under {state.read_high}",
            )
        if state.grant is not None and state.grant != (token, name):
            raise TraceViolation(
                step,
                "reads under the valid grant",
                f"{name} read {shard} under token {token}, but the newest grant is "
                f"token {state.grant[0]} to {state.grant[1]}",
            )
        if state.fence is not None and state.fence != (token, name):
            raise TraceViolation(
                step,
                "reads under the valid grant",
                f"{name} read {shard} under token {token}, but the newest fence written "
                f"is {state.fence[0]}:{state.fence[1]}",
            )
        state.read_high = token if state.read_high is None else max(state.read_high, token)

    def _on_ack(self, step: Step) -> None:
        group, name, shard, token = (
            step.text("group"), step.text("member"), step.text("shard"), step.token(),
        )  # fmt: skip
        me = self.member(group, name)
        grant = self.shard(group, shard).grant
        if not me.may_settle(shard, token, step.t):
            raise TraceViolation(
                step,
                "reads under the valid grant",
                f"{name} acked {step.fields.get('entry')} of {shard} without holding it "
                f"under a valid lease (lease until {me.lease_until})",
            )
        if grant is not None and (grant[1] != name or token > grant[0]):
            raise TraceViolation(
                step,
                "reads under the valid grant",
                f"{name} acked {step.fields.get('entry')} of {shard} (token {token}) but the "
                f"newest grant is token {grant[0]} to {grant[1]}",
            )

    # -- coordinator steps ----------------------------------------------------------

    def _on_fence(self, step: Step) -> None:
        if not step.fields["written"]:
            return
        state = self.shard(step.text("group"), step.text("shard"))
        token, member = step.token(), step.text("member")
        if state.fence is not None and token < state.fence[0]:
            raise TraceViolation(
                step,
                "tokens never decrease",
                f"fence {token}:{member} written after {state.fence[0]}:{state.fence[1]}",
            )
        state.fence = (token, member)

    def _on_commit(self, step: Step) -> None:
        # Timed when sent: a commit that succeeds after another was sent after that
        # one succeeded (it loaded what that one wrote), so send order is commit order.
        revision = _revision(step.fields["revision"], step)
        what = ("group", step.fields.get("group")) if step.fields.get("group") else None
        what = what or ("stream", step.text("stream"))
        last = self.revisions.get(what)
        if last is not None and revision <= last:
            raise TraceViolation(
                step,
                "revisions only grow",
                f"{what[0]} {what[1]!r} committed revision {revision} after {last} "
                "(a compare-and-set that let a stale writer through, or a lost commit)",
            )
        self.revisions[what] = revision

    def _on_migration(self, step: Step) -> None:
        stream = step.text("stream")
        if step.text("phase") == "NONE":  # its shards: the retired ones
            self.retired.setdefault(stream, set()).update(step.fields.get("shards") or ())


def check_history(paths: Sequence[Path]) -> Summary:
    """Replay the merged history of ``paths``.

    Raises:
        TraceViolation: the first step that breaks an invariant (or is malformed).
    """
    replay = _Replay()
    for step in load_steps(paths):
        replay.apply(step)
    return replay.summary


def record_history(env: MutableMapping[str, str], directory: Path) -> Path:
    """Make every ``streamworks`` process started with ``env`` record its protocol
    steps in a file of its own in ``directory`` (``STREAMWORKS_HISTORY_FILE``, with
    ``{pid}``); returns ``directory`` (created), for :func:`check_directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    env["STREAMWORKS_HISTORY_FILE"] = str(directory / "{pid}.jsonl")
    return directory


def check_directory(directory: Path) -> tuple[bool, str]:
    """Check the history files (``*.jsonl``) of ``directory`` (a run's processes, one
    file each): whether they pass, and the summary line or the first offending step."""
    files = sorted(directory.glob("*.jsonl"))
    if not files:
        return False, f"trace check: no history recorded in {directory}"
    try:
        return True, check_history(files).line()
    except TraceViolation as e:
        return False, e.report()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.trace_check",
        description="Check a recorded protocol history against the model's invariants.",
    )
    parser.add_argument("files", nargs="+", type=Path, help="history files (JSON lines)")
    args = parser.parse_args(argv)
    for path in args.files:
        if not path.is_file():
            print(f"trace check: no such file: {path}", file=sys.stderr)
            return 2
    try:
        summary = check_history(args.files)
    except TraceViolation as e:
        print(e.report())
        return 1
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
