"""The ledger's stored attribute names: one per attribute, and the orchestrator's never the worker's.

A name used twice reads one attribute's value as another's (a string where a set is expected fails every read of
the item); a Control name shared with a FILE or SHARD name would let the job role's `dynamodb:Attributes` condition,
which cannot tell items apart, write the orchestrator's attribute."""

from __future__ import annotations

import collections

from shardline.ledger.table import ControlItem, LedgerItem

KEYS = {"pk", "sk", "ttl"}  # every item's keys, and the expiry every write sets


def _stored_names(model) -> list[str]:
    return [attribute.attr_name for attribute in model.get_attributes().values()]


def test_each_attribute_has_a_stored_name_of_its_own():
    for model in (LedgerItem, ControlItem):
        twice = [name for name, n in collections.Counter(_stored_names(model)).items() if n > 1]
        assert not twice, f"{model.__name__} stores two attributes under {twice}"


def test_the_orchestrators_attributes_share_no_name_with_the_workers():
    shared = (set(_stored_names(LedgerItem)) & set(_stored_names(ControlItem))) - KEYS
    assert not shared, shared


def test_the_ledgers_connections_share_a_session_per_thread_and_aws_environment(monkeypatch):
    """pynamodb gives each connection a new botocore session, and each loads DynamoDB's service model again: the
    ledger's connections share one per thread, while the AWS_* variables (credentials, profile) stay the same."""
    import threading

    from shardline.ledger.table import _SESSIONS, _SESSIONS_KEPT, _shared_session, bind_ledger

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "one")
    first = bind_ledger("shared-a", "us-east-1", "http://127.0.0.1:9")
    again = bind_ledger("shared-b", "us-east-1", "http://127.0.0.1:9")
    models = (first, first.Control, again, again.Control)
    assert {id(m._get_connection().connection.session) for m in models} == {id(_shared_session())}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "two")  # other credentials: another session, as a new one would read
    assert _shared_session() is not first._get_connection().connection.session
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append(_shared_session()))
    thread.start()
    thread.join()
    assert elsewhere[0] is not _shared_session()  # building clients from one session is not thread-safe
    for n in range(_SESSIONS_KEPT + 3):
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(n))
        _shared_session()
    assert len(_SESSIONS.by_environment) == _SESSIONS_KEPT  # a test per environment keeps no more than a few
