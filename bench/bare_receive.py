"""The least a head node can do with the agents' traffic: a bare ROUTER that decodes each frame.

    python bench/bare_receive.py

Binds a ROUTER on 127.0.0.1 (any free port, the receiver's socket options), prints ``port N``,
then receives ``[identity, frame]`` messages and decodes each frame with msgspec (the fastest
msgpack decoder here, the one the aggregator's receiver uses), counting records, until stdin
closes; then prints ``records N frames M cpu_s S``: its own CPU time since it bound (the clock
``/proc`` counts in ticks of 10 ms, too coarse for a short load). Its CPU time per record is the
baseline ``bench/scale_soak.py`` puts beside the aggregator's, under the same load.
"""

from __future__ import annotations

import sys
import threading
import time

import msgspec
import zmq
from rankwatch.agent.wire.records import MAX_FRAME_BYTES
from rankwatch.aggregator.ingest.receiver import RCVHWM_MESSAGES

POLL_MS = 100


def main() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.RCVHWM, RCVHWM_MESSAGES)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    cpu0 = time.process_time()
    print(f"port {port}", flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    decode = msgspec.msgpack.decode
    recv = sock.recv_multipart
    records = frames = 0
    while not done.is_set():
        if not sock.poll(POLL_MS):
            continue
        while True:
            try:
                _, frame = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            records += len(decode(frame)["records"])
            frames += 1
    cpu = time.process_time() - cpu0
    print(f"records {records} frames {frames} cpu_s {cpu:.9f}", flush=True)
    sock.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
