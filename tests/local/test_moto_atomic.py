"""The embedded endpoint serves one request at a time, so a conditional write is atomic there as on AWS."""

from __future__ import annotations

import threading

from shardline.local.moto_atomic import one_at_a_time


def test_a_request_holds_the_lock_for_its_whole_call_so_the_next_one_waits():
    lock = threading.Lock()
    inside, release = threading.Event(), threading.Event()
    seen = []

    def app(environ, start_response):
        seen.append(lock.locked())
        inside.set()
        release.wait()
        return [b"done"]

    call = one_at_a_time(app, lock)
    first = threading.Thread(target=call, args=({}, None))
    first.start()
    inside.wait()
    assert not lock.acquire(blocking=False)  # a second request cannot start its read-check-write now
    release.set()
    first.join()
    assert seen == [True]
    assert lock.acquire(blocking=False)  # and is let in once the first has answered
    lock.release()
    assert call({}, None) == [b"done"]


def test_the_endpoint_runs_moto_s_own_server_application_under_the_lock():
    from moto import server

    from shardline.local import moto_atomic
    from shardline.local.embedded_aws import is_moto_command, moto_server_command

    moto_atomic.install()
    moto_atomic.install()  # once only: a second wrap would be harmless, but is not made
    call = server.DomainDispatcherApplication.__call__
    assert getattr(call, "one_at_a_time", False)
    assert not getattr(call.__wrapped__, "one_at_a_time", False)  # moto's own, wrapped once
    command = moto_server_command(5000)
    assert command[1:3] == ["-m", "shardline.local.moto_atomic"]
    assert is_moto_command(command)  # what `shardline local down` recognises as the server it started
    assert is_moto_command(["/venv/bin/python", "/venv/bin/moto_server", "-p", "5000"])
    assert not is_moto_command(["/usr/bin/python3", "-m", "http.server"])
