"""An S3 or DynamoDB HTTP request read as IAM authorizes it; what cannot be read one way only is refused."""

from __future__ import annotations

import json

import pytest

from shardline.grant.requests import Unreadable, requests_of

SIGNATURE = ", SignedHeaders=host;x-amz-date, Signature=0f1e"
SIGNED = {"authorization": "AWS4-HMAC-SHA256 Credential=AK/20261128/us-east-1/s3/aws4_request" + SIGNATURE}
DYNAMO = {
    "authorization": "AWS4-HMAC-SHA256 Credential=AK/20261128/eu-west-1/dynamodb/aws4_request" + SIGNATURE,
    "x-amz-target": "DynamoDB_20120810.TransactWriteItems",
}


def s3(method: str, path: str, headers: dict | None = None, body: bytes = b"") -> list[tuple[str, str, dict]]:
    return [(r.action, r.resource, r.context) for r in requests_of(method, path, {**SIGNED, **(headers or {})}, body)]


@pytest.mark.parametrize(
    ("method", "path", "action", "resource"),
    [
        ("GET", "/b/out/part-0.parquet", "s3:GetObject", "arn:aws:s3:::b/out/part-0.parquet"),
        ("HEAD", "/b/out/part-0.parquet?x-id=HeadObject", "s3:GetObject", "arn:aws:s3:::b/out/part-0.parquet"),
        ("PUT", "/b/out/a%20b.parquet", "s3:PutObject", "arn:aws:s3:::b/out/a b.parquet"),
        ("POST", "/b/out/big?uploads", "s3:PutObject", "arn:aws:s3:::b/out/big"),
        ("PUT", "/b/out/big?partNumber=2&uploadId=u", "s3:PutObject", "arn:aws:s3:::b/out/big"),
        ("POST", "/b/out/big?uploadId=u", "s3:PutObject", "arn:aws:s3:::b/out/big"),
        ("DELETE", "/b/out/big?uploadId=u", "s3:AbortMultipartUpload", "arn:aws:s3:::b/out/big"),
        ("DELETE", "/b/out/x", "s3:DeleteObject", "arn:aws:s3:::b/out/x"),
        ("PUT", "/b/out/x?acl", "s3:PutObjectAcl", "arn:aws:s3:::b/out/x"),
        ("GET", "/b?location", "s3:GetBucketLocation", "arn:aws:s3:::b"),
        ("PUT", "/b", "s3:CreateBucket", "arn:aws:s3:::b"),
        ("PUT", "/b?policy", "s3:PutBucketPolicy", "arn:aws:s3:::b"),
        ("GET", "/", "s3:ListAllMyBuckets", "*"),
    ],
)
def test_an_s3_request_is_the_action_iam_authorizes(method, path, action, resource):
    ((found_action, found_resource, _),) = s3(method, path)
    assert (found_action, found_resource) == (action, resource)


