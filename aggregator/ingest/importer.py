"""Import JSONL histories: the agent's own files and the legacy per-rank callback logs.

Two formats are read, line by line and told apart per line:

* agent JSONL (``<log_dir>/<run>/rank<k>.jsonl``): one ``records.to_json_line`` record a line;
* legacy callback logs, one file per rank named ``<model>_rank<k>.jsonl``, lines like
  ``{"step": 10, "epoch": 0, "loss": 0.3 | {"ce": .., "aux": ..}, "lr": 1e-3,
  "timestamp": 1.7e9, "rank": 0}`` and a last ``{"event": "train_end", "step": -1}``. They carry
  no run or seq: the run is ``<model>`` (unless given) and the seq is the line number, which is
  stable, so importing a file twice imports it once.

Records go to a *sink*: anything with ``add(records)`` returning the number accepted, or a
mapping with an ``"accepted"`` count (``Aggregator.add``: the service's ingest path, so imported
and live records dedupe against each other). ``import_into_store``
is the CLI's path without a running aggregator: it opens the Store itself and dedupes against
``store.seen_seqs()``. A bad line is counted with its number and reason, never fatal.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rankwatch.agent.wire.records import (
    DecodeError,
    Heartbeat,
    Record,
    check_version,
    decode_record,
)
from rankwatch.aggregator.ingest.legacy import LegacyContext
from rankwatch.aggregator.seqs import SeqTracker
from rankwatch.aggregator.store.db import Store, StoreError

BATCH_RECORDS = 5000  # records handed to the sink at once
STORE_FLUSH_RECORDS = 200_000  # import_into_store flushes this often (bounds memory)
MAX_LINE_BYTES = 1 << 20  # a longer line is reported bad, never loaded whole
MAX_BAD_EXAMPLES = 20  # bad lines kept per file with their reason (all are counted)
PROGRESS_INTERVAL_S = 0.2
# Older tools also wrote Python's repr of the value ("nan", "inf", "-inf").


# Reads a stacks file: (path, the rank's last step) -> the sample's wire form, or None.
StacksReader = Callable[[Path, int | None], dict[str, Any] | None]


class Sink(Protocol):
    """Takes records. A sink that stores telemetry says so with ``stores_telemetry = True``;
    for any other, telemetry records are counted (``FileSummary.telemetry``) and not sent."""

    def add(self, records: Sequence[Record]) -> Any: ...


@dataclass(frozen=True)
class BadLine:
    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class FileSummary:
    path: Path
    format: str = "empty"  # "agent", "legacy", "mixed" or "empty"
    read: int = 0  # records parsed
    accepted: int = 0  # records the sink took
    duplicates: int = 0  # records the sink already had
    bad: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)  # the first MAX_BAD_EXAMPLES
    error: str | None = None  # the file could not be read at all
    stacks: str = ""  # what became of a rank<k>.stacks.txt beside it ("" when there is none)
    telemetry: int = 0  # telemetry records read but not imported: the sink does not store them

    def __str__(self) -> str:
        if self.error:
            return f"{self.path}: {self.error}"
        text = (
            f"{self.path}: {self.format}, {self.read} records, {self.accepted} new, "
            f"{self.duplicates} duplicates, {self.bad} bad lines"
        )
        if self.telemetry:
            text += f", {self.telemetry} telemetry records not imported (not stored here yet)"
        return text


def iter_file(
    path: Path | str,
    *,
    run: str | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[Record | BadLine]:
    """Records (or BadLine) of one JSONL file, in file order. ``run`` renames every record;
    ``on_bytes`` is told how many bytes each line took (progress). Raises OSError only if the
    file cannot be opened."""
    for item, _ in _items(Path(path), run, on_bytes):
        yield item


def _items(
    path: Path, run: str | None, on_bytes: Callable[[int], None] | None
) -> Iterator[tuple[Record | BadLine, str]]:
    """(record or BadLine, "agent" | "legacy" | "bad") per non-blank line."""
    legacy = LegacyContext(path, run)
    with path.open("rb") as f:
        lineno = 0
        while chunk := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            size = len(chunk)
            if size > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    size += len(rest)
                size += len(rest)
                yield BadLine(path, lineno, f"line longer than {MAX_LINE_BYTES} bytes"), "bad"
            elif chunk.strip():
                yield _parse(chunk, lineno, path, run, legacy)
            if on_bytes is not None:
                on_bytes(size)


def _parse(
    chunk: bytes, lineno: int, path: Path, run: str | None, legacy: LegacyContext
) -> tuple[Record | BadLine, str]:
    try:
        raw = json.loads(chunk.decode("utf-8"))
    except UnicodeDecodeError:
        return BadLine(path, lineno, "not UTF-8 text"), "bad"
    except ValueError as exc:
        return BadLine(path, lineno, f"not a JSON line: {exc}"), "bad"
    if not isinstance(raw, dict):
        return BadLine(path, lineno, f"a JSON {type(raw).__name__}, expected an object"), "bad"
    try:
        if "kind" in raw or "v" in raw:
            check_version(raw.get("v"))
            rec = decode_record(raw)
            return (rec if run is None else dataclasses.replace(rec, run=run)), "agent"
        return legacy.record(raw, lineno), "legacy"
    except DecodeError as exc:
        return BadLine(path, lineno, str(exc)), "bad"


def import_paths(
    paths: Iterable[Path | str],
    sink: Sink,
    progress: bool | Callable[[int, int], None] = False,
    *,
    run: str | None = None,
    stacks: StacksReader | None = None,
) -> list[FileSummary]:
    """Import files (directories: every ``*.jsonl`` below them) into ``sink``; one summary per
    file. ``progress``: True for a stderr line, or a callable(bytes_done, bytes_total).
    ``stacks``: reads the ``<stem>.stacks.txt`` the agent's watchdog writes beside a rank's
    JSONL into a stack sample, given to ``sink.add_stack(run, rank, sample)`` when the sink
    has it, as that rank's latest."""
    files = _expand(paths)
    report = _Progress(sum(f.stat().st_size for f in files), progress)
    summaries = []
    telemetry = bool(getattr(sink, "stores_telemetry", False))
    for path in files:
        summary = FileSummary(path)
        kinds: set[str] = set()
        batch: list[Record] = []
        last: Record | None = None
        last_step: int | None = None
        try:
            for item, kind in _items(path, run, report.advance):
                if isinstance(item, BadLine):
                    summary.bad += 1
                    if len(summary.bad_lines) < MAX_BAD_EXAMPLES:
                        summary.bad_lines.append(item)
                    continue
                summary.read += 1
                kinds.add(kind)
                if item.kind == "telemetry" and not telemetry:
                    summary.telemetry += 1
                    continue
                batch.append(item)
                last = item
                if item.kind == "step":
                    last_step = item.step  # type: ignore[union-attr]
                if len(batch) >= BATCH_RECORDS:
                    _send(sink, batch, summary)
                    batch = []
        except OSError as exc:
            summary.error = f"cannot read: {exc.strerror or exc}"
        _send(sink, batch, summary)
        if stacks is not None and last is not None:
            summary.stacks = _import_stacks(path, last, last_step, sink, stacks)
        summary.format = "mixed" if len(kinds) > 1 else kinds.pop() if kinds else "empty"
        summaries.append(summary)
    report.finish()
    return summaries


