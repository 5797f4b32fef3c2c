"""One local job's grant: the template's job-role statements with this job's own prefixes, table and pipeline.

On AWS a deployment has one data bucket and lays a pipeline's outputs out as ``<OutputPrefix><Pipeline>/``. A
local job's prefixes are its spec's own, in any bucket. So for S3 every ARN is read in one bucket-wide namespace
(``arn:aws:s3:::<namespace>/<bucket>/<key>``; a listing's ``s3:prefix`` is ``<bucket>/<prefix>``), and the
template's prefix parameters are the job's: ``InputPrefix`` its input, ``ModelPrefix`` its model, and
``OutputPrefix`` + ``Pipeline`` its output prefix exactly (so "its pipeline's outputs" becomes "its own output
prefix"). For DynamoDB ``Pipeline`` is the pipeline's name and the table is the ledger's, but a statement about an
output prefix's lock item (``PARTITION#s3://...``) is read as the S3 ones are. Nothing else is
written twice: what a job may do is what the template says, evaluated as IAM does (``policy``).
"""

from __future__ import annotations

import dataclasses

from shardline.grant.policy import IamRequest, allowed
from shardline.grant.requests import LOCAL_ACCOUNT, table_arn
from shardline.grant.template import JOB_ROLE, resolved_statements, shipped, with_conditions
from shardline.ledger.context import ENV_INPUT_URI, ENV_MANIFEST_URI, ENV_OUTPUT_URI, ENV_PIPELINE, ENV_TABLE
from shardline.ledger.keys import partition_lock_pk
from shardline.s3uri import path_of

S3_NAMESPACE = "shardline-local"  # the one bucket every local S3 ARN is read in (see the module's docstring)
LOCK_KEY_PREFIX = partition_lock_pk("")  # an output prefix's lock item: PARTITION#s3://bucket/key/


@dataclasses.dataclass(frozen=True)
class JobScope:
    """What one job works on: the values its grant is resolved with."""

    pipeline: str
    table: str
    region: str
    input_uri: str
    model_uri: str
    output_uri: str
    manifest_uri: str = ""  # where its instances' manifests go: under the output, or under a metadata_prefix

    @classmethod
    def of_request(cls, request: dict, environ) -> JobScope:
        """The scope of a CreateProcessingJob request Shardline built: its ledger identity and prefixes travel in
        its Environment, its model is its ``model`` input. ``environ``: the region when the request has none."""
        env = request.get("Environment", {})
        models = [i["S3Input"]["S3Uri"] for i in request.get("ProcessingInputs", []) if i.get("InputName") == "model"]
        missing = [n for n in (ENV_PIPELINE, ENV_TABLE, ENV_INPUT_URI, ENV_OUTPUT_URI) if not env.get(n)]
        if missing or not models:
            raise ValueError(
                f"job {request.get('ProcessingJobName')}: no grant can be resolved for a request without "
                f"{', '.join(missing) or 'a model input'} (only requests Shardline builds run locally)"
            )
        region = env.get("AWS_REGION") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(
            env[ENV_PIPELINE],
            env[ENV_TABLE],
            region,
            env[ENV_INPUT_URI],
            models[0],
            env[ENV_OUTPUT_URI],
            env.get(ENV_MANIFEST_URI, ""),
        )


def _template_values(template: dict, scope: JobScope, *, for_s3: bool, output_uri: str | None = None) -> dict:
    values: dict = {
        "AWS::Partition": "aws",
        "AWS::Region": scope.region,
        "AWS::AccountId": LOCAL_ACCOUNT,
        "AWS::StackName": "local",
        "AWS::URLSuffix": "amazonaws.com",
    }
    for name, parameter in template["Parameters"].items():
        value = parameter.get("Default", "")
        values[name] = value.split(",") if parameter["Type"] == "CommaDelimitedList" else str(value)
    output = path_of(output_uri or scope.output_uri).rstrip("/")
    parent, _, last = output.rpartition("/")
    if for_s3:
        # <OutputPrefix><Pipeline>/ is the job's output prefix, exactly.
        values |= {"OutputPrefix": f"{parent}/" if parent else "", "Pipeline": last}
    else:
        values |= {"OutputPrefix": "", "Pipeline": scope.pipeline}
    values |= {
        "InputPrefix": path_of(scope.input_uri),
        "ModelPrefix": path_of(scope.model_uri),
        "LedgerTableName": scope.table,
        "DataBucket": S3_NAMESPACE,
        "DataBucket.Arn": f"arn:aws:s3:::{S3_NAMESPACE}",
        "AccessLogBucket.Arn": f"arn:aws:s3:::{S3_NAMESPACE}-logs",
        "LedgerTable": scope.table,
        "LedgerTable.Arn": table_arn(scope.region, scope.table),
        "Key.Arn": f"arn:aws:kms:{scope.region}:{LOCAL_ACCOUNT}:key/local",
        "SageMakerExecutionRole.Arn": f"arn:aws:iam::{LOCAL_ACCOUNT}:role/local-job",
        "WorkerRepository.Arn": f"arn:aws:ecr:{scope.region}:{LOCAL_ACCOUNT}:repository/local",
    }
    return with_conditions(template, values)


