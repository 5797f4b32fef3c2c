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
