"""Receiver bounds and log lines, on a real ROUTER fed by real DEALER sockets: a newer schema
version is always said in words, and one peer inventing ranks, names or identities costs
counts, never unbounded memory."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq
from rankwatch.agent.wire import records
from rankwatch.aggregator.ingest import peers as peers_mod
from rankwatch.aggregator.ingest import problems as problems_mod
from rankwatch.aggregator.ingest.receiver import Receiver

from .test_receiver import collect, step


def drain(rx: Receiver, messages: int, timeout_s: float = 10.0) -> None:
    """Receive until ``messages`` more messages were counted (valid or not)."""
    want = rx.counters()["messages"] + messages
    deadline = time.monotonic() + timeout_s
    while rx.counters()["messages"] < want:
        assert time.monotonic() < deadline, f"{rx.counters()['messages']} < {want} messages"
        rx.recv(50)


def test_a_newer_version_is_said_in_words_whatever_the_sender_sent_before(
    dealer: Callable[[], zmq.Socket], receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rankwatch.receiver")
    agent = dealer()
    agent.send(records.encode_frame([step(3, 1)]))
    collect(receiver, 1)
    newer = records.SCHEMA_VERSION + 1
    for version in (0, newer, newer, newer + 1, -5):  # invalid first, then newer ones
        agent.send(msgpack.packb({"v": version, "records": [records.to_wire(step(3, 2))]}))
    drain(receiver, 5)
    assert receiver.counters()["reasons"] == {"version": 5}
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "r1/3" in r.getMessage()]
    assert len(lines) == 3, lines  # version 0, then one line per newer version
    invalid, first, second = (text for _, text in lines)
    assert "schema version 0 is not valid" in invalid
    for text, version in ((first, newer), (second, newer + 1)):
        assert f"wire schema version {version}, newer than this aggregator's" in text
        assert "upgrade rankwatch on the head node" in text
    assert [level for level, _ in lines] == [logging.WARNING, logging.ERROR, logging.ERROR]


def test_the_log_once_memory_is_bounded_and_says_when_it_is_full(
    dealer: Callable[[], zmq.Socket],
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(problems_mod, "MAX_LOGGED", 4)
    caplog.set_level(logging.WARNING, logger="rankwatch.receiver")
    socks = [dealer() for _ in range(10)]
    for sock in socks:
        sock.send(b"\xc1 not msgpack")
    drain(receiver, 10)
    assert receiver.counters()["reasons"] == {"msgpack": 10}  # every one still counted
    lines = [r.getMessage() for r in caplog.records]
    assert sum("dropped a bad message" in line for line in lines) == 4
    assert sum("further bad input is only counted" in line for line in lines) == 1
    assert len(receiver.problems._logged) == 5


def test_one_connection_naming_thousands_of_ranks_keeps_only_its_newest_routes(
    dealer: Callable[[], zmq.Socket], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers_mod, "MAX_RANKS_PER_PEER", 1024)  # its records are sent here
    honest, fuzzer = dealer(), dealer()
    honest.send(records.encode_frame([step(0, 1, run="real")]))
    collect(receiver, 1)
    cap = peers_mod.MAX_RANKS_PER_PEER
    ranks = 3 * cap
    for first in range(0, ranks, 512):  # a "relay" whose every record names a new rank
        fuzzer.send(
            records.encode_frame([step(r, 1, run="fuzz") for r in range(first, first + 512)])
        )
    assert len(collect(receiver, ranks)) == ranks  # the records themselves all go in
    c = receiver.counters()
    assert c["peer_ranks_capped"] == ranks - cap
    assert len(receiver.peers.routes) == cap + 1
    assert receiver.identity_of("real", 0) is not None  # the other peer's route is untouched
    assert receiver.identity_of("fuzz", ranks - 1) is not None  # the newest are reachable
    assert receiver.identity_of("fuzz", 0) is None


def test_all_routes_together_are_bounded_oldest_first(
    dealer: Callable[[], zmq.Socket], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers_mod, "MAX_ROUTES", 100)
    socks = [dealer() for _ in range(5)]
    for k, sock in enumerate(socks):  # five relays of 40 ranks each: 200 routes asked for
        sock.send(records.encode_frame([step(r, 1, run=f"node{k}") for r in range(40)]))
        collect(receiver, 40)
    assert len(receiver.peers.routes) == 100
    assert receiver.counters()["routes_evicted"] == 100
    assert receiver.identity_of("node0", 0) is None and receiver.identity_of("node4", 39)


def test_evicted_identities_fold_into_a_bounded_set_of_labels(
    dealer: Callable[[], zmq.Socket], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers_mod, "MAX_SENDERS", 4)
    monkeypatch.setattr(peers_mod, "MAX_RETIRED", 3)
    for k in range(12):  # reconnecting agents, each under a run name of its own
        dealer().send(records.encode_frame([step(0, 1, run=f"made-up-{k}")]))
        collect(receiver, 1)
    senders = receiver.counters()["senders"]
    assert len(senders) == 4 + 3 + 1
    assert senders["(others)"]["messages"] == 12 - 4 - 3
    assert sum(s["messages"] for s in senders.values()) == 12  # nothing uncounted
