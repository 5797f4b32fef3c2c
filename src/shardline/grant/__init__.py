"""The job role's grant, as the CloudFormation template states it, and the local endpoint that enforces it.

On AWS, IAM enforces the template's statements for the SageMaker execution role. Locally, nothing did: a job's
model reached moto_server with every right. This package enforces the grant locally as IAM enforces it on AWS:

- :mod:`.template`: the CloudFormation template, ``cloudformation.yaml``, loaded and resolved. It is the one source
  for both sides: ``infra/cloudformation/shardline.yaml`` links to it.
- :mod:`.policy`: IAM's evaluation. A request is allowed by an Allow and no Deny; conditions have IAM's semantics.
- :mod:`.requests`: an S3 or DynamoDB HTTP request as IAM authorizes it. What it cannot read is refused.
- :mod:`.job`: the grant of one processing request: its own input, model and output prefix, and its pipeline's
  ledger items.
- :mod:`.proxy`: ``GrantProxy``, the endpoint a local job's instances reach AWS through. What the grant allows goes
  on; the rest is refused with AccessDenied, as AWS would refuse it.
- :mod:`.book`: many jobs' grants behind one endpoint, each found by the job name that signs a request (compose's
  ``grant`` service).
- :mod:`.session`: the session policy that narrows the job role to one job, for a local job whose endpoints are
  AWS itself.
"""
