"""Requests that cannot lie (issue 18, findings 2 and 3), over real HTTP.

* A heartbeat from an unknown member, or one reporting an epoch or a metadata version
  above what the group issued, changes nothing in Redis (it used to raise and commit
  the group epoch to 2**31 with one ``curl``, bricking the group).
* Every heartbeat carries a sequence number; a copy the coordinator already acted on
  (a duplicate, a re-send, a request stalled inside a replica while the member moved
  on through another, a reordered pair) acts on nothing: it neither completes a
  revocation nor takes a grant, nor renews a lease (it is refused, retryable
  ``STALE_REQUEST``).

Two coordinator replicas serve over HTTP; a request is *stalled* inside replica A by a
hook in front of its heartbeat handler (as a request queued in a paused replica is),
so the member's client times out there, re-sends the same body to replica B, and goes
on; the stalled copy is released later and must change nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from streamworks.coordinator.service import CoordinatorService
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import HeartbeatRequest, HeartbeatResponse, HeartbeatStatus
from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import SimMember, open_service, serve_api, settle

SHARDS = [f"orders/{i}@0" for i in range(4)]


async def control_state(redis: Any, keyspace: Keyspace) -> dict[str, Any]:
    """The group's control keys and owner fences as Redis holds them (``DUMP``)."""
    keys = [
        keyspace.group_meta("g"),
        keyspace.group_leases("g"),
        keyspace.group_sequences("g"),
        keyspace.registry_groups(),
        *[keyspace.fence(ShardId.parse(s), "g") for s in SHARDS],
    ]
    return {k: await redis.dump(k) for k in keys}


# -- finding 2 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"memberId": "intruder", "memberEpoch": 2147483647}, id="unknown-max-epoch"),
        pytest.param(
            {"memberId": "intruder", "memberEpoch": 7, "metadataVersion": 2147483647},
            id="unknown-max-version",
        ),
        pytest.param(
            {"memberId": "intruder", "memberEpoch": -1, "ownedShards": SHARDS}, id="unknown-leave"
        ),
        pytest.param({"memberId": "m1", "memberEpoch": 2147483647}, id="known-max-epoch"),
        pytest.param(
            {"memberId": "m1", "memberEpoch": 1, "metadataVersion": 2147483647},
            id="known-max-version",
        ),
    ],
)
async def test_one_heartbeat_that_lies_changes_nothing_over_http(
    settings: Settings, redis: Any, keyspace: Keyspace, body: dict[str, Any]
) -> None:
    """The review's ``curl``, as a raw POST: answered with a refusal (or UNKNOWN_MEMBER),
    nothing in Redis moves, and the honest member goes on. Before the fix the group
    epoch went to 2**31 and every honest heartbeat got INVALID_REQUEST."""
    async with open_service(fast_settings(settings)) as service:
        await service.create_stream("orders", 4)
        m1 = SimMember("m1", ["orders"])
        await settle([m1], service)
        before = await control_state(redis, keyspace)
        epoch = (await service.group_info("g")).group_epoch
        async with serve_api(service) as url, httpx.AsyncClient(base_url=url) as http:
            r = await http.post("/v1/groups/g/heartbeat", json=body)
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["status"] in ("UNKNOWN_MEMBER", "FENCED", "SYNC_METADATA", "OK")
            assert answer["assigned"] == [] and answer["groupEpoch"] == epoch
            assert await control_state(redis, keyspace) == before
            for _ in range(3):  # the honest member is untouched
                r = await http.post(
                    "/v1/groups/g/heartbeat",
                    content=m1.request().model_dump_json(by_alias=True, exclude_none=True),
                )
                assert r.status_code == 200, r.text
                m1.apply(HeartbeatResponse.model_validate_json(r.content))
                assert m1.last.status is HeartbeatStatus.OK and len(m1.owned) == 4


