"""Worker processes: start them, talk JSONL to them, stop them with a bounded ladder.

``python -m braid_actors.workers.local`` is the built-in local runner's worker program
(see ``docs/local-runner.md``); it is deliberately not imported here.
"""

from braid_actors.workers._launch import (
    LOCAL_WORKER_MODULE,
    local_worker_command,
    worker_environment,
)
from braid_actors.workers._process import (
    BoundedLog,
    ProcessInfo,
    StopPolicy,
    StopReport,
    WorkerProcess,
    open_worker,
    process_gone,
)
from braid_actors.workers._session import (
    SessionFileError,
    SessionLine,
    SessionState,
    is_session_id,
    read_session,
    session_digest,
    session_path,
)
from braid_actors.workers._wire import (
    PROTOCOL_VERSION,
    LineReader,
    decode_message,
    encode_message,
    structure_part,
    unstructure_part,
)

__all__ = [
    "LOCAL_WORKER_MODULE",
    "PROTOCOL_VERSION",
    "BoundedLog",
    "LineReader",
    "ProcessInfo",
    "SessionFileError",
    "SessionLine",
    "SessionState",
    "StopPolicy",
    "StopReport",
    "WorkerProcess",
    "decode_message",
    "encode_message",
    "is_session_id",
    "local_worker_command",
    "open_worker",
    "process_gone",
    "read_session",
    "session_digest",
    "session_path",
    "structure_part",
    "unstructure_part",
    "worker_environment",
]