def _import_stacks(
    path: Path, last: Record, step: int | None, sink: Sink, read: StacksReader
) -> str:
    side = path.with_name(f"{path.stem}.stacks.txt")
    if not side.is_file():
        return ""
    add = getattr(sink, "add_stack", None)
    if add is None:
        return f"{side.name}: not imported (--url takes records only: import it with --data)"
    try:
        sample = read(side, step)
    except (OSError, ValueError) as exc:
        return f"{side.name}: cannot read: {exc}"
    if sample is None:
        return f"{side.name}: no stack dump in it"
    add(last.run, last.rank, sample)
    return f"{side.name}: rank {last.rank}'s last stack sample ({sample.get('where')})"


def _send(sink: Sink, batch: list[Record], summary: FileSummary) -> None:
    if not batch:
        return
    result = sink.add(batch)
    if isinstance(result, Mapping) and "accepted" in result:  # Aggregator.add
        accepted = int(result["accepted"])
    elif isinstance(result, int) and not isinstance(result, bool):
        accepted = result
    elif isinstance(result, Sequence):
        accepted = len(result)
    else:  # a sink that does not say: all taken
        accepted = len(batch)
    summary.accepted += accepted
    summary.duplicates += len(batch) - accepted


def _expand(paths: Iterable[Path | str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("*.jsonl")))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return files


