"""Application actions and the running application; every client calls these."""

from braid_actors.app._actions import COMMANDS, Command, call, parse
from braid_actors.app._errors import error_body, error_reply
from braid_actors.app._events import (
    EVENT_BUFFER,
    SUBSCRIBE,
    EventHub,
    EventMapper,
    ProtocolEvent,
    SubscribeParams,
    Subscription,
    parse_subscribe,
)
from braid_actors.app._service import (
    APP_VERSION,
    DEFAULT_DRAIN_GRACE,
    PROTOCOL_VERSION,
    BraidApp,
    default_home,
    freeze_long_lived,
    open_app,
    tune_process,
)
from braid_actors.app._views import conversation_view, graph_view, run_record
from braid_actors.app._wire import camel, to_wire, wire

__all__ = [
    "APP_VERSION",
    "COMMANDS",
    "DEFAULT_DRAIN_GRACE",
    "EVENT_BUFFER",
    "PROTOCOL_VERSION",
    "SUBSCRIBE",
    "BraidApp",
    "Command",
    "EventHub",
    "EventMapper",
    "ProtocolEvent",
    "SubscribeParams",
    "Subscription",
    "call",
    "camel",
    "conversation_view",
    "default_home",
    "error_body",
    "error_reply",
    "freeze_long_lived",
    "graph_view",
    "open_app",
    "parse",
    "parse_subscribe",
    "run_record",
    "to_wire",
    "tune_process",
    "wire",
]
