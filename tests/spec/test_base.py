"""What every part of a spec shares (``shardline.spec.base``): the name patterns, the error, the strict base model."""

from __future__ import annotations

import re

import pydantic
import pytest

from shardline.errors import PermanentError
from shardline.spec.base import INSTANCE_TYPE_PATTERN, NAME_PATTERN, SHA256_PATTERN, VERSION_PATTERN, SpecError, _Strict


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [
        (NAME_PATTERN, "score", True),
        (NAME_PATTERN, "score_v2-eu", True),
        (NAME_PATTERN, "s" * 40, True),
        (NAME_PATTERN, "s" * 41, False),  # a name goes into a SageMaker job name (63 characters)
        (NAME_PATTERN, "Score", False),
        (NAME_PATTERN, "2score", False),
        (NAME_PATTERN, "sc ore", False),
        (SHA256_PATTERN, "0" * 64, True),
        (SHA256_PATTERN, "A" * 64, False),
        (SHA256_PATTERN, "0" * 63, False),
        (VERSION_PATTERN, "v1", True),
        (VERSION_PATTERN, "2026-11-01.3_rc", True),
        (VERSION_PATTERN, "v" * 64, True),
        (VERSION_PATTERN, "v" * 65, False),
        (VERSION_PATTERN, "..", False),  # a version is one plain segment of an S3 key
        (VERSION_PATTERN, ".hidden", False),
        (VERSION_PATTERN, "v1/../x", False),
        (VERSION_PATTERN, "v 1", False),
        (INSTANCE_TYPE_PATTERN, "ml.c5.2xlarge", True),
        (INSTANCE_TYPE_PATTERN, "ml.g5.xlarge", True),
        (INSTANCE_TYPE_PATTERN, "ml.m5.large", True),
        (INSTANCE_TYPE_PATTERN, "ml.t3.medium", True),
        (INSTANCE_TYPE_PATTERN, "c5.2xlarge", False),
        (INSTANCE_TYPE_PATTERN, "ml.c5.huge", False),
    ],
)
def test_the_name_patterns(pattern, value, matches):
    assert bool(re.fullmatch(pattern, value)) is matches


def test_a_spec_error_is_permanent_and_a_value_error():
    err = SpecError("p.yaml: invalid pipeline spec")
    assert isinstance(err, PermanentError) and isinstance(err, ValueError)
    assert err.permanent is True  # a bad spec fails the same way on every try: no retry


class _Part(_Strict):
    size: int = 1
    """how big it is"""


def test_a_spec_part_refuses_unknown_fields_and_cannot_be_changed():
    with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
        _Part(size=2, sise=3)
    part = _Part(size=2)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        part.size = 3
    assert part.size == 2


def test_a_fields_docstring_is_its_description():
    """The spec reference (docs/spec-reference.md) is generated from these descriptions."""
    assert _Part.model_fields["size"].description == "how big it is"
