"""Worker processes: start them, talk JSONL to them, observe their process trees, control
them (pause, resume, stop through a bounded ladder, kill), and check spend limits.

``python -m braid_actors.workers.local`` is the built-in local runner's worker program
(see ``docs/local-runner.md``); it is deliberately not imported here.

The names below are loaded on first use (PEP 562): a worker program imports this package
too, and it needs none of the supervisor's side (psutil, the observation hub, controls),
whose import was two thirds of every local worker's start-up CPU.
"""

import typing

from braid_actors import _lazy

if typing.TYPE_CHECKING:
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
    from braid_actors.workers._identity import ProcessKey, presence, same_start
    from braid_actors.workers._launch import (
        LOCAL_WORKER_MODULE,
        control_path,
        local_worker_command,
        spool_path,
        worker_environment,
    )
    from braid_actors.workers._member import ProcessSnapshot
    from braid_actors.workers._observe import ARGV_LIMIT, TreeObserver, TreeSample, observe_tree
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

_SOURCES: dict[str, str] = {
    "UNSTOPPABLE": "braid_actors.workers._controls",
    "ControlAction": "braid_actors.workers._controls",
    "ControlOutcome": "braid_actors.workers._controls",
    "ControlResult": "braid_actors.workers._controls",
    "adopt": "braid_actors.workers._controls",
    "kill": "braid_actors.workers._controls",
    "pause": "braid_actors.workers._controls",
    "recognise": "braid_actors.workers._controls",
    "resume": "braid_actors.workers._controls",
    "stop": "braid_actors.workers._controls",
    "ObservationHub": "braid_actors.workers._hub",
    "Watch": "braid_actors.workers._hub",
    "ProcessKey": "braid_actors.workers._identity",
    "same_start": "braid_actors.workers._identity",
    "presence": "braid_actors.workers._identity",
    "LOCAL_WORKER_MODULE": "braid_actors.workers._launch",
    "control_path": "braid_actors.workers._launch",
    "local_worker_command": "braid_actors.workers._launch",
    "spool_path": "braid_actors.workers._launch",
    "worker_environment": "braid_actors.workers._launch",
    "ARGV_LIMIT": "braid_actors.workers._observe",
    "ProcessSnapshot": "braid_actors.workers._member",
    "TreeObserver": "braid_actors.workers._observe",
    "TreeSample": "braid_actors.workers._observe",
    "observe_tree": "braid_actors.workers._observe",
    "HubLineReader": "braid_actors.workers._pipes",
    "PipeHub": "braid_actors.workers._pipes",
    "pipe_hub_supported": "braid_actors.workers._pipes",
    "BoundedLog": "braid_actors.workers._process",
    "ProcessInfo": "braid_actors.workers._process",
    "StopPolicy": "braid_actors.workers._process",
    "StopReport": "braid_actors.workers._process",
    "WorkerProcess": "braid_actors.workers._process",
    "open_worker": "braid_actors.workers._process",
    "process_gone": "braid_actors.workers._process",
    "ProcessTable": "braid_actors.workers._proctable",
    "read_parent_ids": "braid_actors.workers._proctable",
    "find_local_workers": "braid_actors.workers._scan",
    "SessionFileError": "braid_actors.workers._session",
    "SessionLine": "braid_actors.workers._session",
    "SessionState": "braid_actors.workers._session",
    "is_session_id": "braid_actors.workers._session",
    "read_session": "braid_actors.workers._session",
    "session_digest": "braid_actors.workers._session",
    "session_path": "braid_actors.workers._session",
    "DIMENSIONS": "braid_actors.workers._spend",
    "Crossing": "braid_actors.workers._spend",
    "Dimension": "braid_actors.workers._spend",
    "Measured": "braid_actors.workers._spend",
    "effective_limits": "braid_actors.workers._spend",
    "first_crossing": "braid_actors.workers._spend",
    "limit_of": "braid_actors.workers._spend",
    "unmeasured": "braid_actors.workers._spend",
    "native_text": "braid_actors.workers._start",
    "PROTOCOL_VERSION": "braid_actors.workers._wire",
    "LineReader": "braid_actors.workers._wire",
    "decode_message": "braid_actors.workers._wire",
    "encode_message": "braid_actors.workers._wire",
    "structure_part": "braid_actors.workers._wire",
    "unstructure_part": "braid_actors.workers._wire",
}
"""Where each public name lives."""


# The type checker reads the imports above, so a wrong name stays an error.
if not typing.TYPE_CHECKING:
    __getattr__, __dir__ = _lazy.names(__name__, _SOURCES)


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
    "presence",
    "process_gone",
    "read_parent_ids",
    "read_session",
    "recognise",
    "resume",
    "same_start",
    "session_digest",
    "session_path",
    "spool_path",
    "stop",
    "structure_part",
    "unmeasured",
    "unstructure_part",
    "worker_environment",
]
