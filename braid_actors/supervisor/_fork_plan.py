"""Planning a native fork: a new branch's first turn may start from the source's session.

Theory of operation: a branch (``/branch``, ``/clone``) always gets a new provider session.
When its source branch's native session ends exactly where the new branch's context ends,
a runner that claims ``sessions_fork`` can make that new session as a native fork of the
source session (its own history up to the boundary, the source left unchanged) instead of
being handed a copy. Only with a proof: the branch has no session of its own yet, the
source binding is bound on the same runner and records this very boundary, and the runner
proves its session ends at the recorded native boundary now. Anything else is ``None``:
the turn gets portable context as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from braid_actors.providers import SessionRequest

if TYPE_CHECKING:
    from braid_actors.graph import GraphState
    from braid_actors.model import Branch
    from braid_actors.providers import Provider

PROOF_DEADLINE = 10.0


async def plan_fork(
    state: GraphState,
    branch: Branch,
    provider: Provider,
    boundary: str | None,
    preference: str,
) -> SessionRequest | None:
    """The fork request for the branch's first turn, or ``None`` (see the module note)."""
    own = branch.binding
    if (
        preference != "reuse"
        or boundary is None
        or branch.source is None
        or (own is not None and own.state != "unbound")
        or not provider.capabilities.sessions_fork
    ):
        return None
    source = state.branches[branch.source.branch_id].binding
    if (
        source is None
        or source.state != "bound"
        or source.session_id is None
        or source.runner != provider.name
        or source.boundary_message_id != boundary
    ):
        return None
    native = source.native_boundary or source.boundary_message_id
    with trio.move_on_after(PROOF_DEADLINE):
        proof = await provider.prove_session(source.session_id)
        if (
            proof.available
            and proof.last_message_id == native
            and (source.session_digest is None or proof.digest == source.session_digest)
        ):
            return SessionRequest(source.session_id, native, source.session_digest, fork=True)
    return None
