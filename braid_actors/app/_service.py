"""The running application: journal actor, runs supervisor, and the actions' shared plumbing.

``open_app`` is started with ``nursery.start``: it opens the encrypted journal under the
Braid home, rebuilds the graph (snapshot + tail), starts the journal actor and the runs
supervisor in its own nursery, and hands back a :class:`BraidApp`. ``BraidApp.shutdown``
journals ``application.shutdown.requested`` first, then drains or cancels runs, then stops
services in reverse start order.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import resource
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from braid_actors._faults import crash_point
from braid_actors.app._events import EventHub
from braid_actors.errors import ShuttingDown, UnknownRun
from braid_actors.evidence import EvidenceStore
from braid_actors.journal import (
    GraphAdmission,
    Journal,
    JournalHandle,
    NewRecord,
    Operation,
    event_to_record,
    load_or_create_key,
    run_journal,
)
from braid_actors.model import (
    Event,
    IdSource,
    Limits,
    Run,
    digest,
    new_id,
)
from braid_actors.providers import ClaudeCodeProvider, CodexProvider, LocalProvider, Provider
from braid_actors.supervisor import (
    DEFAULT_OBSERVE_INTERVAL,
    RECORD_DEADLINE,
    ChildSpec,
    RunsSupervisor,
    SupervisorHandle,
    SupervisorSpec,
    run_supervisor,
    utc_now,
)

if TYPE_CHECKING:
    from braid_actors import graph

PROTOCOL_VERSION = 1
APP_VERSION = "0.1.0"
SNAPSHOT_EVERY = 5_000
SNAPSHOT_PER_ENTITY = 4
"""A snapshot waits until the tail since the last one holds 4 events per graph entity.

