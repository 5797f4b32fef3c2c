"""The on-call errors (``shardline.oncall.errors``): each kind with the HTTP status the page answers and the exit
code the CLI exits with."""

from __future__ import annotations

import pytest


def test_each_kind_of_on_call_error_says_how_the_page_answers_and_the_cli_exits():
    from shardline.oncall.errors import BadRequest, Conflict, NotFound, OnCallError, Refused, Unavailable
    from shardline.oncall.values import RunRef

    kinds = {NotFound: (404, 1), Conflict: (409, 1), BadRequest: (400, 2), Refused: (403, 1), Unavailable: (503, 1)}
    for kind, (http_status, exit_code) in kinds.items():
        assert issubclass(kind, OnCallError) and (kind.http_status, kind.exit_code) == (http_status, exit_code)
    with pytest.raises(BadRequest):
        RunRef.parse("no-slash")
