"""``tools/bench evidence``: transcript ingest throughput against the raw parse limit and ccusage.

One run, one corpus: the Claude Code and Codex transcript fixtures copied again and again
into a temporary folder until it holds at least ``--mb`` MB. Every copy gets its own session
ids (a plain string replace of each file's ``sessionId`` / ``session_meta`` id, the same
mapping for a main session and its subagent files) and its own folder, so each copy is a
distinct session and Braid stores it anew instead of counting duplicates.

(a) raw limit: plain ``orjson.loads`` of every line of every corpus file;
(b) ``ccusage daily --json --offline`` (npm, pinned in ``tools/harnesses``) with
    ``CLAUDE_CONFIG_DIR`` at the corpus's Claude folder (``projects/<copy>/<session>.jsonl``).
    ccusage reads Claude Code files only, so (b) and the ratio c/b cover the Claude subset;
(c) Braid's full ingest (``EvidenceStore.ingest_many``: detect the format, parse, normalize,
    redact, hash, store, coverage) of every corpus file into one run, as
    ``braid evidence ingest --run`` does it: the Claude subset first, then the Codex subset,
    each followed by a WAL checkpoint that is timed with it (the database writes an ingest
    defers are part of its cost). Like the CLI, ``ingest_many`` uses one process per usable
    CPU when the files hold 8 MB or more (``--workers`` overrides): the printed figures are
    wall-clock over all of them, spawning included, and say how many processes ran.

(a), (b) and (c) run ``--rounds`` times (3), in turn, each (c) into a fresh store. The
figures printed are medians over the rounds, with every round's seconds; a ratio is the
median of the rounds' own ratios, whose parts ran in the same minute (on a shared machine the
speed drifts by tens of percent from one minute to the next, and one round decided a
verdict).

Then more copies are ingested into the last round's run until it holds ``--entries`` entries, and
200-entry pages are timed: every page of the run following ``next_cursor``, then pages from
cursors picked at random among those. Targets: c/a >= 0.25, c/b >= 1, page p99 <= 10 ms.
Figures are printed as measured, with PASS or MISS; ``--strict`` makes a MISS exit 1.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import orjson

from braid_actors.app import freeze_long_lived
from braid_actors.evidence import EvidenceStore, worker_count

C_OVER_A_TARGET = 0.25
C_OVER_B_TARGET = 1.0
P99_TARGET_MS = 10.0
PAGE = 200
ROOT = Path(__file__).resolve().parents[2]
CCUSAGE = ROOT / "tools" / "harnesses" / "node_modules" / ".bin" / "ccusage"
RUN = "run_bench_evidence"


def find_fixtures() -> Path:
    """``shared/fixtures/transcripts`` as ``tests/evidence/_helpers.py`` finds it."""
    explicit = os.environ.get("BRAID_SHARED")
    if explicit:
        return Path(explicit) / "fixtures" / "transcripts"
    for folder in ROOT.parents:
        candidate = folder / "shared" / "fixtures" / "transcripts"
        if candidate.is_dir():
            return candidate
    return ROOT.parent / "shared" / "fixtures" / "transcripts"


@attrs.frozen
class Fixture:
    harness: str  # claude_code | codex
    relative: str  # path below the harness folder
    data: bytes
    sessions: tuple[str, ...]


@attrs.frozen
class CorpusFile:
    harness: str
    path: Path
    size: int
    lines: int


def session_ids(harness: str, data: bytes) -> tuple[str, ...]:
    found: set[str] = set()
    for line in data.splitlines():
        if not line.strip():
            continue
        obj = orjson.loads(line)
        if not isinstance(obj, dict):
            continue
        if harness == "claude_code" and isinstance(obj.get("sessionId"), str):
            found.add(obj["sessionId"])
        payload = obj.get("payload")
        if harness == "codex" and obj.get("type") == "session_meta":
            ident = payload.get("id") if isinstance(payload, dict) else None
            if isinstance(ident, str):
                found.add(ident)
    return tuple(sorted(found))


def load_fixtures(folder: Path) -> list[Fixture]:
    out: list[Fixture] = []
    for harness, sub in (("claude_code", "claude-code"), ("codex", "codex")):
        base = folder / sub
        for path in sorted(base.rglob("*.jsonl")):
            data = path.read_bytes()
            rel = str(path.relative_to(base))
            out.append(Fixture(harness, rel, data, session_ids(harness, data)))
    return out


def copy_id(session: str, copy: int) -> str:
    """A distinct id of the same length: the first 8 characters become the copy number."""
    return f"{copy:08x}{session[8:]}" if len(session) > 8 else f"{session}-{copy}"


def write_copy(fixtures: list[Fixture], root: Path, copy: int) -> list[CorpusFile]:
    """One copy of every fixture under ``root``, with every session id rewritten."""
    mapping = {s: copy_id(s, copy) for f in fixtures for s in f.sessions}
    out: list[CorpusFile] = []
    for fixture in fixtures:
        data, rel = fixture.data, fixture.relative
        for old, new in mapping.items():
            data = data.replace(old.encode(), new.encode())
            rel = rel.replace(old, new)
        if fixture.harness == "claude_code":
            path = root / "claude" / "projects" / f"copy-{copy:04d}" / rel
        else:
            path = root / "codex" / f"copy-{copy:04d}" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines = sum(1 for line in data.splitlines() if line.strip())
        out.append(CorpusFile(fixture.harness, path, len(data), lines))
    return out


def raw_limit(files: list[CorpusFile]) -> float:
    """(a): seconds to read every file and ``orjson.loads`` every non-empty line."""
    start = time.perf_counter()
    for f in files:
        for line in f.path.read_bytes().splitlines():
            if line.strip():
                orjson.loads(line)
    return time.perf_counter() - start


def ccusage(claude_root: Path, scratch: Path) -> tuple[float | None, str]:
    """(b): seconds of one ``ccusage daily --json --offline`` over the Claude copies."""
    if not CCUSAGE.exists():
        return None, f"{CCUSAGE} missing: run tools/harnesses/install.sh"
    env = dict(os.environ, CLAUDE_CONFIG_DIR=str(claude_root), HOME=str(scratch), NO_COLOR="1")
    start = time.perf_counter()
    done = subprocess.run(
        [str(CCUSAGE), "daily", "--json", "--offline"],
        env=env,
        capture_output=True,
        timeout=600,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        return None, f"ccusage exited {done.returncode}: {done.stderr.decode()[-400:]}"
    report = orjson.loads(done.stdout)
    totals = report.get("totals", {}) if isinstance(report, dict) else {}
    return elapsed, f"{len(report.get('daily', []))} days, {totals.get('totalTokens', 0):,} tokens"


def ingest(store: EvidenceStore, files: list[CorpusFile], workers: int | None) -> dict[str, float]:
    """(c): seconds of Braid's ingest per harness, each harness's files then a checkpoint."""
    spent = {"claude_code": 0.0, "codex": 0.0}
    for harness in spent:
        paths = [f.path for f in files if f.harness == harness]
        start = time.perf_counter()
        # What ``braid evidence ingest PATH... --run`` does: detects each file's format and
        # ingests them in order, with one process per CPU when they hold 8 MB or more.
        for path, report in zip(
            paths, store.ingest_many(paths, run_id=RUN, workers=workers), strict=True
        ):
            if report.harness != harness:
                raise SystemExit(f"evidence: {path} detected as {report.harness}")
        checkpoint(store.home)
        spent[harness] += time.perf_counter() - start
    return spent


def processes(files: list[CorpusFile], workers: int | None) -> str:
    """How many processes ``ingest_many`` uses for each harness's files."""
    return ", ".join(
        f"{harness} {worker_count([str(f.path) for f in files if f.harness == harness], workers)}"
        for harness in ("claude_code", "codex")
    )


