"""Translation of errors into replies: the one place that decides what a client sees."""

from __future__ import annotations

from typing import Any

from braid_actors.errors import BraidError


def error_body(exc: BaseException) -> dict[str, Any]:
    """Code, plain message and details of a Braid error; nothing else ever leaks."""
    if isinstance(exc, BraidError):
        return {"code": exc.code, "message": exc.message, "details": exc.details}
    # Unexpected failures keep their text out of replies: it may quote secrets or paths.
    return {"code": "internal_error", "message": "an internal error occurred", "details": {}}


def error_reply(request_id: Any, exc: BaseException) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": error_body(exc)}