class _Progress:
    def __init__(self, total: int, progress: bool | Callable[[int, int], None]) -> None:
        self.total, self.done, self._last = total, 0, 0.0
        self._fn = progress if callable(progress) else self._line if progress else None

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self._fn is not None and now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            self._fn(self.done, self.total)

    def finish(self) -> None:
        if self._fn is not None:
            self._fn(self.done, self.total)
            if self._fn == self._line:
                sys.stderr.write("\n")

    @staticmethod
    def _line(done: int, total: int) -> None:
        pct = 100.0 * done / total if total else 100.0
        sys.stderr.write(f"\rimporting: {done / 1e6:.1f} / {total / 1e6:.1f} MB ({pct:.0f}%)")
        sys.stderr.flush()


# --- straight into a Store (no aggregator running) ------------------------------------------


class StoreSink:
    """A sink writing to a Store, dropping (run, rank, inc, seq) it already holds."""

    stores_telemetry = True  # the store keeps telemetry beside the steps (store/telemetry.py)

    def __init__(self, store: Store, flush_every: int = STORE_FLUSH_RECORDS) -> None:
        self.store = store
        self.flush_every = flush_every
        self.runs: set[str] = set()
        self._pending = 0
        # exact: an import never gives a gap up (the live tracker bounds its memory instead)
        self._seen = SeqTracker(max_intervals=sys.maxsize)
        for run, rank, inc, lo, hi in store.seen_seqs():
            self._seen.load(run, rank, lo, hi, inc)

    def accept(self, run: str, rank: int, seq: int, inc: int = 0) -> bool:
        return self._seen.accept(run, rank, seq, inc)

    def add_stack(self, run: str, rank: int, sample: dict[str, Any]) -> None:
        self.store.append_stack(run, rank, sample)

    def add(self, records: Sequence[Record]) -> int:
        accept = self._seen.accept
        fresh = [r for r in records if accept(r.run, r.rank, r.seq, r.inc)]
        self.store.append(fresh)
        for r in fresh:  # the heartbeat rows do not hold stacks: the rank's latest is kept aside
            if type(r) is Heartbeat and r.stack is not None:
                self.store.append_stack(r.run, r.rank, r.stack.as_dict())
        self.runs.update(r.run for r in fresh)
        self._pending += len(fresh)
        if self._pending >= self.flush_every:
            self.store.flush()
            self._pending = 0
        return len(fresh)


def import_into_store(
    paths: Iterable[Path | str],
    data: Path | str,
    progress: bool | Callable[[int, int], None] = False,
    *,
    run: str | None = None,
    stacks: StacksReader | None = None,
) -> list[FileSummary]:
    """``rankwatch import PATH --data DIR``: import into the store under ``data`` directly.
    Raises StoreError if the store is in use by a running aggregator (import with --url)."""
    try:
        store = Store(data)
    except StoreError as exc:
        if "lock" not in str(exc).lower():
            raise
        raise StoreError(
            f"{exc}\n(an aggregator is probably running on {data}: import through it with --url)"
        ) from exc
    with store:
        sink = StoreSink(store)
        summaries = import_paths(paths, sink, progress, run=run, stacks=stacks)
        store.flush()
        # files arrive one rank after another: settle each run's band over all of its ranks
        for name in sorted(sink.runs):
            store.rebuild_band(name)
    return summaries
