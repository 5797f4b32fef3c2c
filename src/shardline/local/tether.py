"""``python -m shardline.local.tether COMMAND...``: run a server that must not outlive what started it.

The embedded endpoint of ``make demo`` and the servers the tests start (moto_server, ``airflow standalone``) run in
sessions of their own, so that they can be stopped as a group. A caller killed without running its clean-up (SIGKILL,
a CI timeout's SIGTERM) would leave them running: a standalone Airflow left behind parses its DAG files every few
seconds for hours, and slows everything after it.

The tether runs the command as its child, in the session its caller started for it, and asks the kernel to tell it
when its caller dies (Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing asks, and it only runs the command). Told, or
sent SIGTERM, it ends the whole session's process group, the command's own children included, and exits. Its exit
status is otherwise the command's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
STOP_GRACE_SECONDS = 10.0


def tethered(command: list[str]) -> list[str]:
    """``command``, run by the tether. Start it with ``start_new_session=True``: the tether ends its process group."""
    return [sys.executable, "-m", __name__, *command]


def _ask_for_parent_death_signal() -> bool:
    """Ask the kernel for SIGTERM when the process that started this one dies; False where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _session_members() -> list[int]:
    """Every other process of this session: the command's children that left its process group (uvicorn's workers
    do) are still in it. Read from /proc (Linux, where the kernel tells the tether); elsewhere none."""
    me, session = os.getpid(), os.getsid(0)
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getsid(int(entry)) == session:
                    found.append(int(entry))
            except OSError:  # gone meanwhile, or not ours to ask
                continue
    return found


def _kill_session() -> None:
    for pid in _session_members():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m shardline.local.tether COMMAND [ARG...]", file=sys.stderr)
        return 2
    if os.getsid(0) != os.getpid():  # it ends its whole session: one of its own, never its caller's
        print("shardline.local.tether: start it in a session of its own (start_new_session=True)", file=sys.stderr)
        return 2
    parent = os.getppid()
    asked = _ask_for_parent_death_signal()
    if asked and os.getppid() != parent:  # the caller died before the kernel was asked: nothing to serve
        return 1
    child = subprocess.Popen(argv)
    stopping = False

    def stop(*_) -> None:
        """SIGTERM (the caller's, or the kernel's when the caller died): the command's group gets SIGTERM, and
        what of the session is left after a grace gets SIGKILL."""
        nonlocal stopping
        stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches the tether too
        signal.signal(signal.SIGALRM, lambda *_: _kill_session())
        signal.alarm(int(STOP_GRACE_SECONDS))
        os.killpg(os.getpgrp(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    code = child.wait()
    if stopping:
        signal.alarm(0)
        _kill_session()  # the command's children that did not stop with it
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
