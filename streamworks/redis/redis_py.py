"""What streamworks uses of redis-py beyond its documented API, in one place.

The batch writers (``wire.py``, ``cluster.py``) and the idle waiter
(``runtime/waiter.py``) go below redis-py's command layer to send many commands in one
write, and the cluster code steers redis-py's slot map. Of that, these are not
documented redis-py API, and a release may change them without notice:

* ``RedisCluster._initialize`` — redis-py's own flag "reload the slot map before the
  next command" (set by its commands after a redirection or a connection error; read
  by ``RedisCluster.initialize``). Read and set only through :func:`slot_map_stale`
  and :func:`reload_slot_map`.
* ``RedisCluster.nodes_manager`` (``get_node``, ``get_node_from_slot``, ``move_slot``)
  and ``ClusterNode.acquire_connection``/``release`` — the slot → node map and a
  node's connection pool.
* ``AbstractConnection.send_packed_command``/``read_response`` on a connection taken
  from the pool — one write of hand-packed RESP (``wire.pack``), one reply per command.

So ``pyproject.toml`` accepts only the redis-py releases this was tested with,
:data:`TESTED_REDIS_PY`, and ``tests/redis/test_redis_py_pin.py`` fails on any other
installed version (and when the pin and this list disagree): moving to a new redis-py
means running the suite on it (the cluster suites above all), then adding it here and
widening the pin.
"""

from __future__ import annotations

from redis.asyncio import RedisCluster

__all__ = ("TESTED_REDIS_PY", "reload_slot_map", "slot_map_stale")

#: The redis-py release series (``major.minor``) the private API above was tested with.
TESTED_REDIS_PY: tuple[str, ...] = ("8.1",)


def reload_slot_map(cluster: RedisCluster) -> None:
    """Have ``cluster`` reload its slot map before its next command (or before
    :func:`slot_map_stale` is acted on): a failover may be under way, a slot moved."""
    cluster._initialize = True


def slot_map_stale(cluster: RedisCluster) -> bool:
    """Whether ``cluster`` will reload its slot map before its next command (its node
    list is loaded on first use, and after :func:`reload_slot_map`)."""
    return bool(cluster._initialize)
