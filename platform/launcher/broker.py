"""The Celery broker transports: kombu's, each with one fix.

Filesystem (the embedded default), atomic writes: kombu writes a message file in place while readers
poll the folder: a reader can take the file between its creation and the write and read nothing, and
the worker dies with "Unrecoverable error: JSONDecodeError" (seen here with the launcher's sweep every
few seconds). Writing to a name readers ignore and renaming it into place makes a message appear
complete or not at all.

Redis (production): a worker that outlives a Redis restart (see :class:`RedisChannel`).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

import redis
from kombu.transport import filesystem
from kombu.transport import redis as redis_transport
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class AtomicChannel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # readers take only names ending in ".<queue>.msg"
        try:
            with open(partial, "wb") as fh:
                fh.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = AtomicChannel


# --- Redis (production) ---------------------------------------------------------------------------------


class RedisChannel(redis_transport.Channel):
    """kombu's Redis channel, made safe to use after its connection was discarded.

    When Redis goes away under a running worker, Celery 5.7 first ``collect()``s the consumer's
    connection (which detaches the transport from it: ``transport.client = None``) and then closes it.
    That close, and the ack of every task still running on the old channel, needs a new Redis client;
    kombu builds one from ``transport.client`` and fails with ``AttributeError: 'NoneType' object has no
    attribute 'hostname'``, which Celery treats as unrecoverable: the worker stops consuming for good.
    Raising the connection error it really is lets Celery ignore it and reconnect. The unacknowledged
    message stays in Redis and is redelivered after the visibility timeout (launcher tasks are idempotent).
    """

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection of this channel was closed")
        return super()._connparams(asynchronous=asynchronous)


class RedisTransport(redis_transport.Transport):
    Channel = RedisChannel
