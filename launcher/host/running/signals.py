"""The launcher's signal policy: SIGINT, SIGTERM and SIGHUP (STOP_SIGNALS) end an attached launch, or a link test,
the same way: what it started is removed on every node, once, with no signal cutting that cleanup short; the line
and the exit status (128 + the signal) say which signal it was.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from launcher.core.protocol import STOP_SIGNALS, Signalled

STOPPED_BY = {
    signal.SIGINT: "interrupted",
    signal.SIGTERM: "stopped (SIGTERM)",
    signal.SIGHUP: "the terminal closed (SIGHUP)",
}


def stop_on_signals() -> None:
    """Each of STOP_SIGNALS raises Signalled, once (further signals are ignored while the cleanup runs). A signal the
    launcher was started ignoring (nohup, a background job's SIGINT) stays ignored: that is the caller's choice."""

    def stop(signum: int, _frame: object) -> None:
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise Signalled(signum)

    for signum in STOP_SIGNALS:
        if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, stop)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """STOP_SIGNALS ignored inside, as they were outside: a second Ctrl-C must not cut a cleanup short."""
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def stopped(stop: Signalled, removed: str) -> tuple[str, int]:
    """The one line and the exit status of a command that `stop` ended, after `removed` was removed."""
    return f"{STOPPED_BY[signal.Signals(stop.signum)]}; {removed} removed", 128 + stop.signum
