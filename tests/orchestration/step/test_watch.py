"""What a poll makes of AWS's "slow down" (``orchestration.step.watch.is_throttled``): asked again at the next poll,
never a failed watch. Pure: errors built as boto3 and pynamodb raise them."""

from __future__ import annotations

import botocore.exceptions
import pytest
from pynamodb.exceptions import QueryError

from shardline.orchestration.step.watch import is_throttled, is_unreachable


def _client_error(code: str, operation: str = "DescribeProcessingJob") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "x"}}, operation)


@pytest.mark.parametrize(
    ("code", "throttled"),
    [
        ("ThrottlingException", True),  # SageMaker
        ("ProvisionedThroughputExceededException", True),  # DynamoDB
        ("RequestLimitExceeded", True),
        ("ServiceUnavailable", True),
        ("InternalFailure", True),
        ("ResourceLimitExceeded", False),  # a quota: a submit's answer, not a poll's
        ("ValidationException", False),
        ("AccessDeniedException", False),
    ],
)
def test_a_throttled_poll_is_told_from_a_failed_one(code, throttled):
    err = _client_error(code)
    assert is_throttled(err) is throttled and not is_unreachable(err)


def test_a_throttle_inside_pynamodbs_error_is_found_through_its_cause():
    try:
        try:
            raise _client_error("ProvisionedThroughputExceededException", "Query")
        except botocore.exceptions.ClientError as cause:
            raise QueryError("Failed to query items") from cause
    except QueryError as err:
        assert is_throttled(err)
    assert not is_throttled(ConnectionError("refused")) and is_unreachable(ConnectionError("refused"))
