"""The Channels layer settings of the production stack (Redis), in one place for settings and tests."""

from __future__ import annotations

from typing import Any

# A consumer waits on the layer in blocking reads of 5 s (channels-redis' BZPOPMIN timeout). redis-py >= 6
# defaults socket_timeout to 5 s as well, so an idle websocket died with "TimeoutError: Timeout reading
# from ..." after 5 s and closed with code 1011. The socket timeout is set here explicitly, well above
# the blocking read, so that no redis-py default can bring that back; it only fires on a dead connection.
SOCKET_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
# Messages a consumer may fall behind by before the layer drops new ones for it (channels-redis: 100).
CAPACITY = 1000


def redis_channel_layer(url: str, prefix: str = "asgi") -> dict[str, Any]:
    """The ``CHANNEL_LAYERS["default"]`` entry for the Redis at ``url``. ``prefix`` namespaces the
    layer's keys: deployments (and test sessions) sharing one Redis never see each other's groups."""
    return {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": url,
                    "socket_timeout": SOCKET_TIMEOUT_S,
                    "socket_connect_timeout": CONNECT_TIMEOUT_S,
                    "socket_keepalive": True,
                }
            ],
            "capacity": CAPACITY,
            "prefix": prefix,
        },
    }
