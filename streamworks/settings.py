"""Settings, read from ``STREAMWORKS_*`` environment variables at the edge.

Settings are built once by the CLI, ``App(settings=...)`` or ``TestRuntime`` and
passed down explicitly; library code never reads the environment itself.

Nested groups use ``__``: ``STREAMWORKS_WORKER__READ_BATCH=200``. Durations are
seconds (floats). Every default is meant for production; ``docs/configuration.md``
has the full table with guidance on choosing them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = (
    "CoordinatorSettings",
    "ProducerSettings",
    "Settings",
    "SupervisorSettings",
    "WorkerSettings",
)


class WorkerSettings(BaseModel):
    """Tuning of the data plane (``streamworks worker``)."""

    read_batch: int = Field(500, ge=1, le=10_000, description="entries per fenced read")
    read_ahead: int = Field(3, ge=1, le=64, description="batches in flight per shard")
    block: float = Field(1.0, gt=0, le=30, description="longest wait for new entries (s)")
    read_concurrency: int = Field(
        8, ge=1, le=1024, description="fenced reads of a worker in flight at once"
    )
    own_waits: int = Field(
        8, ge=0, le=1024, description="idle shards waiting on a connection of their own"
    )
    idle_poll: float = Field(
        0.05, gt=0, le=5, description="poll period of idle shards on a Redis Cluster (s)"
    )
    delay_poll: float = Field(
        5.0,
        gt=0,
        le=300,
        description=(
            "longest wait of a shard's delayed-message mover between two checks (s); it "
            "also wakes at the next due time and when a publish becomes the earliest"
        ),
    )
    shutdown_timeout: float = Field(30.0, ge=0, description="in-flight time on SIGTERM (s)")
    lease_grace: float | None = Field(
        None,
        ge=0,
        description=(
            "no new run starts this long before the lease's cancel point (s); "
            "None: 5 s, or half of what the lease leaves when that does not fit"
        ),
    )
    lease_drift: float = Field(
        0.01, ge=0, lt=0.5, description="clock-rate difference allowed for in leases (ratio)"
    )
    ack_batch: int = Field(1000, ge=1, description="most acks sent in one pipeline")
    trim_interval: float = Field(1.0, gt=0, description="ack-delete/retention trim period (s)")
    idempotency_ttl: float = Field(86_400.0, gt=0, description="completed idempotency keys (s)")
    idempotency_claim_ttl: float = Field(300.0, gt=0, description="in-progress claims (s)")
    # The worker's own HTTP endpoint (/metrics, /livez, /readyz; docs/operations.md).
    # Loopback by default, like the coordinator: set http_host=0.0.0.0 for a scraper
    # on another host (a container, a pod). Port 0 picks a free port (it is logged).
    http_enabled: bool = Field(True, description="serve /metrics, /livez and /readyz")
    http_host: str = "127.0.0.1"
    http_port: int = Field(9400, ge=0, le=65535)
    traceback_interval: float = Field(
        60.0, ge=0, description="least time between two logged tracebacks of a handler (s)"
    )


class SupervisorSettings(BaseModel):
    """Restarts and give-up of ``streamworks worker --processes N`` (its parent process)."""

    restart_delay: float = Field(0.5, ge=0, description="first wait before a restart (s)")
    restart_delay_max: float = Field(30.0, ge=0, description="longest wait (doubling) (s)")
    max_crashes: int = Field(5, ge=0, description="crashes tolerated within crash_window")
    crash_window: float = Field(60.0, gt=0, description="window of max_crashes (s)")
    stop_timeout: float = Field(60.0, ge=0, description="wait for children on SIGTERM (s)")


class ProducerSettings(BaseModel):
    """Tuning of producers."""

    max_reroutes: int = Field(5, ge=1, le=100, description="refresh+retry rounds on nil XADD")
    sticky_batch: int = Field(100, ge=1, description="unkeyed messages per shard before moving on")
    dedup_ttl: float | None = Field(
        None,
        gt=0,
        description=(
            "how long an idempotent-publish record lives (s), for every stream with "
            "dedup on; None: each stream's dedup_window"
        ),
    )
    schedule_dedup_window: float = Field(
        86_400.0,
        ge=60,
        description=(
            "how long a schedule tick's event id is remembered on the shard it was "
            "published to (s): a stale owner paused longer than this could publish it again"
        ),
    )


class CoordinatorSettings(BaseModel):
    """Tuning of a coordinator replica (``streamworks coordinator``)."""

    host: str = "127.0.0.1"
    port: int = Field(7400, ge=0, le=65535)
    # Above the clients' own idle expiry (protocol/client.py, CLIENT_KEEPALIVE = 60 s),
    # so a client always drops an idle connection before the server closes it: a
    # request never meets a connection the server is closing (a failed heartbeat).
    http_keep_alive: float = Field(
        75.0, gt=60, description="how long an idle HTTP connection is kept open (s)"
    )
    mutex_ttl: float = Field(5.0, gt=0, description="group/stream mutex expiry (s)")
    mutex_wait: float = Field(2.0, gt=0, description="longest wait for a mutex (s)")
    cas_retries: int = Field(5, ge=1, description="reload+retry rounds before CONFLICT")
    loop_interval: float = Field(0.5, gt=0, description="expiry/deadline/migration loop period")
    assignment_interval: float = Field(0.25, ge=0, description="batching of target computation")
    # Control-plane writes that wait for Redis replicas (coordinator/replication.py,
    # docs/configuration.md#replication-of-control-plane-writes).
    replica_wait: int | None = Field(
        None,
        ge=0,
        description=(
            "replicas a commit, fence or lease write waits for (WAIT); None/auto: every "
            "replica in sync; 0: never wait"
        ),
    )
    replica_wait_timeout: float = Field(
        1.0, gt=0, le=60, description="longest WAIT; fewer acknowledgements: not done (s)"
    )
    replica_max_lag: float = Field(
        5.0, gt=0, description="a replica acknowledging later than this is not in sync (s)"
    )
    replica_check_interval: float = Field(
        1.0, gt=0, description="how often the replicas in sync are counted (s)"
    )
    # Steps of the Redis clock (coordinator/core/clock_steps.py).
    clock_step_tolerance: float = Field(
        0.25, ge=0, description="Redis TIME movement beyond the local clock's = a step (s)"
    )
    clock_drift: float = Field(
        0.01, ge=0, lt=0.5, description="clock-rate difference allowed for (ratio)"
    )

    @field_validator("replica_wait", mode="before")
    @classmethod
    def _auto_replicas(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("", "auto"):
            return None
        return value


class Settings(BaseSettings):
    """All streamworks settings. Read from ``STREAMWORKS_*``; flags override them."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMWORKS_",
        env_nested_delimiter="__",
        extra="ignore",
        frozen=True,
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    #: ``None`` (the default, or ``auto``): ask the server (``CLUSTER INFO``) when the
    #: client is created; ``True``/``False`` force the cluster or single-node client.
    redis_cluster: bool | None = None
    key_prefix: str = Field("sw", pattern=r"^[A-Za-z0-9._-]{1,32}$")
    coordinator_urls: Annotated[list[str], NoDecode] = ["http://127.0.0.1:7400"]
    token: SecretStr | None = None
    admin_token: SecretStr | None = None
    #: Read-only token of the web dashboard (``/ui``); the member token works there too.
    viewer_token: SecretStr | None = None

    heartbeat_interval: float = Field(1.0, gt=0)
    lease_ttl: float = Field(10.0, gt=0)
    rebalance_timeout: float = Field(60.0, gt=0)
    routing_lease: float = Field(30.0, gt=0)
    stale_member_retention: float = Field(600.0, ge=0)

    worker: WorkerSettings = WorkerSettings()
    producer: ProducerSettings = ProducerSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    coordinator: CoordinatorSettings = CoordinatorSettings()

    @field_validator("redis_cluster", mode="before")
    @classmethod
    def _auto_cluster(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("", "auto"):
            return None
        return value

    @field_validator("coordinator_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    def with_overrides(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied (None values are ignored)."""
        kept = {k: v for k, v in changes.items() if v is not None}
        return self.model_copy(update=kept) if kept else self
