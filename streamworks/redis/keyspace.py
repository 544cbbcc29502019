"""Every Redis key streamworks uses, built in one place.

Hash tags decide which keys share a Redis Cluster slot:

* all control-plane keys of a namespace share the tag ``{<prefix>}``, so one Lua
  script may touch several of them atomically;
* each shard has its own tag ``{<prefix>:<stream>/<index>@<incarnation>}`` shared by
  the stream key, the set of groups that must exist on it, its per-group owner
  fences and retry records, and its publish dedup records, so the fenced read, the
  takeover claim, the idempotent publish, trimming and the drain-and-retire check
  each run as one script in the shard's slot;
* each group's redelivery stream of a shard (``dlq replay`` writes there, only that
  group's owner of the shard reads it) shares the shard's tag too, so the owner's
  fenced read of it checks the same owner fence;
* a shard's delayed messages (the delayed set, their entries, the delay id counter
  and the wake stream) share the shard's tag too, so a delayed publish (``delay_add.lua``) and the
  owner's move into the stream (``delay_move.lua``, fenced) are each one script in the
  slot, and ``retire.lua`` sees them as drain blockers;
* a schedule's tick state lives in the slot of the schedule shard (shard 0 of the
  internal stream :attr:`Keyspace.SCHEDULE_STREAM`), beside the owner fence that every
  write of it checks (``schedule_tick.lua``);
* dead-letter streams and idempotency records are spread by their own names, and so
  are a handler's rate-limit buckets, one tag per (group, stream) shared by its
  per-key buckets so one ``rate_take.lua`` call serves a whole read batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from streamworks.protocol.shards import ShardId

__all__ = ("Keyspace",)


@dataclass(frozen=True, slots=True)
class Keyspace:
    """Key names under one prefix (``Settings.key_prefix``)."""

    prefix: str = "sw"

    # -- data plane: one slot per shard -------------------------------------------------
    def shard_tag(self, shard: ShardId) -> str:
        return f"{{{self.prefix}:{shard}}}"

    def stream(self, shard: ShardId) -> str:
        """The shard's Redis Stream."""
        return f"{self.shard_tag(shard)}:stream"

    def fence(self, shard: ShardId, group: str) -> str:
        """Owner fence of ``group`` on the shard: ``<fence token>:<member id>``."""
        return f"{self.shard_tag(shard)}:fence:{group}"

    def read_hold(self, shard: ShardId) -> str:
        """Where a fenced read refused by the fence moves the shard's stream for the
        rest of its transaction (``read_gate.lua``); never exists outside one."""
        return f"{self.shard_tag(shard)}:hold"

    def retries(self, shard: ShardId, group: str) -> str:
        """Hash entry id -> ``<failed attempts>:<due ms>`` for entries awaiting a retry."""
        return f"{self.shard_tag(shard)}:retry:{group}"

    def dedup(self, shard: ShardId, event_id: str) -> str:
        """Shard-level publish dedup record of ``event_id`` (outlives the shard, E18)."""
        return f"{self.shard_tag(shard)}:dedup:{event_id}"

    # -- delayed messages: in the shard's slot --------------------------------------------
    def delayed(self, shard: ShardId) -> str:
        """Sorted set delay id -> due ms (Redis clock) of the shard's delayed messages."""
        return f"{self.shard_tag(shard)}:delayed"

    def delayed_entries(self, shard: ShardId) -> str:
        """Hash delay id -> the delayed message's entry fields (cmsgpack)."""
        return f"{self.shard_tag(shard)}:delayed:entries"

    def delayed_counter(self, shard: ShardId) -> str:
        """Counter the shard's delay ids are taken from (they keep publish order)."""
        return f"{self.shard_tag(shard)}:delayed:seq"

    def delayed_wake(self, shard: ShardId) -> str:
        """Stream (MAXLEN 1) a delayed publish adds to when its message is the shard's
        earliest: an idle owner's wait for new entries covers it (``delay_add.lua``)."""
        return f"{self.shard_tag(shard)}:delayed:wake"

    # -- schedules: in the schedule shard's slot --------------------------------------------
    #: The internal stream whose shard 0 carries every group's schedules: its owner for
    #: a group publishes that group's ticks (docs/design/scheduling.md). Never scaled.
    SCHEDULE_STREAM: ClassVar[str] = "sw-schedules"

    def schedule_shard(self, incarnation: int) -> ShardId:
        """Shard 0 of :attr:`SCHEDULE_STREAM` (its incarnation from the stream's
        metadata)."""
        return ShardId(self.SCHEDULE_STREAM, 0, incarnation)

    def schedule_state(self, shard: ShardId, group: str, name: str) -> str:
        """Hash of schedule ``name`` of ``group``: last, pending and next tick."""
        return f"{self.shard_tag(shard)}:schedule:{group}:{name}"

    def schedules(self, shard: ShardId, group: str) -> str:
        """Set of the schedule names of ``group`` (what ``status`` lists)."""
        return f"{self.shard_tag(shard)}:schedules:{group}"

    # -- data plane: finding and parsing shard keys (coordinator recovery) ------------
    def stream_pattern(self, stream: str) -> str:
        """``SCAN`` pattern matching every shard key of ``stream`` (any index or
        incarnation): the data-plane evidence that a stream existed (E21)."""
        return f"{{{self.prefix}:{stream}/*}}:stream"

    def fence_pattern(self, group: str) -> str:
        """``SCAN`` pattern matching the owner fences of ``group`` on every shard."""
        return f"{{{self.prefix}:*}}:fence:{group}"

    def shard_of(self, key: str) -> ShardId:
        """The shard a shard-tagged key (:meth:`stream`, :meth:`fence`, ...) belongs to.

        Raises:
            ValueError: ``key`` is not a shard key under this prefix.
        """
        head = f"{{{self.prefix}:"
        end = key.find("}")
        if not key.startswith(head) or end < 0:
            raise ValueError(f"{key!r} is not a shard key under prefix {self.prefix!r}")
        return ShardId.parse(key[len(head) : end])

    # The groups that must exist on a shard live in the shard's own slot, beside the
    # stream, so that trim.lua and retire.lua (which run in that slot, and cannot read
    # the control plane on Cluster) refuse while one of them is missing
    # (docs/resharding.md#shards-created-before-the-group-set-existed).
    # Written by shard_create.lua / group_create.lua / shard_groups.lua, cleared by
    # group_destroy.lua, each in the same script as the consumer-group change.
    #: Member of a shard's group set while the list is not final (a scale-out created
    #: the shard and has not re-read the registry since its commit): trimming refuses.
    #: Never a group name (those start with a letter or digit); the Lua scripts spell it.
    SHARD_GROUPS_UNSEALED: ClassVar[str] = "!unsealed"

    def shard_groups(self, shard: ShardId) -> str:
        """Set of the group names that must have a consumer group on the shard; holds
        :attr:`SHARD_GROUPS_UNSEALED` until the coordinator has confirmed the list."""
        return f"{self.shard_tag(shard)}:groups"

    # -- per-group redelivery (dlq replay): in the shard's slot ---------------------------
    def redelivery(self, shard: ShardId, group: str) -> str:
        """Stream of dead letters replayed to ``group`` only, read by its shard owner."""
        return f"{self.shard_tag(shard)}:redeliver:{group}"

    def redelivery_retries(self, shard: ShardId, group: str) -> str:
        """Retry records (as :meth:`retries`) of entries of the redelivery stream."""
        return f"{self.shard_tag(shard)}:redeliver:{group}:retry"

    # -- per group --------------------------------------------------------------------
    def dead_letters(self, group: str, stream: str) -> str:
        """Dead-letter stream of ``group`` for messages of ``stream``."""
        return f"{self.prefix}:dlq:{{{group}:{stream}}}"

    def dead_letters_of(self, key: str) -> tuple[str, str]:
        """``(group, stream)`` of a :meth:`dead_letters` key (from a ``SCAN``).

        Raises:
            ValueError: ``key`` is not a dead-letter stream under this prefix.
        """
        head = f"{self.prefix}:dlq:{{"
        if not key.startswith(head) or not key.endswith("}"):
            raise ValueError(f"{key!r} is not a dead-letter stream under {self.prefix!r}")
        group, sep, stream = key[len(head) : -1].partition(":")
        if not sep:
            raise ValueError(f"{key!r} is not a dead-letter stream under {self.prefix!r}")
        return group, stream

    def dead_letter_markers(self, group: str, stream: str) -> str:
        """Markers of the entries ``group`` dead-lettered for ``stream``: a sorted set,
        ``<source key>|<entry id>`` -> the time (ms) it is kept until. In the dead-letter
        stream's slot, so writing an entry at most once is one script
        (``dead_letter.lua``); one key per dead-letter stream, however many dead letters.
        Its own family (not under ``dlq:``), so a scan for dead-letter streams never
        meets it."""
        return f"{self.prefix}:dlq-written:{{{group}:{stream}}}"

    @staticmethod
    def dead_letter_marker_member(source: str, entry_id: str) -> str:
        """The member of :meth:`dead_letter_markers` for entry ``entry_id`` of the key
        ``source`` (a shard stream or a redelivery stream: their ids may repeat)."""
        return f"{source}|{entry_id}"

    def dead_letter_marker(self, group: str, stream: str, source: str, entry_id: str) -> str:
        """The marker of one dead-lettered entry as earlier versions wrote it: a key of
        its own per entry (7 days each; a poison storm left millions). Only read now
        (``dead_letter.lua``), so an entry an older worker dead-lettered is not written
        again after an upgrade; :meth:`dead_letter_markers` replaces it. In the
        dead-letter stream's slot (the first hash tag decides)."""
        return f"{self.prefix}:dlq-written:{{{group}:{stream}}}:{source}:{entry_id}"

    def rate_bucket(self, group: str, stream: str) -> str:
        """GCRA bucket of ``group``'s handler of ``stream`` (``rate_limit=``)."""
        return f"{self.prefix}:rate:{{{group}:{stream}}}"

    def rate_key_bucket(self, group: str, stream: str, key: str) -> str:
        """GCRA bucket of one rate-limit key (``rate_limit_key=``); in the slot of
        :meth:`rate_bucket`."""
        return f"{self.prefix}:rate:{{{group}:{stream}}}:k:{key}"

    def idempotency(self, group: str, key: str) -> str:
        """Default idempotency store record for a handler's idempotency key."""
        return f"{self.prefix}:idem:{group}:{key}"

    # -- control plane: one slot for the namespace ----------------------------------
    @property
    def control_tag(self) -> str:
        return f"{{{self.prefix}}}"

    def group_meta(self, group: str) -> str:
        """Group metadata hash: header fields plus one field per member."""
        return f"{self.control_tag}:group:{group}"

    def group_changes(self, group: str) -> str:
        """The group's changelog (list, newest first): what each commit changed, so a
        replica catches up by reading only that (``group_delta.lua``)."""
        return f"{self.control_tag}:group:{group}:changes"

    def group_mutex(self, group: str) -> str:
        return f"{self.control_tag}:group:{group}:mutex"

    def group_leases(self, group: str) -> str:
        """Sorted set member id -> lease expiry (ms, Redis clock)."""
        return f"{self.control_tag}:group:{group}:leases"

    def group_sequences(self, group: str) -> str:
        """Hash member id -> the newest heartbeat sequence number the coordinator acted
        on (written with the member's record or its lease, in the same script)."""
        return f"{self.control_tag}:group:{group}:sequences"

    def stream_meta(self, stream: str) -> str:
        """Stream metadata hash: shard layout, routing version, migration record."""
        return f"{self.control_tag}:stream:{stream}"

    def stream_mutex(self, stream: str) -> str:
        return f"{self.control_tag}:stream:{stream}:mutex"

    def registry_streams(self) -> str:
        """Every stream ever created (tells 'new' from 'lost', E21)."""
        return f"{self.control_tag}:registry:streams"

    def registry_groups(self) -> str:
        """Every group ever created."""
        return f"{self.control_tag}:registry:groups"

    def registry_subscriptions(self, stream: str) -> str:
        """Groups subscribed to ``stream``: each has (or is about to get) a consumer group
        on every shard of it, and every shard created later is created with them."""
        return f"{self.control_tag}:registry:subscriptions:{stream}"

    def epoch_floor(self) -> str:
        """Highest epoch ever issued in the namespace (keeps epochs monotonic, E19)."""
        return f"{self.control_tag}:epoch-floor"

    def lag_repair_turn(self, stream: str) -> str:
        """Whose turn it is to check ``stream``'s ACTIVE shards for a lag a Redis
        restart broke (``coordinator/lag_repair.py``): one replica per interval."""
        return f"{self.control_tag}:lag-repair:{stream}"

    def namespace(self) -> str:
        """The namespace id, written once by the coordinator and checked by every
        worker and producer in its own Redis (``streamworks.redis.namespace``)."""
        return f"{self.control_tag}:namespace"

    def status(self) -> str:
        """Monitoring projection (never read back as truth)."""
        return f"{self.control_tag}:status"

    # -- glob patterns (ACL key selectors, SCAN) --------------------------------------
    # Patterns over the key names above, kept next to them so a new key family cannot
    # slip past the ACLs or a namespace cleanup. A prefix has no glob characters
    # (Settings.key_prefix allows only [A-Za-z0-9._-]), so it is used as is.
    def shard_slot_pattern(self) -> str:
        """Every key in any shard's slot: ``{<prefix>:<shard>}:…``."""
        return f"{{{self.prefix}:*"

    def shard_streams_pattern(self) -> str:
        """Every shard's stream (:meth:`stream`)."""
        return f"{{{self.prefix}:*}}:stream"

    def fences_pattern(self) -> str:
        """Every owner fence of every group on every shard (:meth:`fence`)."""
        return f"{{{self.prefix}:*}}:fence:*"

    def read_holds_pattern(self) -> str:
        """Every shard's hold key (:meth:`read_hold`)."""
        return f"{{{self.prefix}:*}}:hold"

    def retries_pattern(self) -> str:
        """Every group's retry records on every shard (:meth:`retries`)."""
        return f"{{{self.prefix}:*}}:retry:*"

    def shard_groups_pattern(self) -> str:
        """Every shard's set of groups that must exist on it (:meth:`shard_groups`)."""
        return f"{{{self.prefix}:*}}:groups"

    def redelivery_pattern(self) -> str:
        """Every per-group redelivery stream and its retry records (:meth:`redelivery`)."""
        return f"{{{self.prefix}:*}}:redeliver:*"

    def delayed_pattern(self) -> str:
        """Every shard's delayed set, entries and counter (:meth:`delayed`)."""
        return f"{{{self.prefix}:*}}:delayed*"

    def schedule_pattern(self) -> str:
        """Every schedule state and schedule name set (:meth:`schedule_state`)."""
        return f"{{{self.prefix}:{self.SCHEDULE_STREAM}/*}}:schedule*"

    def rate_pattern(self) -> str:
        """Every rate-limit bucket (:meth:`rate_bucket`, :meth:`rate_key_bucket`)."""
        return f"{self.prefix}:rate:*"

    def dedup_pattern(self) -> str:
        """Every shard-level publish dedup record (:meth:`dedup`)."""
        return f"{{{self.prefix}:*}}:dedup:*"

    def dead_letters_pattern(self) -> str:
        """Every dead-letter stream of the namespace (:meth:`dead_letters`)."""
        return f"{self.prefix}:dlq:*"

    def dead_letter_marker_pattern(self) -> str:
        """Every dead-letter marker of the namespace (:meth:`dead_letter_marker`)."""
        return f"{self.prefix}:dlq-written:*"

    def idempotency_pattern(self) -> str:
        """Every default idempotency record (:meth:`idempotency`)."""
        return f"{self.prefix}:idem:*"

    def control_pattern(self) -> str:
        """Every control-plane key (``{<prefix>}:…``)."""
        return f"{self.control_tag}:*"

    def namespace_patterns(self) -> tuple[str, ...]:
        """SCAN patterns that together match every key under the prefix."""
        return (f"{self.prefix}:*", self.shard_slot_pattern(), self.control_pattern())
