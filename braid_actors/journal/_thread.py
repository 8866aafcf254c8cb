"""One long-lived thread for the journal actor's database writes.

``trio.to_thread`` hands each call to a cached thread, and a thread goes back to the cache
only after it has delivered its result. Under load the actor can ask for the next commit
in the very pass that receives the previous one, before that thread is idle again, and the
cache then starts (and names) a new thread; profiles of the event loop showed thread
starts on the commit path. The actor's writes are sequential by design (one writer), so
one thread that lives as long as the actor does them all, and the event loop only posts a
job and is woken once.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

T = TypeVar("T")


class WriterThread:
    """Runs the functions it is given, one at a time, in order, on one thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[WriterThread]:
        """Own the thread for the block; it ends (after its last job) when the block does."""
        thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
        thread.start()
        self._thread = thread
        try:
            yield self
        finally:
            self._jobs.put(None)
            thread.join()
            self._thread = None

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; like ``trio.to_thread.run_sync`` it is not
        cancellable (a write, once begun, is waited for)."""
        if self._thread is None:
            raise RuntimeError("the writer thread is not running")
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[tuple[bool, Any]] = []

        def job() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # delivered to the caller, re-raised there
                box.append((False, exc))
            token.run_sync_soon(done.set)

        self._jobs.put(job)
        with trio.CancelScope(shield=True):
            await done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]
