"""wait_for: the one poll loop (a fake clock makes each case exact and instant); end_processes: the one way a child
process is stopped and reaped."""

import signal
import subprocess
import sys

import pytest

from shardline.waiting import end_processes, wait_for


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_returns_the_first_answer_that_is_done_without_pausing_after_it():
    clock, answers = FakeClock(), iter([None, None, 7, 8])
    assert wait_for(lambda: next(answers), timeout=10, interval=1, clock=clock, sleep=clock.sleep) == 7
    assert clock.pauses == [1, 1]


def test_a_timeout_returns_the_last_answer_polled_at_the_deadline():
    clock, polled_at = FakeClock(), []

    def poll():
        polled_at.append(clock.now)
        return "RUNNING"

    answer = wait_for(poll, lambda s: s == "STOPPED", timeout=2.5, interval=1, clock=clock, sleep=clock.sleep)
    assert answer == "RUNNING"
    assert polled_at == [0, 1, 2, 2.5]  # the last pause is cut to the deadline, and it polls once more there


def test_an_answer_that_arrives_in_the_last_pause_is_seen():
    clock = FakeClock()
    assert wait_for(lambda: clock.now >= 2.5, timeout=2.5, interval=1, clock=clock, sleep=clock.sleep) is True


def test_poll_may_raise_to_stop_waiting_at_once():
    clock = FakeClock()

    def poll():
        raise RuntimeError("the process died")

    with pytest.raises(RuntimeError, match="died"):
        wait_for(poll, timeout=10, clock=clock, sleep=clock.sleep)
    assert clock.pauses == []


def test_end_processes_stops_each_child_and_kills_one_that_ignores_sigterm():
    polite = subprocess.Popen(["sleep", "60"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout.readline() == "ready\n"  # it ignores SIGTERM from here on
    done = subprocess.Popen(["true"])
    done.wait()

    end_processes([polite, stubborn, done], grace=0.5)

    assert polite.returncode in (-signal.SIGTERM, -signal.SIGKILL)  # asked first; killed only on a very busy machine
    assert stubborn.returncode == -signal.SIGKILL
    assert done.returncode == 0  # an ended one is left alone
    stubborn.stdout.close()
