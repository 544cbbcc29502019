"""Typed messages of the coordinator's HTTP API (v1), shared by server and clients.

Field names are camelCase on the wire (as in the protocol document) and snake_case
in Python. Every request model bounds its sizes, so a hostile body gets a clear
``INVALID_REQUEST`` instead of exhausting the coordinator.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

__all__ = (
    "CLIENT_METRICS",
    "ApiError",
    "ErrorCode",
    "GroupInfo",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "HeartbeatStatus",
    "MemberInfo",
    "ReinitializeRequest",
    "RoutingResponse",
    "RoutingShard",
    "ScheduleInfo",
    "ShardGrant",
    "ShardGroupInfo",
    "ShardInfo",
    "StartPosition",
    "StatusResponse",
    "StreamCreateRequest",
    "StreamInfo",
    "StreamScaleRequest",
    "UnsubscribeRequest",
)

# (pydantic-core's regex engine: ``$`` is the end of the text, ``\d`` would match any
# Unicode digit, hence [0-9].)
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")]
ShardIdText = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}/[0-9]{1,6}@[0-9]{1,9}$")
]
MemberId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
ShortText = Annotated[str, StringConstraints(max_length=200)]

#: Where a group starts on a stream it subscribes to for the first time: the first
#: entry still retained, or only entries published after it joined.
StartPosition = Literal["earliest", "latest"]

#: Upper bounds on list sizes in requests (hostile-body protection).
MAX_SHARDS_PER_MEMBER = 65_536
MAX_SUBSCRIPTIONS = 1_024


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class _Request(_Model):
    """Request bodies are validated strictly: ``"0"``, ``0.0`` or ``false`` is not an
    integer, whatever lax coercion would make of it (the schema says integer)."""

    model_config = ConfigDict(strict=True)


class ErrorCode(StrEnum):
    INVALID_REQUEST = "INVALID_REQUEST"
    UNAUTHORIZED = "UNAUTHORIZED"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    IN_USE = "IN_USE"
    COORDINATOR_TERMINATING = "COORDINATOR_TERMINATING"
    METADATA_UNAVAILABLE = "METADATA_UNAVAILABLE"
    MIGRATION_IN_PROGRESS = "MIGRATION_IN_PROGRESS"
    NOT_REPLICATED = "NOT_REPLICATED"
    STALE_REQUEST = "STALE_REQUEST"
    INTERNAL = "INTERNAL"


class ApiError(_Model):
    """Every error answer: ``{"error": CODE, "message": ..., "retryable": ...}``."""

    error: ErrorCode
    message: str
    retryable: bool


class HeartbeatStatus(StrEnum):
    OK = "OK"
    SYNC_METADATA = "SYNC_METADATA"
    FENCED = "FENCED"
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"


#: The key of a member's client info (``HeartbeatRequest.client``, sent on joining)
#: holding the base URL of its ``/metrics``, ``/livez`` and ``/readyz`` (optional: a
#: worker run with ``--no-http`` sends none). ``status`` and the dashboard link to it.
CLIENT_METRICS = "metrics"


class HeartbeatRequest(_Request):
    """A member's heartbeat (docs/protocol.md#heartbeat).

    ``sequence`` numbers the member's requests: each new request takes the next number,
    a re-send of a request (the same body, to another replica after a timeout) keeps
    it. The coordinator acts on a request only if its number is above every number it
    acted on for the member, so a duplicated, re-sent or delayed copy acts on nothing:
    it is refused with the retryable ``STALE_REQUEST`` (the member sends a new one).
    Optional for clients that predate it (nothing of theirs is then recognised as
    stale: upgrade the workers; ``docs/coordinator.md``).
    """

    member_id: MemberId
    member_epoch: int = Field(ge=-1, le=2**53)
    metadata_version: int = Field(0, ge=0, le=2**53)
    subscriptions: list[Name] | None = Field(None, max_length=MAX_SUBSCRIPTIONS)
    owned_shards: list[ShardIdText] | None = Field(None, max_length=MAX_SHARDS_PER_MEMBER)
    revoking_shards: list[ShardIdText] = Field(
        default_factory=list, max_length=MAX_SHARDS_PER_MEMBER
    )
    fenced_shards: list[ShardIdText] = Field(default_factory=list, max_length=MAX_SHARDS_PER_MEMBER)
    rebalance_timeout_ms: int | None = Field(None, ge=1_000, le=3_600_000)
    client: dict[ShortText, ShortText] | None = Field(None, max_length=16)
    #: Per subscribed stream, where the group starts if this request is the one that
    #: subscribes the group to it; a stream left out starts at ``earliest``.
    subscription_starts: dict[Name, StartPosition] | None = Field(
        None, max_length=MAX_SUBSCRIPTIONS
    )
    sequence: int | None = Field(None, ge=1, le=2**53 - 1)

    @model_validator(mode="after")
    def _starts_of_subscribed_streams(self) -> HeartbeatRequest:
        if self.subscription_starts:
            unknown = set(self.subscription_starts) - set(self.subscriptions or ())
            if unknown:
                raise ValueError(
                    f"subscriptionStarts names streams not in subscriptions: {sorted(unknown)}"
                )
        return self


class ShardGrant(_Model):
    """A shard the member may read now, under the owner fence ``<token>:<member id>``.

    ``epoch`` is the grant's fence token (its name predates tokens): above every token
    the shard was granted under before, including before a loss of Redis writes; the
    member's handlers see it as ``ctx.fencing_token``.
    """

    shard: ShardIdText
    epoch: int


class HeartbeatResponse(_Model):
    status: HeartbeatStatus
    member_id: str
    member_epoch: int
    group_epoch: int
    metadata_version: int
    assigned: list[ShardGrant] = Field(default_factory=list)
    pending: list[str] = Field(default_factory=list)
    revoke: list[str] = Field(default_factory=list)
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    key_prefix: str
    # The coordinator's namespace id: the member checks its own Redis holds the same
    # (``streamworks.redis.namespace``). Optional only so a missing one is reported
    # as such rather than as a malformed answer.
    namespace_id: str | None = None


class RoutingShard(_Model):
    shard: str
    key: str


class RoutingResponse(_Model):
    """Producer routing for one stream (docs/protocol.md#producer-routing)."""

    stream: str
    routing_version: int
    protocol: str
    shard_count: int
    shards: list[RoutingShard]
    lease_ms: int
    namespace_id: str | None = None  # as in HeartbeatResponse


class StreamCreateRequest(_Request):
    name: Name
    shards: int = Field(ge=0, le=4096)


class StreamScaleRequest(_Request):
    shards: int = Field(ge=0, le=4096)


class ShardGroupInfo(_Model):
    """A consumer group's position on one shard (from ``XINFO GROUPS``)."""

    group: str
    pending: int
    lag: int | None  # None: Redis cannot compute it (never counted as drained)
    owner: str | None = None


class ShardInfo(_Model):
    shard: str
    state: Literal["PROVISIONING", "ACTIVE", "DRAINING", "RETIRED"]
    length: int | None = None
    groups: list[ShardGroupInfo] = Field(default_factory=list)
    #: Delayed messages waiting in the shard's slot (not in the stream yet), and the
    #: earliest one's due time (ms since the epoch, Redis clock); None: not read.
    delayed: int | None = None
    delayed_next_due_ms: int | None = None


class StreamInfo(_Model):
    name: str
    shard_count: int
    routing_version: int
    protocol: str
    shards: list[ShardInfo]
    migration: dict[str, object] | None = None
    created: bool = False


class MemberInfo(_Model):
    member_id: str
    epoch: int
    state: str
    assigned: list[str]
    pending_revocation: list[str]
    target: list[str]
    lease_expires_in_ms: int | None = None
    client: dict[str, str] = Field(default_factory=dict)


class ScheduleInfo(_Model):
    """One periodic schedule of a group, as its owner recorded it in Redis (the
    schedule shard's slot); times in ms since the epoch (the Redis clock)."""

    name: str
    stream: str
    #: ``every 5m`` or ``cron 0 * * * * (Europe/Paris)``.
    spec: str
    #: The last tick done (published, or found published), or when the schedule started.
    last_tick_ms: int | None = None
    #: The next tick its owner planned.
    next_tick_ms: int | None = None
    #: A tick claimed and not recorded done yet (its owner crashed, or is publishing).
    pending_tick_ms: int | None = None
    #: Where the last tick went.
    last_shard: str | None = None
    last_entry: str | None = None
    published: int = 0
    #: Ticks found already published (an owner died after publishing, before done).
    duplicate: int = 0
    #: Missed ticks the catch-up policy did not publish.
    skipped: int = 0


class GroupInfo(_Model):
    group: str
    state: str
    group_epoch: int
    target_epoch: int
    metadata_version: int
    subscriptions: list[str]
    members: list[MemberInfo]
    #: Entries in the group's dead-letter stream of each stream it consumes.
    dead_letters: dict[str, int] = Field(default_factory=dict)
    #: Its periodic schedules (``@app.schedule``), by name.
    schedules: list[ScheduleInfo] = Field(default_factory=list)


class StatusResponse(_Model):
    streams: list[StreamInfo]
    groups: list[GroupInfo]
    #: What an operator must act on, each with its fix (e.g. Redis lost the namespace).
    alerts: list[str] = Field(default_factory=list)


class UnsubscribeRequest(_Request):
    """Operator action: a group stops consuming a stream for good (its consumer groups
    on the stream's shards are destroyed, with their positions and pending entries)."""

    group: Name
    stream: Name
    confirm: Literal[True]


class ReinitializeRequest(_Request):
    """Operator recovery after metadata loss (E21): re-create one entity's metadata."""

    kind: Literal["stream", "group"]
    name: Name
    shards: int | None = Field(None, ge=0, le=4096)
    confirm: Literal[True]
