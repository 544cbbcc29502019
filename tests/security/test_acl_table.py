"""The ACL table (``streamworks.redis.acl.PATHS``) against the code it describes: every
script's commands are read, every script is run by some role, each script path lays its
key families out as the script's ``KEYS`` contract says, every family's pattern matches
the keys ``Keyspace`` builds, and the coordinator is never granted a command that reads,
acknowledges or deletes messages (E24). Whether the grants suffice is proven by running
every path as its user (``test_acl.py``, and the ``--redis-acl`` suites)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import pytest

from streamworks.protocol.shards import ShardId
from streamworks.redis.acl import _PATTERNS, PATHS, ROLES, Path, acl_rules, script_commands
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import SCRIPT_NAMES, load_script


def _grants(role: str) -> set[str]:
    return {c for rule in acl_rules(role) for c in re.findall(r"\+([a-z|]+)", rule)}  # type: ignore[arg-type]


def test_every_script_is_run_by_a_role() -> None:
    used = {s for paths in PATHS.values() for p in paths for s in p.scripts}
    assert used == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_command_a_script_runs_is_read(name: str) -> None:
    source = "\n".join(line.split("--", 1)[0] for line in load_script(name).splitlines())
    literal = re.findall(r"redis\.p?call\(\s*'([A-Za-z]+)'", source)
    names = {c.split("|")[0] for c in script_commands(name)}
    assert {c.lower() for c in literal} <= names
    assert names, f"{name}.lua runs no command?"


@pytest.mark.parametrize(
    "path", [p for role in ROLES for p in PATHS[role] if p.scripts], ids=lambda p: p.name
)
def test_a_script_path_lays_out_keys_as_the_script_declares(path: Path) -> None:
    """A script path names a family for every fixed ``KEYS[n]`` its scripts document,
    and no more unless the script takes a variable number (``KEYS[3..]``)."""
    for script in path.scripts:
        header = "\n".join(
            line for line in load_script(script).splitlines() if line.startswith("--")
        )
        fixed = max((int(n) for n in re.findall(r"KEYS\[(\d+)\](?!\.)", header)), default=0)
        variadic = re.search(r"KEYS\[[^\]]*\.\.", header) is not None
        assert len(path.keys) >= fixed, (script, path)
        assert variadic or (len(path.keys) == fixed and not path.rest), (script, path)


def test_each_family_pattern_matches_the_keys_keyspace_builds() -> None:
    keys = Keyspace("sw")
    shard = ShardId("orders", 3, 2)
    examples = {
        "stream": keys.stream(shard),
        "fence": keys.fence(shard, "billing"),
        "hold": keys.read_hold(shard),
        "retries": keys.retries(shard, "billing"),
        "groups": keys.shard_groups(shard),
        "dedup": keys.dedup(shard, "e-1"),
        "redelivery": keys.redelivery(shard, "billing"),
        "dead_letters": keys.dead_letters("billing", "orders"),
        "markers": keys.dead_letter_markers("billing", "orders"),
        "idempotency": keys.idempotency("billing", "k"),
        "control": keys.group_meta("billing"),
        "namespace": keys.namespace(),
        "delayed": keys.delayed_entries(shard),
        "schedule": keys.schedule_state(keys.schedule_shard(1), "billing", "hourly"),
        "rate": keys.rate_key_bucket("billing", "orders", "k"),
    }
    assert set(examples) == set(_PATTERNS)
    for family, key in examples.items():
        matched = {f for f, pattern in _PATTERNS.items() if fnmatchcase(key, pattern(keys))}
        assert family in matched, (family, key)
        # A key of one family is no other's (but the namespace id is a control key).
        assert matched - {family} <= {"control"}, (family, key, matched)
    assert fnmatchcase(keys.redelivery_retries(shard, "billing"), _PATTERNS["redelivery"](keys))
    legacy = keys.dead_letter_marker("billing", "orders", keys.stream(shard), "1-0")
    assert fnmatchcase(legacy, _PATTERNS["markers"](keys))


def test_the_coordinator_cannot_read_acknowledge_or_delete_messages() -> None:
    """E24, in the grants themselves: nothing that reads, acknowledges or deletes
    entries on any key but dead letters (read and deleted only on an admin's request,
    from the dashboard), and no hash read of a delayed message's payload (hash reads:
    control-plane keys and the schedules' state only)."""
    forbidden = {
        "xreadgroup", "xread", "xrange", "xrevrange", "xack", "xclaim", "xautoclaim", "xdel",
        "xtrim", "rename", "hget", "hgetall", "hmget",
    }  # fmt: skip
    dead_letters = _PATTERNS["dead_letters"](Keyspace("sw"))
    for rule in acl_rules("coordinator"):
        patterns = set(re.findall(r"~(\S+)", rule))
        granted = set(re.findall(r"\+([a-z|]+)", rule))
        if not rule.startswith("(") or patterns == {_PATTERNS["control"](Keyspace("sw"))}:
            assert not granted & forbidden - {"hget", "hgetall", "hmget"}, rule
            continue
        if patterns == {dead_letters}:
            assert not granted & {"xreadgroup", "xack", "xtrim"}, rule
            continue
        if patterns == {_PATTERNS["schedule"](Keyspace("sw"))}:
            # Schedule state (tick times, counters) for status: no message is there.
            assert granted <= {"hgetall", "smembers"}, rule
            continue
        assert not granted & forbidden, rule


def test_producers_and_workers_never_create_shards_or_groups() -> None:
    for role in ("producer", "worker"):
        assert not _grants(role) & {"xgroup|create", "xgroup|destroy", "xgroup|setid"}, role
    assert not _grants("producer") & {"xreadgroup", "xack", "del", "rename", "multi"}
