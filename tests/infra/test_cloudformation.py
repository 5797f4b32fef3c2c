"""The CloudFormation template: cfn-lint clean, and consistent with the code it deploys for.

The structural checks compare the template against the code's own definitions (the
pynamodb model, shardline.planning.naming, the pipeline spec) rather than re-typed strings, and the
DynamoDB permissions are checked against the API calls the ledger code really makes, recorded
on moto_server. A change on either side that breaks a deployment fails here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shardline.grant import template as grant_template
from shardline.grant.policy import action_match, condition_holds, iam_match
from shardline.grant.requests import dynamodb_requests as grant_requests
from shardline.grant.template import as_list, resolve, statements, with_conditions
from shardline.ledger.keys import StepRef
from tests.support.records import hold_run

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_DIR = ROOT / "infra" / "cloudformation"
TEMPLATES = sorted(TEMPLATE_DIR.glob("*.yaml"))
TEMPLATE = TEMPLATE_DIR / "shardline.yaml"
INFRA_README = ROOT / "infra" / "README.md"
# Partitions with different ARNs and service coverage, so a region-specific finding shows up.
LINT_REGIONS = ["us-east-1", "eu-west-1", "ap-southeast-2", "us-gov-west-1", "cn-north-1"]

# Actions that have no resource type, where IAM only accepts Resource "*".
RESOURCE_STAR_ALLOWED = {
    "ecr:GetAuthorizationToken",
    "cloudwatch:PutMetricData",
    # SageMaker's ENIs in the job's subnets (only with SageMakerVpcAccess=true).
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
}
VPC_ACTIONS = {a for a in RESOURCE_STAR_ALLOWED if a.startswith("ec2:")}


# -- loading ------------------------------------------------------------------------------------------------


def load(path: Path = TEMPLATE) -> dict:
    return grant_template.load(path)


@pytest.fixture(scope="module")
def template() -> dict:
    return load()


def resources_of(template: dict, kind: str) -> dict[str, dict]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


# -- resolving intrinsics against an example deployment -----------------------------------------------------

ACCOUNT, REGION = "123456789012", "eu-west-1"
# Values of the required parameters (those without a default) in the example deployment.
REQUIRED_EXAMPLES = {"Pipeline": "churn"}


def example_values(template: dict, **parameters) -> dict:
    """What each Ref / GetAtt evaluates to in a deployment with the parameter defaults (or ``parameters``)."""
    values: dict = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::StackName": "sl",
        "AWS::URLSuffix": "amazonaws.com",
    }
    for name, param in template["Parameters"].items():
        value = parameters.pop(name, param.get("Default", REQUIRED_EXAMPLES.get(name, "")))
        if param["Type"] == "CommaDelimitedList" and isinstance(value, str):
            value = value.split(",")  # what Ref gives: a list ("" is [""])
        values[name] = value if isinstance(value, list) else str(value)
    assert not parameters, f"not parameters of the template: {sorted(parameters)}"
    name, table = values["Name"], values["LedgerTableName"]
    bucket = f"{name}-data-{ACCOUNT}-{REGION}"
    values |= {
        "DataBucket": bucket,
        "DataBucket.Arn": f"arn:aws:s3:::{bucket}",
        "AccessLogBucket.Arn": f"arn:aws:s3:::{name}-logs-{ACCOUNT}-{REGION}",
        "LedgerTable": table,
        "LedgerTable.Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}",
        "Key.Arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "SageMakerExecutionRole.Arn": f"arn:aws:iam::{ACCOUNT}:role/{name}-sagemaker-execution-{REGION}",
        "WorkerRepository.Arn": f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{values['WorkerRepositoryName']}",
    }
    return with_conditions(template, values)


def allows(template: dict, role: str, action: str, resource: str) -> bool:
    """Whether the role's policies allow ``action`` on ``resource`` (conditions aside): an Allow and no Deny."""
    values = example_values(template)

    def matches(statement: dict) -> bool:
        return any(action_match(a, action) for a in as_list(statement["Action"])) and any(
            iam_match(r, resource) for r in as_list(resolve(statement["Resource"], values))
        )

    matching = [s for s in statements(template, role) if matches(s)]
    return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)


# -- IAM conditions, evaluated ------------------------------------------------------------------------------
#
# AWS evaluates Condition blocks against the request; moto does not. So the conditions are evaluated
# here, against the request contexts of calls the code really makes, with IAM's documented semantics.
# An operator this evaluator does not know raises rather than passing.


def decide(template: dict, role: str, action: str, resource: str, context: dict, **parameters) -> bool:
    """Whether the role's policies allow the request, conditions included, in a deployment with ``parameters``."""
    values = example_values(template, **parameters)
    found = [
        s
        for policy in template["Resources"][role]["Properties"]["Policies"]
        for s in resolve(policy["PolicyDocument"]["Statement"], values)
    ]

    def applies(statement: dict) -> bool:
        return (
            any(action_match(a, action) for a in as_list(statement["Action"]))
            and any(iam_match(r, resource) for r in as_list(statement["Resource"]))
            and condition_holds(statement.get("Condition", {}), context)
        )

    matching = [s for s in found if applies(s)]
    return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)


def trusts(template: dict, role: str, principal: dict, action: str, context: dict, **parameters) -> bool:
    """Whether the role's trust policy lets ``principal`` perform ``action`` (sts:...) in this request."""
    values = example_values(template, **parameters)
    trust = resolve(template["Resources"][role]["Properties"]["AssumeRolePolicyDocument"]["Statement"], values)
    return any(
        s["Effect"] == "Allow"
        and s["Principal"] == principal
        and any(action_match(a, action) for a in as_list(s["Action"]))
        and condition_holds(s.get("Condition", {}), context)
        for s in trust
    )


# -- cfn-lint -----------------------------------------------------------------------------------------------


def test_there_is_a_template():
    assert TEMPLATE in TEMPLATES


