"""Process hooks shared by every live ``Monitor``: installed once, on the first monitor.

* an uncaught exception records a ``crash`` event on every monitor and closes them (a
  ``KeyboardInterrupt`` closes with reason ``"KeyboardInterrupt"``), then the previous
  ``sys.excepthook`` runs as before; an interactive session (``sys.ps1``) is left alone;
* one in another thread records a ``crash`` event with ``fatal: false`` (training may go on);
* SIGTERM, if its handler was the default, closes with reason ``"SIGTERM"`` and then dies of
  SIGTERM as before (a handler the script installed itself is never replaced);
* exit closes with ``"normal"`` (``atexit``);
* a child made by ``fork`` inherits no monitor: the sender thread does not exist there, so the
  copies are made inert.

Monitors are held weakly: a monitor dropped without ``close()`` does not stay alive for this.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import weakref
from types import TracebackType
from typing import Any, Protocol


class Hooked(Protocol):
    """What the hooks need from a monitor (``Monitor`` in ``monitor.py``)."""

    _active: bool
    _closed: bool

    def close(self, reason: str = "normal") -> None: ...

    def _crash(self, exc: BaseException, tb: TracebackType | None, thread: str | None) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False


def register(monitor: Hooked) -> None:
    """Track ``monitor`` (until ``forget``) and install the hooks if not done yet."""
    _live.add(monitor)
    _install()


def forget(monitor: Hooked) -> None:
    _live.discard(monitor)


def close_all(reason: str) -> None:
    for monitor in list(_live):
        monitor.close(reason)


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(close_all, "normal")
    previous_hook = sys.excepthook
    previous_thread_hook = threading.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not hasattr(sys, "ps1"):  # an interactive session goes on after an exception
            try:
                if issubclass(exc_type, KeyboardInterrupt):
                    close_all("KeyboardInterrupt")
                else:
                    for mon in list(_live):
                        mon._crash(exc, tb, None)
                    close_all("crash")
            except Exception:
                pass
        previous_hook(exc_type, exc, tb)

    def thread_excepthook(args: Any) -> None:
        if args.exc_value is not None and args.thread is not None:
            for mon in list(_live):
                mon._crash(args.exc_value, args.exc_traceback, args.thread.name)
        previous_thread_hook(args)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            pass
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_in_child)


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all("SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _forget_in_child() -> None:
    # The sender thread does not exist in a forked child; its monitor copies must stay quiet.
    for monitor in list(_live):
        monitor._active = False
        monitor._closed = True
    _live.clear()
