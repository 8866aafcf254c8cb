"""One observer for every watched process tree: a tick per interval, one thread hop per tick.

:func:`~braid_actors.workers.observe_tree` gives each tree its own task, its own timer and
its own worker-thread call per sample. With hundreds of runs that is hundreds of tasks kept
alive and hundreds of thread hops per interval. An :class:`ObservationHub` keeps one
:class:`~braid_actors.workers.TreeObserver` per watched tree and, once per ``interval``,
samples every tree that is not still busy with its previous sample in one thread call per
chunk of :data:`CHUNK` trees (so no single call holds the interpreter for long), the chunks
spread over half the interval, sharing one :class:`~braid_actors.workers.ProcessTable` that
is read once per tick (it expires at each tick and lasts an interval otherwise), passing over
the processes that are already members of the trees it samples.

Each sample is handed to its watcher's ``on_sample`` in a short-lived task of the *watcher's*
nursery (the run owns what its callback does, and its callback's failures are the run's),
so a slow consumer delays only its own next sample, never the others'. A new watch gets its
first sample promptly, without waiting for the tick. A watch ends after delivering a sample
that found its tree empty, or when its watcher closes it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Final

import attrs
import trio

from braid_actors.workers._observe import ARGV_LIMIT, TreeObserver, TreeSample
from braid_actors.workers._proctable import ProcessTable

if TYPE_CHECKING:
    from braid_actors.workers._identity import ProcessKey

CHUNK: Final = 96
"""Trees sampled per worker-thread call (about a millisecond of the interpreter's time).

Each call also costs the event loop a thread hand-off, a wake-up and a pause between
calls. With 16 a call, 500 idle one-process trees sampled every 0.5 s took 7.5-8.1% of a
core; with 32, 48 and 64: 5.5-5.6, 4.8-5.6 and 4.2% (two runs each, the samples repeating
their previous ones). Since a member's stat file stays open a repeated sample costs ~11 us
(60-90 us before), and the hub alone (``on_repeat`` taking every sample) took 2.8-3.1% of a
core at 48, 2.3% at 96 and 2.1-2.2% at 128. 96 keeps a call's hold on the interpreter (the
stat reads keep it) near the ~1 ms that 16 samples took when each cost 60-90 us. In
``tools/bench runs`` the supervisor's CPU with 500 idle runs went from 5.3-6.7% (48, ten
runs) to 4.0-4.7% (96, two runs); streaming, its CPU and p99 did not move past the noise."""


@attrs.define(eq=False)
class Watch:
    """One watched tree; :meth:`close` stops it (idempotent)."""

    observer: TreeObserver
    on_sample: Callable[[TreeSample], Awaitable[None]]
    nursery: trio.Nursery
    on_repeat: Callable[[TreeSample], bool] | None = None
    """Takes a repeated sample at once, without a task, when it can: True when it has
    (see :meth:`ObservationHub.watch`)."""
    sampled: bool = False
    """True once its first sample was taken."""
    busy: bool = False
    """A sample is being taken or delivered."""
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        if not self.busy:  # else once its sample is back (no thread may read its files)
            self.observer.close()

    def _handled(self) -> None:
        """Its sample was handed out: it may be sampled again, or, closed, its observer's
        files are closed (no thread reads them now)."""
        self.busy = False
        if self.closed:
            self.observer.close()

    async def _deliver(self, sample: TreeSample | Exception) -> None:
        if isinstance(sample, Exception):
            # Sampling this tree failed: it fails its watcher (as its own observer task
            # would have), not the hub and every other watcher.
            self.closed = True
            self._handled()
            raise sample
        try:
            if not self.closed:
                await self.on_sample(sample)
        finally:
            if sample.finished:
                self.closed = True
            self._handled()


@attrs.define(eq=False)
class ObservationHub:
    """Samples every watched tree each ``interval`` seconds; run it with :meth:`run`."""

    interval: float
    argv_limit: int = ARGV_LIMIT
    table: ProcessTable | None = None
    """Shared by the observers and expired at each tick; by default one that lasts an
    interval (so the samples between two ticks, a new watch's first ones, share it too)."""
    _watches: list[Watch] = attrs.Factory(list)
    _new: trio.Event = attrs.Factory(trio.Event)
    ticks: int = 0
    """Interval ticks that sampled at least one tree (for tests and benchmarks)."""
    samples: int = 0
    """Tree samples taken (for benchmarks)."""
    sample_cpu_seconds: float = 0.0
    """CPU time the sampling threads spent taking them (for benchmarks)."""
    repeated_samples: int = 0
    """Samples that repeated their tree's previous one (``TreeSample.repeated``)."""

    def __attrs_post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError("interval must be positive")
        if self.table is None:
            self.table = ProcessTable(max_age=self.interval)

    @property
    def watching(self) -> int:
        """Trees watched now."""
        return sum(1 for w in self._watches if not w.closed)

    def watch(
        self,
        root: ProcessKey,
        on_sample: Callable[[TreeSample], Awaitable[None]],
        nursery: trio.Nursery,
        *,
        on_repeat: Callable[[TreeSample], bool] | None = None,
        adopt: Iterable[ProcessKey] = (),
    ) -> Watch:
        """Watch ``root``'s tree: ``on_sample`` gets each sample, in a task of ``nursery``.

        With ``on_repeat``, a sample that repeats the previous one (``TreeSample.repeated``:
        most samples of a quiet tree) is first offered to it, called at once in the hub's
        task: True means it was handled, False that it goes to ``on_sample`` as any other.
        It must not block; what it raises is delivered to the watcher's nursery, as a
        failure of ``on_sample`` would be. (The hub alone with 500 quiet trees: 3.8-4.1% of
        a core with a task per sample, 3.1-3.2% with a trivial ``on_repeat``.) ``adopt``:
        processes already known to be in the tree (see ``TreeObserver.adopt``).
        """
        observer = TreeObserver.of(root, argv_limit=self.argv_limit, table=self.table, adopt=adopt)
        watch = Watch(observer=observer, on_sample=on_sample, nursery=nursery, on_repeat=on_repeat)
        self._watches.append(watch)
        self._new.set()
        return watch

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick until cancelled; each tick samples the due trees and hands the samples out."""
        task_status.started()
        next_tick = trio.current_time() + self.interval
        while True:
            with trio.move_on_at(next_tick):
                await self._new.wait()
            self._new = trio.Event()
            now = trio.current_time()
            tick = now >= next_tick
            if tick:
                next_tick = max(next_tick + self.interval, now)
            self._watches = [w for w in self._watches if not w.closed]
            # On a tick every idle tree is due; between ticks only the new ones are.
            due = [w for w in self._watches if not w.busy and (tick or not w.sampled)]
            if not due:
                continue
            if tick:
                self.ticks += 1
                # One read of every process's parent per tick, shared by all its chunks (a
                # table that expired by age alone was read two or three times a tick); a
                # child started after the read waits for the next tick. The read passes
                # over the due trees' members, whose parents nothing looks up (an observer
                # that is not busy is this thread's to read).
                assert self.table is not None
                self.table.expire(frozenset(p for w in due for p in w.observer.member_pids()))
            for w in due:
                w.busy = True
            chunks = range(0, len(due), CHUNK)
            for start in chunks:
                if start:
                    # Spread the chunks over half the interval: the samples' journal writes
                    # then arrive in small groups instead of one burst per tick.
                    await trio.sleep(self.interval / (2 * len(chunks)))
                chunk = due[start : start + CHUNK]
                samples, cpu = await trio.to_thread.run_sync(_sample_all, chunk)
                self.samples += len(chunk)
                self.sample_cpu_seconds += cpu
                for w, sample in zip(chunk, samples, strict=True):
                    w.sampled = True
                    if isinstance(sample, TreeSample) and sample.repeated:
                        self.repeated_samples += 1
                    _hand_out(w, sample)


def _hand_out(w: Watch, sample: TreeSample | Exception) -> None:
    """Give ``w``'s watcher its sample (a closed watch's is dropped)."""
    if w.closed:
        w._handled()
        return
    if w.on_repeat is not None and isinstance(sample, TreeSample) and sample.repeated:
        try:
            taken = w.on_repeat(sample)
        except Exception as exc:  # the watcher's failure, delivered as on_sample's would be
            sample, taken = exc, False
        if taken:
            w._handled()
            return
    try:
        w.nursery.start_soon(w._deliver, sample)
    except RuntimeError:  # its nursery is closed: the watcher has gone
        w.closed = True
        w._handled()


def _sample_all(watches: list[Watch]) -> tuple[list[TreeSample | Exception], float]:
    """Runs in a worker thread: one sample of each tree (each observer is used by one
    thread at a time, since a busy watch is never sampled again until delivered), and the
    thread's CPU time that took; a failure is returned in its tree's place."""
    began = time.thread_time()
    samples: list[TreeSample | Exception] = []
    for w in watches:
        try:
            samples.append(w.observer.sample())
        except Exception as exc:  # handed to the tree's own watcher
            samples.append(exc)
    return samples, time.thread_time() - began
