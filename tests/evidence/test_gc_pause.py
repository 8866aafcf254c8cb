"""An ingest runs without automatic cyclic collections, and leaves the collector as it was."""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._gcpause import collection_paused
from braid_actors.evidence._parallel import Job, ingest_in_order

from ._helpers import FIXTURES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

RUN = "run_gc_pause"


class _Collections:
    """Counts the collector's passes while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.passes = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.passes += 1

    def __enter__(self) -> _Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class _Node:
    """A container the collector tracks, never taken from a free list (lists can be)."""


@contextmanager
def _low_threshold() -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(5, 1, 1)  # a pass every few allocations when the collector runs
    try:
        yield
    finally:
        gc.set_threshold(*old)


def test_ingesting_a_file_runs_no_collection_and_resumes_the_collector(tmp_path: Path) -> None:
    path = next((FIXTURES / "claude-code").rglob("subagent.jsonl"))
    with EvidenceStore.open(tmp_path / "home") as store:
        store.ingest(path, run_id=RUN)  # (opening, imports: not what is counted)
        with _low_threshold():
            with _Collections() as during:
                report = store.ingest(path, run_id="run_gc_pause_2")
            assert gc.isenabled()
            with _Collections() as after:
                [_Node() for _ in range(50)]  # the collector runs again
    assert report.harness == "claude_code"
    assert report.sources  # (the pass stored something)
    # With a pass due every 5 allocations, one can come in ``ingest`` before the pause and
    # one after it; the file's own work would make hundreds (265 without the pause).
    assert during.passes <= 2
    assert after.passes > 0


def test_the_calling_process_of_a_parallel_ingest_prepares_and_writes_paused(
    tmp_path: Path,
) -> None:
    paths = sorted(str(p) for p in (FIXTURES / "claude-code").rglob("*.jsonl"))
    home = tmp_path / "home"
    seen: list[tuple[str, bool]] = []
    with EvidenceStore.open(home) as store:
        job = Job(str(home), (), tuple(paths), RUN, None, None, None)

        def prepare(path: str) -> Callable[[Callable[[], AbstractContextManager[object]]], Any]:
            seen.append(("prepare", gc.isenabled()))
            write = store.prepare_for_turn(path, job=job)

            def written(turn: Callable[[], AbstractContextManager[object]]) -> Any:
                seen.append(("write", gc.isenabled()))
                return write(turn)

            return written

        reports = list(ingest_in_order(prepare, job, 2))
    assert len(reports) == len(paths)
    assert seen, "the calling process took no file"
    assert all(not enabled for _, enabled in seen)
    assert gc.isenabled()


def test_nested_pauses_resume_once_the_outer_one_ends() -> None:
    assert gc.isenabled()
    with collection_paused():
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_of_two_threads_resume_when_the_last_one_leaves() -> None:
    entered = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with collection_paused():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=other)
    with collection_paused():
        thread.start()
        assert entered.wait(30)
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    thread.join(30)
    assert gc.isenabled()