@dataclasses.dataclass(frozen=True)
class JobGrant:
    """The job role's statements, resolved for one job: ``allows`` answers for each request as IAM would."""

    scope: JobScope
    s3_statements: tuple[dict, ...]
    dynamodb_statements: tuple[dict, ...]

    @classmethod
    def of(cls, scope: JobScope, template: dict | None = None) -> JobGrant:
        template = template or shipped()
        s3 = resolved_statements(template, JOB_ROLE, _template_values(template, scope, for_s3=True))
        if scope.manifest_uri and not scope.manifest_uri.startswith(scope.output_uri.rstrip("/") + "/"):
            # Its instances' manifests go under a metadata_prefix, away from the outputs: the same statements with
            # that folder as the job's "output" (its manifests, and no _SUCCESS, report or input manifest there).
            values = _template_values(template, scope, for_s3=True, output_uri=scope.manifest_uri)
            s3 += resolved_statements(template, JOB_ROLE, values)
        by_pipeline = resolved_statements(template, JOB_ROLE, _template_values(template, scope, for_s3=False))
        # A statement about output prefixes' lock items names the prefix as the S3 statements do: it is read with
        # the job's own output prefix, in the namespace, as they are.
        by_output = resolved_statements(template, JOB_ROLE, _template_values(template, scope, for_s3=True))
        ledger = [s for s in by_pipeline if not _about_prefix_locks(s)]
        ledger += [s for s in by_output if _about_prefix_locks(s)]
        return cls(scope, tuple(s3), tuple(ledger))

    @property
    def buckets(self) -> frozenset[str]:
        """The buckets the job's prefixes are in: the only ones a bucket-level call may name."""
        uris = (self.scope.input_uri, self.scope.model_uri, self.scope.output_uri)
        return frozenset(path_of(u).split("/", 1)[0] for u in uris)

    def allows(self, request: IamRequest) -> bool:
        if request.action.lower().startswith("s3:"):
            return allowed(list(self.s3_statements), _in_namespace(request, self.buckets))
        if request.action.lower().startswith("dynamodb:"):
            return allowed(list(self.dynamodb_statements), _lock_keys_in_namespace(request))
        return False  # a job reaches S3 and the ledger only


def _about_prefix_locks(statement: dict) -> bool:
    """Whether a DynamoDB statement is about output prefixes' lock items (its leading keys are theirs)."""
    conditions = statement.get("Condition", {}).values()
    keys = [k for c in conditions if isinstance(c, dict) for k in _as_list(c.get("dynamodb:LeadingKeys", []))]
    return any(str(k).startswith(LOCK_KEY_PREFIX) for k in keys)


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _lock_keys_in_namespace(request: IamRequest) -> IamRequest:
    """A DynamoDB request whose leading key is an output prefix's lock item, with the prefix read in the local
    namespace (``PARTITION#s3://<namespace>/<bucket>/<key>``), as an S3 request's ARN is."""
    keys = request.context.get("dynamodb:LeadingKeys") or []
    if not any(str(k).startswith(LOCK_KEY_PREFIX) for k in keys):
        return request
    scheme = LOCK_KEY_PREFIX + "s3://"
    read = [f"{scheme}{S3_NAMESPACE}/{str(k)[len(scheme) :]}" if str(k).startswith(scheme) else str(k) for k in keys]
    return dataclasses.replace(request, context={**request.context, "dynamodb:LeadingKeys": read})


def _in_namespace(request: IamRequest, buckets: frozenset[str]) -> IamRequest:
    """An S3 request with its ARN (and listing prefix) read in the one local namespace. A bucket-level call on
    another bucket than the job's stays as it is: no statement of the job's names it."""
    prefix = "arn:aws:s3:::"
    if not request.resource.startswith(prefix):
        return request  # "*" (ListAllMyBuckets): no statement of the job's names it
    bucket, slash, key = request.resource[len(prefix) :].partition("/")
    if slash:
        return dataclasses.replace(request, resource=f"{prefix}{S3_NAMESPACE}/{bucket}/{key}")
    if bucket not in buckets:
        return request
    context = dict(request.context)
    if "s3:prefix" in context:
        context["s3:prefix"] = f"{bucket}/{context['s3:prefix']}"
    else:
        # A bucket-level call names the bucket only by its ARN: here that is its listing prefix, so the grant's
        # conditions on s3:prefix still see which bucket it is (a listing with no prefix lists the whole bucket).
        context["s3:prefix"] = f"{bucket}/"
    return dataclasses.replace(request, resource=f"{prefix}{S3_NAMESPACE}", context=context)
