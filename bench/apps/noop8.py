"""A worker app with a no-op handler on 8 shards, for ``bench/processes.py``."""

from __future__ import annotations

from streamworks import App

app = App("bench-procs")
app.stream("orders", shards=8)


@app.handler("orders", ordering="key")
async def handle(payload: bytes) -> None:
    return None
