"""The leanest raw consumer loop (issue 23): what a hand-written loop costs when it
does nothing it does not have to.

One task per shard, each on a connection of its own taken from the pool once, sends
a pre-packed ``XREADGROUP COUNT 100`` and reads the reply as the parser (hiredis)
built it — nested lists of ``bytes``, no response callback turning entries into
tuples and dicts, no decoding — takes the entry ids, and sends one ``XACK`` per batch
packed by hand. A no-op per message. It is ``raw-per-shard`` minus redis-py's
per-command work (argument encoding, the pool round trip, the reply callbacks), so it
is the ceiling for a Python consumer of this shape on this machine.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import common

#: Entries per XREADGROUP (COUNT 500 measured the same in issue 23).
COUNT = 100


def _bulk(arg: bytes | str | int) -> bytes:
    data = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _pack(*args: bytes | str | int) -> bytes:
    """A RESP array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(_bulk(arg) for arg in args)


async def lean_child(
    url: str, keys: list[str], group: str, total: int, count: int = COUNT
) -> dict[str, Any]:
    """Drain every shard of ``keys`` for ``group`` with one lean task per shard; the
    entries were published before, so a shard is done when a read returns nothing."""
    redis = common.create_client(url)
    await redis.ping()
    pool = redis.connection_pool
    conns = [await pool.get_connection("XREADGROUP") for _ in keys]
    done = 0

    async def drain(key: str, conn: Any) -> None:
        nonlocal done
        name = key.encode()
        read = _pack("XREADGROUP", "GROUP", group, "lean", "COUNT", count, "STREAMS", key, ">")
        ack_head = _bulk("XACK") + _bulk(key) + _bulk(group)
        while True:
            await conn.send_packed_command(read, check_health=False)
            reply = await conn.read_response()
            if not reply:
                return
            # RESP3 (how streamworks' client talks) answers a map {stream: entries}.
            entries = reply[name] if isinstance(reply, dict) else reply[0][1]
            if not entries:
                return
            ids = [entry[0] for entry in entries]
            parts = [b"*%d\r\n" % (3 + len(ids)), ack_head]
            parts += [b"$%d\r\n%s\r\n" % (len(i), i) for i in ids]
            await conn.send_packed_command(b"".join(parts), check_health=False)
            await conn.read_response()
            done += len(ids)

    start = time.perf_counter()
    cpu = time.process_time()
    await asyncio.gather(*(drain(key, conn) for key, conn in zip(keys, conns, strict=True)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    for conn in conns:
        await pool.release(conn)
    await redis.aclose()
    if done != total:
        raise RuntimeError(f"raw-lean handled {done} of {total}")
    return {"rate": done / elapsed, "elapsed": elapsed, "handled": done, "cpu_us": cpu / done * 1e6}