A snapshot encodes every entity (between commits): with 200 streaming runs (~2,000
entities) each took 60-100 ms (its write, once a row that held the journal's writer, is now
a file of its own), and at 5,000 events/s one every ``SNAPSHOT_EVERY`` events would be one
per second. Tied to the state's size, its cost per event stays a fixed share
of a fold, and a restart replays at most 4 events per entity more."""
COMMIT_INTERVAL = 0.010
"""Least time between two journal commits (the journal's floor; see journal/_actor.py).

A commit costs ~0.3-0.5 ms of the supervisor's CPU however few records it holds (the
transaction, the WAL's fsync, the thread hand-offs) and ~10 us per record, so under load a
longer floor is most of what a record costs. At 500 streaming runs (5,000 events/s,
``tools/bench runs``): 4 ms, ~220 commits/s, supervisor 62-64% of a core, ack p50 ~5 ms;
6 ms 57%; 8 ms ~120 commits/s, 55-57%, p50 ~8 ms; 10 ms ~96 commits/s, 49-56%, p50 ~9 ms,
p99 16-33 ms (most of its tail falls around snapshot writes). An isolated request
is still written at once; under load a record waits at most 10 ms more, which no one
watching an agent's stream can see."""
HEAD_INTERVAL = 0.1
"""Least time between two writes of the journal's head (its loss detector; the journal's
default is 20 ms). Each is a write and an fdatasync in a worker thread: at 50 a second
they took 2.8% of a core (half of it in the kernel) at 500 streaming runs. The head
trails the database by at most this much, which the journal tolerates by design."""
DEFAULT_DRAIN_GRACE = 30.0
SERVICE_RESTARTS = 3
SERVICE_PERIOD = 60.0
RECORD_GRACE = 35.0


def default_home(env: Mapping[str, str] = os.environ) -> Path:
    """``$BRAID_HOME``, else ``~/.braid``."""
    return Path(env.get("BRAID_HOME") or Path.home() / ".braid")


@attrs.define(eq=False)
class JournalService:
    """The journal service actor's handle: the store, its actor, the graph it admits."""

    journal: Journal
    handle: JournalHandle
    admission: GraphAdmission


@attrs.define(eq=False)
class Services:
    """What the root supervisor's children currently are (replaced on a restart)."""

    journal: JournalService | None = None
    runs: RunsSupervisor | None = None

    def require(self) -> JournalService:
        if self.journal is None:
            raise ShuttingDown("the journal service is not running")
        return self.journal


async def journal_service(
    home: Path,
    key: bytes,
    on_ready: Callable[[JournalService], None],
    *,
    on_loaded: Callable[[], None] | None = None,
    task_status: trio.TaskStatus[JournalService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Service actor: open the journal, rebuild the graph (then ``on_loaded()``), run the
    journal actor."""
    journal = await trio.to_thread.run_sync(Journal.open, home, key)
    try:
        admission = await trio.to_thread.run_sync(GraphAdmission.load, journal)
        if on_loaded is not None:
            on_loaded()
        admission.snapshot_per_entity = SNAPSHOT_PER_ENTITY
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(
                functools.partial(
                    run_journal,
                    journal,
                    admission=admission,
                    snapshot_every=SNAPSHOT_EVERY,
                    commit_interval=COMMIT_INTERVAL,
                    head_interval=HEAD_INTERVAL,
                    answer_within=RECORD_DEADLINE,
                )
            )
            service = JournalService(journal, handle, admission)
            on_ready(service)
            task_status.started(service)
    finally:
        journal.close()


@attrs.define(eq=False)
class BraidApp:
    """Handle on a running Braid: state readers, committing helpers, lifecycle."""

    home: Path
    journal_path: Path
    providers: dict[str, Provider]
    ids: IdSource
    clock: Callable[[], Any] = utc_now
    services: Services = attrs.Factory(lambda: Services())
    """The service actors currently running under the root supervisor."""
    events: EventHub = attrs.Factory(EventHub)
    """Subscriptions to protocol events (``subscribe``), fed by every commit."""
    drain_grace: float = DEFAULT_DRAIN_GRACE
    """How long a draining shutdown lets active runs finish before cancelling them."""
    stopped: trio.Event = attrs.Factory(trio.Event)
    _changed: trio.Event = attrs.Factory(trio.Event)
    _shutting_down: bool = False

    @property
    def journal(self) -> JournalHandle:
        return self.services.require().handle

    @property
    def admission(self) -> GraphAdmission:
        return self.services.require().admission

    @property
    def runs(self) -> RunsSupervisor:
        if self.services.runs is None:
            raise ShuttingDown("the runs supervisor is not running")
        return self.services.runs

    @property
    def state(self) -> graph.GraphState:
        """The committed graph (read model)."""
        return self.admission.read

    def bind_journal(self, service: JournalService) -> None:
        """A (re)started journal service: readers follow its read model from now on."""
        self.services.journal = service
        service.admission.listeners.append(self.notify)
        self.events.attach(service.admission)

    def notify(self, _records: object) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Wait for the next commit."""
        await self._changed.wait()

    async def mutate(
        self,
        command: str,
        params: Mapping[str, Any],
        operation_id: str | None,
        build: Callable[[str], tuple[Event, dict[str, Any]]],
    ) -> dict[str, Any]:
        """Run a mutating command idempotently under ``operationId``.

        The canonical params digest binds the operation; the event and the ledger entry are
        committed in one transaction. The journal actor checks its ledger before admission:
        a retry with the same digest returns the recorded result and writes nothing (the
        freshly built event is discarded); another digest is ``operation_conflict``.
        """
        if self._shutting_down:
            raise ShuttingDown("Braid is shutting down and accepts no new work")
        op_id = operation_id or new_id("op")
        params_digest = digest({"command": command, "params": dict(params)})
        recorded = await self.journal.recorded(op_id, params_digest)
        if recorded is not None:
            return dict(recorded)
        event, result = build(op_id)
        result = {**result, "operationId": op_id}
        outcome = await self.journal.append(
            [event_to_record(event)], Operation(op_id, command, params_digest, result)
        )
        assert outcome.result is not None
        crash_point(f"op.{command}")
        return dict(outcome.result)

    async def commit(self, event: Event) -> None:
        """Commit one graph event that needs no operation ledger entry."""
        if self._shutting_down:
            raise ShuttingDown("Braid is shutting down and accepts no new work")
        await self.journal.append([event_to_record(event)])

    async def record_app(self, record_type: str, data: Mapping[str, Any]) -> None:
        await self.journal.append([NewRecord(stream="application", type=record_type, data=data)])

    def run(self, run_id: str) -> Run:
        run = self.state.runs.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id}", details={"runId": run_id})
        return run

    async def shutdown(self, *, drain: bool, grace: float | None = None) -> None:
        """Journal the request, settle runs (drain or cancel), stop services in reverse.

        Only the first call journals ``application.shutdown.requested``; a later call (a
        second signal, another client's ``shutdown``) waits for the same stop. ``grace``
        defaults to :attr:`drain_grace`.
        """
        if grace is None:
            grace = self.drain_grace
        if self._shutting_down:
            await self.stopped.wait()
            return
        self._shutting_down = True
        await self.record_app(
            "application.shutdown.requested",
            {
                "drain": drain,
                "activeRuns": sorted(self.runs.active_runs()),
                "at": str(self.clock()),
            },
        )
        crash_point("shutdown.requested")
        await self.runs.stop(drain=drain, grace=grace)
        await self.record_app("application.stopped", {"at": str(self.clock())})
        await self.journal.aclose()
        self.stopped.set()


def _harness_bin(env: Mapping[str, str], variable: str, name: str) -> str | None:
    """``$variable``, else the checkout's pinned install, else ``name`` on PATH."""
    if env.get(variable):
        return env[variable]
    pinned = Path(__file__).resolve().parents[2] / "tools/harnesses/node_modules/.bin" / name
    if pinned.exists():
        return str(pinned)
    return shutil.which(name)


def default_providers(home: Path, env: Mapping[str, str]) -> dict[str, Provider]:
    """The embedded ``local`` runner, and Claude Code and Codex when they are installed.

    Each CLI runs with its own home under the Braid home; endpoints and API keys come from
    this process's environment (``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``,
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``) and are handed to the CLI only, never
    journaled.
    """
    found: dict[str, Provider] = {"local": LocalProvider(home / "runners" / "local")}
    codex = _harness_bin(env, "BRAID_CODEX_BIN", "codex")
    if codex is not None:
        key = env.get("OPENAI_API_KEY")
        found["codex"] = CodexProvider(
            bin=codex,
            home=home / "runners" / "codex" / "home",
            base_url=env.get("OPENAI_BASE_URL") or None,
            env={"BRAID_CODEX_API_KEY": key, "OPENAI_API_KEY": key} if key else {},
        )
    claude = _harness_bin(env, "BRAID_CLAUDE_BIN", "claude")
    if claude is not None:
        extra = {k: env[k] for k in ("ANTHROPIC_API_KEY",) if env.get(k)}
        found["claude_code"] = ClaudeCodeProvider(
            bin=claude,
            home=home / "runners" / "claude_code" / "home",
            base_url=env.get("ANTHROPIC_BASE_URL") or None,
            env=extra,
        )
    return found


GC_THRESHOLDS = (10_000, 10, 10)
"""The collector's thresholds for the process that runs Braid (CPython's are 700, 10, 10).

Every provider event replaces a run's and a message's entities, which then live until that
run's next event (~100 ms at 10 events/s): with a young generation of 700 allocations they
survived into the old generation and made full passes frequent (19% of wall time at
500 streaming runs, passes up to 87 ms). With 10,000 most die young. While runs stream, the
passes that remain collect nothing (the streaming path makes no cycles: 6-7 young passes of
5.7-8.2 ms and one gen1 pass of 29 ms in 12 s, each collecting 0); 2,500 instead made them
shorter but more: 0.5% of wall against 0.1%, the longest 13 ms against 4."""


SWITCH_INTERVAL = 0.001
"""How long a thread may hold the interpreter while another waits for it (CPython's is 5 ms).

The event loop waits for the interpreter after every pipe read and every poll, and the
journal's writer thread after its COMMIT: with 5 ms, each wait could last a whole interval
while the other thread ran Python code. At 500 streaming runs (``tools/bench runs``) the
event -> durable ack p50 went from 45-48 ms to about 20 ms with 1 ms at the same CPU (the
writer then also waited after every row it handed SQLite); 0.2-0.5 ms halved it again but
cost 5-9 points of a core in switches. Once the writer thread only committed, 5 ms against
1 ms (100 runs x 50 events/s, two runs each) gave the same CPU (65-66%) and no better
acknowledgements (p50 13-21 ms against 12-34 ms)."""


OPEN_FILES_CEILING = 1 << 20
"""The most open files asked for when the hard limit is unlimited (Linux's default
``fs.nr_open``; a larger soft limit is refused)."""


def tune_process() -> None:
    """Collector thresholds, thread switch interval and open-files limit for the process
    that runs Braid."""
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL)
    raise_open_files_limit()


def raise_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit.

    Each run holds about four (three pipes to its worker and a pidfd; 420 for 100 idle
    runs in ``tools/bench runs``): some 240 runs pass the 1,024 files many systems give a
    process by default, and a spawn or a pipe then fails with "Too many open files"
    although the hard limit allows far more (the Go runtime raises its own limit the same
    way). Worker processes inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        # refused (a container's own ceiling, say): the limit stays as it was
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def freeze_long_lived() -> None:
    """Take what is alive now (the imports, the loaded graph) out of later collector passes.

    Every full pass would otherwise walk all of it again while the event loop waits: about
    100,000 objects of imports, and a loaded graph of 1,000 runs as many again. A restart
    that reconciled 1,000 runs made 2-3 full passes of 90-114 ms each before this was done
    once the graph was loaded. Objects created later are collected as usual.
    """
    gc.collect()
    gc.freeze()


async def open_app(
    home: Path,
    *,
    env: Mapping[str, str] = os.environ,
    admission_limit: int | None = None,
    default_limits: Limits | None = None,
    observe_interval: float = DEFAULT_OBSERVE_INTERVAL,
    providers: Mapping[str, Provider] | None = None,
    settle: bool = False,
    task_status: trio.TaskStatus[BraidApp] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run Braid until :meth:`BraidApp.shutdown`; hands the app to the starter.

    With ``settle`` (``braid serve``, ``braid headless``) the process is tuned for Braid
    first (:func:`tune_process`), and what is alive is frozen out of the collector's passes
    (:func:`freeze_long_lived`) once the graph is loaded, before any run is reconciled.

    The service actors run under the root supervisor (``one_for_all``): the journal
    service first, then the runs supervisor. A failing service restarts both (the graph
    is rebuilt from the journal and every active run is reconciled); more than
    ``SERVICE_RESTARTS`` failures in ``SERVICE_PERIOD`` seconds stop them in reverse
    order and the error escalates out of ``open_app``.
    """
    await trio.Path(home).mkdir(mode=0o700, parents=True, exist_ok=True)
    key = load_or_create_key(home, env)
    found = dict(providers or default_providers(home, env))
    app = BraidApp(home=home, journal_path=home / "journal.sqlite3", providers=found, ids=new_id)
    if settle:
        tune_process()

    async def runs_service(
        *, task_status: trio.TaskStatus[RunsSupervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        service = app.services.require()
        evidence = await trio.to_thread.run_sync(EvidenceStore.open, home)
        runs = RunsSupervisor(
            service.handle,
            service.admission,
            found,
            admission_limit=admission_limit,
            default_limits=default_limits,
            observe_interval=observe_interval,
            artifacts_dir=home / "artifacts",
            evidence=evidence,
            ids=new_id,
        )
        app.services.runs = runs
        try:
            await runs.run(task_status=task_status)
        finally:
            evidence.close()

    spec = SupervisorSpec(
        name="braid",
        strategy="one_for_all",
        max_restarts=SERVICE_RESTARTS,
        period=SERVICE_PERIOD,
        children=(
            ChildSpec(
                "journal",
                functools.partial(
                    journal_service,
                    home,
                    key,
                    app.bind_journal,
                    on_loaded=freeze_long_lived if settle else None,
                ),
                restart="transient",
                shutdown_grace=RECORD_GRACE,
                stop=lambda service: service.handle.aclose(),
            ),
            ChildSpec(
                "runs",
                runs_service,
                restart="transient",
                shutdown_grace=RECORD_GRACE,
                stop=lambda runs: runs.stop(drain=False, grace=RECORD_GRACE),
            ),
        ),
    )
    async with trio.open_nursery() as nursery:
        root: SupervisorHandle = await nursery.start(run_supervisor, spec)
        await app.record_app("application.started", {"version": APP_VERSION})
        task_status.started(app)
        await app.stopped.wait()
        await root.stop()
        nursery.cancel_scope.cancel()
