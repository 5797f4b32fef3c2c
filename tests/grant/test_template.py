"""The CloudFormation template read and resolved (``shardline.grant.template``): short-form intrinsics, the
Conditions, and a role's statements as one deployment has them."""

from __future__ import annotations

import pytest
import yaml

from shardline.grant.template import (
    CONDITIONS,
    JOB_ROLE,
    CfnLoader,
    load,
    resolve,
    resolved_statements,
    shipped,
    statements,
    with_conditions,
)

TEMPLATE = """\
Parameters:
  Name: {Type: String}
Conditions:
  Isolated: !Equals [!Ref Mode, isolated]
  Shared: !Not [!Equals [!Ref Mode, isolated]]
Resources:
  Role:
    Type: AWS::IAM::Role
    Properties:
      Policies:
        - PolicyName: data
          PolicyDocument:
            Statement:
              - Effect: Allow
                Action: s3:GetObject
                Resource: !Sub "arn:aws:s3:::${Bucket}/in/*"
              - !If
                - Isolated
                - Effect: Deny
                  Action: "s3:*"
                  Resource: !Sub ["arn:aws:s3:::${Other}/*", {Other: !Ref Shared}]
                - !Ref AWS::NoValue
              - Effect: Allow
                Action: [dynamodb:GetItem, dynamodb:Query]
                Resource: !GetAtt Table.Arn
"""


@pytest.fixture
def template() -> dict:
    return yaml.load(TEMPLATE, Loader=CfnLoader)


def test_short_form_intrinsics_read_as_their_long_form(template):
    first, choice, last = template["Resources"]["Role"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    assert first["Resource"] == {"Fn::Sub": "arn:aws:s3:::${Bucket}/in/*"}
    assert choice["Fn::If"][0] == "Isolated" and choice["Fn::If"][2] == {"Ref": "AWS::NoValue"}
    assert last["Resource"] == {"Fn::GetAtt": ["Table", "Arn"]}
    assert template["Conditions"]["Shared"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "Mode"}, "isolated"]}]}


def test_a_roles_statements_include_both_branches_of_an_if_but_no_novalue(template):
    found = statements(template, "Role")
    assert [s["Effect"] for s in found] == ["Allow", "Deny", "Allow"]


@pytest.mark.parametrize(
    ("mode", "effects"), [("isolated", ["Allow", "Deny", "Allow"]), ("shared", ["Allow", "Allow"])]
)
def test_a_deployments_statements_are_resolved_with_its_values_and_conditions(template, mode, effects):
    values = with_conditions(template, {"Mode": mode, "Bucket": "raw", "Shared": "common", "Table.Arn": "arn:t"})
    assert values[CONDITIONS] == {"Isolated": mode == "isolated", "Shared": mode != "isolated"}
    resolved = resolved_statements(template, "Role", values)
    assert [s["Effect"] for s in resolved] == effects
    assert resolved[0]["Resource"] == "arn:aws:s3:::raw/in/*"
    assert resolved[-1] == {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:Query"], "Resource": "arn:t"}
    if mode == "isolated":
        assert resolved[1]["Resource"] == "arn:aws:s3:::common/*"  # Fn::Sub's own variables, resolved first


@pytest.mark.parametrize(
    ("node", "value"),
    [
        ({"Ref": "Name"}, "shardline"),
        ({"Fn::Sub": "${Name}-jobs-${AWS::Region}"}, "shardline-jobs-eu-west-1"),
        ({"Fn::Equals": [{"Ref": "Name"}, "shardline"]}, True),
        ({"Fn::EachMemberEquals": [["a", "a"], "a"]}, True),
        ({"Fn::EachMemberEquals": [["a", "b"], "a"]}, False),
        ([{"Ref": "Name"}, {"Ref": "AWS::NoValue"}, "x"], ["shardline", "x"]),
        ({"Keep": 1, "Drop": {"Ref": "AWS::NoValue"}}, {"Keep": 1}),
    ],
)
def test_resolve_evaluates_each_intrinsic(node, value):
    assert resolve(node, {"Name": "shardline", "AWS::Region": "eu-west-1"}) == value


def test_an_intrinsic_resolve_does_not_know_raises_rather_than_passing():
    with pytest.raises(ValueError, match=r"resolve does not know \['Fn::Select'\]"):
        resolve({"Fn::Select": [0, ["a"]]}, {})
    with pytest.raises(KeyError):
        resolve({"Ref": "Missing"}, {})


def test_the_shipped_template_is_loaded_once_and_has_the_job_role(tmp_path):
    assert shipped() is shipped()
    job = statements(shipped(), JOB_ROLE)
    assert job and all(s["Effect"] in ("Allow", "Deny") and "Action" in s for s in job)
    copy = tmp_path / "t.yaml"
    copy.write_text(TEMPLATE)
    assert load(copy)["Conditions"]["Isolated"] == {"Fn::Equals": [{"Ref": "Mode"}, "isolated"]}
