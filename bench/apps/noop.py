"""A worker app with a no-op handler, for control-plane benchmarks."""

from __future__ import annotations

from streamworks import App

app = App("bench")
app.stream("events", shards=16)


@app.handler("events")
async def handle(payload: bytes) -> None:
    return None
