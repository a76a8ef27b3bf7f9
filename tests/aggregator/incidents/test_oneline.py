"""Crash messages to one line, on texts worded as MindSpore, torch/gloo and NCCL print them."""

from __future__ import annotations

import pytest
from rankwatch.aggregator.incidents.oneline import ONE_LINE_MAX, is_collective_failure, one_line

from tests.aggregator.incidents.builders import crash_text, crashed

CASES = [
    # (fixture, one line, collective failure?)
    (
        "mindspore_allreduce_kernel.txt",
        "RuntimeError: Launch kernel failed, name:.../AllReduce-op2",
        True,
    ),
    (
        "mindspore_hccl_timeout.txt",
        "RuntimeError: Call runtime rtStreamSynchronize failed. Op name: Default/AllReduce-op2",
        True,
    ),
    (
        "mindspore_gloo_peer_closed.txt",
        "RuntimeError: [.../pair.cc:598] Connection closed by peer [192.0.2.12]:61013",
        True,
    ),
    (
        "torch_gloo_timeout.txt",
        "RuntimeError: [.../unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation"
        " to complete",
        True,
    ),
    (
        "torch_nccl_system_error.txt",
        "DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1970, unhandled system error"
        " (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
        True,
    ),
    (
        "msrun_demo_hang_peer_allreduce.txt",
        "RuntimeError: Launch kernel failed:"
        " Default/grad_reducer-DistributedGradReducer/AllReduce-op2",
        True,
    ),
    (
        "torchrun_demo_crash_peer_gloo.txt",
        "RuntimeError: Got the following error when running the callback: RuntimeError:"
        " [.../pair.cc:553] Connection closed by peer [127.0.0.1]:31647.",
        True,
    ),
    ("user_valueerror.txt", "ValueError: label 7 out of range for 5 classes", False),
    (
        "torch_cuda_oom.txt",
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        False,
    ),
]


@pytest.mark.parametrize(("name", "line", "collective"), CASES)
def test_fixture_to_one_line(name: str, line: str, collective: bool) -> None:
    text = crash_text(name)
    got = one_line(text)
    assert got == line or (got.startswith(line) and len(got) <= ONE_LINE_MAX), got
    assert "\n" not in got and len(got) <= ONE_LINE_MAX
    assert is_collective_failure(text) is collective


def test_nccl_watchdog_log_lines_lose_their_prefix() -> None:
    got = one_line(crash_text("torch_nccl_watchdog.txt"))
    assert got.startswith("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2101")
    assert got.endswith("…") and len(got) == ONE_LINE_MAX
    assert is_collective_failure(crash_text("torch_nccl_watchdog.txt"))


def test_health_message_form_is_cut_to_its_gist() -> None:
    # health's "crashed: <module.Type>: <str(exc)> at step N", MindSpore banners first
    h = crashed(0, "RuntimeError: \n----------\n- Kernel error:\n----------\n"
                "Launch kernel failed: Default/network/grad/AllReduce-op2\n\n----------\n"
                "- The Function Call Stack:\n", step=30)  # fmt: skip
    assert one_line(h.message) == "RuntimeError: Launch kernel failed: .../AllReduce-op2"


def test_demo_injected_crash_is_not_a_collective_failure() -> None:
    h = crashed(2, "RuntimeError: injected fault: rank 2 crashed at step 20")
    assert one_line(h.message) == "RuntimeError: injected fault: rank 2 crashed at step 20"
    assert not is_collective_failure(h.message)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("", ""),
        ("   \n\n", ""),
        ("KeyboardInterrupt", "KeyboardInterrupt"),
        ("crashed: builtins.KeyboardInterrupt at step 3", "KeyboardInterrupt"),
        ("something odd happened\nsecond line", "something odd happened"),
        ("x" * 10_000, "x" * (ONE_LINE_MAX - 1) + "…"),
        (
            'Traceback (most recent call last):\n  File "a.py", line 1, in <module>\n'
            "KeyError: 'lr'\n\nDuring handling of the above exception, another exception "
            'occurred:\n\nTraceback (most recent call last):\n  File "a.py", line 3, in f\n'
            "    g()\nRuntimeError: config broken",
            "RuntimeError: config broken",
        ),
        (  # names start where a word does, or after a character no name holds
            "OSError: cannot open ab@c/d/e/f.so and name:Default/x-y/z/w/AllReduce-op2",
            "OSError: cannot open ab@.../f.so and name:.../AllReduce-op2",
        ),
    ],
)
def test_odd_texts(text: str, line: str) -> None:
    assert one_line(text) == line
