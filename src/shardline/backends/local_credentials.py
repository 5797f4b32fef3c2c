"""The credentials a local job's instances hold when its endpoints are AWS's own: the request's role, assumed for
the job with the session policy ``shardline.grant.session`` writes, never the submitter's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from shardline.grant.job import JobGrant, JobScope
from shardline.grant.session import ROLE_SESSION_SECONDS, JobCredentialsError, session_policy


@dataclasses.dataclass(frozen=True)
class JobCredentials:
    access_key: str
    secret_key: str
    token: str
    expires_at: float  # seconds since the epoch

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_SESSION_TOKEN": self.token,
        }


def assume_job_role(request: Mapping, sts, environ: Mapping[str, str]) -> JobCredentials:
    """Temporary credentials of the request's ``RoleArn``, narrowed to the job by its session policy, for as long
    as the job may run (within the role's default session of an hour: a longer job's writes fail once they end)."""
    from botocore.exceptions import BotoCoreError, ClientError

    name = request["ProcessingJobName"]
    policy = session_policy(JobGrant.of(JobScope.of_request(dict(request), environ)))
    runtime = int(request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds", ROLE_SESSION_SECONDS))
    try:
        answer = sts.assume_role(
            RoleArn=request["RoleArn"],
            RoleSessionName=name[:64],
            Policy=policy,
            DurationSeconds=max(900, min(runtime + 300, ROLE_SESSION_SECONDS)),
        )
    except (ClientError, BotoCoreError) as err:
        raise JobCredentialsError(
            f"job {name}: cannot assume its role {request['RoleArn']} ({err}). A local job against AWS holds the "
            "job role's credentials, never this machine's: deploy the stack with LocalJobsPrincipalArn set to the "
            "principal that runs the local backend (infra/README.md), or run the step on SageMaker"
        ) from err
    found = answer["Credentials"]
    return JobCredentials(
        found["AccessKeyId"], found["SecretAccessKey"], found["SessionToken"], found["Expiration"].timestamp()
    )
