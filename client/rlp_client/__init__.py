"""Python client of the RL post-training platform: its REST API and the live stream of a run.

    from rlp_client import Client

    client = Client("http://127.0.0.1:8000", token="rlp_...")   # or Client.from_env()
    run = client.launch(experiment=3)
    for item in run.follow():                                   # events and metric points, live
        print(item)
    print(run.wait())                                           # "succeeded" | "failed" | "cancelled"

Depends on httpx, websockets, rich and PyYAML only: no Django, torch or Ray.
"""

from rlp_client.client import Client, create_token
from rlp_client.config import Credentials, NotLoggedIn, load_credentials, save_credentials
from rlp_client.errors import (
    ApiError,
    AuthenticationFailed,
    BadRequest,
    ClientError,
    Conflict,
    ConnectionFailed,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServerError,
    StreamRefused,
)
from rlp_client.live import FollowState, LiveStream
from rlp_client.models import (
    ACTIVE_STATES,
    FINAL_STATES,
    Checkpoint,
    CheckpointExport,
    Event,
    Experiment,
    MetricPoint,
    MetricSeries,
    NewToken,
    Project,
    RunInfo,
    Sample,
)
from rlp_client.runs import Run
from rlp_client.transport import RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "ApiError",
    "AuthenticationFailed",
    "BadRequest",
    "Checkpoint",
    "CheckpointExport",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "Credentials",
    "Event",
    "Experiment",
    "FollowState",
    "LiveStream",
    "MetricPoint",
    "MetricSeries",
    "NewToken",
    "NotFound",
    "NotLoggedIn",
    "PayloadTooLarge",
    "PermissionDenied",
    "Project",
    "RateLimited",
    "RetryPolicy",
    "Run",
    "RunInfo",
    "Sample",
    "ServerError",
    "StreamRefused",
    "create_token",
    "load_credentials",
    "save_credentials",
]
