"""Worker processes: start them, talk JSONL to them, observe their process trees, control
them (pause, resume, stop through a bounded ladder, kill), and check spend limits.

``python -m braid_actors.workers.local`` is the built-in local runner's worker program
(see ``docs/local-runner.md``); it is deliberately not imported here.
"""

from braid_actors.workers._controls import (
    UNSTOPPABLE,
    ControlAction,
    ControlOutcome,
    ControlResult,
    adopt,
    kill,
    pause,
    recognise,
    resume,
    stop,
)
from braid_actors.workers._hub import ObservationHub, Watch
from braid_actors.workers._identity import ProcessKey
from braid_actors.workers._launch import (
    LOCAL_WORKER_MODULE,
    control_path,
    local_worker_command,
    spool_path,
    worker_environment,
)
from braid_actors.workers._observe import (
    ARGV_LIMIT,
    ProcessSnapshot,
    TreeObserver,
    TreeSample,
    observe_tree,
)
from braid_actors.workers._pipes import HubLineReader, PipeHub, pipe_hub_supported
from braid_actors.workers._process import (
    BoundedLog,
    ProcessInfo,
    StopPolicy,
    StopReport,
    WorkerProcess,
    open_worker,
    process_gone,
)
from braid_actors.workers._proctable import ProcessTable, read_parent_ids
from braid_actors.workers._scan import find_local_workers
from braid_actors.workers._session import (
    SessionFileError,
    SessionLine,
    SessionState,
    is_session_id,
    read_session,
    session_digest,
    session_path,
)
from braid_actors.workers._spend import (
    DIMENSIONS,
    Crossing,
    Dimension,
    Measured,
    effective_limits,
    first_crossing,
    limit_of,
    unmeasured,
)
from braid_actors.workers._start import native_text
from braid_actors.workers._wire import (
    PROTOCOL_VERSION,
    LineReader,
    decode_message,
    encode_message,
    structure_part,
    unstructure_part,
)

__all__ = [
    "ARGV_LIMIT",
    "DIMENSIONS",
    "LOCAL_WORKER_MODULE",
    "PROTOCOL_VERSION",
    "UNSTOPPABLE",
    "BoundedLog",
    "ControlAction",
    "ControlOutcome",
    "ControlResult",
    "Crossing",
    "Dimension",
    "HubLineReader",
    "LineReader",
    "Measured",
    "ObservationHub",
    "PipeHub",
    "ProcessInfo",
    "ProcessKey",
    "ProcessSnapshot",
    "ProcessTable",
    "SessionFileError",
    "SessionLine",
    "SessionState",
    "StopPolicy",
    "StopReport",
    "TreeObserver",
    "TreeSample",
    "Watch",
    "WorkerProcess",
    "adopt",
    "control_path",
    "decode_message",
    "effective_limits",
    "encode_message",
    "find_local_workers",
    "first_crossing",
    "is_session_id",
    "kill",
    "limit_of",
    "local_worker_command",
    "native_text",
    "observe_tree",
    "open_worker",
    "pause",
    "pipe_hub_supported",
    "process_gone",
    "read_parent_ids",
    "read_session",
    "recognise",
    "resume",
    "session_digest",
    "session_path",
    "spool_path",
    "stop",
    "structure_part",
    "unmeasured",
    "unstructure_part",
    "worker_environment",
]
