"""IAM's evaluation of identity-based statements (``shardline.grant.policy``): wildcards, conditions with their
qualifiers, and an explicit Deny over any Allow."""

from __future__ import annotations

import pytest

from shardline.grant.policy import IamRequest, action_match, allowed, applies, condition_holds, iam_match


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [
        ("arn:aws:s3:::data/scores/*", "arn:aws:s3:::data/scores/dt=1/a.parquet", True),  # '*' crosses '/'
        ("arn:aws:s3:::data/scores/*", "arn:aws:s3:::data/scoresX", False),
        ("arn:aws:s3:::data/part-?.csv", "arn:aws:s3:::data/part-7.csv", True),
        ("arn:aws:s3:::data/part-?.csv", "arn:aws:s3:::data/part-17.csv", False),
        ("arn:aws:s3:::data/a.b", "arn:aws:s3:::data/aXb", False),  # '.' is no wildcard
        ("RUN#p#*", "RUN#p#r1\nline", True),
        ("arn:aws:s3:::Data/*", "arn:aws:s3:::data/x", False),  # resources are case-sensitive
    ],
)
def test_iam_wildcards(pattern, value, matches):
    assert iam_match(pattern, value) is matches


@pytest.mark.parametrize(
    ("pattern", "action", "matches"),
    [
        ("s3:GetObject", "s3:getobject", True),  # actions are not case-sensitive
        ("s3:Get*", "s3:GetObjectVersion", True),
        ("s3:Get*", "s3:PutObject", False),
        ("dynamodb:*", "s3:GetObject", False),
        ("*", "sts:AssumeRole", True),
    ],
)
def test_action_names(pattern, action, matches):
    assert action_match(pattern, action) is matches


KEYS = {"dynamodb:LeadingKeys": ["RUN#p#r1"], "s3:prefix": "in/", "aws:SecureTransport": "true"}


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        ({}, True),
        ({"StringEquals": {"s3:prefix": ["out/", "in/"]}}, True),  # a key's values are alternatives
        ({"StringEquals": {"s3:prefix": "in"}}, False),
        ({"StringLike": {"s3:prefix": "i*"}}, True),
        ({"StringLike": {"s3:prefix": "i*"}, "StringEquals": {"s3:prefix": "out/"}}, False),  # operators AND
        ({"Bool": {"aws:SecureTransport": True}}, True),  # a YAML boolean against the request's string
        ({"Bool": {"aws:SecureTransport": "false"}}, False),
        ({"StringEquals": {"s3:delimiter": "/"}}, False),  # a key the request lacks
        ({"StringEqualsIfExists": {"s3:delimiter": "/"}}, True),
        ({"StringEqualsIfExists": {"s3:prefix": "out/"}}, False),
        ({"Null": {"s3:delimiter": "true"}}, True),
        ({"Null": {"s3:prefix": "true"}}, False),
        ({"Null": {"s3:prefix": "false"}}, True),
        ({"ForAllValues:StringLike": {"dynamodb:LeadingKeys": "RUN#p#*"}}, True),
        ({"ForAllValues:StringLike": {"dynamodb:LeadingKeys": "RUN#q#*"}}, False),
        ({"ForAllValues:StringLike": {"dynamodb:Attributes": "x"}}, True),  # no value: holds (as on IAM)
        ({"ForAnyValue:StringLike": {"dynamodb:Attributes": "x"}}, False),
        ({"ForAnyValue:StringEquals": {"dynamodb:LeadingKeys": ["RUN#q#r", "RUN#p#r1"]}}, True),
    ],
)
def test_condition_semantics(condition, holds):
    assert condition_holds(condition, KEYS) is holds


@pytest.mark.parametrize(
    ("condition", "words"),
    [
        ({"ForEvery:StringLike": {"s3:prefix": "x"}}, "unknown qualifier"),
        ({"StringLike": {"dynamodb:LeadingKeys": "RUN#*"}}, "multivalued"),
    ],
)
def test_a_condition_this_evaluator_cannot_read_raises_rather_than_passing(condition, words):
    with pytest.raises(ValueError, match=words):
        condition_holds(condition, KEYS)


def test_an_operator_this_evaluator_does_not_know_raises_rather_than_passing():
    with pytest.raises(KeyError, match="NumericLessThan"):
        condition_holds({"NumericLessThan": {"s3:max-keys": "10"}}, {"s3:max-keys": "5"})


READ = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "arn:aws:s3:::data/in/*"}
NO_SUCCESS = {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::data/*/_SUCCESS"}
WRITE = {
    "Effect": "Allow",
    "Action": "s3:PutObject",
    "Resource": "arn:aws:s3:::data/*",
    "Condition": {"StringEquals": {"s3:x-amz-server-side-encryption": "aws:kms"}},
}


@pytest.mark.parametrize(
    ("request_", "allow"),
    [
        (IamRequest("s3:GetObject", "arn:aws:s3:::data/in/a.parquet"), True),
        (IamRequest("s3:GetObject", "arn:aws:s3:::data/out/a.parquet"), False),  # nothing allows it
        (IamRequest("s3:GetObject", "arn:aws:s3:::data/in/_SUCCESS"), False),  # a Deny wins over an Allow
        (IamRequest("s3:PutObject", "arn:aws:s3:::data/out/a", {"s3:x-amz-server-side-encryption": "aws:kms"}), True),
        (IamRequest("s3:PutObject", "arn:aws:s3:::data/out/a"), False),  # its condition does not hold
    ],
)
def test_allowed_when_a_statement_allows_and_none_denies(request_, allow):
    assert allowed([READ, NO_SUCCESS, WRITE], request_) is allow


def test_a_statement_applies_when_action_resource_and_condition_all_match():
    request = IamRequest("s3:ListBucket", "arn:aws:s3:::data/in/x")
    assert applies(READ, request)
    assert not applies({**READ, "Action": "s3:GetObject"}, request)
    assert not applies({**READ, "Condition": {"Null": {"s3:prefix": "false"}}}, request)