def test_a_listing_carries_its_prefix_and_a_copy_reads_its_source():
    assert s3("GET", "/b?list-type=2&prefix=in%2F2026%2F&delimiter=%2F") == [
        ("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "in/2026/", "s3:delimiter": "/"})
    ]
    copied = s3("PUT", "/b/out/x", {"x-amz-copy-source": "/secrets/airflow.cfg"})
    assert [(a, r) for a, r, _ in copied] == [
        ("s3:PutObject", "arn:aws:s3:::b/out/x"),
        ("s3:GetObject", "arn:aws:s3:::secrets/airflow.cfg"),
    ]
    deleted = s3(
        "POST", "/b?delete", body=b"<Delete><Object><Key>in/a</Key></Object><Object><Key>in/b</Key></Object></Delete>"
    )
    assert [r for _, r, _ in deleted] == ["arn:aws:s3:::b/in/a", "arn:aws:s3:::b/in/b"]


def copy_read(source: str, path: str = "/b/out/x") -> tuple[str, str]:
    """The (action, resource) a copy's source is authorized as."""
    found = s3("PUT", path, {"x-amz-copy-source": source})
    assert found[0][:2] == ("s3:PutObject", "arn:aws:s3:::b/out/x")
    ((action, resource, _),) = found[1:]
    return action, resource


def endpoint_reading(source: str) -> tuple[str, str]:
    """The (bucket, key) moto 5.2.5 copies from: its CopyObject and UploadPartCopy, word for word."""
    from urllib.parse import unquote, urlparse

    bucket, key = unquote(urlparse(source).path).lstrip("/").split("/", 1)
    return bucket, key


@pytest.mark.parametrize(
    ("source", "action", "resource"),
    [
        ("secrets/airflow.cfg", "s3:GetObject", "arn:aws:s3:::secrets/airflow.cfg"),
        ("/data/in/a%20b%2Bc%3Dd.csv", "s3:GetObject", "arn:aws:s3:::data/in/a b+c=d.csv"),
        ("data/in/a%2Fb.csv", "s3:GetObject", "arn:aws:s3:::data/in/a/b.csv"),
        ("data/in/x%3FversionId%3Dv", "s3:GetObject", "arn:aws:s3:::data/in/x?versionId=v"),
        ("data/in/%C3%A9t%C3%A9.csv", "s3:GetObject", "arn:aws:s3:::data/in/été.csv"),
        (
            "/data/in/x.csv?versionId=3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrH",
            "s3:GetObjectVersion",
            "arn:aws:s3:::data/in/x.csv",
        ),
    ],
)
def test_a_copy_source_is_read_as_s3_and_the_endpoint_read_it(source, action, resource):
    assert copy_read(source) == (action, resource)
    assert copy_read(source, "/b/out/x?partNumber=1&uploadId=u") == (action, resource)  # UploadPartCopy
    bucket, key = endpoint_reading(source.split("?versionId=")[0])
    assert f"arn:aws:s3:::{bucket}/{key}" == resource


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        # Found by review: the check read bucket data, the endpoint bucket secrets (//data is a URL's host).
        ("//data/secrets/airflow.cfg", "bucket's name"),
        ("/%64ata/in/x", "bucket's name"),
        ("%2Fsecrets/airflow.cfg", "bucket's name"),
        ("http://data/secrets/airflow.cfg", "bucket's name"),
        ("arn:aws:s3:us-east-1:123456789012:accesspoint/ap/object/in/x", "bucket's name"),
        ("data", "bucket's name"),
        ("data/", "empty"),
        ("data/in/../../secrets/x", ". or .. segment"),
        ("data/in//x", "empty"),
        ("data/in/x;v=1", "percent-encoded"),
        ("data/in/x#../../y", "percent-encoded"),
        ("data/in/a b", "percent-encoded"),
        ("data/in/%zz", "no escape"),
        ("data/in/%ff", "not UTF-8"),
        ("data/in/x?versionId=a&versionId=b", "one versionId"),
        ("data/in/x?partNumber=1", "one versionId"),
        ("data/in/x?versionId=", "one versionId"),
        ("", "percent-encoded"),
    ],
)
def test_a_copy_source_that_could_be_read_another_way_is_refused(source, reason):
    with pytest.raises(Unreadable, match=reason):
        s3("PUT", "/b/out/x", {"x-amz-copy-source": source})


def test_a_copy_source_on_anything_but_a_put_is_refused():
    with pytest.raises(Unreadable, match="only a PUT copies"):
        s3("POST", "/b/out/x?uploads", {"x-amz-copy-source": "data/in/x"})


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/b/out/dt=1/../../other/x", ". or .. segment"),
        ("/b/out/./x", ". or .. segment"),
        ("/b/out//x", "empty"),
        ("/b%2Fout/x", "encoded"),
        ("http://victim.localhost/b/out/x", "absolute URI"),
        ("/b/out/x?uploadId=u&versionId=v", "several subresources"),
        ("/moto-api/reset", "moto-api"),
    ],
)
def test_a_request_the_endpoint_could_read_another_way_is_refused(path, reason):
    with pytest.raises(Unreadable, match=reason):
        s3("PUT", path)


