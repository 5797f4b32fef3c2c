"""IAM's evaluation of identity-based statements: a request is allowed when a statement allows it and none
denies it; a statement applies when its action, resource and every condition match.

AWS evaluates Condition blocks against the request; moto does not. So conditions are evaluated here, with IAM's
documented semantics, and an operator this evaluator does not know raises rather than passing.
"""

from __future__ import annotations

import dataclasses
import re

from shardline.grant.template import as_list


@dataclasses.dataclass(frozen=True)
class IamRequest:
    """One request as IAM authorizes it: an action on a resource, with the request's condition keys."""

    action: str  # e.g. "s3:PutObject"
    resource: str  # an ARN
    context: dict = dataclasses.field(default_factory=dict, hash=False)


def iam_match(pattern: str, value: str) -> bool:
    """IAM's wildcard match: ``*`` is any run of characters (slashes included), ``?`` one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def action_match(pattern: str, action: str) -> bool:
    """Action names match case-insensitively, with ``*`` wildcards."""
    regex = "".join(".*" if c == "*" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, action, flags=re.IGNORECASE) is not None


MATCHERS = {
    "StringEquals": lambda wanted, got: wanted == got,
    "StringLike": iam_match,
    "ArnEquals": iam_match,  # both ARN operators accept wildcards
    "ArnLike": iam_match,
    "Bool": lambda wanted, got: wanted.lower() == got.lower(),
}


def condition_holds(condition: dict, context: dict) -> bool:
    """Every operator and key must hold (AND); a key's values are alternatives (OR). ForAllValues holds when each
    request value is allowed (also when there is none), ForAnyValue when one is; IfExists holds when the request
    lacks the key; Null "true" wants the key absent, "false" present."""
    for operator, keys in condition.items():
        qualifier, _, base = operator.rpartition(":")
        if_exists = base.endswith("IfExists")
        base = base.removesuffix("IfExists")
        for key, policy_values in keys.items():
            wanted = [str(w).lower() if isinstance(w, bool) else str(w) for w in as_list(policy_values)]
            if base == "Null":
                (flag,) = wanted
                if (key not in context) != (flag == "true"):
                    return False
                continue
            match = MATCHERS[base]
            if qualifier == "ForAllValues":
                holds = all(any(match(w, g) for w in wanted) for g in as_list(context.get(key, [])))
            elif qualifier == "ForAnyValue":
                holds = any(any(match(w, g) for w in wanted) for g in as_list(context.get(key, [])))
            elif qualifier:
                raise ValueError(f"unknown qualifier {operator}")
            elif key not in context:
                holds = if_exists
            else:
                if isinstance(context[key], list):
                    raise ValueError(f"{key} is multivalued: {operator} needs a qualifier")
                holds = any(match(w, str(context[key])) for w in wanted)
            if not holds:
                return False
    return True


def applies(statement: dict, request: IamRequest) -> bool:
    return (
        any(action_match(a, request.action) for a in as_list(statement["Action"]))
        and any(iam_match(r, request.resource) for r in as_list(statement["Resource"]))
        and condition_holds(statement.get("Condition", {}), request.context)
    )


def allowed(statements: list[dict], request: IamRequest) -> bool:
    """Whether resolved ``statements`` allow ``request``: a statement allows it and no statement denies it."""
    matching = [s for s in statements if applies(s, request)]
    return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)
