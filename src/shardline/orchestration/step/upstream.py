"""A step that reads an earlier step's output (``input.from_step``) reads exactly what that step committed.

The earlier step's outputs manifest (written when it ended SUCCEEDED or PARTIAL, see
``outputs.commit_outputs``) names each output it wrote and which attempt wrote it. The later step plans
those objects, never a listing of the prefix: a listing would also find outputs of an older run of the
partition, or of inputs the earlier step no longer has, and score them as if they were this run's.
"""

from __future__ import annotations

import dataclasses
import json

from shardline.errors import PermanentError
from shardline.ledger.keys import StepRef
from shardline.orchestration import services
from shardline.orchestration.step.files import latest_attempt
from shardline.planning import naming
from shardline.planning.inputs import S3Object
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec


class UpstreamError(PermanentError):
    """The earlier step has no committed outputs this step can read; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class UpstreamOutputs:
    step: str
    status: str  # SUCCEEDED or PARTIAL
    manifest_uri: str
    objects: list[S3Object]  # keys relative to the bucket, sizes in bytes
    not_succeeded: list[dict]  # the earlier step's inputs that have no output: input, status, error_class

    def tolerated_text(self, step: str) -> str | None:
        """What a step reading these outputs says about the inputs the earlier step tolerated as failed."""
        if not self.not_succeeded:
            return None
        shown = ", ".join(f"{f['input']} ({f.get('error_class') or f.get('status')})" for f in self.not_succeeded[:5])
        more = f" and {len(self.not_succeeded) - 5} more" if len(self.not_succeeded) > 5 else ""
        return (
            f"step {self.step} ended {self.status} with {len(self.not_succeeded)} input(s) failed within its "
            f"tolerance, so step {step} has no rows for them: {shown}{more}"
        )


def upstream_outputs(spec: PipelineSpec, step: str, run_id: str, input_prefix: str) -> UpstreamOutputs:
    """The outputs ``step``'s ``from_step`` committed in run ``run_id``, as this step's inputs."""
    from botocore.exceptions import ClientError

    source = spec.step(step).input.from_step
    assert source is not None
    earlier = latest_attempt(spec, StepRef(spec.pipeline, run_id, source))
    if earlier is None:
        raise UpstreamError(
            f"step {step} reads step {source}'s outputs, and step {source} was never planned in run {run_id}"
        )
    manifest_uri = naming.outputs_manifest_key(earlier.output_prefix, run_id, source, earlier.metadata_prefix)
    bucket, key = parse_s3_uri(manifest_uri)
    try:
        body = services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey"):
            raise
        raise UpstreamError(
            f"step {source} has not committed its outputs (no {manifest_uri}): step {step} starts "
            f"only once step {source} has ended SUCCEEDED or PARTIAL"
        ) from err
    manifest = _manifest_object(body, manifest_uri, source)
    if manifest.get("status") not in ("SUCCEEDED", "PARTIAL") or manifest.get("run_id") != run_id:
        raise UpstreamError(
            f"{manifest_uri} says step {source} ended {manifest.get('status')} in run "
            f"{manifest.get('run_id')}: step {step} reads only the outputs of a step of this run that "
            "ended SUCCEEDED or PARTIAL"
        )
    if manifest.get("outputs_missing"):
        raise UpstreamError(
            f"step {source}'s outputs manifest {manifest_uri} lists outputs missing from S3 (e.g. "
            f"{manifest['outputs_missing'][0]}): resubmit step {source}'s files first"
        )
    want_bucket, want_key = parse_s3_uri(input_prefix)
    objects = []
    for output in manifest.get("outputs", []):
        if not _is_output_entry(output):
            raise UpstreamError(
                f'{manifest_uri} lists an output that is not an object with an s3:// "output" and a whole number of '
                f'"bytes" ({str(output)[:200]}): it was not written by step {source}\'s end; score step {source} '
                "again: " + naming.rerun_command(spec.pipeline, run_id)
            )
        out_bucket, out_key = parse_s3_uri(output["output"])
        if out_bucket != want_bucket or not out_key.startswith(want_key):
            raise UpstreamError(
                f"{manifest_uri} lists {output['output']}, outside {input_prefix} where step {step} "
                "reads: the spec's output prefix changed under this run; trigger a new run"
            )
        objects.append(S3Object(out_key, output["bytes"]))
    return UpstreamOutputs(source, manifest["status"], manifest_uri, objects, list(manifest.get("not_succeeded", [])))


def _manifest_object(body: bytes, manifest_uri: str, source: str) -> dict:
    """The outputs manifest as the JSON object a step's end writes; anything else is refused, naming it."""
    try:
        manifest = json.loads(body)
    except ValueError:  # not JSON, or not UTF-8
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs", []), list):
        raise UpstreamError(
            f"{manifest_uri} is not an outputs manifest (a JSON object with a list of outputs): it was not written by "
            f"step {source}'s end, or was overwritten since; score step {source} again"
        )
    return manifest


def _is_output_entry(output: object) -> bool:
    return (
        isinstance(output, dict)
        and isinstance(output.get("output"), str)
        and output["output"].startswith("s3://")
        and isinstance(output.get("bytes"), int)
        and not isinstance(output["bytes"], bool)
        and output["bytes"] >= 0
    )
