"""Periodic schedules: a heartbeat every 5 minutes, a daily digest at 09:00 in Paris."""

# (No `from __future__ import annotations`: pydantic resolves Digest's field types
# when this file is loaded as a script, outside sys.modules.)
from datetime import datetime, timedelta

import anyio
from pydantic import BaseModel

from streamworks import App, Tick
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings

app = App("newsletter")
app.stream("jobs", shards=2)


class Digest(BaseModel):
    edition: datetime  # the tick's nominal time: 09:00 Paris, however late it ran


# No function body needed: each tick publishes the Tick itself.
@app.schedule("heartbeat", stream="jobs", every=timedelta(minutes=5))
def heartbeat(tick: Tick) -> None: ...


# The function makes the message; after an outage, only the latest missed digest.
@app.schedule("digest", stream="jobs", cron="0 9 * * *", tz="Europe/Paris", catch_up="latest")
async def digest(tick: Tick) -> Digest:
    return Digest(edition=tick.at)


received: list[str] = []


@app.handler("jobs")
async def run_job(job: dict[str, object]) -> None:
    received.append("digest" if "edition" in job else "heartbeat")


async def main() -> None:
    received.clear()
    # Leases longer than the day the clock jumps below (a jump past a lease ends it).
    async with TestRuntime(app, workers=2, settings=fast_settings(lease_ttl=3 * 86_400)) as rt:
        await rt.advance(86_400)  # a day later: every schedule has missed ticks...
        with anyio.fail_after(10):  # ...and publishes its latest one (catch_up="latest")
            while len(received) < 2:  # noqa: ASYNC110 - a list, no event to wait on
                await anyio.sleep(0.01)
        await rt.wait_idle()
        assert sorted(received) == ["digest", "heartbeat"]
        assert rt.service is not None
        [*schedules] = (await rt.service.group_info("newsletter")).schedules
        assert {s.name: s.published for s in schedules} == {"digest": 1, "heartbeat": 1}
        assert all(s.next_tick_ms for s in schedules)  # and each planned its next tick


if __name__ == "__main__":
    anyio.run(main)
