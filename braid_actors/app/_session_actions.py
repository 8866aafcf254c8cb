"""``close_session``: release a branch's native session; its next turn starts afresh.

The provider closes the session first (for the CLIs there is nothing on a server to
release, and their native files are the user's, so they are left alone); then the binding
is recorded ``closed``. A closed binding is never continued: the branch's next turn gets a
fresh native session with the portable context, a ``handed_off`` edge and the label "new
session with copied context". A retry under the same ``operationId`` returns the recorded
result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from braid_actors import graph
from braid_actors.app._wire import to_wire
from braid_actors.errors import IllegalTransition
from braid_actors.model import BindingClosed

if TYPE_CHECKING:
    from braid_actors.app._service import BraidApp


@attrs.frozen
class CloseSessionParams:
    branch_id: str
    operation_id: str | None = None


async def close_session(app: BraidApp, p: CloseSessionParams) -> dict[str, Any]:
    branch = graph.get_branch(app.state, p.branch_id)
    binding = branch.binding
    session = binding.session_id if binding is not None and binding.state == "bound" else None
    provider = app.providers.get(binding.runner) if binding is not None else None
    released, detail = False, "the runner is not available: nothing was released"
    if session is not None and provider is not None:
        closed = await provider.close_session(session)
        released, detail = closed.released, closed.detail

    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        if session is None:
            raise IllegalTransition(
                "the branch has no bound native session to close",
                details={"branchId": p.branch_id},
            )
        event = BindingClosed(branch.conversation_id, branch.branch_id, session, op_id, app.clock())
        result = {
            "branchId": branch.branch_id,
            "sessionId": session,
            "released": released,
            "detail": detail,
        }
        return event, result

    params: dict[str, Any] = to_wire(p)
    params.pop("operationId", None)
    return await app.mutate("close_session", params, p.operation_id, build)
