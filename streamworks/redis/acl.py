"""Least-privilege Redis ACLs for each streamworks role, derived from one table.

:data:`PATHS` lists, per role, every code path the role runs against Redis: the key
families it touches, the commands it sends, and the Lua scripts it runs. The rules
``streamworks admin acl ROLE`` prints are compiled from it, and nothing else:

* a path without keys (connecting, the script cache, ``MULTI``…) grants its commands
  at the root of the user;
* a path with keys becomes one ACL *selector* (Redis 7.0+ / Valkey): its key patterns
  and its commands, so each command is allowed only on the keys of the paths that run
  it. A script path grants ``EVAL``/``EVALSHA`` there — Redis checks the keys a script
  declares against *one* selector, so every key family a script takes is in its path —
  and every command the script runs (read from its Lua source, :func:`script_commands`:
  Redis checks those too, against the caller), on the same keys.

Paths with the same key families share a selector. The whole table is checked: the
tests run every path of every role as its user and read ``ACL LOG`` (which records every
refusal, however the code handled it), and ``tests/security/test_acl_table.py`` checks
that every command of every script is read and every script is run by some role.

* **worker** — reads, acks, retries and dead-letters on shard keys; its idempotency
  records; never creates a key with ``MKSTREAM``, never deletes a shard, never writes an
  owner fence or a control-plane key (it only reads the namespace id). It publishes from
  handlers, so it has the producer's paths too.
* **producer** — ``XADD`` (and the dedup script) on shard streams only, and a read of the
  namespace id.
* **coordinator** — the control-plane keys, plus what it needs on shard keys: create
  them (``XGROUP CREATE … MKSTREAM``), write owner fences, read consumer-group positions
  (``XINFO``/``XLEN``), and retire a drained shard (``retire.lua``, which decides on
  consumer-group metadata alone). It cannot read, acknowledge or delete messages (E24):
  no ``XREADGROUP``, ``XREAD``, ``XRANGE``, ``XACK``, ``XCLAIM``, ``XAUTOCLAIM``,
  ``XDEL`` or ``XTRIM``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Literal

from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import load_script

__all__ = (
    "PATHS",
    "ROLES",
    "Family",
    "Path",
    "Role",
    "acl_rules",
    "compile_rules",
    "script_commands",
    "setuser_command",
)

Role = Literal["worker", "producer", "coordinator"]
ROLES: tuple[Role, ...] = ("worker", "producer", "coordinator")

#: A family of keys, by its glob pattern in :class:`Keyspace`.
Family = Literal[
    "stream",  # shard streams
    "fence",  # owner fences
    "hold",  # the fenced read's hold keys
    "retries",  # retry records
    "groups",  # a shard's set of groups that must exist on it
    "dedup",  # idempotent-publish records
    "redelivery",  # per-group redelivery streams and their retry records
    "dead_letters",  # dead-letter streams
    "markers",  # dead-letter markers
    "idempotency",  # the default idempotency store
    "control",  # every control-plane key
    "namespace",  # the namespace id (a control-plane key)
    "delayed",  # a shard's delayed messages: set, entries, counter, wake stream
    "schedule",  # schedule tick state and names (the schedule shard's slot)
    "rate",  # rate-limit buckets
]

_PATTERNS: dict[Family, Callable[[Keyspace], str]] = {
    "stream": Keyspace.shard_streams_pattern,
    "fence": Keyspace.fences_pattern,
    "hold": Keyspace.read_holds_pattern,
    "retries": Keyspace.retries_pattern,
    "groups": Keyspace.shard_groups_pattern,
    "dedup": Keyspace.dedup_pattern,
    "redelivery": Keyspace.redelivery_pattern,
    "dead_letters": Keyspace.dead_letters_pattern,
    "markers": Keyspace.dead_letter_marker_pattern,
    "idempotency": Keyspace.idempotency_pattern,
    "control": Keyspace.control_pattern,
    "namespace": Keyspace.namespace,
    "delayed": Keyspace.delayed_pattern,
    "schedule": Keyspace.schedule_pattern,
    "rate": Keyspace.rate_pattern,
}


@dataclass(frozen=True, slots=True)
class Path:
    """One code path of a role: what it runs on which keys.

    Attributes:
        name: what it is, for people (``docs/security.md`` lists them).
        keys: the key families it touches (none: keyless commands, granted at the
            root). For a script path, in the order of the scripts' ``KEYS``: each
            command a script runs is granted on the family of the key it is given.
        commands: the commands it sends itself (on any of ``keys``), lower case,
            ``container|sub`` for a subcommand (``xinfo|groups``).
        scripts: the ``redis/lua`` scripts it runs, all with ``KEYS`` laid out as
            ``keys``, then any number of keys of the ``rest`` families.
        rest: the families of a script's variable-length tail of ``KEYS``.
    """

    name: str
    keys: tuple[Family, ...] = ()
    commands: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()
    rest: tuple[Family, ...] = ()


# -- what each role runs ------------------------------------------------------------------
# CLIENT SETINFO is not needed: streamworks' clients do not send it (it does not exist
# before Redis 7.2, and its refusal would fill ACL LOG). CLUSTER INFO tells a cluster
# from a single node when the client is created (redis_cluster=auto); the cluster client
# learns (and relearns, after a failover) which node owns what with CLUSTER SLOTS, and
# where each command's keys are with COMMAND (read-only server metadata). HELLO also
# tells which server and version answers (the coordinator's lag repair asks).
_CONNECT = Path(
    "connect",
    commands=("ping", "hello", "auth", "select", "cluster|info", "cluster|slots", "command"),
)
_SCRIPT_CACHE = Path("load scripts", commands=("script|load", "script|exists"))
_NAMESPACE = Path("namespace id check", ("namespace",), ("get",))
_PUBLISH = (
    Path("publish", ("stream",), ("xadd",)),
    Path("idempotent publish", ("stream", "dedup"), scripts=("publish_dedup",)),
    Path("durable publish and dead letters (min_replicas)", commands=("wait",)),
    # Issue 21: delayed publish (runtime/delayed_publish.py); proven under these grants
    # by tests/redis/test_lua_scheduling_acl.py (docs/design/scheduling.md).
    Path(
        "delayed publish",
        ("stream", "delayed", "delayed", "delayed", "delayed", "dedup"),
        scripts=("delay_add",),
    ),
)

PATHS: dict[Role, tuple[Path, ...]] = {
    "worker": (
        _CONNECT,
        _SCRIPT_CACHE,
        _NAMESPACE,
        # The fenced read is one MULTI/EXEC: the gate moves a fenced-out shard's stream
        # to its hold key (RENAME: both keys in one selector) so that the XREADGROUP
        # takes nothing, and the ungate moves it back. Without +multi each would run on
        # its own: the read unchecked, the stream missing for producers in between.
        Path("fenced read: one transaction", commands=("multi", "exec")),
        Path("fenced read: gate", ("stream", "fence", "hold"), scripts=("read_gate",)),
        Path("fenced read: read", ("stream",), ("xreadgroup",)),
        Path("fenced read: ungate", ("stream", "hold"), scripts=("read_ungate",)),
        # The idle waiter cuts its own shared XREAD BLOCK short when a shard joins it
        # (runtime/waiter.py); CLIENT UNBLOCK only ends a wait early, as a timeout would.
        Path("wait for new entries", ("stream",), ("xread",)),
        Path("interrupt a shared wait", commands=("client|id", "client|unblock")),
        Path("takeover", ("stream", "fence", "retries"), scripts=("claim",)),
        Path("prune consumers", ("stream",), scripts=("prune_consumers",)),
        Path("ack", ("stream",), ("xack",)),
        Path("forget retry records", ("retries",), ("hdel",)),
        Path("retry records (fenced)", ("fence", "retries"), scripts=("retry_record",)),
        Path("trim below every group", ("stream", "groups"), scripts=("trim",)),
        Path("lag and pending gauges", ("stream",), ("xinfo|groups",)),
        Path(
            "dead letters, at most once",
            ("markers", "dead_letters", "markers"),
            scripts=("dead_letter",),
        ),
        Path("find redelivery streams", ("redelivery",), ("exists",)),
        Path("redelivery takeover", ("redelivery", "fence", "redelivery"), scripts=("claim",)),
        Path("redelivery read", ("redelivery", "fence"), scripts=("read",)),
        Path("redelivery prune", ("redelivery",), scripts=("prune_consumers",)),
        Path("redelivery acks", ("redelivery",), ("xack", "xdel", "hdel")),
        Path("redelivery retry records", ("fence", "redelivery"), scripts=("retry_record",)),
        # Removes its group's redelivery stream of a shard it owns once it is empty.
        Path(
            "redelivery cleanup",
            ("redelivery", "fence", "redelivery"),
            scripts=("redelivery_done",),
        ),
        Path("idempotency store", ("idempotency",), ("set", "get", "del", "pexpire")),
        *_PUBLISH,
        # Issue 21, phase 2 (see _PUBLISH).
        Path(
            "delayed messages due: into the stream",
            ("stream", "fence", "delayed", "delayed"),
            scripts=("delay_move",),
        ),
        # The mover waits on its shard's wake stream in the shared idle wait (a plain
        # XREAD of a stream that only ever holds a due time, runtime/delay_mover.py):
        # one XREAD BLOCK names shard streams and wake streams, so one selector.
        Path("wait for an earlier delayed message", ("stream", "delayed"), ("xread",)),
        Path("schedule ticks", ("fence", "schedule", "schedule"), scripts=("schedule_tick",)),
        Path("rate limits", rest=("rate",), scripts=("rate_take",)),
    ),
    "producer": (_CONNECT, _SCRIPT_CACHE, _NAMESPACE, *_PUBLISH),
    "coordinator": (
        _CONNECT,
        _SCRIPT_CACHE,
        # Redis TIME: directly on a single node, from a script on a control key on a
        # cluster (so it is the control node's clock). SCAN finds shard keys and fences
        # of a stream or group whose metadata was lost (E21).
        Path("clock and key discovery", commands=("time", "scan")),
        # Control-plane commits, fences and leases wait for the replicas in sync
        # (coordinator/replication.py), counted with INFO replication on every primary.
        Path("writes that wait for replicas", commands=("info", "wait")),
        Path("clock (cluster)", ("control",), ("eval", "time")),
        Path(
            "control plane: metadata, mutexes, registry",
            ("control",),
            ("get", "set", "del", "hmget", "hgetall", "sismember", "smembers", "sadd", "srem"),
        ),
        Path("control plane: leases", ("control",), ("zrange", "zrangebyscore")),
        Path("group commit", ("control",) * 5, scripts=("group_commit",)),
        Path("group changelog", ("control",) * 2, scripts=("group_delta",)),
        Path("stream commit", ("control",) * 2, scripts=("stream_commit",)),
        Path("lease renewal", ("control",) * 3, scripts=("lease_renew",), rest=("control",)),
        Path("mutex release and renewal", ("control",), scripts=("mutex_release", "mutex_renew")),
        Path(
            "create shards and consumer groups",
            ("stream", "groups"),
            scripts=("shard_create", "group_create", "shard_groups"),
        ),
        Path(
            "unsubscribe a group from a shard",
            ("stream", "groups", "fence", "retries", "redelivery", "redelivery"),
            scripts=("group_destroy",),
        ),
        Path("owner fences", ("fence", "stream"), scripts=("fence",)),
        Path("highest fence epoch (E21)", ("fence",), ("get",)),
        Path(
            "drain check, lag repair and retirement",
            ("stream", "groups"),
            scripts=("retire",),
            rest=("redelivery", "delayed", "fence", "retries"),
        ),
        Path("positions (status, drain)", ("stream",), ("xlen", "xinfo|groups", "xinfo|stream")),
        Path("dead-letter counts (status, dashboard)", ("dead_letters",), ("xlen",)),
        # Ids and due times of the delayed set only; the payloads are in the entries
        # hash, which the coordinator never reads (no HGET on these keys).
        Path("delayed counts (status, metrics)", ("delayed",), ("zcard", "zrange")),
        # Each schedule's tick times and counters (coordinator/schedules.py): state the
        # schedule shard's owner wrote, never a message.
        Path("schedule state (status, dashboard)", ("schedule",), ("smembers", "hgetall")),
        # The dashboard's dead-letter actions (coordinator/dashboard/actions.py, the
        # library of streamworks.dlq): on an admin's request only, the one place a
        # coordinator reads messages — dead letters, never a shard's (E24).
        Path(
            "dashboard: list, show and delete dead letters (admin)",
            ("dead_letters",),
            ("exists", "xrange", "xdel", "del"),
        ),
        Path(
            "dashboard: replay a dead letter to its group only (admin)",
            ("stream", "redelivery"),
            scripts=("redeliver",),
        ),
    ),
}

# -- scripts: the commands each runs, on which keys --------------------------------------
#: Container commands whose ACL is per subcommand (``xinfo|groups``).
_CONTAINERS = frozenset({"xinfo", "xgroup", "client", "cluster", "script", "object", "config"})
_CALL = re.compile(r"redis\.p?call\(")
_LITERAL = re.compile(r"""^'([A-Za-z]+)'$""")
_KEY_AT = re.compile(r"^KEYS\[(\d+)\]$")
_KEY_ANY = re.compile(r"KEYS\[[^\]]+\]")
_UNPACK = re.compile(r"^unpack\(\s*KEYS\s*(?:,\s*(\d+)\s*)?\)$")
#: Scripts that pass command names to ``redis.call`` through a helper function: the
#: helper's name (its calls are read as ``redis.call``'s are). A call by a variable
#: anywhere else is refused by :func:`script_grants`.
_HELPERS = {"group_commit": "each_chunk"}


_LOCAL = re.compile(r"^\s*local\s+([\w\s,]+?)\s*=\s*(.+)$", re.MULTILINE)


def _key_aliases(source: str) -> dict[str, str]:
    """Local names a script gives its keys (``local state = KEYS[2]``, also in a
    multiple assignment): each name -> its ``KEYS[n]``."""
    aliases: dict[str, str] = {}
    for names, values in _LOCAL.findall(source):
        pairs = zip(names.split(","), values.split(","), strict=False)
        aliases |= {n.strip(): v.strip() for n, v in pairs if _KEY_AT.match(v.strip())}
    return aliases


def _arguments(source: str, start: int) -> tuple[list[str], int]:
    """The top-level, comma-separated arguments of the call whose ``(`` ends at
    ``start``, and where the call ends."""
    depth, quote, j, args, begin = 1, "", start, [], start
    while depth:
        ch = source[j]
        if quote:
            if ch == "\\":
                j += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 1:
            args.append(source[begin:j].strip())
            begin = j + 1
        j += 1
    args.append(source[begin : j - 1].strip())
    return [a for a in args if a], j


@dataclass(frozen=True, slots=True)
class _Call:
    command: str  # ACL name
    #: Per key argument, the ``KEYS`` position: n ≥ 1 that one, -n that one and every
    #: later one (``unpack``), 0 one of the variable tail, None any (a variable).
    keys: tuple[frozenset[int | None], ...]
    many: bool  # several keys in one argument (unpack)


def _script_calls(name: str) -> list[_Call]:
    source = "\n".join(
        line.split("--", 1)[0] if not line.lstrip().startswith("--") else ""
        for line in load_script(name).splitlines()
    )
    aliases = _key_aliases(source)
    starts = [m.end() for m in _CALL.finditer(source)]
    helper = _HELPERS.get(name)
    if helper is not None:
        starts += [m.end() for m in re.finditer(rf"\b{helper}\(", source)]
    calls = []
    for start in starts:
        args, _ = _arguments(source, start)
        literal = _LITERAL.match(args[0]) if args else None
        if literal is None:
            if helper is not None:
                continue  # the helper's own redis.call(command, ...): read at its callers
            raise ValueError(f"{name}.lua calls a command by a variable: declare its helper")
        command, rest = literal.group(1).lower(), args[1:]
        sub = _LITERAL.match(rest[0]) if rest else None
        if command in _CONTAINERS and sub is not None:
            command, rest = f"{command}|{sub.group(1).lower()}", rest[1:]
        keys: list[frozenset[int | None]] = []
        many = False
        for arg in rest:
            arg = aliases.get(arg, arg)
            if (at := _KEY_AT.match(arg)) is not None:
                keys.append(frozenset({int(at.group(1))}))
            elif (unpacked := _UNPACK.match(arg)) is not None:
                keys.append(frozenset({-int(unpacked.group(1) or 1)}))  # from there on
                many = True
            elif _KEY_ANY.search(arg):
                keys.append(frozenset({0}))  # KEYS[i]: a loop over the variable tail
        if not keys and rest and not rest[0].startswith(("'", "ARGV")) and not rest[0].isdigit():
            keys.append(frozenset({None}))  # a key in a variable (a helper's parameter)
        calls.append(_Call(command, tuple(keys), many))
    return calls


@cache
def script_commands(name: str) -> frozenset[str]:
    """Every command ``lua/<name>.lua`` runs, as ACL names (``xgroup|create``).

    Raises:
        ValueError: the script calls a command whose name this cannot read.
    """
    return frozenset(call.command for call in _script_calls(name))


def _families(position: int | None, path: Path) -> set[Family]:
    """The families a script's ``KEYS[position]`` may be in (see ``_Call.keys``)."""
    if position is None or (position == 0 and not path.rest):
        return {*path.keys, *path.rest}
    if position == 0:
        return set(path.rest)
    if position < 0:
        return {*path.keys[-position - 1 :], *path.rest}
    if position <= len(path.keys):
        return {path.keys[position - 1]}
    return set(path.rest)


def _grants(path: Path) -> Iterable[tuple[frozenset[Family], str]]:
    """``(key families, command)``: each command of ``path`` with the keys it runs on
    (no families: a keyless command)."""
    own = frozenset(path.keys)
    for command in path.commands:
        yield own, command
    if not path.scripts:
        return
    declared = frozenset({*path.keys, *path.rest})
    yield declared, "eval"  # on hot paths (script_body)
    yield declared, "evalsha"
    for script in path.scripts:
        for call in _script_calls(script):
            families = [_families(p, path) for positions in call.keys for p in positions]
            if not families:
                yield declared, call.command  # keyless (TIME): beside the call's own
            elif len(families) == 1 and not call.many:
                for family in families[0]:  # one key: on whichever family it is in
                    yield frozenset({family}), call.command
            else:  # several keys in one command (RENAME, DEL): one selector for all
                yield frozenset().union(*families), call.command


def compile_rules(paths: Iterable[Path], prefix: str = "sw") -> list[str]:
    """The ACL rules granting exactly ``paths`` for keys under ``prefix``: what
    :func:`acl_rules` gives a role, for any set of paths (a test proves a path's grants
    are needed by leaving it out)."""
    return ["resetkeys", "resetchannels", "-@all", *_compile(paths, Keyspace(prefix))]


def _compile(paths: Iterable[Path], keys: Keyspace) -> list[str]:
    root: set[str] = set()
    selectors: dict[tuple[Family, ...], set[str]] = {}
    for path in paths:
        for families, command in _grants(path):
            if families:
                selectors.setdefault(tuple(sorted(families)), set()).add(command)
            else:
                root.add(command)
    rules = [f"+{c}" for c in sorted(root)]
    for selected, commands in sorted(selectors.items()):
        patterns = " ".join(f"~{_PATTERNS[f](keys)}" for f in selected)
        rules.append(f"({patterns} {' '.join(f'+{c}' for c in sorted(commands))})")
    return rules


def acl_rules(role: Role, prefix: str = "sw") -> list[str]:
    """The ACL rules of ``role`` for keys under ``prefix`` (without user and password)."""
    return compile_rules(PATHS[role], prefix)


def setuser_command(role: Role, user: str, password: str, prefix: str = "sw") -> list[str]:
    """``ACL SETUSER`` arguments creating ``user`` for ``role``."""
    return ["ACL", "SETUSER", user, "reset", "on", f">{password}", *acl_rules(role, prefix)]
