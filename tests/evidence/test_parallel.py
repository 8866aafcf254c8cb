"""``ingest_many``: several processes store exactly what a sequential ``ingest`` loop stores.

Every comparison reads the whole database of both stores (entries, sources, coverage, links,
objects and their bodies, actions, file cursors) with only the clock's values and the random
coverage ids left out, so rows, their order (primary keys) and every body must be equal.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import shutil
import signal
import sqlite3
import threading
import time
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from braid_actors.errors import EvidenceInvalidArgument
from braid_actors.evidence import PARALLEL_MIN_BYTES, EvidenceStore, worker_count
from braid_actors.evidence._parallel import (
    AHEAD_FILES,
    CHECKPOINT_WAIT,
    Job,
    Reports,
    Turns,
    _work,
    background_checkpoints,
    send_report,
)
from tests._imports import loaded_after

from ._helpers import FIXTURES, claude_line, jsonl

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager
    from pathlib import Path

RUN = "run_parallel"
_CLOCK = frozenset(
    {"created_at", "observed_at", "last_success_at", "updated_at", "id", "object_hash"}
)
"""Keys of clock values (a coverage report's id is random, its hash covers both)."""


def _corpus(tmp_path: Path) -> list[Path]:
    """Every Claude Code and Codex fixture, the Gemini one, an unknown-format file and a
    missing one: each kind of pass."""
    out = sorted((FIXTURES / "claude-code").rglob("*.jsonl"))
    out += sorted((FIXTURES / "codex").rglob("*.jsonl"))
    out += sorted((FIXTURES / "gemini-cli").rglob("*.json"))
    unknown = tmp_path / "notes.jsonl"
    unknown.write_text('{"note": 1}\n', encoding="utf-8")
    return [*out, unknown, tmp_path / "missing.jsonl"]


def _clockless(body: str) -> Any:
    value = json.loads(body)
    if isinstance(value, dict):
        for key in _CLOCK & value.keys():
            value[key] = None
    return value


def _dump(home: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table an ingest writes, in primary-key order, clock values blanked."""
    queries = {
        "entries": "SELECT pk, id, run_id, source_pk, source_key, sequence, ordinal, revision, "
        "latest, kind, tool_call_id, scope, content_ref, raw_ref, intent_ref, object_hash, "
        "body FROM entries ORDER BY pk",
        "sources": "SELECT pk, id, run_id, harness, session_id, agent_id, parent_session_id, "
        "path_key, body FROM sources ORDER BY pk",
        "coverage": "SELECT pk, run_id, source_id, status, body FROM coverage ORDER BY pk",
        "links": "SELECT * FROM links ORDER BY run_id, entry_id, node_id, kind",
        "objects": "SELECT * FROM objects ORDER BY ref",
        "object_data": "SELECT * FROM object_data ORDER BY pk",
        "actions": "SELECT * FROM actions ORDER BY pk",
        "files": "SELECT run_id, path_key, boundary, boundary_hash, cursor, cursor_hash "
        "FROM files ORDER BY run_id, path_key",
        "runs": "SELECT run_id, policy FROM runs ORDER BY run_id",
    }
    out: dict[str, list[tuple[Any, ...]]] = {}
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        for table, query in queries.items():
            cursor = conn.execute(query)
            names = [d[0] for d in cursor.description]
            out[table] = [
                tuple(
                    _clockless(v) if name in ("body", "policy") else v
                    for name, v in zip(names, row, strict=True)
                )
                for row in cursor
            ]
    return out


def _reports(reports: list[Any]) -> list[Any]:
    return [
        (r.path, r.harness, [(_blank(s.coverage), s.summary) for s in r.sources]) for r in reports
    ]


def _blank(coverage: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if k in _CLOCK else v) for k, v in coverage.items()}


def _sequential(home: Path, paths: list[Path], **kwargs: Any) -> list[Any]:
    with EvidenceStore.open(home) as store:
        return [store.ingest(path, run_id=RUN, **kwargs) for path in paths]


def test_parallel_ingest_stores_what_sequential_ingest_stores(tmp_path: Path) -> None:
    """Two processes, every kind of file, some files twice: the same rows, bodies, links,
    objects, coverage and reports as one ``ingest`` after the other."""
    corpus = _corpus(tmp_path)
    paths = [*corpus, corpus[2], corpus[0], corpus[-4]]  # again: duplicates, in order
    expected = _sequential(tmp_path / "seq", paths)
    with EvidenceStore.open(tmp_path / "par") as store:
        got = list(store.ingest_many(paths, run_id=RUN, workers=2))
    assert _reports(got) == _reports(expected)
    seq, par = _dump(tmp_path / "seq"), _dump(tmp_path / "par")
    assert seq["entries"]
    assert seq["links"]
    for table in seq:
        assert par[table] == seq[table], table


def test_parallel_ingest_of_a_grown_run_continues_like_sequential(tmp_path: Path) -> None:
    """Into a run that already holds the files (under ``detailed``): all duplicates, the
    run's policy kept, for both ways."""
    corpus = _corpus(tmp_path)[:9]
    for name in ("seq", "par"):
        _sequential(tmp_path / name, corpus, policy="detailed")
    expected = _sequential(tmp_path / "seq", corpus)
    with EvidenceStore.open(tmp_path / "par") as store:
        got = list(store.ingest_many(corpus, run_id=RUN, workers=2))
    assert _reports(got) == _reports(expected)
    assert all(
        s.coverage["counts"]["stored"] == 0 and s.coverage["capture_policy"]["preset"] == "detailed"
        for r in got
        for s in r.sources
    )
    assert _dump(tmp_path / "par") == _dump(tmp_path / "seq")


def test_reports_piling_up_behind_a_long_file_do_not_stop_the_ingest(tmp_path: Path) -> None:
    """Three processes. This one prepares the first file, the longest, while the workers
    prepare the next 32 (16 each); then it takes file 34 and waits for its turn, while the
    workers write the 32 and send their reports (six sessions a file: some 4 KB each, far
    more than a pipe holds). The ingest ends, and stores what a loop stores: a worker whose
    reports filled the pipe used to block in its put holding the next turn, for good."""
    first = "ffffffff-0000-4000-8000-000000000000"
    paths = [
        jsonl(
            tmp_path / "long.jsonl",
            [claude_line(first, "user", f"line {i} " * 20) for i in range(8000)],
        )
    ]
    for i in range(60):
        sessions = [f"{i:04x}{k:04x}-0000-4000-8000-000000000000" for k in range(6)]
        lines = [claude_line(s, "user", f"hello {i}") for s in sessions]
        paths.append(jsonl(tmp_path / f"small-{i:02d}.jsonl", lines))
    expected = _sequential(tmp_path / "seq", paths)
    got: list[Any] = []

    def ingest() -> None:
        with EvidenceStore.open(tmp_path / "par") as store:
            got.extend(store.ingest_many(paths, run_id=RUN, workers=3))

    thread = threading.Thread(target=ingest, daemon=True)  # (left behind if it hangs)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the parallel ingest stopped"
    assert _reports(got) == _reports(expected)
    assert _dump(tmp_path / "par") == _dump(tmp_path / "seq")


def test_a_failing_file_stops_the_parallel_ingest_where_a_loop_stops(tmp_path: Path) -> None:
    """A resume offset that is a line start in the first files only: the files before the
    failing one are stored and reported, the error is the loop's, nothing after is stored."""
    short = FIXTURES / "claude-code/marot__spotter/test/fixtures/transcripts/short.jsonl"
    offset = short.read_bytes().index(b"\n") + 1
    copies = []
    for k in range(3):
        copy = tmp_path / f"c{k}" / short.name
        copy.parent.mkdir()
        shutil.copyfile(short, copy)
        copies.append(copy)
    other = sorted((FIXTURES / "codex").rglob("*.jsonl"))[0]
    assert other.read_bytes()[offset - 1 : offset] != b"\n"
    paths = [copies[0], copies[1], other, copies[2]]
    with EvidenceStore.open(tmp_path / "seq") as store:  # a loop stops at paths[2]
        done = [store.ingest(path, run_id=RUN, resume_offset=offset) for path in paths[:2]]
        with pytest.raises(EvidenceInvalidArgument):
            store.ingest(paths[2], run_id=RUN, resume_offset=offset)
    got: list[Any] = []
    with (
        EvidenceStore.open(tmp_path / "par") as store,
        pytest.raises(EvidenceInvalidArgument) as raised,
    ):
        got.extend(store.ingest_many(paths, run_id=RUN, resume_offset=offset, workers=2))
    assert raised.value.details == {"field": "resume_offset"}
    assert _reports(got) == _reports(done)
    assert len(got) == 2
    assert _dump(tmp_path / "par") == _dump(tmp_path / "seq")


def test_a_file_written_meanwhile_is_prepared_again_inside_the_transaction(
    tmp_path: Path,
) -> None:
    """Another writer ingests the same file (starting the run as ``detailed``) after this
    pass prepared it: the pass reads the new cursor and policy inside its transaction and
    stores what a pass after that writer's stores (all duplicates, ``detailed``)."""
    path = FIXTURES / "claude-code/marot__spotter/test/fixtures/transcripts/subagent.jsonl"
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store, EvidenceStore.open(home) as other:

        @contextmanager
        def turn() -> Iterator[None]:
            other.ingest(path, run_id=RUN, policy="detailed")
            yield

        job = Job(str(home), (), (str(path),), RUN, None, None, None)
        report = store.ingest_with_turn(str(path), turn, job=job)
    expected = _sequential(tmp_path / "seq", [path, path], policy="detailed")[1]
    assert _reports([report]) == _reports([expected])
    coverage = report.sources[0].coverage
    assert coverage["counts"]["stored"] == 0
    assert coverage["counts"]["duplicates"] > 0
    assert coverage["capture_policy"]["preset"] == "detailed"


def test_worker_count(tmp_path: Path) -> None:
    """One process for little input, one per CPU from PARALLEL_MIN_BYTES; never more
    processes than files; an explicit count wins; a missing file weighs nothing."""
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"{}\n")
    big = tmp_path / "big.jsonl"
    big.write_bytes(b" " * PARALLEL_MIN_BYTES)
    missing = str(tmp_path / "missing.jsonl")
    assert worker_count([str(small), missing], None) == 1
    cpus = len(os.sched_getaffinity(0))
    assert worker_count([str(big), str(small), missing], None) == min(cpus, 3)
    assert worker_count([str(small)], 4) == 1
    assert worker_count([str(small), missing], 4) == 2


def test_a_process_waiting_for_its_turn_prepares_the_files_after_it(tmp_path: Path) -> None:
    """While another process still holds file 0, a process prepares files 1, 2, ... up to
    AHEAD_FILES of them (no more), and once file 0 is committed writes them, and the rest,
    in file order."""
    paths = []
    for i in range(AHEAD_FILES + 4):
        path = tmp_path / f"f{i:02d}.jsonl"
        path.write_bytes(b"{}\n")
        paths.append(str(path))
    turns = Turns(multiprocessing.get_context("spawn"), len(paths))
    assert turns.claim() == 0  # another process took file 0 and is still preparing it
    events: list[tuple[str, int]] = []
    outcomes: dict[int, Any] = {}

    def prepare(path: str) -> Callable[[Callable[[], AbstractContextManager[object]]], Any]:
        index = paths.index(path)
        events.append(("prepare", index))

        def write(turn: Callable[[], AbstractContextManager[object]]) -> Any:
            with turn():
                events.append(("write", index))
            return f"report {index}"

        return write

    worker = threading.Thread(
        target=_work,
        args=(prepare, paths, turns, lambda: True, outcomes.__setitem__),
    )
    worker.start()
    deadline = time.monotonic() + 30
    while len(events) < AHEAD_FILES and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # and it goes no further while file 0 is held
    assert events == [("prepare", i) for i in range(1, AHEAD_FILES + 1)]
    with turns.turn(0, lambda: True):
        pass  # the other process writes file 0
    worker.join(30)
    assert not worker.is_alive()
    assert [i for kind, i in events if kind == "write"] == list(range(1, len(paths)))
    assert sorted(i for kind, i in events if kind == "prepare") == list(range(1, len(paths)))
    assert outcomes == {i: f"report {i}" for i in range(1, len(paths))}
    assert turns.finished() == len(paths)


def test_an_ingest_worker_loads_no_server_side() -> None:
    """What a spawned ingest worker imports (``_parallel`` and the store) loads neither the
    HTTP server nor trio, nor the model's converter and entity classes (it needs digests and
    times only): its start-up is time the ingest waits for."""
    modules = ("braid_actors.evidence._parallel", "braid_actors.evidence._store")
    watched = (
        "trio",
        "hypercorn",
        "braid_actors.evidence._http",
        "cattrs",
        "braid_actors.model._codec",
        "braid_actors.model._entities",
        "braid_actors.model._events",
    )
    assert loaded_after(modules, watched) == []


def test_the_braid_command_module_imports_no_application() -> None:
    """Each worker of a parallel ``braid evidence ingest`` loads the parent's main script,
    which imports ``braid_actors.cli.main``: that import loads neither the application nor
    trio (they are imported by the commands that run them)."""
    watched = ("trio", "braid_actors.app", "braid_actors.supervisor")
    assert loaded_after(("braid_actors.cli.main",), watched) == []


class _Frames:
    """A queue's put and read ends over a list (what ``send_report`` and ``Reports`` use)."""

    def __init__(self) -> None:
        self.frames: list[tuple[bool, bytes]] = []

    def put(self, frame: tuple[bool, bytes]) -> None:
        self.frames.append(frame)

    def empty(self) -> bool:
        return not self.frames

    def get(self) -> tuple[bool, bytes]:
        return self.frames.pop(0)


def test_a_report_crosses_in_frames_a_pipe_takes_whole() -> None:
    """Each frame, as the queue writes it (pickled, after a 4-byte length), fits in one
    atomic pipe write; the frames of several reports read back as those reports."""
    big = {"sources": [{"id": f"src_{i}", "issues": [f"{i} " * 100]} for i in range(40)]}
    channel = _Frames()
    send_report(channel, 3, big)  # type: ignore[arg-type]
    send_report(channel, 4, "small")  # type: ignore[arg-type]
    assert len(channel.frames) > 3
    for frame in channel.frames:
        assert 4 + len(multiprocessing.reduction.ForkingPickler.dumps(frame)) <= select.PIPE_BUF
    got: dict[int, Any] = {}
    Reports(channel).collect(got)  # type: ignore[arg-type]
    assert got == {3: big, 4: "small"}


def _killed_mid_report(queue: multiprocessing.queues.Queue[tuple[bool, bytes]]) -> None:
    """A worker killed after the first frame of its report reached the pipe."""
    cut = _Frames()
    send_report(cut, 7, "x" * 20_000)  # type: ignore[arg-type]
    queue.put(cut.frames[0])
    queue.close()
    queue.join_thread()  # the frame is in the pipe
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_in_the_middle_of_a_report_leaves_no_report_and_no_wait() -> None:
    """Reading what a worker killed mid-report left returns at once with no report for that
    file (the ingest then says a worker stopped): a report sent as one message of more than
    a pipe's atomic write could be cut short in the pipe, and its read waited for the rest
    for good."""
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.queues.Queue[tuple[bool, bytes]] = ctx.Queue()
    proc = ctx.Process(target=_killed_mid_report, args=(queue,), daemon=True)
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert not queue.empty()  # its first frame is there
    got: dict[int, Any] = {}
    reader = threading.Thread(target=Reports(queue).collect, args=(got,), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading the frames waited"
    assert got == {} and queue.empty()


def test_a_thread_checkpoints_the_wal_while_a_parallel_ingest_runs(tmp_path: Path) -> None:
    """Committed pages reach the database file through ``background_checkpoints`` alone
    (the writer runs no automatic checkpoint, so they stay in the WAL until the thread
    starts), and the thread is gone afterwards."""
    home = tmp_path / "home"
    with EvidenceStore.open(home):
        pass
    db = home / "evidence.sqlite3"
    with closing(sqlite3.connect(db, isolation_level=None)) as writer:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("CREATE TABLE scratch(data BLOB)")
        before = db.stat().st_size
        writer.execute("INSERT INTO scratch VALUES (?)", (os.urandom(2_000_000),))
        time.sleep(0.3)
        assert db.stat().st_size - before < 2_000_000  # (in the WAL only)
        with background_checkpoints(home, every=0.05):
            deadline = time.monotonic() + 30
            while db.stat().st_size < before + 2_000_000 and time.monotonic() < deadline:
                time.sleep(0.02)
            grown = db.stat().st_size - before
    assert grown >= 2_000_000
    assert "braid-evidence-checkpoints" not in [t.name for t in threading.enumerate()]


@contextmanager
def _scratch_writer(home: Path) -> Iterator[sqlite3.Connection]:
    """A new store under ``home`` and a connection writing its ``scratch(data)`` table, with
    no automatic checkpoint (as the ingesting processes) and a 10 s busy timeout."""
    with EvidenceStore.open(home):
        pass
    with closing(sqlite3.connect(home / "evidence.sqlite3", isolation_level=None)) as writer:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("PRAGMA busy_timeout=10000")
        writer.execute("CREATE TABLE scratch(data BLOB)")
        yield writer


def test_the_wal_starts_over_while_writers_keep_committing(tmp_path: Path) -> None:
    """With the thread checkpointing beside a writer that commits every millisecond,
    commits write the WAL from its start again: it stays far smaller than what was
    committed (6-9% of it in 8 trials; with ``PASSIVE`` checkpoints alone it held all of
    it in every trial)."""
    home = tmp_path / "home"
    wal = home / "evidence.sqlite3-wal"
    committed = 0
    largest = 0
    with _scratch_writer(home) as writer, background_checkpoints(home, every=0.02):
        while committed < 40_000_000:
            time.sleep(0.001)  # (an ingest prepares its next file between commits)
            writer.execute("INSERT INTO scratch VALUES (?)", (os.urandom(200_000),))
            committed += 200_000
            largest = max(largest, wal.stat().st_size)
    assert largest < committed / 4


def test_a_reader_holding_an_old_snapshot_stalls_no_writer_beyond_the_checkpoint_wait(
    tmp_path: Path,
) -> None:
    """``RESTART`` keeps writers out while it waits for readers of older snapshots (a
    ``braid evidence serve`` request beside an ingest): the checkpoint thread waits at most
    ``CHECKPOINT_WAIT`` for them, then gives the round up, so a commit waits no longer and
    writers still commit between rounds. (With the connection's default 5 s busy timeout,
    this writer failed with "database is locked" after 10 s.)"""
    home = tmp_path / "home"
    slowest = 0.0
    commits = 0
    with (
        _scratch_writer(home) as writer,
        closing(sqlite3.connect(home / "evidence.sqlite3", isolation_level=None)) as reader,
    ):
        writer.execute("INSERT INTO scratch VALUES (?)", (b"x",))
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM scratch").fetchone()  # holds this snapshot
        with background_checkpoints(home, every=0.1):
            ends = time.monotonic() + 3 * CHECKPOINT_WAIT
            while time.monotonic() < ends:
                time.sleep(0.005)
                began = time.monotonic()
                writer.execute("BEGIN IMMEDIATE")
                writer.execute("INSERT INTO scratch VALUES (?)", (os.urandom(1000),))
                writer.execute("COMMIT")
                slowest = max(slowest, time.monotonic() - began)
                commits += 1
        reader.execute("COMMIT")
    assert slowest < CHECKPOINT_WAIT + 0.5, f"a commit waited {slowest:.2f} s"
    assert commits >= 3