def checkpoint(home: Path) -> None:
    """Write the WAL back into the database (what closing the store would do)."""
    conn = sqlite3.connect(home / "evidence.sqlite3")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()


def entry_count(home: Path) -> int:
    conn = sqlite3.connect(f"file:{home / 'evidence.sqlite3'}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT COUNT(*) FROM entries WHERE run_id=?", (RUN,)).fetchone()
    finally:
        conn.close()
    return int(row[0])


def timed_page(store: EvidenceStore, cursor: str | None) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    page = store.entries(RUN, cursor=cursor, limit=PAGE)
    return (time.perf_counter() - start) * 1000, page


def pages(store: EvidenceStore, randoms: int) -> tuple[list[float], list[float], int]:
    """Latencies (ms) following every cursor of the run, then from random cursors."""
    sequential: list[float] = []
    cursors: list[str] = []
    seen = 0
    cursor: str | None = None
    while True:
        ms, page = timed_page(store, cursor)
        sequential.append(ms)
        seen += len(page["entries"])
        cursor = page.get("next_cursor")
        if not cursor:
            break
        cursors.append(cursor)
    rng = random.Random(1)
    picked = [rng.choice(cursors) for _ in range(randoms)] if cursors else []
    jumps = [timed_page(store, c)[0] for c in picked]
    return sequential, jumps, seen


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def rates(files: list[CorpusFile], seconds: float) -> str:
    size = sum(f.size for f in files) / 1e6
    records = sum(f.lines for f in files)
    return (
        f"{size / seconds:,.1f} MB/s, {records / seconds:,.0f} records/s "
        f"({size:,.1f} MB, {records:,} records, {len(files)} files, {seconds:.2f} s)"
    )


