"""The embedded endpoint serves one request at a time, so a conditional write is atomic there as on AWS."""

from __future__ import annotations

import io
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


class _SlowUpload:
    """A request body that arrives only when the test lets it: a client stalled halfway through an upload."""

    def __init__(self, body: bytes, arrived: threading.Event, reading: threading.Event):
        self.body, self.arrived, self.reading = body, arrived, reading

    def read(self, size: int = -1) -> bytes:
        self.reading.set()
        self.arrived.wait()
        return self.body if size < 0 else self.body[:size]


def test_a_stalled_upload_is_read_before_the_lock_so_it_holds_up_no_other_request():
    lock = threading.Lock()
    got = []

    def app(environ, start_response):
        got.append((lock.locked(), environ["wsgi.input"].read()))
        return [b"ok"]

    call = one_at_a_time(app, lock)
    arrived, reading = threading.Event(), threading.Event()
    stalled = threading.Thread(
        target=call, args=({"wsgi.input": _SlowUpload(b"x" * 10, arrived, reading), "CONTENT_LENGTH": "10"}, None)
    )
    stalled.start()
    reading.wait()
    # While its body has not arrived, the lock is free: another request runs its whole call.
    assert not lock.locked()
    assert call({"wsgi.input": io.BytesIO(b"quick"), "CONTENT_LENGTH": "5"}, None) == [b"ok"]
    assert got == [(True, b"quick")]
    arrived.set()
    stalled.join()
    assert got[1] == (True, b"x" * 10)  # the app still gets the whole body, under the lock


def test_a_body_over_the_cap_is_refused_unread_with_413():
    lock = threading.Lock()
    called, answered = [], []

    def app(environ, start_response):
        called.append(True)
        return [b"ok"]

    call = one_at_a_time(app, lock, max_body=100)
    stream = io.BytesIO(b"y" * 1000)
    with lock:  # another request holds the endpoint: the refusal does not wait for it
        reply = call({"wsgi.input": stream, "CONTENT_LENGTH": "1000"}, lambda status, headers: answered.append(status))
    assert answered == ["413 Request Entity Too Large"] and b"cap" in b"".join(reply)
    assert not called and stream.tell() == 0  # never read, never passed on
    chunked = one_at_a_time(app, lock, max_body=100)(
        {"wsgi.input": io.BytesIO(b"z" * 101), "wsgi.input_terminated": True},
        lambda status, headers: answered.append(status),
    )
    assert answered[-1].startswith("413") and not called and b"cap" in b"".join(chunked)


def test_every_connection_has_a_socket_timeout():
    from werkzeug import serving

    from shardline.local import moto_atomic

    moto_atomic.install()
    assert serving.WSGIRequestHandler.timeout == moto_atomic.SOCKET_TIMEOUT_SECONDS


def test_a_request_without_length_or_chunks_has_no_body_and_is_not_waited_for():
    class NeverEnds:
        def read(self, size: int = -1) -> bytes:
            raise AssertionError("a GET's body was read: the server would wait for the client to hang up")

    call = one_at_a_time(lambda environ, start_response: [environ["wsgi.input"].read()], threading.Lock())
    assert call({"wsgi.input": NeverEnds(), "REQUEST_METHOD": "GET"}, None) == [b""]
