"""Least-privilege Redis ACLs for each streamworks role.

``streamworks admin acl ROLE`` prints the ``ACL SETUSER`` rules; the tests create
these users on a real server and run the whole data and control plane with them.
Commands that scripts run count too (Redis checks them against the caller's ACL),
so every command a role's Lua scripts use is listed.

* **worker** — reads, acks, retries and dead-letters on shard keys; its idempotency
  records; never creates a key with ``MKSTREAM``, never deletes a shard, never
  writes an owner fence or control-plane key (it only reads the namespace id).
* **producer** — ``XADD`` (and the dedup script) on shard keys only, and a read of
  the namespace id.
* **coordinator** — the control-plane keys, plus what it needs on shard keys: create
  them (``XGROUP CREATE … MKSTREAM``), write owner fences, read consumer-group
  positions (``XINFO``/``XLEN``), and retire a drained shard (``retire.lua``, which
  decides on consumer-group metadata alone). It cannot read, acknowledge or delete
  messages (E24): no ``XREADGROUP``, ``XREAD``, ``XRANGE``, ``XACK``, ``XCLAIM``,
  ``XAUTOCLAIM``, ``XDEL`` or ``XTRIM``.
"""

from __future__ import annotations

from typing import Literal

from streamworks.redis.keyspace import Keyspace

__all__ = ("ROLES", "Role", "acl_rules", "setuser_command")

Role = Literal["worker", "producer", "coordinator"]
ROLES: tuple[Role, ...] = ("worker", "producer", "coordinator")

# CLIENT SETINFO is not granted: it does not exist before Redis 7.2, and redis-py
# ignores its refusal when it announces itself on connect.
_CONNECTION = ["+ping", "+hello", "+auth", "+select"]
_SCRIPTS = ["+evalsha", "+eval", "+script|load", "+script|exists"]


def _rules(role: Role, prefix: str) -> list[str]:
    """Root permissions plus selectors ``(...)`` (Redis 7.0+ / Valkey) that tie the
    riskier commands to the keys they are meant for."""
    keys = Keyspace(prefix)
    shard = f"~{keys.shard_slot_pattern()}"  # every key in a shard's slot
    dedup = f"(~{keys.dedup_pattern()} +set)"  # idempotent publish
    if role == "worker":
        return [
            shard,
            *_CONNECTION,
            *_SCRIPTS,
            # fenced read, takeover, pruning, trimming (in scripts), waiting, acking
            "+exists", "+get", "+xreadgroup", "+xrevrange", "+xautoclaim", "+xpending",
            "+xinfo|consumers", "+xinfo|groups", "+xgroup|delconsumer", "+xtrim",
            "+xread", "+xack", "+xadd",
            "+hget", "+hset", "+hdel", "+hincrby",  # retry records (fenced in scripts)
            f"(~{keys.shard_groups_pattern()} +smembers)",  # groups that must exist (trim.lua)
            dedup,  # idempotent publish from a handler
            # dead letters, written at most once (dead_letter.lua: the script call needs
            # both keys in one selector, its commands each their own)
            f"(~{keys.dead_letters_pattern()} +xadd)",
            f"(~{keys.dead_letter_marker_pattern()} +get +set)",
            f"(~{keys.dead_letters_pattern()} ~{keys.dead_letter_marker_pattern()} +evalsha +eval)",
            f"(~{keys.redelivery_pattern()} +xdel)",  # replayed dead letters, once acked
            f"(~{keys.idempotency_pattern()} +set +get +del +pexpire)",  # idempotency store
            f"(~{keys.namespace()} +get)",  # namespace identity check
        ]  # fmt: skip
    if role == "producer":
        return [
            shard, *_CONNECTION, *_SCRIPTS, "+xadd", "+get", dedup,
            f"(~{keys.namespace()} +get)",  # namespace identity check
        ]  # fmt: skip
    return [
        f"~{keys.control_pattern()}",
        shard,
        *_CONNECTION,
        *_SCRIPTS,
        "+time", "+scan",
        # control-plane metadata, mutexes, leases, registry
        "+hget", "+hgetall", "+hmget", "+hset", "+hdel", "+set", "+get", "+del",
        "+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zscore",
        "+sadd", "+srem", "+smembers", "+sismember",
        # shard provisioning, owner fences, positions, drain check and retirement (with
        # the lag repair of retire.lua: XGROUP SETID ... ENTRIESREAD)
        "+exists", "+xgroup|create", "+xgroup|destroy", "+xgroup|setid", "+xinfo|groups",
        "+xinfo|stream", "+xlen",
    ]  # fmt: skip


def acl_rules(role: Role, prefix: str = "sw") -> list[str]:
    """The ACL rules of ``role`` for keys under ``prefix`` (without user and password)."""
    return ["resetkeys", "-@all", *_rules(role, prefix)]


def setuser_command(role: Role, user: str, password: str, prefix: str = "sw") -> list[str]:
    """``ACL SETUSER`` arguments creating ``user`` for ``role``."""
    return ["ACL", "SETUSER", user, "reset", "on", f">{password}", *acl_rules(role, prefix)]
