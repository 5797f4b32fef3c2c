"""Credentials a local job may hold when its ledger and buckets are AWS's own: the job role, narrowed to the job.

Where the endpoints are emulated, the job's grant proxy is its one way out (``proxy``). Against AWS itself IAM
is the check, so a local job must hold the job role's credentials, never those of whoever submitted it (Airflow's
role, or an engineer's): the supervisor assumes the request's ``RoleArn`` (``backends.local_credentials``) with
this session policy, which keeps S3 and DynamoDB to this job's own prefixes and ledger items (the same template
statements the proxy evaluates, resolved for the job), and hands the instances those credentials, by name.

The job role trusts SageMaker only, unless the stack is deployed with ``LocalJobsPrincipalArn``: that principal may
then assume it, for sessions named as Shardline names its jobs.
"""

from __future__ import annotations

import json

from shardline.errors import ShardlineError
from shardline.grant.job import LOCK_KEY_PREFIX, S3_NAMESPACE, JobGrant

SESSION_POLICY_LIMIT = 2048  # STS refuses a longer session policy
ROLE_SESSION_SECONDS = 3600  # an IAM role's default longest session
_NAMESPACE_ARN = f"arn:aws:s3:::{S3_NAMESPACE}"


class JobCredentialsError(ShardlineError):
    """The job role could not be assumed for a local job whose endpoints are AWS's own."""


def _real_s3(statement: dict) -> list[dict]:
    """A resolved S3 statement of the local namespace (``shardline-local/<bucket>/<key>``) with AWS's own ARNs:
    object ARNs lose the namespace, and a listing grant becomes one statement per bucket with its key prefixes."""
    resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
    if all(r.startswith(_NAMESPACE_ARN + "/") for r in resources):
        real = ["arn:aws:s3:::" + r[len(_NAMESPACE_ARN) + 1 :] for r in resources]
        return [{**statement, "Resource": real[0] if len(real) == 1 else real}]
    prefixes = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
    if prefixes is None:
        return []  # a bucket-level action the worker never needs (GetBucketLocation): left out
    by_bucket: dict[str, list[str]] = {}
    for prefix in [prefixes] if isinstance(prefixes, str) else prefixes:
        bucket, _, key = prefix.partition("/")
        by_bucket.setdefault(bucket, []).append(key)
    return [
        {**statement, "Resource": f"arn:aws:s3:::{bucket}", "Condition": {"StringLike": {"s3:prefix": keys}}}
        for bucket, keys in sorted(by_bucket.items())
    ]


def session_policy(grant: JobGrant) -> str:
    """The job's session policy, compact JSON. A session gets what both its role and this policy allow, so this
    only narrows: S3 to the job's own prefixes and DynamoDB to its pipeline's items, as its grant resolves them
    (on AWS's own ARNs, any account); every other service as the role allows (KMS for its outputs, logs). The
    role's own denials (``_SUCCESS``, reports, input manifests) and attribute lists still apply, unrepeated."""
    statements: list[dict] = [{"Effect": "Allow", "NotAction": ["s3:*", "dynamodb:*"], "Resource": "*"}]
    for statement in grant.s3_statements:
        if statement["Effect"] == "Allow" and all(a.lower().startswith("s3:") for a in _actions(statement)):
            statements += _real_s3({k: v for k, v in statement.items() if k != "Sid"})
    statements += _ledger_statements(grant)
    text = json.dumps({"Version": "2012-10-17", "Statement": _merged(statements)}, separators=(",", ":"))
    if len(text) > SESSION_POLICY_LIMIT:
        raise JobCredentialsError(
            f"the job's session policy is {len(text)} characters, over STS's {SESSION_POLICY_LIMIT}: its prefixes "
            "are too long to narrow the job role to them (shorten input.prefix, output.prefix or model.uri)"
        )
    return text


def _ledger_statements(grant: JobGrant) -> list[dict]:
    """The job's DynamoDB grants as one statement per table: every action, on the union of their leading keys (the
    role's own statements still say which action may touch which keys and attributes, so this only narrows), with
    an output prefix's lock key on its real bucket."""
    by_table: dict[str, tuple[list[str], list[str]]] = {}
    whole: list[dict] = []  # a grant with no leading key condition stays as it is
    for statement in grant.dynamodb_statements:
        if statement["Effect"] != "Allow" or not all(a.lower().startswith("dynamodb:") for a in _actions(statement)):
            continue
        table = statement["Resource"].split(":table/", 1)[1]
        resource = f"arn:aws:dynamodb:{grant.scope.region}:*:table/{table}"
        leading = statement.get("Condition", {}).get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys")
        if not leading:
            whole.append({"Effect": "Allow", "Action": statement["Action"], "Resource": resource})
            continue
        actions, keys = by_table.setdefault(resource, ([], []))
        actions += [a for a in _actions(statement) if a not in actions]
        keys += [k for k in map(_real_lock_key, [leading] if isinstance(leading, str) else leading) if k not in keys]
    return whole + [
        {
            "Effect": "Allow",
            "Action": actions[0] if len(actions) == 1 else actions,
            "Resource": resource,
            "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": keys}},
        }
        for resource, (actions, keys) in by_table.items()
    ]


def _real_lock_key(key: str) -> str:
    """A lock item's leading key read in the local namespace, on AWS's own bucket."""
    namespaced = f"{LOCK_KEY_PREFIX}s3://{S3_NAMESPACE}/"
    return f"{LOCK_KEY_PREFIX}s3://{key[len(namespaced) :]}" if key.startswith(namespaced) else key


def _merged(statements: list[dict]) -> list[dict]:
    """The same grants in fewer characters: a listing's prefixes joined per bucket, then the resources of
    statements that differ in nothing else joined."""
    listings: dict[str, list[str]] = {}
    rest: list[dict] = []
    for statement in statements:
        if statement.get("Action") == "s3:ListBucket":
            keys = listings.setdefault(statement["Resource"], [])
            keys += [k for k in statement["Condition"]["StringLike"]["s3:prefix"] if k not in keys]
        else:
            rest.append(statement)
    rest += [
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket,
            "Condition": {"StringLike": {"s3:prefix": keys}},
        }
        for bucket, keys in listings.items()
    ]
    joined: dict[str, dict] = {}
    for statement in rest:
        same = json.dumps({k: v for k, v in statement.items() if k != "Resource"}, sort_keys=True)
        resources = joined.setdefault(same, {**statement, "Resource": []})["Resource"]
        for resource in [statement["Resource"]] if isinstance(statement["Resource"], str) else statement["Resource"]:
            if resource not in resources:
                resources.append(resource)
    return [{**s, "Resource": s["Resource"][0] if len(s["Resource"]) == 1 else s["Resource"]} for s in joined.values()]


def _actions(statement: dict) -> list[str]:
    actions = statement.get("Action", [])
    return [actions] if isinstance(actions, str) else list(actions)
