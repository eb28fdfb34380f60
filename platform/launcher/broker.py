"""kombu's filesystem transport with atomic writes (the embedded default's Celery broker).

kombu writes a message file in place while readers poll the folder: a reader can take the file
between its creation and the write and read nothing, and the worker dies with "Unrecoverable error:
JSONDecodeError" (seen here with the launcher's sweep every few seconds). Writing to a name readers
ignore and renaming it into place makes a message appear complete or not at all.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
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