async def test_a_sequence_out_of_range_is_a_clear_400(settings: Settings) -> None:
    async with (
        open_service(fast_settings(settings)) as service,
        serve_api(service) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        for sequence in (0, -1, 2**53, "1"):
            r = await http.post(
                "/v1/groups/g/heartbeat",
                json={
                    "memberId": "m",
                    "memberEpoch": 0,
                    "subscriptions": ["o"],
                    "sequence": sequence,
                },
            )
            assert r.status_code in (400, 422) and r.json()["error"] == "INVALID_REQUEST"


# -- finding 3: two replicas, a stall inside one ---------------------------------------


@dataclass
class Stall:
    """Holds the heartbeats ``matches`` selects inside a replica until released."""

    matches: Callable[[HeartbeatRequest], bool]
    release: anyio.Event = field(default_factory=anyio.Event)
    held: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    answers: list[HeartbeatResponse | BaseException] = field(default_factory=list)

    def install(self, service: CoordinatorService) -> None:
        handle = service.heartbeats.handle

        async def stalled(group_id: str, body: HeartbeatRequest) -> HeartbeatResponse:
            if not self.matches(body):
                return await handle(group_id, body)
            self.held.set()
            await self.release.wait()  # queued in the replica, its client long gone
            try:
                answer = await handle(group_id, body)
                self.answers.append(answer)
                return answer
            except BaseException as e:
                self.answers.append(e)
                raise
            finally:
                self.done.set()

        service.heartbeats.handle = stalled  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def two_replicas(
    settings: Settings,
) -> AsyncIterator[tuple[CoordinatorService, CoordinatorService, str, str]]:
    async with (
        open_service(settings, replica="a") as a,
        open_service(settings, replica="b") as b,
        serve_api(a) as url_a,
        serve_api(b) as url_b,
    ):
        yield a, b, url_a, url_b


async def send(client: CoordinatorClient, member: SimMember) -> HeartbeatResponse:
    response = await client.heartbeat("g", member.request())
    member.apply(response)
    return response


async def test_a_join_stalled_in_one_replica_acts_on_nothing_when_released(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """m1's join times out in replica A (stalled there), its client re-sends the same
    body to replica B, m1 joins through B and goes on; m2 joins and takes half the
    shards. Then A processes the stalled join: it must not replace m1's record (which
    would free every shard m1 reads for m2 to take) nor renew its lease."""
    configured = fast_settings(settings, lease_ttl=30.0)
    async with two_replicas(configured) as (a, b, url_a, url_b):
        await a.create_stream("orders", 4)
        m1, m2 = SimMember("m1", ["orders"]), SimMember("m2", ["orders"])
        stall = Stall(lambda body: body.member_id == "m1" and body.member_epoch == 0)
        stall.install(a)
        async with (
            CoordinatorClient([url_a, url_b], timeout=0.5) as client1,
            CoordinatorClient([url_b], timeout=5) as client2,
        ):
            joined = await send(client1, m1)  # A holds it; B answers the re-send
            assert stall.held.is_set() and joined.status is HeartbeatStatus.OK
            assert len(joined.assigned) == 4 and client1.urls[client1._current] == url_b
            await m2.heartbeat(b, "g")

            async def settled() -> bool:
                await send(client1, m1)
                await send(client2, m2)
                return len(m1.owned) == 2 and len(m2.owned) == 2

            for _ in range(50):
                if await settled():
                    break
            assert len(m1.owned) == 2 == len(m2.owned)
            before = await control_state(redis, keyspace)
            stall.release.set()
            with anyio.fail_after(10):
                await stall.done.wait()
            [answer] = stall.answers
            assert isinstance(answer, CoordinatorError) and answer.code == "STALE_REQUEST"
            assert answer.retryable
            assert await control_state(redis, keyspace) == before  # acted on nothing
            assert a.metrics.stale_heartbeats._value.get() == 1
            for _ in range(3):  # m2 gains nothing m1 still reads
                await send(client2, m2)
                assert m2.owned.isdisjoint(m1.owned) and len(m2.owned) == 2


async def test_a_stale_report_stalled_in_one_replica_cannot_complete_a_revocation(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """The review's scenario: m1, waiting for shards m2 held, reports (truthfully) that
    it owns nothing; that request stalls in replica A and is re-sent to B. m2 leaves,
    m1 gets every shard, and when m3 joins m1 must give two back: it is UNREVOKED, and
    the stalled request's epoch is its previous one (accepted with nothing owned beyond
    what it holds: KIP-848's lost-response rule). Released then, the stalled
    ``ownedShards = []`` would complete the revocation (and m3 would read shards m1
    still reads) had it been acted on."""
    configured = fast_settings(settings, lease_ttl=30.0)
    async with two_replicas(configured) as (a, b, url_a, url_b):
        await a.create_stream("orders", 4)
        m1, m2, m3 = (SimMember(f"m{i}", ["orders"]) for i in (1, 2, 3))
        await settle([m2], b)  # m2 holds everything
        await m1.heartbeat(b, "g")  # m1 joins: everything pending
        assert m1.epoch > 0 and not m1.owned
        stall = Stall(lambda body: body.member_id == "m1" and body.owned_shards == [])
        stall.install(a)
        async with CoordinatorClient([url_a, url_b], timeout=0.5) as client1:
            r = await send(client1, m1)  # stalled in A, answered by B
            assert stall.held.is_set() and r.status is HeartbeatStatus.OK
            stall.matches = lambda body: False  # nothing else is held
            await b.heartbeat("g", m2.request().model_copy(update={"member_epoch": -1}))
            for _ in range(20):
                if len(m1.owned) == 4:
                    break
                await send(client1, m1)
            assert len(m1.owned) == 4
            await m3.heartbeat(b, "g")  # joins: a new target
            r = await send(client1, m1)
            assert len(r.revoke) == 2, "m1 must revoke two shards"
            revoking = set(r.revoke)
            m1.owned |= revoking  # still draining them (it reads them until it reports)
            before = await control_state(redis, keyspace)
            stall.release.set()
            with anyio.fail_after(10):
                await stall.done.wait()
            assert await control_state(redis, keyspace) == before
            info = {m.member_id: m for m in (await b.group_info("g")).members}
            assert set(info["m1"].pending_revocation) == revoking
            r = await m3.heartbeat(b, "g")
            assert revoking.isdisjoint(g.shard for g in r.assigned)
            assert revoking <= set(r.pending)


async def test_a_duplicated_and_a_reordered_request_act_once(
    settings: Settings, redis: Any, keyspace: Keyspace
) -> None:
    """The same body delivered to both replicas, and an older request delivered after a
    newer one: each acts at most once, in sequence order."""
    configured = fast_settings(settings, lease_ttl=30.0)
    async with two_replicas(configured) as (a, b, url_a, url_b):
        await a.create_stream("orders", 4)
        m1 = SimMember("m1", ["orders"])
        leases = keyspace.group_leases("g")
        async with httpx.AsyncClient() as http:

            async def post(url: str, body: HeartbeatRequest) -> HeartbeatResponse | None:
                """The answer, or None for the retryable STALE_REQUEST refusal."""
                r = await http.post(
                    f"{url}/v1/groups/g/heartbeat",
                    content=body.model_dump_json(by_alias=True, exclude_none=True),
                    headers={"content-type": "application/json"},
                )
                if r.status_code == 409 and r.json()["error"] == "STALE_REQUEST":
                    assert r.json()["retryable"] is True
                    return None
                assert r.status_code == 200, r.text
                return HeartbeatResponse.model_validate_json(r.content)

            join = m1.request()
            first = await post(url_a, join)
            assert first is not None
            epoch = first.member_epoch
            before = await control_state(redis, keyspace)
            assert await post(url_b, join) is None  # the duplicate: not a second join
            assert await control_state(redis, keyspace) == before
            m1.apply(first)

            newer, older = m1.request(), m1.request()
            newer, older = older, newer  # older has the lower number
            assert older.sequence is not None and newer.sequence is not None
            assert older.sequence < newer.sequence
            answered = await post(url_b, newer)  # delivered first: acts (renews the lease)
            assert answered is not None and answered.member_epoch == epoch
            lease = await redis.zscore(leases, "m1")
            state = await control_state(redis, keyspace)
            assert await post(url_a, older) is None  # reordered: after the newer one
            assert await redis.zscore(leases, "m1") == lease  # no renewal
            assert await control_state(redis, keyspace) == state
            assert (
                a.metrics.stale_heartbeats._value.get() + b.metrics.stale_heartbeats._value.get()
                == 2
            )
