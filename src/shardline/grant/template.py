"""The CloudFormation template (``cloudformation.yaml``, deployed from ``infra/cloudformation/shardline.yaml``),
loaded and resolved: its roles' statements with the values of one deployment (or of one local job)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml

TEMPLATE = Path(__file__).with_name("cloudformation.yaml")
JOB_ROLE = "SageMakerExecutionRole"  # the role a processing job runs as: what its model's code may do
CONDITIONS = "::conditions"  # where a deployment's values keep the template's Conditions, evaluated
NO_VALUE = object()  # what AWS::NoValue resolves to


class CfnLoader(yaml.SafeLoader):
    """SafeLoader that reads CloudFormation short-form intrinsics (!Ref, !Sub, ...) as long form."""


def _intrinsic(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict:
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _intrinsic)


def load(path: Path = TEMPLATE) -> dict:
    return yaml.load(path.read_text(), Loader=CfnLoader)  # a SafeLoader subclass: safe


@functools.cache
def shipped() -> dict:
    """The template this package ships, loaded once per process (callers must not change it)."""
    return load()


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def statements(template: dict, role: str) -> list[dict]:
    """Every statement of the role's inline policies, unresolved; both branches of an Fn::If are included."""
    found = []
    for policy in template["Resources"][role]["Properties"]["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            if "Fn::If" in statement:
                _, yes, no = statement["Fn::If"]
                found += [s for s in (yes, no) if s != {"Ref": "AWS::NoValue"}]
            else:
                found.append(statement)
    return found


def resolved_statements(template: dict, role: str, values: dict) -> list[dict]:
    """The role's statements as one deployment has them: every intrinsic evaluated with ``values``."""
    return [
        statement
        for policy in template["Resources"][role]["Properties"]["Policies"]
        for statement in resolve(policy["PolicyDocument"]["Statement"], values)
    ]


def with_conditions(template: dict, values: dict) -> dict:
    """``values`` with the template's Conditions evaluated on them (what Fn::If reads)."""
    done = {**values, CONDITIONS: {}}
    for condition, expression in template.get("Conditions", {}).items():
        done[CONDITIONS][condition] = resolve(expression, done)
    return done


def resolve(node, values: dict):
    """Evaluate Ref, GetAtt, Sub, If and the condition functions; anything unknown raises, so a typo cannot pass
    silently. A branch that is AWS::NoValue disappears from lists."""
    if isinstance(node, list):
        resolved = [resolve(n, values) for n in node]
        return [n for n in resolved if n is not NO_VALUE]
    if not isinstance(node, dict):
        return node
    if "Ref" in node:
        return NO_VALUE if node["Ref"] == "AWS::NoValue" else values[node["Ref"]]
    if "Fn::If" in node:
        condition, yes, no = node["Fn::If"]
        return resolve(yes if values[CONDITIONS][condition] else no, values)
    if "Fn::Equals" in node:
        left, right = resolve(node["Fn::Equals"], values)
        return left == right
    if "Fn::Not" in node:
        (operand,) = resolve(node["Fn::Not"], values)
        return not operand
    if "Fn::EachMemberEquals" in node:  # a Rules function
        members, value = resolve(node["Fn::EachMemberEquals"], values)
        return all(member == value for member in members)
    if "Fn::GetAtt" in node:
        return values[".".join(node["Fn::GetAtt"])]
    if "Fn::Sub" in node:
        text, extra = (node["Fn::Sub"], {}) if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"]
        scope = values | {k: resolve(v, values) for k, v in extra.items()}
        return re.sub(r"\$\{([^}!]+)\}", lambda m: scope[m.group(1)], text)
    unknown = [k for k in node if k.startswith("Fn::")]
    if unknown:
        raise ValueError(f"resolve does not know {unknown}")
    resolved = {k: resolve(v, values) for k, v in node.items()}
    return {k: v for k, v in resolved.items() if v is not NO_VALUE}