def test_cfn_lint_finds_nothing():
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    if not cfn_lint.exists():
        pytest.fail(f"cfn-lint is not installed next to {sys.executable}; install the pinned requirements")
    proc = subprocess.run(
        [str(cfn_lint), "--format", "json", "--regions", *LINT_REGIONS, "--", *map(str, TEMPLATES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        findings = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        pytest.fail(f"cfn-lint did not report JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    serious = [f for f in findings if f["Level"] in {"Error", "Warning"}]
    report = "\n".join(
        f"{f['Filename']}:{f['Location']['Start']['LineNumber']} {f['Rule']['Id']} [{f['Level']}] {f['Message']}"
        for f in serious
    )
    assert not serious, f"cfn-lint findings:\n{report}"
    assert proc.returncode in {0, 8}, proc.stderr  # 8: informational findings only


# -- the ledger table matches the pynamodb model ------------------------------------------------------------


def _sorted_pairs(items: list[dict], *keys: str) -> list[tuple]:
    return sorted(tuple(item[k] for k in keys) for item in items)


def test_ledger_table_matches_the_model(template):
    from shardline.ledger.table import FAILURES_INDEX_NAME, LedgerItem, bind_ledger

    model = bind_ledger("infra-schema-check", "us-east-1", "http://127.0.0.1:9")  # builds classes, no IO
    schema = model._get_schema()  # pynamodb 6: what create_ledger_table sends to CreateTable
    table = resources_of(template, "AWS::DynamoDB::Table")["LedgerTable"]["Properties"]

    assert table["BillingMode"] == LedgerItem.Meta.billing_mode == "PAY_PER_REQUEST"
    assert _sorted_pairs(table["KeySchema"], "AttributeName", "KeyType") == _sorted_pairs(
        schema["key_schema"], "AttributeName", "KeyType"
    )
    assert _sorted_pairs(table["AttributeDefinitions"], "AttributeName", "AttributeType") == _sorted_pairs(
        schema["attribute_definitions"], "AttributeName", "AttributeType"
    )

    expected = {i["index_name"]: i for i in schema["global_secondary_indexes"]}
    actual = {i["IndexName"]: i for i in table["GlobalSecondaryIndexes"]}
    assert set(actual) == set(expected) == {FAILURES_INDEX_NAME}
    for name, index in actual.items():
        assert _sorted_pairs(index["KeySchema"], "AttributeName", "KeyType") == _sorted_pairs(
            expected[name]["key_schema"], "AttributeName", "KeyType"
        )
        assert index["Projection"] == expected[name]["projection"]
    assert not schema["local_secondary_indexes"] and "LocalSecondaryIndexes" not in table

    assert table["TimeToLiveSpecification"] == {"AttributeName": LedgerItem._ttl_attribute().attr_name, "Enabled": True}


def test_ledger_table_is_protected(template):
    resource = template["Resources"]["LedgerTable"]
    props = resource["Properties"]
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"]["SSEEnabled"] is True
    assert props["SSESpecification"]["SSEType"] == "KMS"
    assert props["SSESpecification"]["KMSMasterKeyId"] == {"Fn::GetAtt": ["Key", "Arn"]}
    assert props["DeletionProtectionEnabled"] is True
    assert resource["DeletionPolicy"] == resource["UpdateReplacePolicy"] == "Retain"


def test_default_table_name_is_the_spec_default(template):
    from shardline.spec import PipelineSpec

    assert template["Parameters"]["LedgerTableName"]["Default"] == PipelineSpec.model_fields["ledger_table"].default


# -- buckets, key, repository --------------------------------------------------------------------------------


def test_every_bucket_is_encrypted_private_tls_only_and_retained(template):
    buckets = resources_of(template, "AWS::S3::Bucket")
    policies = {
        p["Properties"]["Bucket"]["Ref"]: p["Properties"]["PolicyDocument"]
        for p in resources_of(template, "AWS::S3::BucketPolicy").values()
    }
    assert "DataBucket" in buckets
    for name, bucket in buckets.items():
        props = bucket["Properties"]
        rules = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert rules and all(
            r["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in {"aws:kms", "AES256"} for r in rules
        ), name
        assert props["PublicAccessBlockConfiguration"] == dict.fromkeys(
            ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"], True
        ), name
        assert props["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}], name
        assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain", name

        deny_plain_http = [
            s
            for s in policies[name]["Statement"]
            if s["Effect"] == "Deny"
            and s["Principal"] == "*"
            and s["Action"] == "s3:*"
            and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        ]
        assert len(deny_plain_http) == 1, f"{name} has no policy denying non-TLS requests"
        assert deny_plain_http[0]["Resource"] == [{"Fn::GetAtt": [name, "Arn"]}, {"Fn::Sub": f"${{{name}.Arn}}/*"}]


def test_data_bucket_uses_the_kms_key_with_a_bucket_key(template):
    props = template["Resources"]["DataBucket"]["Properties"]
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": {"Fn::GetAtt": ["Key", "Arn"]},
    }
    assert rule["BucketKeyEnabled"] is True
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": "AccessLogBucket"}


def test_access_logs_are_accepted_from_the_data_bucket(template):
    values = example_values(template)
    policy = resolve(template["Resources"]["AccessLogBucketPolicy"]["Properties"]["PolicyDocument"], values)
    (grant,) = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    assert grant["Principal"] == {"Service": "logging.s3.amazonaws.com"}
    assert grant["Condition"]["ArnLike"]["aws:SourceArn"] == values["DataBucket.Arn"]
    log_prefix = template["Resources"]["DataBucket"]["Properties"]["LoggingConfiguration"]["LogFilePrefix"]
    assert iam_match(grant["Resource"], f"{values['AccessLogBucket.Arn']}/{log_prefix}2026-01-01-00-00-00-ABC")
    bucket_name = resolve(template["Resources"]["DataBucket"]["Properties"]["BucketName"], values)
    assert bucket_name == values["DataBucket"]


def test_key_rotates_and_is_retained(template):
    key = template["Resources"]["Key"]
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == key["UpdateReplacePolicy"] == "Retain"
    assert template["Resources"]["KeyAlias"]["Properties"]["TargetKeyId"] == {"Ref": "Key"}


def test_worker_repository(template):
    props = template["Resources"]["WorkerRepository"]["Properties"]
    assert props["ImageTagMutability"] == "IMMUTABLE"
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert props["EncryptionConfiguration"] == {"EncryptionType": "KMS", "KmsKey": {"Fn::GetAtt": ["Key", "Arn"]}}
    lifecycle = json.loads(resolve(props["LifecyclePolicy"]["LifecyclePolicyText"], example_values(template)))
    rules = sorted(lifecycle["rules"], key=lambda r: r["rulePriority"])
    assert rules[-1]["selection"]["tagStatus"] == "any"  # "any" must be the lowest-priority rule
    assert all(r["action"] == {"type": "expire"} for r in rules)


# -- IAM ----------------------------------------------------------------------------------------------------

SM, AF = "SageMakerExecutionRole", "AirflowRole"
ROLES = [SM, AF]


@pytest.mark.parametrize("role", ROLES)
def test_no_wildcard_actions_and_no_star_resources_beyond_the_allow_list(template, role):
    for statement in statements(template, role):
        actions = as_list(statement["Action"])
        assert not [a for a in actions if "*" in a or "?" in a], statement
        if "*" in as_list(statement["Resource"]):
            assert set(actions) <= RESOURCE_STAR_ALLOWED, f"{role}: Resource '*' for {actions}"
        assert "NotAction" not in statement and "NotResource" not in statement


def test_vpc_permissions_only_with_vpc_access(template):
    policy = template["Resources"]["SageMakerExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    plain = [s for s in policy["Statement"] if "Fn::If" not in s]
    assert not [s for s in plain if set(as_list(s["Action"])) & VPC_ACTIONS]
    (conditional,) = [s["Fn::If"] for s in policy["Statement"] if "Fn::If" in s]
    assert conditional[0] == "VpcAccess" and conditional[2] == {"Ref": "AWS::NoValue"}
    assert set(conditional[1]["Action"]) == VPC_ACTIONS
    assert template["Conditions"]["VpcAccess"] == {"Fn::Equals": [{"Ref": "SageMakerVpcAccess"}, "true"]}


def test_metrics_star_is_limited_to_the_processing_namespace(template):
    (metrics,) = [
        s for s in statements(template, "SageMakerExecutionRole") if "cloudwatch:PutMetricData" in as_list(s["Action"])
    ]
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": "/aws/sagemaker/ProcessingJobs"}}


def test_pass_role_is_the_execution_role_to_sagemaker_only(template):
    passing = [
        s
        for role in ROLES
        for s in statements(template, role)
        if any(action_match(a, "iam:PassRole") for a in as_list(s["Action"]))
    ]
    assert len(passing) == 1
    (statement,) = passing
    assert statement in statements(template, "AirflowRole")
    assert statement["Action"] == "iam:PassRole"
    assert statement["Resource"] == {"Fn::GetAtt": ["SageMakerExecutionRole", "Arn"]}
    assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    assert not [
        s
        for role in ROLES
        for s in statements(template, role)
        if any(a.startswith("iam:") and a != "iam:PassRole" for a in as_list(s["Action"]))
    ]


def test_execution_role_trusts_sagemaker_only(template):
    """By default; a local-jobs principal only when the stack names one (the next test)."""
    trust = template["Resources"]["SageMakerExecutionRole"]["Properties"]["AssumeRolePolicyDocument"]
    resolved = resolve(trust["Statement"], example_values(template))
    assert [s["Principal"] for s in resolved] == [{"Service": "sagemaker.amazonaws.com"}]


def test_a_named_local_jobs_principal_assumes_the_execution_role_only_for_sessions_named_as_jobs(template):
    from shardline.planning.naming import job_name

    local = f"arn:aws:iam::{ACCOUNT}:role/ml-dev"
    ours = job_name("daily_churn", "manual__2026-11-22T00:00:00+00:00", "score", 1)

    def assumable(session: str, **parameters) -> bool:
        context = {"sts:RoleSessionName": session}
        return trusts(template, SM, {"AWS": local}, "sts:AssumeRole", context, **parameters)

    assert not assumable(ours)  # not unless the stack names it
    assert assumable(ours, LocalJobsPrincipalArn=local)
    assert not assumable("someone-elses-session", LocalJobsPrincipalArn=local)
    assert not trusts(
        template, SM, {"AWS": local}, "sts:AssumeRole", {"sts:RoleSessionName": ours}, LocalJobsPrincipalArn=""
    )


def test_airflow_role_trusts_the_configured_principal(template):
    (statement,) = template["Resources"]["AirflowRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    condition, principal, pod_identity = statement["Fn::If"]
    assert condition == "TrustPrincipal"
    assert principal["Principal"] == {"AWS": {"Ref": "AirflowPrincipalArn"}}
    assert pod_identity["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert pod_identity["Condition"]["StringEquals"]["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}


def test_execution_role_is_assumed_only_for_this_accounts_shardline_processing_jobs(template):
    """Confused deputy: SageMaker gets the role for our processing jobs only, not for a training job or
    another account's job that someone able to pass the role points at it."""
    from shardline.planning.naming import job_name

    sagemaker = {"Service": "sagemaker.amazonaws.com"}
    ours = job_name("daily_churn", "scheduled__2026-11-22T00:00:00+00:00", "score", 1)
    assert ours == ours.lower()  # SageMaker ARNs carry the job name lower-cased

    def assumable(source_arn: str, account: str = ACCOUNT) -> bool:
        return trusts(
            template, SM, sagemaker, "sts:AssumeRole", {"aws:SourceAccount": account, "aws:SourceArn": source_arn}
        )

    assert assumable(f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:processing-job/{ours}")
    assert not assumable(f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{ours}")
    assert not assumable(f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:processing-job/someone-elses-job")
    assert not assumable(f"arn:aws:sagemaker:{REGION}:210987654321:processing-job/{ours}", "210987654321")
    assert not trusts(template, SM, sagemaker, "sts:AssumeRole", {})


POD_TAGS = {
    "aws:SourceAccount": ACCOUNT,
    "aws:RequestTag/eks-cluster-arn": f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/ml",
    "aws:RequestTag/kubernetes-namespace": "airflow",
    "aws:RequestTag/kubernetes-service-account": "airflow-worker",
}


def test_pod_identity_trust_is_airflows_cluster_namespace_and_service_accounts(template):
    """EKS Pod Identity tags the session with the pod's cluster, namespace and service account: any
    other pod bound to the role, in any cluster of the account, is refused."""
    pods = {"Service": "pods.eks.amazonaws.com"}
    deployment = dict(AirflowTrust="eks-pod-identity", EksClusterArn=POD_TAGS["aws:RequestTag/eks-cluster-arn"])
    for action in ("sts:AssumeRole", "sts:TagSession"):
        for account in example_values(template)["AirflowServiceAccounts"]:
            tags = {**POD_TAGS, "aws:RequestTag/kubernetes-service-account": account}
            assert trusts(template, AF, pods, action, tags, **deployment), (action, account)
        for tag, other in [
            ("eks-cluster-arn", f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/sandbox"),
            ("kubernetes-namespace", "default"),
            ("kubernetes-service-account", "default"),
        ]:
            assert not trusts(template, AF, pods, action, {**POD_TAGS, f"aws:RequestTag/{tag}": other}, **deployment), (
                action,
                tag,
            )
        # An association with session tags disabled sends none, and is refused rather than trusted blindly.
        assert not trusts(template, AF, pods, action, {"aws:SourceAccount": ACCOUNT}, **deployment)
        assert not trusts(
            template, AF, pods, action, POD_TAGS, AirflowPrincipalArn=f"arn:aws:iam::{ACCOUNT}:role/airflow"
        )


def _refused(template: dict, **parameters) -> list[str]:
    """The template Rules' assertions a deployment with ``parameters`` fails."""
    values = example_values(template, **parameters)
    return [
        assertion["AssertDescription"]
        for rule in template["Rules"].values()
        if resolve(rule.get("RuleCondition", True), values)
        for assertion in rule["Assertions"]
        if not resolve(assertion["Assert"], values)
    ]


def test_rules_refuse_a_trust_or_network_left_open(template):
    principal = dict(AirflowPrincipalArn=f"arn:aws:iam::{ACCOUNT}:role/airflow")
    assert not _refused(template, **principal)
    assert _refused(template) == ["AirflowTrust `principal` needs AirflowPrincipalArn."]
    assert _refused(template, AirflowTrust="eks-pod-identity") == [
        "AirflowTrust `eks-pod-identity` needs EksClusterArn."
    ]
    assert not _refused(
        template, AirflowTrust="eks-pod-identity", EksClusterArn=POD_TAGS["aws:RequestTag/eks-cluster-arn"]
    )
    assert len(_refused(template, **principal, SageMakerVpcAccess="true")) == 2
    assert not _refused(
        template,
        **principal,
        SageMakerVpcAccess="true",
        SageMakerSubnetIds=["subnet-0abc1234"],
        SageMakerSecurityGroupIds=["sg-0abc1234"],
    )


# The services each role's key use may go through: where its data lies under the key (S3 objects, the
# ledger table, worker images) and SageMaker/EC2 for the jobs' volumes.
KMS_SERVICES = {SM: {"s3", "dynamodb", "ecr", "sagemaker", "ec2"}, AF: {"s3", "dynamodb", "sagemaker", "ec2"}}


@pytest.mark.parametrize("role", ROLES)
def test_kms_key_is_used_only_through_aws_services(template, role):
    """kms:ViaService on every KMS grant: the key works through S3, DynamoDB, ... and never directly,
    so code running as the role cannot decrypt or encrypt data of its own choosing with it."""
    values = example_values(template)
    key = values["Key.Arn"]
    kms = [
        s
        for s in resolve(statements(template, role), values)
        if any(a.startswith("kms:") for a in as_list(s["Action"]))
    ]
    assert kms
    for statement in kms:
        via = as_list(statement["Condition"]["StringEquals"]["kms:ViaService"])
        services = {re.fullmatch(rf"([a-z0-9]+)\.{REGION}\.amazonaws\.com", v).group(1) for v in via}
        assert services <= KMS_SERVICES[role], statement["Sid"]

    def may(action: str, **context) -> bool:
        return decide(template, role, action, key, context)

    for service in ("s3", "dynamodb", "sagemaker"):  # both roles' data: objects, the ledger, job keys
        assert may("kms:Decrypt", **{"kms:ViaService": f"{service}.{REGION}.amazonaws.com"}), service
    assert may("kms:GenerateDataKey", **{"kms:ViaService": f"s3.{REGION}.amazonaws.com"})
    assert not may("kms:Decrypt")  # a direct call
    assert not may("kms:Decrypt", **{"kms:ViaService": f"lambda.{REGION}.amazonaws.com"})
    assert not may("kms:Decrypt", **{"kms:ViaService": "s3.us-east-1.amazonaws.com"})  # another region
    volume_grant = {"kms:ViaService": f"sagemaker.{REGION}.amazonaws.com", "kms:GrantIsForAWSResource": "true"}
    assert may("kms:CreateGrant", **volume_grant)
    assert not may("kms:CreateGrant", **{**volume_grant, "kms:GrantIsForAWSResource": "false"})
    assert not may("kms:CreateGrant", **{**volume_grant, "kms:ViaService": f"s3.{REGION}.amazonaws.com"})


def _create_job_context(request: dict) -> dict:
    """The sagemaker: condition keys a CreateProcessingJob request carries (of those the policy may use)."""
    context = {}
    cluster, network = request["ProcessingResources"]["ClusterConfig"], request.get("NetworkConfig", {})
    if "VolumeKmsKeyId" in cluster:
        context["sagemaker:VolumeKmsKey"] = cluster["VolumeKmsKeyId"]
    if "KmsKeyId" in request.get("ProcessingOutputConfig", {}):
        context["sagemaker:OutputKmsKey"] = request["ProcessingOutputConfig"]["KmsKeyId"]
    if "VpcConfig" in network:
        context["sagemaker:VpcSubnets"] = network["VpcConfig"]["Subnets"]
        context["sagemaker:VpcSecurityGroupIds"] = network["VpcConfig"]["SecurityGroupIds"]
    if "EnableNetworkIsolation" in network:
        context["sagemaker:NetworkIsolation"] = str(network["EnableNetworkIsolation"]).lower()
    return context


@pytest.mark.parametrize("vpc_access", [False, True])
def test_airflow_creates_jobs_only_with_the_stack_key_and_network(template, vpc_access):
    """The real request (shardline.planning.request) passes the CreateProcessingJob conditions with the spec's
    kms_key_id set to the stack's key ARN, and in the allowed subnets; anything else is refused."""
    from shardline.planning.attempt import Attempt
    from shardline.planning.naming import job_name
    from shardline.planning.request import build_processing_request
    from shardline.spec import SpecError, parse_spec

    subnets, groups = ["subnet-0abc1234", "subnet-0def5678"], ["sg-0abc1234"]
    deployment = (
        dict(SageMakerVpcAccess="true", SageMakerSubnetIds=subnets, SageMakerSecurityGroupIds=groups)
        if vpc_access
        else {}
    )
    values = example_values(template, **deployment)
    key, bucket = values["Key.Arn"], values["DataBucket"]
    name = job_name("daily_churn", "run-1", "score", 1)
    attempt = Attempt(
        pipeline="daily_churn",
        run_id="run-1",
        step="score",
        number=1,
        input_prefix=f"s3://{bucket}/inputs/x/",
        output_prefix=f"s3://{bucket}/outputs/x/",
        model_uri=f"s3://{bucket}/models/m.tar.gz",
        requested_instances=2,
        file_count=2,
    )
    assert attempt.job_name == name
    job_arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:processing-job/{name}"

    def may_create(**sagemaker) -> bool:
        spec = parse_spec(
            {
                "pipeline": "daily_churn",
                "backend": "sagemaker",
                "steps": [
                    {
                        "name": "score",
                        "model": {"uri": attempt.model_uri, "sha256": "0" * 64},
                        "input": {"prefix": attempt.input_prefix},
                        "output": {"prefix": attempt.output_prefix},
                    }
                ],
                "sagemaker": {"role_arn": values["SageMakerExecutionRole.Arn"], "image_uri": "repo:tag", **sagemaker},
            },
            "p.yaml",
        )
        request = build_processing_request(spec, attempt, image_uri="repo:tag", role_arn=spec.sagemaker.role_arn)
        return decide(
            template, AF, "sagemaker:CreateProcessingJob", job_arn, _create_job_context(request), **deployment
        )

    allowed_network = {"vpc": {"subnets": subnets[:1], "security_group_ids": groups}} if vpc_access else {}
    assert may_create(kms_key_id=key, **allowed_network)
    with pytest.raises(SpecError, match=r"sagemaker\.kms_key_id"):  # SageMaker's default key: the spec says no first
        may_create(**allowed_network)
    assert not may_create(kms_key_id="alias/shardline", **allowed_network)  # the README says: the ARN
    assert not may_create(kms_key_id=key.replace("1234abcd", "0000abcd"), **allowed_network)
    if vpc_access:
        assert not may_create(kms_key_id=key)  # outside the VPC
        assert not may_create(kms_key_id=key, vpc={"subnets": ["subnet-0bad0000"], "security_group_ids": groups})
        assert not may_create(kms_key_id=key, vpc={"subnets": subnets, "security_group_ids": ["sg-0bad0000"]})
    else:  # the execution role could not create the job's network interfaces anyway
        assert not may_create(kms_key_id=key, vpc={"subnets": subnets, "security_group_ids": groups})
    for action in ("sagemaker:DescribeProcessingJob", "sagemaker:StopProcessingJob", "sagemaker:AddTags"):
        assert decide(template, AF, action, job_arn, {}, **deployment), action


def test_airflow_may_run_exactly_the_jobs_shardline_names(template):
    from shardline.planning.naming import job_name

    values = example_values(template)
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:processing-job/"
    name = job_name("daily_churn", "scheduled__2026-11-22T00:00:00+00:00", "calibrate", 3)
    for action in [
        "sagemaker:CreateProcessingJob",
        "sagemaker:DescribeProcessingJob",
        "sagemaker:StopProcessingJob",
        "sagemaker:AddTags",
    ]:  # AddTags: the request carries Tags
        assert allows(template, "AirflowRole", action, arn + name), action
        assert not allows(template, "AirflowRole", action, arn + "someone-elses-job"), action
    assert not allows(template, "AirflowRole", "sagemaker:CreateTrainingJob", arn + name)
    assert name.startswith(values["JobNamePrefix"])
    assert re.fullmatch(template["Parameters"]["JobNamePrefix"]["AllowedPattern"], values["JobNamePrefix"])


def _uri_key(values: dict, prefix_param: str, rest: str) -> str:
    return f"s3://{values['DataBucket']}/{values[prefix_param]}{rest}"


def _object_arn(values: dict, uri: str) -> str:
    from shardline.s3uri import parse_s3_uri

    bucket, key = parse_s3_uri(uri)
    assert bucket == values["DataBucket"]
    return f"arn:aws:s3:::{bucket}/{key}"


@pytest.mark.parametrize("output_rest", ["churn/", "churn/scores/dt=2026-11-22/"])
def test_s3_access_follows_the_data_layout(template, output_rest):
    """Who may read and write inputs, models, outputs and manifests, at the keys the code uses."""
    from shardline.planning.naming import manifest_key, outputs_manifest_key, success_marker_key, worker_manifest_key

    values = example_values(template)
    input_uri = _uri_key(values, "InputPrefix", "customers/dt=2026-11-22/part-000.parquet")
    model_uri = _uri_key(values, "ModelPrefix", "sklearn/v1/model.tar.gz")
    output_prefix = _uri_key(values, "OutputPrefix", output_rest)
    prediction = output_prefix + "part-000.parquet"
    worker_report = worker_manifest_key(output_prefix, "scheduled__2026-11-22T00:00:00+00:00", "score", 2, "algo-1")
    success_marker = success_marker_key(output_prefix)  # outputs.commit_outputs writes and withdraws it
    outputs_manifest = outputs_manifest_key(output_prefix, "scheduled__2026-11-22T00:00:00+00:00", "score")
    manifest = manifest_key(output_prefix, "scheduled__2026-11-22T00:00:00+00:00", "score", 2)
    assert manifest.startswith(output_prefix)
    input_arn, model_arn, prediction_arn, report_arn, manifest_arn = (
        _object_arn(values, u) for u in (input_uri, model_uri, prediction, worker_report, manifest)
    )

    sm, af = "SageMakerExecutionRole", "AirflowRole"
    for arn in (input_arn, model_arn, manifest_arn, prediction_arn):  # prediction: read by from_step steps
        assert allows(template, sm, "s3:GetObject", arn), arn
    for arn in (prediction_arn, report_arn):
        assert allows(template, sm, "s3:PutObject", arn), arn
    for arn in (input_arn, model_arn, manifest_arn):
        assert not allows(template, sm, "s3:PutObject", arn), arn
    assert not allows(template, sm, "s3:GetObject", f"arn:aws:s3:::{values['DataBucket']}/elsewhere/x")
    assert not allows(template, sm, "s3:DeleteObject", prediction_arn)

    assert allows(template, af, "s3:PutObject", manifest_arn)
    marker_arn, outputs_arn = _object_arn(values, success_marker), _object_arn(values, outputs_manifest)
    assert allows(template, af, "s3:PutObject", outputs_arn)
    assert allows(template, af, "s3:PutObject", marker_arn) and allows(template, af, "s3:DeleteObject", marker_arn)
    # Only the orchestrator says a prefix is complete: a job (its model code) may not write the marker.
    assert not allows(template, sm, "s3:PutObject", marker_arn)
    for arn in (input_arn, model_arn, prediction_arn, report_arn):
        assert not allows(template, af, "s3:PutObject", arn), arn
        assert not allows(template, af, "s3:DeleteObject", arn), arn
    assert not allows(template, af, "s3:GetObject", input_arn)
    # Before _SUCCESS the orchestrator checks each output's size and checksum (HeadObject needs s3:GetObject).
    assert allows(template, af, "s3:GetObject", prediction_arn)


def test_a_pipeline_stack_reads_and_writes_only_its_own_outputs(template):
    """A job's outputs (and from_step reads) are <OutputPrefix><Pipeline>/ only: never another pipeline's."""
    values = example_values(template, Pipeline="daily_churn")
    bucket, out = values["DataBucket"], values["OutputPrefix"]

    def obj(key: str) -> str:
        return f"arn:aws:s3:::{bucket}/{key}"

    own, other = obj(f"{out}daily_churn/scores/part-0.parquet"), obj(f"{out}weekly_ltv/scores/part-0.parquet")
    twin = obj(f"{out}daily_churn_v2/scores/part-0.parquet")  # a longer name is another pipeline
    for action in ("s3:GetObject", "s3:PutObject"):
        assert decide(template, SM, action, own, {}, Pipeline="daily_churn"), action
        for arn in (other, twin):
            assert not decide(template, SM, action, arn, {}, Pipeline="daily_churn"), (action, arn)
    listing = {"s3:prefix": f"{out}weekly_ltv/scores/"}
    assert not decide(template, SM, "s3:ListBucket", values["DataBucket.Arn"], listing, Pipeline="daily_churn")
    manifest = obj(f"{out}daily_churn/scores/_shardline/manifests/run/score/attempt-0001.manifest")
    assert decide(template, SM, "s3:GetObject", manifest, {}, Pipeline="daily_churn")
    assert not decide(template, SM, "s3:PutObject", manifest, {}, Pipeline="daily_churn")
    for shared in (f"{values['InputPrefix']}customers/part-0.parquet", f"{values['ModelPrefix']}m/model.tar.gz"):
        assert decide(template, SM, "s3:GetObject", obj(shared), {}, Pipeline="daily_churn")


def test_a_job_writes_under_shardline_only_its_instances_manifests(template):
    """Of every key the code writes under an output's _shardline/ folder, a job may write the instances'
    manifests alone: never an input manifest, an outputs manifest, a run report (which the on-call engineer
    opens, and whose JSON is the next run's drift reference) or _SUCCESS. Of its own pipeline or any other."""
    from shardline.planning import naming

    values = example_values(template, Pipeline="daily_churn")
    bucket = values["DataBucket"]
    run = "scheduled__2026-11-22T00:00:00+00:00"
    for pipeline in ("daily_churn", "weekly_ltv"):
        prefix = f"s3://{bucket}/{values['OutputPrefix']}{pipeline}/scores/dt=2026-11-22/"
        written = {
            "instance manifest": naming.worker_manifest_key(prefix, run, "score", 2, "algo-1"),
            "input manifest": naming.manifest_key(prefix, run, "score", 2),
            "rejects part": naming.rejects_parts_prefix(prefix, run, "score", 2) + "part-0.rejects-a2.csv",
            "rejects parts' rows": naming.rejects_parts_prefix(prefix, run, "score", 2).rstrip("/") + ".json",
            "outputs manifest": naming.outputs_manifest_key(prefix, run, "score"),
            "report.html": naming.report_key(prefix, run, "score"),
            "report.json": naming.report_key(prefix, run, "score", suffix="json"),
            "_SUCCESS": naming.success_marker_key(prefix),
        }
        for what, uri in written.items():
            arn = f"arn:aws:s3:::{uri.removeprefix('s3://')}"
            may = what == "instance manifest" and pipeline == "daily_churn"
            assert decide(template, SM, "s3:PutObject", arn, {}, Pipeline="daily_churn") == may, (pipeline, what)
            # Tagged with the lifecycle rule's tag as it is written (the worker's put_bytes): that manifest only.
            assert decide(template, SM, "s3:PutObjectTagging", arn, {}, Pipeline="daily_churn") == may, what
            assert not decide(template, SM, "s3:DeleteObject", arn, {}, Pipeline="daily_churn"), (pipeline, what)
        # An output may never be tagged: the lifecycle rule would expire it.
        output = f"arn:aws:s3:::{prefix.removeprefix('s3://')}part-0.parquet"
        assert not decide(template, SM, "s3:PutObjectTagging", output, {}, Pipeline="daily_churn")


def test_airflow_reads_and_writes_exactly_the_report_keys_it_uses_and_reads_the_instances_manifests(template):
    """The run report's two objects (naming.report_key), read and written; the instances' manifests, read (the
    check before _SUCCESS and the report); nothing else under reports/, and no manifest of an instance written."""
    from shardline.planning import naming

    values = example_values(template)
    prefix = f"s3://{values['DataBucket']}/{values['OutputPrefix']}churn/scores/dt=2026-11-22/"
    run = "scheduled__2026-11-22T00:00:00+00:00"

    def arn(uri: str) -> str:
        return f"arn:aws:s3:::{uri.removeprefix('s3://')}"

    for suffix in ("html", "json"):
        report = arn(naming.report_key(prefix, run, "score", suffix=suffix))
        assert decide(template, AF, "s3:PutObject", report, {}) and decide(template, AF, "s3:GetObject", report, {})
    reports = arn(naming.report_key(prefix, run, "score")).rsplit("/", 1)[0]
    for other in ("report.js", "index.html", "report.html.bak"):
        assert not decide(template, AF, "s3:PutObject", f"{reports}/{other}", {}), other
    instance = arn(naming.worker_manifest_key(prefix, run, "score", 2, "algo-1"))
    assert decide(template, AF, "s3:GetObject", instance, {})
    assert not decide(template, AF, "s3:PutObject", instance, {})


def test_shardline_metadata_expires_by_the_tag_the_code_puts_on_it(template):
    from shardline.contract import METADATA_TAGGING

    key, value = METADATA_TAGGING.split("=")
    rules = template["Resources"]["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    (rule,) = [r for r in rules if r["Id"] == "expire-shardline-metadata"]
    assert rule["Status"] == "Enabled" and rule["TagFilters"] == [{"Key": key, "Value": value}]
    assert rule["ExpirationInDays"] == {"Ref": "MetadataRetentionDays"}
    assert template["Parameters"]["MetadataRetentionDays"]["MinValue"] >= 30
    # The Airflow role may tag exactly what it writes there.
    from shardline.planning import naming

    values = example_values(template)
    prefix = f"s3://{values['DataBucket']}/{values['OutputPrefix']}churn/scores/"
    part = naming.rejects_parts_prefix(prefix, "r", "score", 2) + "x.rejects-a2.csv"
    for uri in (
        naming.report_key(prefix, "r", "score"),
        naming.manifest_key(prefix, "r", "score", 1),
        naming.outputs_manifest_key(prefix, "r", "score"),
        part,
    ):
        assert decide(template, AF, "s3:PutObjectTagging", f"arn:aws:s3:::{uri.removeprefix('s3://')}", {}), uri
    # `resubmit --rejects` writes a part where the orchestrator writes the input manifests; the job reads it.
    assert decide(template, AF, "s3:PutObject", f"arn:aws:s3:::{part.removeprefix('s3://')}", {})
    assert decide(template, SM, "s3:GetObject", f"arn:aws:s3:::{part.removeprefix('s3://')}", {}, Pipeline="churn")


def test_pipeline_parameter_is_required_and_takes_exactly_the_specs_pipeline_names(template):
    from shardline.spec import NAME_PATTERN

    assert "Default" not in template["Parameters"]["Pipeline"]  # no `*`, no stack for every pipeline
    pattern = template["Parameters"]["Pipeline"]["AllowedPattern"]
    for name in ("*", "daily_churn", "a", "x-1", "a" * 40, "a" * 41, "", "Daily", "1abc", "a*", "RUN#x", "a?b"):
        assert bool(re.fullmatch(pattern, name)) == bool(re.fullmatch(NAME_PATTERN, name)), name


def test_list_bucket_prefixes(template):
    values = example_values(template)
    bucket_arn = values["DataBucket.Arn"]

    def prefixes(role: str) -> list[str]:
        (listing,) = [s for s in statements(template, role) if s["Action"] == "s3:ListBucket"]
        assert resolve(listing["Resource"], values) == bucket_arn
        return resolve(listing["Condition"]["StringLike"]["s3:prefix"], values)

    planner_lists = [values["InputPrefix"] + "events/dt=2026-11-22/", values["OutputPrefix"] + "scores/"]
    assert all(any(iam_match(p, key) for p in prefixes("AirflowRole")) for key in planner_lists)
    model_listing = values["ModelPrefix"] + "xgboost/v1/model.tar.gz"  # S3Prefix input of the model
    assert any(iam_match(p, model_listing) for p in prefixes("SageMakerExecutionRole"))
    for role in ROLES:
        assert not any(iam_match(p, "") or iam_match(p, "other/") for p in prefixes(role)), role
    warehouse = values["TableWarehousePrefix"] + "scoring.db/churn/metadata/00001-x.metadata.json/"
    assert not any(iam_match(p, warehouse) for role in ROLES for p in prefixes(role)), "no table: no listing"


def test_prefix_rules_keep_the_tables_metadata_apart_from_what_jobs_write(template):
    values = example_values(template)
    rules = [a for a in template["Rules"]["PrefixesAreDistinct"]["Assertions"]]
    for other in ("OutputPrefix", "InputPrefix"):
        clash = example_values(template, TableWarehousePrefix=values[other])
        assert not all(resolve(rule["Assert"], clash) for rule in rules), other
    assert all(resolve(rule["Assert"], values) for rule in rules)


def test_prefix_parameters_cannot_be_empty_or_whole_bucket(template):
    for name in ("InputPrefix", "OutputPrefix", "ModelPrefix", "TableWarehousePrefix"):
        pattern = template["Parameters"][name]["AllowedPattern"]
        assert re.fullmatch(pattern, template["Parameters"][name]["Default"])
        for bad in ("", "/", "*", "inputs", "/inputs/"):
            assert not re.fullmatch(pattern, bad), (name, bad)


def test_airflow_ledger_index_is_the_models_index(template):
    from shardline.ledger.table import FAILURES_INDEX_NAME

    values = example_values(template)
    index_arn = f"{values['LedgerTable.Arn']}/index/{FAILURES_INDEX_NAME}"
    assert allows(template, "AirflowRole", "dynamodb:Query", index_arn)
    assert not allows(template, "SageMakerExecutionRole", "dynamodb:Query", index_arn)


# -- DynamoDB permissions against the calls the ledger code makes --------------------------------------------


def dynamodb_requests(calls: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The calls as IAM authorizes them (``shardline.grant.requests``, which the local grant proxy uses too):
    (action, condition context) each. TransactWriteItems has no action of its own: each of its items is
    authorized as the single-item action."""
    return [(r.action, r.context) for operation, kwargs in calls for r in grant_requests(operation, kwargs, REGION)]


def _iam_actions(calls: list[tuple[str, dict]]) -> set[str]:
    """IAM actions a list of DynamoDB API calls needs."""
    return {action for action, _ in dynamodb_requests(calls)}


@pytest.fixture
def record_ledger_calls(monkeypatch):
    from pynamodb.connection.base import Connection

    calls: list[tuple[str, dict]] = []
    lock = threading.Lock()
    original = Connection.dispatch

    def dispatch(self, operation_name, operation_kwargs):
        with lock:
            calls.append((operation_name, dict(operation_kwargs)))
        return original(self, operation_name, operation_kwargs)

    monkeypatch.setattr(Connection, "dispatch", dispatch)
    return calls


def _granted(template: dict, role: str, resource: str) -> set[str]:
    values = example_values(template)
    return {
        a
        for s in statements(template, role)
        if s["Effect"] == "Allow"
        for a in as_list(s["Action"])
        if a.startswith("dynamodb:") and any(iam_match(r, resource) for r in as_list(resolve(s["Resource"], values)))
    }


@dataclasses.dataclass
class LedgerSession:
    """The DynamoDB calls of one run's life, split by who makes them."""

    model: type
    planned: list  # the orchestrator planning and retrying (Airflow)
    worker: list  # a processing instance, on every path (SageMaker execution role)
    read: list  # the watch task finishing, the CLI and the UI page (Airflow)


@pytest.fixture
def ledger_session(template, ledger_table, record_ledger_calls) -> LedgerSession:
    from shardline.ledger.job_writes import FinishedFile, LedgerContext, StaleAttemptError, WorkerLedger
    from shardline.ledger.keys import RUN_SK, run_pk
    from shardline.ledger.requests import RequestCounter
    from shardline.ledger.states import FileStatus, ShardStatus, StepStatus
    from shardline.ledger.step_reads import list_runs, read_run, read_step
    from shardline.ledger.step_writes import ensure_run, finish_step, set_run_status, start_attempt
    from shardline.ledger.table import bind_ledger

    calls = record_ledger_calls
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", "run-1")
    ensure_run(model, "p", "run-1")
    start_attempt(model, StepRef("p", "run-1", "score"), 1, [(f"s3://b/in/part-{i}.parquet", 10) for i in range(30)])
    planned = list(calls)
    calls.clear()

    values = example_values(template)
    output_uri = f"s3://{values['DataBucket']}/{values['OutputPrefix']}p/dt=2026-11-22/"
    hold_run(model, "p", "run-1", "score", output_uri)  # what the worker checks before each upload
    calls.clear()
    ctx = LedgerContext(
        table=ledger_table,
        pipeline="p",
        run_id="run-1",
        step="score",
        attempt=1,
        input_uri="s3://b/in/",
        output_uri=output_uri,
    )
    # As the worker makes it: with its start, and its AWS requests counted (both written with each heartbeat)
    worker = WorkerLedger(ctx, "algo-1", started_at=dt.datetime.now(dt.UTC), requests=RequestCounter())
    worker.heartbeat(ShardStatus.RUNNING, files_assigned=2, files_done=0, files_failed=0, rows_done=0)
    worker.claim_file("part-0.parquet")
    worker.confirm_claim("part-0.parquet")  # before its upload: the file, the run and the prefix's holder
    worker.finish_file(
        "part-0.parquet",
        FinishedFile(
            FileStatus.SUCCEEDED,
            rows_in=1,
            rows_out=1,
            bytes_in=9,
            bytes_out=7,
            seconds=0.5,
            output_key="out/part-0.parquet",
        ),
    )
    worker.claim_file("part-1.parquet")
    worker.finish_file("part-1.parquet", FinishedFile(FileStatus.FAILED, error_class="E", error_message="x"))
    worker.heartbeat(ShardStatus.SUCCEEDED, files_assigned=2, files_done=1, files_failed=1, rows_done=1)
    worker_calls = list(calls)
    calls.clear()

    # A retry: part-2 moves to attempt 2, and the attempt-1 worker is now a zombie.
    start_attempt(model, StepRef("p", "run-1", "score"), 2, [("s3://b/in/part-2.parquet", 10)])
    planned += calls
    calls.clear()
    with pytest.raises(StaleAttemptError):  # the fenced paths make the same calls
        worker.heartbeat(ShardStatus.RUNNING, files_assigned=2, files_done=1, files_failed=1, rows_done=1)
    with pytest.raises(StaleAttemptError):
        worker.finish_file("part-2.parquet", FinishedFile(FileStatus.SUCCEEDED))
    worker_calls += calls
    calls.clear()

    read_step(model, StepRef("p", "run-1", "score"))
    # What the watch task records at the end, and what the CLI and the UI page read and write.
    finish_step(model, StepRef("p", "run-1", "score"), 2, StepStatus.FAILED, "1 file failed")
    set_run_status(model, "p", "run-1", StepStatus.FAILED, "step score failed")
    list_runs(model)
    list_runs(model, "p")
    read_run(model, "p", "run-1")
    list(model.batch_get([(run_pk("p", "run-1"), RUN_SK)]))
    read = list(calls)
    calls.clear()
    return LedgerSession(model, planned, worker_calls, read)


def test_dynamodb_grants_match_what_the_ledger_code_calls(template, ledger_session):
    table_arn = example_values(template)["LedgerTable.Arn"]
    worker_needs = _iam_actions(ledger_session.worker)
    assert worker_needs == {"dynamodb:UpdateItem", "dynamodb:ConditionCheckItem", "dynamodb:GetItem"}  # sanity
    # Exactly what the worker uses, nothing more.
    assert _granted(template, SM, table_arn) == worker_needs

    orchestrator_needs = _iam_actions(ledger_session.planned + ledger_session.read)
    assert orchestrator_needs >= {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:BatchWriteItem",
        "dynamodb:Query",
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
    }
    missing = orchestrator_needs - _granted(template, AF, table_arn)
    assert not missing, f"the Airflow role lacks {sorted(missing)}"


def test_every_worker_call_passes_the_execution_roles_conditions(template, ledger_session):
    """The real requests (keys, attributes, ReturnValues) pass LeadingKeys, Attributes and ReturnValues in
    the stack of the worker's own pipeline; the stack of another refuses them all: a job of pipeline A cannot
    write pipeline B's ledger items."""
    table_arn = example_values(template)["LedgerTable.Arn"]
    requests = dynamodb_requests(ledger_session.worker)
    denied = [
        (action, context)
        for action, context in requests
        if not decide(template, SM, action, table_arn, context, Pipeline="p")
    ]
    assert not denied, "the execution role would refuse the worker's own calls:\n" + "\n".join(map(str, denied))
    assert not any(decide(template, SM, action, table_arn, context, Pipeline="other") for action, context in requests)


def _granted_attributes(template: dict, action: str) -> set[str]:
    (statement,) = [s for s in statements(template, SM) if action in as_list(s["Action"])]
    return set(statement["Condition"]["ForAllValues:StringEquals"]["dynamodb:Attributes"])


def _worker_code_attributes() -> set[str]:
    """Stored names of the model attributes shardline.ledger.job_writes refers to as ``m.<attribute>``
    (``m = self.model``), in any branch, whether or not the recorded session reached it."""
    import ast

    from shardline.ledger import job_writes
    from shardline.ledger.table import LedgerItem

    attributes = LedgerItem.get_attributes()
    tree = ast.parse(Path(job_writes.__file__).read_text())
    named = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "m"
        and node.attr in attributes
    }
    assert {"status", "attempt", "heartbeat_at"} <= named  # the scan still sees the worker's writes
    return {attributes[name].attr_name for name in named}


def test_worker_may_update_exactly_the_attributes_the_worker_code_writes(template, ledger_session):
    """dynamodb:Attributes of the execution role is the worker's FILE and SHARD attributes, from the code:
    an attribute the worker starts writing and the policy lacks fails here, as does one granted in vain."""
    from shardline.ledger.table import LedgerItem

    requests = dynamodb_requests(ledger_session.worker)
    updated = {a for action, c in requests if action == "dynamodb:UpdateItem" for a in c["dynamodb:Attributes"]}
    checked = {a for action, c in requests if action == "dynamodb:ConditionCheckItem" for a in c["dynamodb:Attributes"]}
    granted = _granted_attributes(template, "dynamodb:UpdateItem")
    assert granted == updated, (
        f"granted but never written: {sorted(granted - updated)}; written but not granted: {sorted(updated - granted)}"
    )
    assert LedgerItem._ttl_attribute().attr_name in updated  # every worker write sets the expiry
    assert _worker_code_attributes() <= granted, sorted(_worker_code_attributes() - granted)
    assert _granted_attributes(template, "dynamodb:ConditionCheckItem") == checked == {"pk", "sk", "oat", "olv"}
    # What the orchestrator alone owns (every RUN and STEP attribute but the keys) is never the worker's to write.
    from shardline.ledger.table import ControlItem

    orchestrator_only = {a.attr_name for a in ControlItem.get_attributes().values()} - {"pk", "sk", "ttl"}
    assert {"ost", "oat", "pj", "msg"} <= orchestrator_only
    assert not orchestrator_only & granted


def test_worker_may_not_ask_for_whole_items_back(template, ledger_session):
    """ReturnValues: never ALL_OLD; ALL_NEW only as long as the worker's pynamodb calls send it."""
    (update,) = [s for s in statements(template, SM) if "dynamodb:UpdateItem" in as_list(s["Action"])]
    granted = set(update["Condition"]["StringEqualsIfExists"]["dynamodb:ReturnValues"])
    sent = {
        c["dynamodb:ReturnValues"] for _, c in dynamodb_requests(ledger_session.worker) if "dynamodb:ReturnValues" in c
    }
    assert "ALL_OLD" not in granted
    whole_items = granted - {"NONE", "UPDATED_OLD", "UPDATED_NEW"}
    assert whole_items <= sent, f"{sorted(whole_items - sent)} is granted but the worker no longer sends it: drop it"


def _forge(model, calls: list, write) -> list[tuple[str, dict]]:
    """What a malicious model could send with the execution role's credentials, as IAM sees it.
    moto does not enforce IAM, so the call goes through there; the verdict is the policy's."""
    calls.clear()
    write()
    requests = dynamodb_requests(calls)
    calls.clear()
    return requests


@pytest.mark.parametrize("pipeline", ["*", "p"])
def test_worker_role_cannot_rewrite_plans_messages_or_whole_items(
    template, ledger_session, record_ledger_calls, pipeline
):
    from shardline.ledger.keys import RUN_SK, RUNS_PK, file_sk, run_pk, runs_pk, step_sk

    m, calls = ledger_session.model, record_ledger_calls
    pk, table_arn = run_pk("p", "run-1"), example_values(template)["LedgerTable.Arn"]
    file_item = (pk, file_sk("score", "s3://b/in/part-0.parquet"))
    connection = m._get_connection()
    forgeries = {
        # The plan the CLI and the UI resubmit from, and the messages on-call reads.
        "rewrite the plan": lambda: m.Control(pk, step_sk("score")).update(
            actions=[m.Control.plan_json.set('{"files": []}')]
        ),
        "rewrite a step message": lambda: m.Control(pk, step_sk("score")).update(
            actions=[m.Control.message.set("all good")]
        ),
        "rewrite a run message": lambda: m.Control(pk, RUN_SK).update(actions=[m.Control.message.set("all good")]),
        # The run index the CLI and the UI list from.
        "touch the run index": lambda: m(runs_pk("p"), "x").update(actions=[m.status.set("SUCCEEDED")]),
        "touch the global run index": lambda: m(RUNS_PK, "x").update(actions=[m.status.set("SUCCEEDED")]),
        # Whole-item writes and reads.
        "replace a file item": lambda: m(*file_item, status="SUCCEEDED", attempt=9).save(),
        "delete a file item": lambda: m(*file_item).delete(),
        "read the step": lambda: m.get(pk, step_sk("score")),
        "query the run": lambda: list(m.query(pk)),
        "update returning the old item": lambda: connection.update_item(
            *file_item, actions=[m.status.set("SUCCEEDED")], return_values="ALL_OLD"
        ),
    }
    allowed = {}
    for what, write in forgeries.items():
        requests = _forge(m, calls, write)
        assert requests, what
        allowed[what] = [a for a, c in requests if decide(template, SM, a, table_arn, c, Pipeline=pipeline)]
    assert not any(allowed.values()), {what: actions for what, actions in allowed.items() if actions}

    # Another pipeline's items: refused by a stack serving one pipeline; a stack for every pipeline
    # cannot tell them apart (infra/README.md says so).
    other = _forge(
        m, calls, lambda: m(run_pk("other", "run-1"), file_item[1]).update(actions=[m.status.set("SUCCEEDED")])
    )
    assert all(decide(template, SM, a, table_arn, c, Pipeline=pipeline) == (pipeline == "*") for a, c in other)


def test_worker_role_cannot_set_a_step_or_run_status_or_attempt(template, ledger_session, record_ledger_calls):
    from shardline.ledger.keys import RUN_SK, run_pk, step_sk

    m, calls = ledger_session.model, record_ledger_calls
    pk, table_arn = run_pk("p", "run-1"), example_values(template)["LedgerTable.Arn"]
    forgeries = [
        # RUN and STEP items keep their status and attempt under names of their own (shardline.ledger's
        # ControlItem), which the job role's dynamodb:Attributes grant does not list.
        lambda: m.Control(pk, step_sk("score")).update(actions=[m.Control.status.set("SUCCEEDED")]),
        lambda: m.Control(pk, step_sk("score")).update(actions=[m.Control.attempt.set(1)]),
        lambda: m.Control(pk, RUN_SK).update(actions=[m.Control.status.set("SUCCEEDED")]),
    ]
    for write in forgeries:
        for action, context in _forge(m, calls, write):
            assert not decide(template, SM, action, table_arn, context, Pipeline="p"), context


# -- parameters, outputs and the README ---------------------------------------------------------------------


def test_parameters_are_documented_and_constrained(template):
    for name, param in template["Parameters"].items():
        assert param.get("Description"), name
        if param["Type"] == "String":
            assert "AllowedPattern" in param or "AllowedValues" in param, name
            if "AllowedPattern" in param and param.get("Default"):
                assert re.fullmatch(param["AllowedPattern"], param["Default"]), name
        if param["Type"] == "Number":
            assert "MinValue" in param and "MaxValue" in param, name


def test_no_hard_coded_accounts_or_regions():
    text = TEMPLATE.read_text()
    assert not re.search(r"(?<![\w{])\d{12}(?!\w)", text), "a literal account id"
    region = r"\b(us|eu|ap|sa|ca|me|af|il|mx|cn)-(gov-)?(north|south|east|west|central)+(east|west)?-\d\b"
    assert not re.search(region, text), "a literal region"
    assert "arn:aws:" not in text, "a literal partition: use ${AWS::Partition}"


def test_outputs_are_exported(template):
    wanted = {
        "LedgerTableName",
        "DataBucketName",
        "SageMakerExecutionRoleArn",
        "AirflowRoleArn",
        "WorkerRepositoryUri",
        "KmsKeyArn",
    }
    assert wanted <= set(template["Outputs"])
    for name, output in template["Outputs"].items():
        assert output["Export"]["Name"] == {"Fn::Sub": f"${{AWS::StackName}}-{name}"}, name
        assert output.get("Description"), name


def test_outputs_name_real_pipeline_spec_fields(template):
    from shardline.spec import PipelineSpec

    named = {}
    for name, output in template["Outputs"].items():
        match = re.search(r"Pipeline spec: ([a-z_.]+)", output["Description"])
        if match:
            named[name] = match.group(1)
    assert set(named) >= {"LedgerTableName", "SageMakerExecutionRoleArn", "WorkerRepositoryUri", "KmsKeyArn"}
    for name, path in named.items():
        model = PipelineSpec
        *parents, leaf = path.split(".")
        for part in parents:
            model = model.model_fields[part].annotation
        assert leaf in model.model_fields, f"output {name} names {path}, which the pipeline spec lacks"


def test_readme_documents_every_parameter_and_output(template):
    readme = INFRA_README.read_text()
    for name in [*template["Parameters"], *template["Outputs"]]:
        assert f"`{name}`" in readme, f"infra/README.md does not mention {name}"
    assert "CAPABILITY_NAMED_IAM" in readme
    assert "cfn-lint infra/cloudformation/*.yaml" in readme


# -- Glue: Airflow's role may make exactly the calls a table commit makes ---------------------------------------


@dataclasses.dataclass
class _Recorded:
    """The requests a commit sent through the recording proxy: Glue's operations (their X-Amz-Target) and S3's
    (method and path)."""

    glue: list[str] = dataclasses.field(default_factory=list)
    s3: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def hear(self, chunk: bytes) -> None:
        head = chunk.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        request = re.match(r"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.[01]\r\n", head)
        if request is None:
            return  # a body's continuation
        target = re.search(r"(?im)^x-amz-target: *AWSGlue\.(\w+)", head)
        if target:
            self.glue.append(f"glue:{target.group(1)}")
        else:
            self.s3.append((request.group(1), request.group(2)))


def _s3_action(method: str, path: str, values: dict) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """The IAM action, resource and condition context of a path-style S3 request, on the template's data bucket."""
    from urllib.parse import parse_qs, unquote, urlsplit

    parts = urlsplit(path)
    _, _, key = unquote(parts.path).lstrip("/").partition("/")
    bucket_arn = values["DataBucket.Arn"]
    if not key:
        query = parse_qs(parts.query)
        assert method == "GET" and "list-type" in query, (method, path)
        return "s3:ListBucket", bucket_arn, (("s3:prefix", query.get("prefix", [""])[0]),)
    action = {"GET": "s3:GetObject", "HEAD": "s3:GetObject", "PUT": "s3:PutObject", "POST": "s3:PutObject"}[method]
    return action, f"{bucket_arn}/{key}", ()


def test_airflow_may_commit_a_glue_table_exactly_as_the_commit_calls_and_no_job_may(
    template, aws_env, tmp_path, monkeypatch
):
    """Two runs of a partition committed through a `type: glue` catalog on the embedded endpoint (the first makes the
    namespace and the table, the second replaces the partition), every request recorded at a proxy in front of it.
    Airflow's role, in a stack with TableNamespace, is granted exactly the Glue operations the commits made and every
    S3 request they made; the execution role none of the Glue ones and no write of the tables' metadata; and a stack
    without TableNamespace gives Airflow's role no Glue right at all."""
    import io
    import os

    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from shardline.orchestration import tables
    from shardline.planning.attempt import Attempt
    from shardline.spec import load_spec
    from tests.support.faults import TcpProxy

    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    bucket = f"t-{os.urandom(4).hex()}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    out = f"outputs/{REQUIRED_EXAMPLES['Pipeline']}/scores/"  # the template's layout: OutputPrefix, the pipeline
    dags = tmp_path / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "catalogs.yaml").write_text(
        "catalog:\n  lake:\n    type: glue\n    glue.endpoint: ${AWS_ENDPOINT_URL}\n    glue.region: us-east-1\n"
        f"    warehouse: s3://{bucket}/warehouse/\n    s3.endpoint: ${{AWS_ENDPOINT_URL}}\n    s3.region: us-east-1\n"
    )
    spec_file = dags / "pipelines" / "churn.yaml"
    table = {"catalog": "lake", "namespace": "scoring", "name": "churn", "partition": {"dt": "{{ ds }}"}}
    step = {
        "name": "score",
        "model": {"uri": f"s3://{bucket}/models/m.tar.gz", "sha256": "0" * 64},
        "input": {"prefix": f"s3://{bucket}/inputs/"},
        "output": {"prefix": f"s3://{bucket}/{out}", "table": table},
    }
    spec_file.write_text(yaml.safe_dump({"pipeline": "churn", "steps": [step]}))
    spec = load_spec(spec_file)

    def output(run: str, rows: int) -> dict:
        body = io.BytesIO()
        pq.write_table(
            pa.table({"id": list(range(rows)), "prediction": [0.5] * rows, "dt": ["2026-12-01"] * rows}), body
        )
        key = f"{out}part-00000.{run}.parquet"
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body.getvalue())
        return {"output": f"s3://{bucket}/{key}", "rows_out": rows}

    runs = {"run-1": [output("run-1", 5)], "run-2": [output("run-2", 3)]}  # written as a job would, not recorded
    recorded = _Recorded()
    upstream = re.match(r"http://([\d.]+):(\d+)", aws_env["AWS_ENDPOINT_URL"])
    with TcpProxy((upstream.group(1), int(upstream.group(2))), before_forwarding=recorded.hear) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        for run, outputs in runs.items():
            attempt = Attempt(
                pipeline="churn",
                run_id=run,
                step="score",
                number=1,
                input_prefix=step["input"]["prefix"],
                output_prefix=step["output"]["prefix"],
                model_uri=step["model"]["uri"],
                table_partition={"dt": "2026-12-01"},
            )
            assert tables.commit_partition(spec, attempt, outputs).rows_added == outputs[0]["rows_out"]
        assert tables.scanned_rows(spec, "score", {"dt": "2026-12-01"}) == 3

    values = example_values(template)
    prefix = f"arn:aws:glue:{REGION}:{ACCOUNT}:"
    glue_resources = [f"{prefix}catalog", f"{prefix}database/scoring", f"{prefix}table/scoring/churn"]
    used = set(recorded.glue)
    assert {"glue:CreateTable", "glue:UpdateTable", "glue:GetTable"} <= used, used  # sanity: the commits were heard
    glue_granted = {a for s in statements(template, AF) for a in as_list(s["Action"]) if a.startswith("glue:")}
    assert glue_granted == used, "grant exactly the Glue operations a commit makes"
    for action in used:
        resources = glue_resources if "Table" in action else glue_resources[:2]
        for resource in resources:
            assert decide(template, AF, action, resource, {}, TableNamespace="scoring"), (action, resource)
            assert not decide(template, AF, action, resource, {}), f"{action} without TableNamespace"
            if not resource.endswith(":catalog"):  # the account's catalog is every namespace's
                assert not decide(template, AF, action, resource, {}, TableNamespace="other"), (action, resource)
            assert not decide(template, SM, action, resource, {}, TableNamespace="scoring"), action

    s3_calls = {_s3_action(method, path, values) for method, path in recorded.s3}
    warehouse = f"{values['DataBucket.Arn']}/warehouse/"
    assert any(r.startswith(warehouse) for _, r, _ in s3_calls), s3_calls
    for action, resource, context in sorted(s3_calls):
        assert decide(template, AF, action, resource, dict(context), TableNamespace="scoring"), (action, resource)
        if resource.startswith(warehouse) and action != "s3:GetObject":
            assert not decide(template, SM, action, resource, {}, TableNamespace="scoring"), (action, resource)
        if dict(context).get("s3:prefix", "").startswith("warehouse/"):
            assert not decide(template, AF, action, resource, dict(context)), "a warehouse listing without tables"
