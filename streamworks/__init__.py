"""streamworks: event consumers and producers over sharded Redis Streams.

.. code-block:: python

    from streamworks import App

    app = App("billing")
    app.stream("orders", shards=8)

    @app.handler("orders")
    async def charge(order: dict) -> None: ...
"""

from __future__ import annotations

from streamworks.app import App as App
from streamworks.app import StreamSpec as StreamSpec
from streamworks.batch import Batch as Batch
from streamworks.exceptions import ConfigurationError as ConfigurationError
from streamworks.exceptions import DecodeError as DecodeError
from streamworks.exceptions import NoShardsError as NoShardsError
from streamworks.exceptions import PublishError as PublishError
from streamworks.exceptions import Retry as Retry
from streamworks.exceptions import RoutingUnavailableError as RoutingUnavailableError
from streamworks.exceptions import Skip as Skip
from streamworks.exceptions import StartupError as StartupError
from streamworks.exceptions import StreamworksError as StreamworksError
from streamworks.middleware import Middleware as Middleware
from streamworks.protocol.codec import Codec as Codec
from streamworks.protocol.codec import JsonCodec as JsonCodec
from streamworks.ratelimit import RateLimit as RateLimit
from streamworks.runtime.batch_context import BatchContext as BatchContext
from streamworks.runtime.idempotency import IdempotencyStore as IdempotencyStore
from streamworks.runtime.idempotency import RedisIdempotencyStore as RedisIdempotencyStore
from streamworks.runtime.message import Context as Context
from streamworks.runtime.message import Message as Message
from streamworks.runtime.producer import Published as Published
from streamworks.runtime.producer import Record as Record
from streamworks.runtime.retry import RetryPolicy as RetryPolicy
from streamworks.runtime.schedule_spec import Tick as Tick
from streamworks.settings import Settings as Settings

__version__ = "0.1.0"

__all__ = (
    "App",
    "Batch",
    "BatchContext",
    "Codec",
    "ConfigurationError",
    "Context",
    "DecodeError",
    "IdempotencyStore",
    "JsonCodec",
    "Message",
    "Middleware",
    "NoShardsError",
    "PublishError",
    "Published",
    "RateLimit",
    "Record",
    "RedisIdempotencyStore",
    "Retry",
    "RetryPolicy",
    "RoutingUnavailableError",
    "Settings",
    "Skip",
    "StartupError",
    "StreamSpec",
    "StreamworksError",
    "Tick",
    "__version__",
)
