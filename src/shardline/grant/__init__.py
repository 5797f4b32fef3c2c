"""The job role's grant, as the CloudFormation template states it, and the local endpoint that enforces it.

On AWS, IAM enforces the template's statements for the SageMaker execution role. Locally, nothing did: a job's
model reached moto_server with every right. ``template`` loads the statements (the one source for both),
``policy`` evaluates them as IAM does, ``requests`` reads an S3 or DynamoDB HTTP request as IAM authorizes it,
``job`` resolves the grant for one processing request, and ``proxy`` is the endpoint a local job's instances
reach AWS through: what the grant allows goes on, the rest is refused with AccessDenied, as AWS would.
"""
