"""``ctx.fencing_token`` never goes down for a shard (issue 18, finding 4d): a worker
refuses a grant whose token is below one it held for the shard, and asks for a fresh
one. The coordinator never issues such a grant (its tokens only grow: unit and
failover tests); to see the worker's side, a transport between worker and coordinator
lowers the tokens of one answer, as a coordinator acting on metadata Redis rolled
back, with its clock behind, would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamworks import App, Context
from streamworks.protocol.control import HeartbeatRequest, HeartbeatResponse, ShardGrant
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for


class LoweringTransport:
    """Passes everything through; when ``armed``, lowers by one the fence token of
    every grant in the next answer that has grants."""

    def __init__(self, inner: CoordinatorTransport) -> None:
        self.inner = inner
        self.armed = False
        self.lowered: list[ShardGrant] = []

    async def heartbeat(self, group: str, request: HeartbeatRequest) -> HeartbeatResponse:
        response = await self.inner.heartbeat(group, request)
        if self.armed and response.assigned:
            self.armed = False
            grants = [g.model_copy(update={"epoch": g.epoch - 1}) for g in response.assigned]
            self.lowered = grants
            response = response.model_copy(update={"assigned": grants})
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_worker_refuses_a_grant_below_a_token_it_held(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=2)
    seen: list[tuple[str, int]] = []

    @app.handler("orders")
    async def handle(value: dict[str, int], ctx: Context) -> None:
        seen.append((ctx.message.shard, ctx.fencing_token))

    async with streamworks_runtime(app, workers=0, settings=fast_settings()) as rt:
        local = rt.coordinator
        link = LoweringTransport(local)
        rt.coordinator = link  # type: ignore[assignment]
        worker = await rt.add_worker()
        rt.coordinator = local
        for n in range(10):
            await app.publish("orders", {"n": n}, key=f"k{n}")
        await rt.wait_idle()
        before = {str(s): int(r.token.split(":")[0]) for s, r in worker.readers.items()}

        link.armed = True
        await wait_for(lambda: worker.assignment.refused_grants >= 1, message="a refusal")
        assert all(g.epoch < before[g.shard] for g in link.lowered)
        # No reader took the lower token (it would be its handlers' ctx.fencing_token).
        for shard, reader in worker.readers.items():
            assert int(reader.token.split(":")[0]) >= before[str(shard)]
        # The worker reported the shards as fenced: the coordinator re-grants them
        # under fresh tokens, above the ones it held, and the worker reads again.

        def regranted() -> bool:
            tokens = {str(s): int(r.token.split(":")[0]) for s, r in worker.readers.items()}
            return set(tokens) == set(before) and all(tokens[s] > before[s] for s in before)

        await wait_for(regranted, message="fresh grants above the old tokens")
        for n in range(10, 20):
            await app.publish("orders", {"n": n}, key=f"k{n}")
        await rt.wait_idle()
        assert len(seen) == 20
        highest: dict[str, int] = {}
        for shard, token in seen:  # in handling order: never down for a shard
            assert token >= highest.get(shard, 0), f"{shard}: {token} after {highest[shard]}"
            highest[shard] = token
