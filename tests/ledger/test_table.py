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
