"""One line out of a crash message, and whether it reads as a collective/communication failure.

A crash reaches the aggregator as ``crashed: <exc type>: <str(exc)> at step N`` (health's
message) or as a whole traceback (the agent's ``traceback``, an imported stack file). MindSpore
appends banners and a C++ call stack to ``str(exc)``; torch's NCCL errors run over several
lines. A person needs the exception type and the first line that says what went wrong.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import compress, repeat
from operator import contains, eq, getitem, ne, not_

ONE_LINE_MAX = 160  # characters of the one-line form, ellipsis included
PATH_PARTS_KEPT = 1  # trailing parts of a long slashed name kept after ".../"
PATH_MIN_PARTS = 4  # a name with this many slash-separated parts is shortened

_HEALTH_PREFIX = re.compile(r"^crashed:\s*")
_AT_STEP = re.compile(r"\s+at step -?\d+$")
_TRACEBACK = "Traceback (most recent call last):"
# "RuntimeError: text", "torch.distributed.DistBackendError: text", a bare "KeyboardInterrupt".
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
# Lines that carry no information: rules, MindSpore's section banners, empty lines.
_BANNER = re.compile(
    r"^(\s*|[-=*_~#]{3,}|- [^:]{0,60}:\s*(\(For framework developers\))?\s*|\[WARNING\].*|"
    r"The (above )?exception was the direct cause.*|During handling of the above.*)$",
    re.IGNORECASE,
)
# glog/c10 prefixes: "[rank1]:[E1201 19:20:11.120534 3021 ProcessGroupNCCL.cpp:616] "
_LOG_PREFIX = re.compile(r"^(?:\[[^\]]{0,80}\]:?\s*)+")
# A name starts where a word does: tried from inside a word too, the pattern backtracks through
# every word of the line (it finds the same names either way).
_LONG_PATH = re.compile(r"(?<![\w.+-])[\w.+-]*(?:/[\w.+@-]*){" + str(PATH_MIN_PARTS - 1) + ",}")

# Wording of a failed collective or lost peer, as MindSpore (HCCL, NCCL, gloo, MPI backends),
# torch.distributed (gloo, NCCL watchdog) and the launchers print it, lower case. A rank that
# fails this way was most likely waiting for another one. Substrings, not one regex: an
# alternation of thirty words costs a millisecond on a 2 kB MindSpore message.
COLLECTIVE_WORDS = (
    "allreduce", "all_reduce", "all-reduce", "all reduce", "allgather", "all_gather",
    "reducescatter", "reduce_scatter", "broadcast", "barrier", "alltoall", "all_to_all", "hccl",
    "nccl", "gloo", "collective", "processgroup", "process group", "watchdog", "timed out",
    "times out", "timeout", "time out", "connection reset", "connection closed",
    "connection refused", "connection abort", "connect to", "socket", "remote process",
    "remote end", "peer", "timed out node", "ei0006", "ej0001", "link down", "link failure",
    "heartbeat", "rendezvous", "distbackenderror", "distnetworkerror",
)  # fmt: skip
_MPI = re.compile(r"\bmpi\b")  # not "compiler"
COLLECTIVE_SCAN_CHARS = 1024  # the head of a message says what failed; a C++ stack follows
COLLECTIVE_QUICK_CHARS = 200  # scanned first: a burst of peers' failures is decided there
SAME_PLACE_MIN = 32  # undecided messages worth checking at one message's place of its word
SAME_PLACE_TRIED = 4  # messages whose place is tried before the rest are searched
# How the collectives are usually spelt in the wording above: each of these, lower-cased, is in
# COLLECTIVE_WORDS (a test checks), so finding one as it is says what the lower-case search would.
_FORMS = ("AllReduce", "NCCL", "HCCL", "gloo", "timeout", "Timeout", "timed out", "ALLREDUCE")

__all__ = ["COLLECTIVE_WORDS", "collective_failures", "is_collective_failure", "one_line"]


def one_line(message: str, limit: int = ONE_LINE_MAX) -> str:
    """``ExcType: first meaningful line`` of a crash message or traceback, at most ``limit``
    characters; long slashed names become ``.../last``. Never raises; ``""`` for no text."""
    text = _HEALTH_PREFIX.sub("", str(message).strip().replace("\r\n", "\n"))
    tail = _AT_STEP.search(text, max(len(text) - 40, 0))
    text = text[: tail.start()] if tail else text
    lines = text.split("\n")
    start = _exception_start(lines)
    if start is None:
        return _fit(_LOG_PREFIX.sub("", _first_meaningful(lines) or ""), limit)
    match = _EXC_LINE.match(lines[start].strip())
    assert match is not None  # _exception_start only returns matching lines
    kind = match.group(1).rsplit(".", 1)[-1]
    first = (match.group(2) or "").strip()
    if _BANNER.match(first):
        first = _first_meaningful(lines[start + 1 :]) or ""
    return _fit(f"{kind}: {first}" if first else kind, limit)


def is_collective_failure(message: str) -> bool:
    """Does this crash message read as a failed collective, a timeout or a lost peer?"""
    return collective_failures([str(message)])[0]


def collective_failures(messages: Sequence[str]) -> list[bool]:
    """``is_collective_failure`` of each message, for a burst of them: each word is looked for
    in every message still undecided at once (``map`` in C), not message by message."""
    texts = messages
    # A burst of peers' failures is mostly one message but for a rank number or a pid: the word
    # one of them holds is looked for at the same place in the others (a compare of a few
    # characters, not a search of the head).
    out, todo = _mark_same_place(texts)
    # Most failures name the collective in their first line, as a collective is usually written:
    # found so (str.find within the head), a message needs no lower-case copy. Then the head of
    # the rest in lower case, then their whole head.
    rest_texts = texts if len(todo) == len(texts) else [texts[i] for i in todo]
    found, left = _mark_forms(rest_texts)
    for i in compress(todo, found):
        out[i] = True
    undecided = [todo[k] for k in left]
    heads = [texts[i][:COLLECTIVE_QUICK_CHARS].lower() for i in undecided]
    rest, todo = _mark_words([False] * len(undecided), heads)
    for i in compress(undecided, rest):
        out[i] = True
    todo = [undecided[k] for k in todo]
    long = [i for i in todo if len(texts[i]) > COLLECTIVE_QUICK_CHARS]
    if long:
        heads = [texts[i][:COLLECTIVE_SCAN_CHARS].lower() for i in long]
        found, _ = _mark_words([False] * len(long), heads)
        for i in compress(long, found):
            out[i] = True
    # A whole traceback names the exception at its end.
    for i in todo:
        if not out[i] and _TRACEBACK in texts[i]:
            out[i] = _collective_words(one_line(texts[i]))
    return out


def _mark_same_place(texts: Sequence[str]) -> tuple[list[bool], list[int]]:
    """Messages holding a usual spelling (``_FORMS``) at the place where one message of the
    burst holds it, within the quick head, and the indices of the others, in order. A few
    messages are tried: a burst whose wording moves from message to message is left to the
    search."""
    out = [False] * len(texts)
    todo = list(range(len(texts)))
    passed: list[int] = []  # tried, holding no usual spelling: for the search
    for _ in range(SAME_PLACE_TRIED):
        if len(todo) < SAME_PLACE_MIN:
            break
        first = texts[todo[0]]
        found = [(at, form) for form in _FORMS
                 if (at := first.find(form, 0, COLLECTIVE_QUICK_CHARS)) >= 0]  # fmt: skip
        if not found:
            passed.append(todo[0])
            todo = todo[1:]
            continue
        at, form = min(found)
        whole = len(todo) == len(texts)
        rest = texts if whole else [texts[i] for i in todo]
        # ``text[at:at + len(form)] == form`` is ``text.startswith(form, at)``; a slice taken
        # and compared in C costs less per message than a method call with its arguments.
        hits = list(map(eq, map(getitem, rest, repeat(slice(at, at + len(form)))), repeat(form)))
        if whole:
            out = hits  # nothing marked yet: the hits are the answer so far
        else:
            for i in compress(todo, hits):
                out[i] = True
        todo = [] if hits.count(True) == len(hits) else list(compress(todo, map(not_, hits)))
    return out, passed + todo  # each passed one came before those left


def _mark_forms(texts: Sequence[str]) -> tuple[list[bool], list[int]]:
    """Messages whose head holds a collective word in one of its usual spellings (``_FORMS``),
    and the indices of the others: what this finds, the lower-case search finds too."""
    out = [False] * len(texts)
    todo = list(range(len(texts)))
    for form in _FORMS:
        if not todo:
            break
        heads = texts if len(todo) == len(texts) else [texts[i] for i in todo]
        hits = list(map(ne, map(str.find, heads, repeat(form), repeat(0),
                                repeat(COLLECTIVE_QUICK_CHARS)), repeat(-1)))  # fmt: skip
        if any(hits):
            for i in compress(todo, hits):
                out[i] = True
            todo = list(compress(todo, map(not_, hits)))
    return out, todo


def _mark_words(out: list[bool], heads: list[str]) -> tuple[list[bool], list[int]]:
    """``out`` marked where ``heads`` (lower case) has a collective word, and the indices left
    unmarked. A burst is decided by its first word found: marked in one go."""
    todo = list(range(len(heads)))
    for word in COLLECTIVE_WORDS:
        if not todo:
            break
        hits = list(map(contains, heads, repeat(word)))
        if not any(hits):
            continue
        if len(todo) == len(out):
            out = hits
            if all(hits):
                return out, []
        else:
            for i in compress(todo, hits):
                out[i] = True
        keep = list(map(not_, hits))
        todo, heads = list(compress(todo, keep)), list(compress(heads, keep))
    for i, head in zip(todo, heads, strict=True):
        if _MPI.search(head) is not None:
            out[i] = True
    return out, [i for i in todo if not out[i]]


def _collective_words(text: str) -> bool:
    head = text.lower()
    for word in COLLECTIVE_WORDS:  # a loop, not any(): no generator per message of a burst
        if word in head:
            return True
    return _MPI.search(head) is not None


def _exception_start(lines: list[str]) -> int | None:
    """Index of the line naming the exception: after the last traceback's frames, else the
    first line if it looks like ``Type: text``."""
    tb = max((i for i, line in enumerate(lines) if line.strip() == _TRACEBACK), default=None)
    if tb is not None:
        for i in range(tb + 1, len(lines)):
            line = lines[i]
            if line.strip() and not line[:1].isspace() and _looks_like_exception(line):
                return i
        return None
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and _looks_like_exception(lines[first].strip()):
        return first
    return None


def _looks_like_exception(line: str) -> bool:
    match = _EXC_LINE.match(line.strip())
    if match is None:
        return False
    name = match.group(1).rsplit(".", 1)[-1]
    return name[:1].isupper() and (match.group(2) is not None or name.endswith(_EXC_SUFFIXES))


_EXC_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Warning", "Failure")


def _first_meaningful(lines: list[str]) -> str | None:
    for line in lines:
        line = line.strip()
        if line and not _BANNER.match(line):
            return line
    return None


def _fit(text: str, limit: int) -> str:
    text = " ".join(text[: limit * 4].split())
    if text.count("/") >= PATH_MIN_PARTS - 1:
        text = _LONG_PATH.sub(_shorten_path, text)
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _shorten_path(match: re.Match[str]) -> str:
    parts = match.group(0).split("/")
    return ".../" + "/".join(parts[-PATH_PARTS_KEPT:])
