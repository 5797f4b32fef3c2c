"""Whether a step's model is where its spec says, checked before its job is planned: a missing model fails the
plan task at once, naming the URI and what is there instead, rather than every instance of the job."""

from __future__ import annotations

import logging

from shardline.orchestration import services
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


def model_problem(spec: PipelineSpec, step: str, model_uri: str) -> str | None:
    """Why the step's model cannot be fetched (no object, nor folder, at its URI), naming the URI and what is
    there instead; None when it is there. A setup error like this is the same on every try."""
    from botocore.exceptions import ClientError

    bucket, key = parse_s3_uri(model_uri)
    s3 = services.s3_client(spec)
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return None
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code")
        if code in ("403", "AccessDenied", "Forbidden"):
            # The orchestrator's role need not read models (infra/'s does not): the job checks it, and a model
            # it cannot set up fails the step at once with its reason (a setup error, recorded by the worker).
            log.info(
                "step %s: the model at %s cannot be checked from here (%s); its job checks it", step, model_uri, code
            )
            return None
        if code not in ("404", "NoSuchKey", "NotFound"):
            raise
    # Name what is there one level up (the versions, when the URI is versioned), so the fix is obvious.
    parent = key.rstrip("/").rsplit("/", 2)[0] + "/" if key.count("/") >= 2 else ""
    try:
        if s3.list_objects_v2(Bucket=bucket, Prefix=key.rstrip("/") + "/", MaxKeys=1).get("KeyCount", 0):
            return None  # a folder of model files
        found = s3.list_objects_v2(Bucket=bucket, Prefix=parent, Delimiter="/", MaxKeys=20).get("CommonPrefixes", [])
    except ClientError as err:  # no list permission there: the 404 alone says the object is missing
        log.info("step %s: cannot list beside %s (%s)", step, model_uri, err.response.get("Error", {}).get("Code"))
        found = []
    there = ", ".join(p["Prefix"][len(parent) :].rstrip("/") for p in found)
    hint = f"; under s3://{bucket}/{parent} there are: {there}" if there else ""
    s = spec.step(step)
    field = "the Param model_version or model.uri" if s.model.versioned else "model.uri"
    return f"no model at {model_uri} (check {field}){hint}"