@attrs.frozen
class Round:
    """Seconds of one round of (a), (b) and (c) on the same files."""

    raw_all: float
    raw_claude: float
    ccusage: float | None
    note: str
    claude: float
    codex: float


def measure(
    root: Path, k: int, files: list[CorpusFile], claude: list[CorpusFile], workers: int | None
) -> Round:
    """Round ``k``: (a) on every file and on the Claude subset, (b), then (c) into a fresh
    store ``root / store<k>``."""
    raw_all = raw_limit(files)
    raw_claude = raw_limit(claude)
    home = root / f"home{k}"
    home.mkdir()
    cc_seconds, cc_note = ccusage(root / "corpus" / "claude", home)
    with EvidenceStore.open(root / f"store{k}") as store:
        spent = ingest(store, files, workers)
    return Round(raw_all, raw_claude, cc_seconds, cc_note, spent["claude_code"], spent["codex"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/bench evidence", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--mb", type=float, default=100.0, help="corpus size in MB (min)")
    parser.add_argument("--entries", type=int, default=100_000, help="entries before paging")
    parser.add_argument("--random-pages", type=int, default=500)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of (a), (b), (c); figures are medians"
    )
    parser.add_argument(
        "--workers", type=int, help="processes of (c) (default: as the CLI, one per CPU)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    out = sys.stdout

    fixtures = load_fixtures(find_fixtures())
    if not any(f.harness == "claude_code" for f in fixtures) or not any(
        f.harness == "codex" for f in fixtures
    ):
        sys.stderr.write(f"evidence: no Claude Code or Codex fixtures under {find_fixtures()}\n")
        return 2
    per_copy = sum(len(f.data) for f in fixtures)
    copies = max(1, -(-int(args.mb * 1e6) // per_copy))
    out.write(
        f"evidence benchmark: {len(fixtures)} fixture files "
        f"({sum(f.harness == 'claude_code' for f in fixtures)} Claude Code, "
        f"{sum(f.harness == 'codex' for f in fixtures)} Codex, {per_copy / 1e6:.2f} MB) "
        f"copied {copies} times, {os.cpu_count()} CPUs\n"
        "    each copy: own folder, every sessionId / session_meta id rewritten by plain "
        "string replace (first 8 characters = copy number), so each copy is a new session\n"
    )
    with tempfile.TemporaryDirectory(prefix="braid-bench-evidence-") as tmp:
        root = Path(tmp)
        corpus = root / "corpus"
        files = [f for k in range(copies) for f in write_copy(fixtures, corpus, k)]
        claude = [f for f in files if f.harness == "claude_code"]
        codex = [f for f in files if f.harness == "codex"]
        used = processes(files, args.workers)  # (while the files exist: it weighs them)
        os.sync()

        rounds: list[Round] = []
        for k in range(args.rounds):
            rounds.append(measure(root, k, files, claude, args.workers))
            if k:
                shutil.rmtree(root / f"store{k - 1}", ignore_errors=True)
        last = root / f"store{args.rounds - 1}"
        stored = entry_count(last)
        with EvidenceStore.open(last) as store:
            extra = 0
            while entry_count(last) < args.entries:
                more = write_copy(fixtures, root / "extra", copies + extra)
                ingest(store, more, args.workers)
                extra += 1
            total_entries = entry_count(last)
            # braid evidence serve freezes what lives once it is up (the store, the modules):
            # full collections walk only what came after.
            freeze_long_lived()
            sequential, jumps, seen = pages(store, args.random_pages)
        shutil.rmtree(corpus, ignore_errors=True)

    def each(values: list[float], form: str = "{:.2f}") -> str:
        return ", ".join(form.format(v) for v in values)

    raw_all = [r.raw_all for r in rounds]
    raw_claude = [r.raw_claude for r in rounds]
    braid_all = [r.claude + r.codex for r in rounds]
    out.write(
        f"corpus: all files = {len(claude)} Claude Code + {len(codex)} Codex files; "
        f"Claude subset = the {len(claude)} Claude Code files\n"
        f"{args.rounds} rounds, each (a), (b), (c) in turn (a fresh store for each (c)); "
        "each figure is the median over the rounds, every round's seconds follow\n"
        f"(a) raw limit, orjson.loads per line, all files:      "
        f"{rates(files, statistics.median(raw_all))}\n      rounds: {each(raw_all)} s\n"
        f"    raw limit, Claude subset:                         "
        f"{rates(claude, statistics.median(raw_claude))}\n"
    )
    cc_all = [r.ccusage for r in rounds if r.ccusage is not None]
    unmeasured = [r.note for r in rounds if r.ccusage is None]
    if unmeasured:
        out.write(f"(b) ccusage: not measured ({unmeasured[0]})\n")
    else:
        out.write(
            f"(b) ccusage daily --json --offline, Claude subset:   "
            f"{rates(claude, statistics.median(cc_all))}\n      rounds: {each(cc_all)} s\n"
            f"    ({rounds[0].note}; Codex files not covered: ccusage reads Claude Code data "
            "only)\n"
        )
    spent_claude = [r.claude for r in rounds]
    spent_codex = [r.codex for r in rounds]
    out.write(
        f"(c) Braid ingest, all files:                          "
        f"{rates(files, statistics.median(braid_all))}\n      rounds: {each(braid_all)} s\n"
        f"    Braid ingest, Claude subset:                      "
        f"{rates(claude, statistics.median(spent_claude))}\n      rounds: {each(spent_claude)} s\n"
        f"    Braid ingest, Codex subset:                       "
        f"{rates(codex, statistics.median(spent_codex))}\n      rounds: {each(spent_codex)} s\n"
        f"    processes (ingest_many, as the CLI): {used}, "
        f"on {os.cpu_count()} CPUs; a spawned worker's start-up is timed\n"
        f"    {stored:,} entries stored\n"
    )
    # Each ratio is taken within a round (its parts measured in the same minute), and the
    # median of those is the figure: the machine's speed drifts between minutes.
    over_a = [a / c for a, c in zip(raw_all, braid_all, strict=True)]
    c_over_a = statistics.median(over_a)
    out.write(
        f"    ratio c/a = {c_over_a:.3f} (all files; target >= {C_OVER_A_TARGET}) "
        f"{verdict(c_over_a >= C_OVER_A_TARGET)}; rounds: {each(over_a, '{:.3f}')}\n"
    )
    over_b = [r.ccusage / r.claude for r in rounds if r.ccusage is not None]
    c_over_b = statistics.median(over_b) if len(over_b) == len(rounds) else float("nan")
    out.write(
        f"    ratio c/b = {c_over_b:.3f} (Claude subset; target >= {C_OVER_B_TARGET}) "
        f"{verdict(c_over_b >= C_OVER_B_TARGET)}; rounds: {each(over_b, '{:.3f}')}\n"
    )
    sequential.sort()
    jumps.sort()
    both = sorted(sequential + jumps)
    p99 = percentile(both, 0.99)
    out.write(
        f"entries pages of {PAGE} at {total_entries:,} entries in one run "
        f"({extra} extra copies ingested to get there; objects alive before paging frozen, "
        "as braid evidence serve does once up):\n"
        f"    following cursors: {len(sequential)} pages ({seen:,} entries), "
        f"p50 {percentile(sequential, 0.5):.2f} ms, p99 {percentile(sequential, 0.99):.2f} ms\n"
        f"    random cursors:    {len(jumps)} pages, "
        f"p50 {percentile(jumps, 0.5):.2f} ms, p99 {percentile(jumps, 0.99):.2f} ms\n"
        f"    all pages: p50 {percentile(both, 0.5):.2f} ms, p99 {p99:.2f} ms "
        f"(target p99 <= {P99_TARGET_MS} ms) {verdict(p99 <= P99_TARGET_MS)}\n"
    )
    missed = (
        c_over_a < C_OVER_A_TARGET or not c_over_b >= C_OVER_B_TARGET or not p99 <= P99_TARGET_MS
    )
    return 1 if args.strict and missed else 0
