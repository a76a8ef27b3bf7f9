"""The JSONL fallback: one file per rank per run, ``<log_dir>/<run>/rank<k>.jsonl``.

The file is opened ``O_APPEND`` and every record is written with a single ``os.write`` before
``Monitor.log`` returns: the bytes are in the kernel once it returns, so ``kill -9`` of the rank
loses nothing already logged (a power cut can still lose what the page cache held). An earlier
file of the same run and rank (a restarted process) is never truncated: the new process appends
after a newline and continues its sequence numbers after the highest one in the file, under
the file's incarnation (``records.py``): one file, one sequence of seqs.

Writes never raise. A full disk (``ENOSPC``) or any other ``OSError`` is counted in ``errors``
and logged once; training goes on and the records still go to the aggregator.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .identity import safe_filename
from .wire.records import DecodeError, Record, from_json_line

log = logging.getLogger("rankwatch.agent")

_SEQ = re.compile(r'"seq":\s*(\d+)')
TAIL_BYTES = 256 * 1024  # enough of an old file's end to find its highest seq
FILE_MODE = 0o644


def jsonl_path(log_dir: Path, run: str, rank: int) -> Path:
    return Path(log_dir) / safe_filename(run) / f"rank{rank}.jsonl"


def last_seq(path: Path) -> int:
    """The highest ``seq`` in the end of an existing JSONL file (0 when none)."""
    return last_position(path)[0]


def last_position(path: Path) -> tuple[int, int]:
    """The highest ``seq`` in the end of an existing JSONL file and the incarnation of its line
    (0 and 0 when none; a line without one is incarnation 0)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read(TAIL_BYTES)  # bounded: a device file may never end
    except OSError:
        return 0, 0
    best, inc = 0, 0
    # Heartbeats are written from another thread, so seqs near the end may be out of order.
    for line in tail.split(b"\n"):
        if b'"seq"' not in line:
            continue
        try:
            raw = json.loads(line)
            seq, line_inc = raw.get("seq"), raw.get("inc", 0)
        except (ValueError, AttributeError):
            continue  # the first, cut line of the tail or a partial last line
        if type(seq) is int and seq > best and type(line_inc) is int:
            best, inc = seq, line_inc
    return best, inc


class JsonlWriter:
    """Appends pre-encoded lines to one file; every method is safe to call after a failure."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors = 0
        self.start_seq = 0  # highest seq already in the file
        self.start_inc = 0  # the incarnation of that line
        self._fd: int | None = None
        self._warned = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.start_seq, self.start_inc = last_position(path)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
            self._fd = os.open(path, flags, FILE_MODE)
            self._end_partial_line()
        except OSError as exc:
            self._failed(exc)

    def _end_partial_line(self) -> None:
        # A killed earlier process may have left half a line; ours must start on a fresh one.
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def _failed(self, exc: OSError) -> None:
        self.errors += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "rankwatch: cannot write %s (%s); training continues, records still go to the "
                "aggregator if one is configured; further write errors are only counted",
                self.path,
                exc,
            )

    def write(self, data: bytes) -> bool:
        """Append ``data`` (whole lines) with one write; False when it could not be written."""
        fd = self._fd
        if fd is None:
            self.errors += 1
            return False
        try:
            n = os.write(fd, data)
            if n < len(data):  # only on a nearly full disk; write the rest or fail trying
                os.write(fd, data[n:])
            return True
        except OSError as exc:
            self._failed(exc)
            return False

    @property
    def fd(self) -> int | None:
        """The open descriptor, for callers that write on their own hot path."""
        return self._fd

    def finish(self, data: bytes, written: int) -> None:
        """After ``os.write`` wrote only ``written`` bytes of ``data`` (-1: no descriptor)."""
        if written < 0:
            self.errors += 1
        else:
            self.write(data[written:])

    def failed(self, exc: OSError) -> None:
        """Count (and the first time, log) a write that raised ``exc``."""
        self._failed(exc)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None


def read_records(path: Path, from_seq: int = 1, inc: int | None = None) -> Iterator[Record]:
    """Records with ``seq >= from_seq`` (of incarnation ``inc``, or any) from a JSONL file,
    skipping lines that do not decode."""
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
    except OSError:
        return
    with f:
        for line in f:
            if not line.endswith("\n"):
                break  # a line still being written (or cut by a kill)
            # Skip old lines without decoding them: "seq" comes before any free-form field.
            found = _SEQ.search(line)
            if found is not None and int(found.group(1)) < from_seq:
                continue
            try:
                record = from_json_line(line)
            except DecodeError:
                continue
            if record.seq >= from_seq and (inc is None or record.inc == inc):
                yield record
