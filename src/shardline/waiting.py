"""One way to wait for something: poll, pause, give up at a deadline.

Every "ask again until it is done" loop outside the triggers (which wait with asyncio) goes
through :func:`wait_for`, so each caller says only what to ask, when it is done, and how long
it may take, and what it does when the time runs out.

Its callers: a job stopped before the next attempt starts (:mod:`shardline.orchestration.step.jobs`), the jobs of a
failed run (:mod:`shardline.orchestration.run`), a watch task about to end before a resubmission clears it
(:mod:`shardline.oncall.resubmission`), a local job's stop, for its supervisor's pid and then its process group
(:mod:`shardline.backends.local`), moto_server coming up (:mod:`shardline.local.embedded_aws`) and its state
folder's lock (:mod:`shardline.local.moto_state`). :func:`end_processes` is the one way a child process is stopped
and reaped: the local job's instances and its grant proxy, and moto_server.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    poll: Callable[[], T],
    done: Callable[[T], bool] = bool,
    *,
    timeout: float,
    interval: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``poll`` until ``done`` holds for its answer or ``timeout`` seconds have passed.

    Returns the last answer, done or not: the caller checks ``done`` again to tell a timeout
    apart. ``poll`` may raise to stop waiting at once (e.g. the process it waits on has died).
    The first poll is immediate, and the last one is taken at or after the deadline, so an
    answer that arrives during the final pause is never missed.
    """
    deadline = clock() + timeout
    while True:
        answer = poll()
        if done(answer) or clock() >= deadline:
            return answer
        sleep(max(0.0, min(interval, deadline - clock())))


def end_processes(procs: Iterable[subprocess.Popen], *, grace: float) -> None:
    """Ask each process still running to end (SIGTERM), give them ``grace`` seconds in all, then kill (SIGKILL)
    whatever is left; every one is reaped, so none lingers as a zombie."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