def test_only_signed_s3_and_dynamodb_requests_are_read():
    with pytest.raises(Unreadable, match="Signature Version 4"):
        requests_of("GET", "/b/k", {}, b"")
    sts = {"authorization": "AWS4-HMAC-SHA256 Credential=AK/20261128/us-east-1/sts/aws4_request" + SIGNATURE}
    with pytest.raises(Unreadable, match="'sts'"):
        requests_of("POST", "/", sts, b"")
    with pytest.raises(Unreadable, match="X-Amz-Target"):
        requests_of("POST", "/", {**DYNAMO, "x-amz-target": "AWSCognito.GetId"}, b"{}")


def test_a_transaction_is_authorized_item_by_item_in_the_signed_region():
    body = {
        "TransactItems": [
            {
                "ConditionCheck": {
                    "TableName": "t",
                    "Key": {"pk": {"S": "RUN#p#r"}, "sk": {"S": "STEP#s"}},
                    "ConditionExpression": "#a = :a",
                    "ExpressionAttributeNames": {"#a": "oat"},
                }
            },
            {
                "Update": {
                    "TableName": "t",
                    "Key": {"pk": {"S": "RUN#p#r"}, "sk": {"S": "SHARD#s#1#algo-1"}},
                    "UpdateExpression": "SET #s = :s",
                    "ExpressionAttributeNames": {"#s": "st"},
                }
            },
        ]
    }
    found = requests_of("POST", "/", DYNAMO, json.dumps(body).encode())
    assert [(r.action, r.resource) for r in found] == [
        ("dynamodb:ConditionCheckItem", "arn:aws:dynamodb:eu-west-1:123456789012:table/t"),
        ("dynamodb:UpdateItem", "arn:aws:dynamodb:eu-west-1:123456789012:table/t"),
    ]
    assert found[1].context == {"dynamodb:Attributes": ["pk", "sk", "st"], "dynamodb:LeadingKeys": ["RUN#p#r"]}


def test_an_attribute_named_outside_its_placeholders_is_refused():
    body = {"TableName": "t", "Key": {"pk": {"S": "RUN#p#r"}, "sk": {"S": "RUN"}}, "UpdateExpression": "SET msg = :m"}
    headers = {**DYNAMO, "x-amz-target": "DynamoDB_20120810.UpdateItem"}
    with pytest.raises(Unreadable, match="without a placeholder"):
        requests_of("POST", "/", headers, json.dumps(body).encode())


UPDATE = json.dumps(
    {
        "TableName": "t",
        "Key": {"pk": {"S": "RUN#p#r"}, "sk": {"S": "FILE#x"}},
        "UpdateExpression": "SET #s = :v",
        "ExpressionAttributeNames": {"#s": "st"},
    }
).encode()


@pytest.mark.parametrize(
    ("path", "headers", "reason"),
    [
        # The endpoint routes by the signature's scope: a DynamoDB body under an S3 signature is S3's POST upload.
        ("/data?key=out/_SUCCESS", {**SIGNED, "x-amz-target": "DynamoDB_20120810.UpdateItem"}, "with a 's3' signature"),
        ("/data?key=out/_SUCCESS", {**DYNAMO, "x-amz-target": "DynamoDB_20120810.UpdateItem"}, "to / itself"),
        ("/%6Doto-api/reset", {**DYNAMO, "x-amz-target": "DynamoDB_20120810.UpdateItem"}, "moto-api"),
        (
            "/",
            {
                "authorization": "AWS4-HMAC-SHA256 Credential=AK/20261128/us-east-1/iam/aws4_request, "
                "Credential=AK/20261128/us-east-1/dynamodb/aws4_request" + SIGNATURE,
                "x-amz-target": "DynamoDB_20120810.UpdateItem",
            },
            "one AWS Signature Version 4 credential",
        ),
    ],
)
def test_a_call_the_endpoint_would_route_elsewhere_is_refused(path, headers, reason):
    with pytest.raises(Unreadable, match=reason):
        requests_of("POST", path, headers, UPDATE)


def test_a_whole_item_back_on_a_failed_condition_is_refused():
    body = {**json.loads(UPDATE), "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
    headers = {**DYNAMO, "x-amz-target": "DynamoDB_20120810.UpdateItem"}
    with pytest.raises(Unreadable, match="whole item"):
        requests_of("POST", "/", headers, json.dumps(body).encode())
