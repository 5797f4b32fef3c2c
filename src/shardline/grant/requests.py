"""An S3 or DynamoDB HTTP request as IAM authorizes it: the actions it needs, on which resources, with which
condition keys. What this module cannot read as one of those is refused (:class:`Unreadable`), never passed.

S3 requests are read path-style (``/bucket/key?subresource``); the proxy sends every request on with the
endpoint's own Host, so the endpoint reads them the same way; a copy's source is read as both S3 and the
endpoint read it (:func:`copy_source`). DynamoDB requests are JSON with an
``X-Amz-Target``; a TransactWriteItems is authorized item by item, as IAM does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, unquote_to_bytes, urlsplit
from xml.etree import ElementTree

from shardline.grant.policy import IamRequest

LOCAL_ACCOUNT = "123456789012"  # moto's account: what the local ARNs say
DYNAMODB_TARGET = "DynamoDB_20120810."


class Unreadable(Exception):
    """A request this reading does not know: refused, with the reason."""


# -- which service ------------------------------------------------------------------------------------------


# The one Authorization a request may carry: SigV4, one credential, its scope (date, region, service) plain.
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[A-Za-z0-9_.-]+)/\d{8}/"
    r"(?P<region>[a-z0-9-]+)/(?P<service>[a-z0-9-]+)/aws4_request,"
    r" ?SignedHeaders=[a-z0-9;-]+, ?Signature=[0-9a-f]+"
)
_PRESIGNED = re.compile(r"(?P<key>[A-Za-z0-9_.-]+)/\d{8}/(?P<region>[a-z0-9-]+)/(?P<service>[a-z0-9-]+)/aws4_request")


def _signature_scope(path: str, headers: Mapping[str, str]) -> re.Match:
    if "/moto-api" in unquote(urlsplit(path).path):
        raise Unreadable("the emulator's own API (/moto-api/) is not AWS: no job may call it")
    authorization = headers.get("authorization")
    query = dict(parse_qsl(urlsplit(path).query, keep_blank_values=True))
    if authorization is not None:
        scope = _AUTHORIZATION.fullmatch(authorization.strip())
        if scope is None or "X-Amz-Credential" in query:
            raise Unreadable("the request's Authorization is not one AWS Signature Version 4 credential")
    else:
        scope = _PRESIGNED.fullmatch(query.get("X-Amz-Credential", ""))
    if scope is None:
        raise Unreadable("the request is not signed with AWS Signature Version 4")
    return scope


def access_key_of(path: str, headers: Mapping[str, str]) -> str:
    """The access key id the request is signed with (its credential's first part); unreadable as ``service_of``."""
    return _signature_scope(path, headers).group("key")


def service_of(path: str, headers: Mapping[str, str]) -> tuple[str, str]:
    """(``s3`` or ``dynamodb``, the region the request is signed for). The endpoint routes a request by its
    signature's scope, so the scope must be exactly one, well formed, and agree with the target header; a
    DynamoDB call must be a POST to ``/`` itself. Anything else is unreadable."""
    scope = _signature_scope(path, headers)
    service = scope.group("service")
    target = headers.get("x-amz-target")
    if target is not None:
        if service != "dynamodb" or not target.startswith(DYNAMODB_TARGET):
            raise Unreadable(f"X-Amz-Target {target!r} with a {service!r} signature is no call a job makes")
        if path != "/":
            raise Unreadable("a DynamoDB call is made to / itself, with no query")
        return "dynamodb", scope.group("region")
    if service != "s3":
        raise Unreadable(f"the service {service!r} is not one a job reaches (S3, DynamoDB)")
    return "s3", scope.group("region")


# -- S3 -----------------------------------------------------------------------------------------------------

# Query parameters that are arguments of an operation, not a subresource that makes it another operation.
_S3_ARGUMENTS = {
    "list-type",
    "prefix",
    "delimiter",
    "max-keys",
    "marker",
    "continuation-token",
    "start-after",
    "encoding-type",
    "fetch-owner",
    "partNumber",
    "x-id",
}
_OBJECT_SUBRESOURCES = {
    # (method, subresource) -> action; None: the plain object operation
    ("GET", None): "s3:GetObject",
    ("HEAD", None): "s3:GetObject",
    ("PUT", None): "s3:PutObject",
    ("DELETE", None): "s3:DeleteObject",
    ("POST", "uploads"): "s3:PutObject",  # CreateMultipartUpload
    ("PUT", "uploadId"): "s3:PutObject",  # UploadPart (partNumber is an argument)
    ("POST", "uploadId"): "s3:PutObject",  # CompleteMultipartUpload
    ("DELETE", "uploadId"): "s3:AbortMultipartUpload",
    ("GET", "uploadId"): "s3:ListMultipartUploadParts",
    ("GET", "versionId"): "s3:GetObjectVersion",
    ("HEAD", "versionId"): "s3:GetObjectVersion",
    ("DELETE", "versionId"): "s3:DeleteObjectVersion",
    ("GET", "acl"): "s3:GetObjectAcl",
    ("PUT", "acl"): "s3:PutObjectAcl",
    ("GET", "tagging"): "s3:GetObjectTagging",
    ("PUT", "tagging"): "s3:PutObjectTagging",
    ("DELETE", "tagging"): "s3:DeleteObjectTagging",
    ("GET", "attributes"): "s3:GetObject",
    ("POST", "restore"): "s3:RestoreObject",
    ("PUT", "retention"): "s3:PutObjectRetention",
    ("PUT", "legal-hold"): "s3:PutObjectLegalHold",
}


def _subresource(query: list[tuple[str, str]]) -> str | None:
    names = {k for k, _ in query if k not in _S3_ARGUMENTS and not k.startswith(("response-", "X-Amz-"))}
    if len(names) > 1:
        # uploadId with versionId, say: no operation of S3 takes both
        raise Unreadable(f"the request names several subresources: {sorted(names)}")
    return next(iter(names), None)


def _canonical_path(path: str) -> tuple[str, str]:
    """(bucket, key) of a path-style request target, refused unless the endpoint can read it only one way: an
    absolute URI (its host could name another bucket), an encoded ``/`` in the bucket, or a key with an empty,
    ``.`` or ``..`` segment (which a web framework may merge or resolve before S3 reads it) is unreadable."""
    if not path.startswith("/"):
        raise Unreadable("the request target is not a path (an absolute URI names its own host)")
    raw_bucket, _, raw_key = urlsplit(path).path[1:].partition("/")
    bucket, key = unquote(raw_bucket), unquote(raw_key)
    if "%" in raw_bucket or "/" in bucket:
        raise Unreadable(f"the bucket name {raw_bucket!r} is encoded")
    segments = key.removesuffix("/").split("/") if key else []  # a trailing / names a folder: it is no segment
    if any(segment in ("", ".", "..") for segment in segments):
        raise Unreadable(f"the key {key!r} has an empty, . or .. segment")
    return bucket, key


# A bucket's name as S3 allows it: never encoded, never empty. The copy source's raw characters: a URI path's,
# less the ones a URL parser splits off (``;`` parameters, ``#`` fragment) where S3 keeps them in the key.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_COPY_SOURCE_PATH = re.compile(r"[A-Za-z0-9._~%/!$&'()*+,=:@-]+")
_VERSION_ID = re.compile(r"[A-Za-z0-9._~%/!$'()*+,=:@-]+")


def copy_source(value: str) -> tuple[str, str, str | None]:
    """(bucket, key, version id or None) of an ``x-amz-copy-source`` header, read as S3 and the endpoint both
    read it: ``[/]bucket/key[?versionId=v]``, the key percent-decoded. Anything they could read as two different
    sources is unreadable: ``//a/b/key`` (a URL parser takes ``a`` for a host and reads bucket ``b``), an encoded
    or empty bucket, a ``;`` or ``#`` (split off by a URL parser, kept by S3), another query, a bad escape, or a
    key with an empty, ``.`` or ``..`` segment."""
    path, question, query = value.partition("?")
    if not _COPY_SOURCE_PATH.fullmatch(path):
        raise Unreadable(f"the copy source {value[:200]!r} has characters S3 wants percent-encoded")
    if re.search(r"%(?![0-9A-Fa-f]{2})", path):
        raise Unreadable(f"the copy source {value[:200]!r} has a % that is no escape")
    raw_bucket, slash, raw_key = path.removeprefix("/").partition("/")
    if not _BUCKET_NAME.fullmatch(raw_bucket) or not slash:
        raise Unreadable(f"the copy source {value[:200]!r} does not start with a bucket's name: write /bucket/key")
    try:
        key = unquote_to_bytes(raw_key).decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"the copy source's key {raw_key[:200]!r} is not UTF-8") from None
    segments = key.removesuffix("/").split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        raise Unreadable(f"the copy source's key {key[:200]!r} is empty or has an empty, . or .. segment")
    version = None
    if question:
        name, equals, version = query.partition("=")
        if name != "versionId" or not equals or not _VERSION_ID.fullmatch(version):
            raise Unreadable(f"the copy source's query {query[:200]!r} is not one versionId")
    return raw_bucket, key, version


def s3_requests(method: str, path: str, headers: Mapping[str, str], body: bytes) -> list[IamRequest]:
    """What IAM authorizes for one S3 request (path-style)."""
    split = urlsplit(path)
    query = parse_qsl(split.query, keep_blank_values=True)
    bucket, key = _canonical_path(path)
    sub = _subresource(query)
    if not bucket:
        return [IamRequest("s3:ListAllMyBuckets", "*")]
    bucket_arn = f"arn:aws:s3:::{bucket}"
    if not key:
        return _bucket_requests(method, bucket_arn, sub, dict(query), body)
    action = _OBJECT_SUBRESOURCES.get((method, sub))
    if action is None:
        raise Unreadable(f"{method} on an object with ?{sub} is no S3 operation a job makes")
    found = [IamRequest(action, f"{bucket_arn}/{key}")]
    if "x-amz-tagging" in headers and action == "s3:PutObject":  # tags set with the object: IAM asks for both
        found.append(IamRequest("s3:PutObjectTagging", f"{bucket_arn}/{key}"))
    if "x-amz-copy-source" in headers:
        if method != "PUT":
            raise Unreadable(f"a copy source on a {method}: only a PUT copies (CopyObject, UploadPartCopy)")
        # It reads the source as well; a version of it is GetObjectVersion, as IAM asks.
        bucket, key, version = copy_source(headers["x-amz-copy-source"])
        found.append(IamRequest("s3:GetObjectVersion" if version else "s3:GetObject", f"arn:aws:s3:::{bucket}/{key}"))
    return found


def _bucket_requests(method: str, bucket_arn: str, sub: str | None, query: dict, body: bytes) -> list[IamRequest]:
    if method in ("GET", "HEAD") and sub is None:  # ListObjects(V2); HeadBucket needs ListBucket too
        context = {"s3:prefix": query["prefix"]} if "prefix" in query else {}
        if "delimiter" in query:
            context["s3:delimiter"] = query["delimiter"]
        if "max-keys" in query:
            context["s3:max-keys"] = query["max-keys"]
        return [IamRequest("s3:ListBucket", bucket_arn, context)]
    if method == "GET" and sub == "location":
        return [IamRequest("s3:GetBucketLocation", bucket_arn)]
    if method == "POST" and sub == "delete":  # DeleteObjects: each key is a DeleteObject
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as err:
            raise Unreadable(f"a DeleteObjects body that is not XML: {err}") from err
        keys = [e.text or "" for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "Key"]
        if not keys:
            raise Unreadable("a DeleteObjects request that names no key")
        return [IamRequest("s3:DeleteObject", f"{bucket_arn}/{k}") for k in keys]
    # Creating, deleting or configuring a bucket, or listing its uploads and versions: never a job's to do.
    operation = {"PUT": "Put", "DELETE": "Delete", "GET": "Get", "HEAD": "Head", "POST": "Post"}.get(method, method)
    name = "".join(part.title() for part in re.split(r"[^A-Za-z]", sub or "")) or ""
    action = {"PUT": "s3:CreateBucket", "DELETE": "s3:DeleteBucket"}.get(method) if sub is None else None
    return [IamRequest(action or f"s3:{operation}Bucket{name}", bucket_arn)]


# -- DynamoDB -----------------------------------------------------------------------------------------------

PER_TRANSACT_ITEM = {
    "ConditionCheck": "ConditionCheckItem",
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
}
EXPRESSION_WORDS = {
    "SET",
    "REMOVE",
    "ADD",
    "DELETE",
    "AND",
    "OR",
    "NOT",
    "BETWEEN",
    "IN",
    "attribute_exists",
    "attribute_not_exists",
    "attribute_type",
    "begins_with",
    "contains",
    "size",
    "if_not_exists",
    "list_append",
}
READS = ("GetItem", "Query", "Scan")  # a read with no Select asks for a projection, or for every attribute
_EXPRESSIONS = ("UpdateExpression", "ConditionExpression", "ProjectionExpression", "FilterExpression")


def table_arn(region: str, table: str, index: str | None = None) -> str:
    arn = f"arn:aws:dynamodb:{region}:{LOCAL_ACCOUNT}:table/{table}"
    return f"{arn}/index/{index}" if index else arn


def dynamodb_context(body: dict, read: bool = False) -> dict:
    """dynamodb:LeadingKeys, :Attributes (every top-level attribute the request names: keys, items,
    expressions), :ReturnValues and :Select of one request. A name written bare in an expression would escape
    ExpressionAttributeNames, and so this context: such a request is unreadable."""
    for expression in _EXPRESSIONS:
        text = body.get(expression, "")
        if not isinstance(text, str):
            raise Unreadable(f"{expression} is not a string")
        bare = set(re.findall(r"(?<![#:\w])[A-Za-z_]\w*", text)) - EXPRESSION_WORDS
        if bare:
            raise Unreadable(f"{expression} names {sorted(bare)} without a placeholder")
    key = body.get("Key") or body.get("Item") or {}
    names = body.get("ExpressionAttributeNames", {})
    if not isinstance(key, dict) or not isinstance(names, dict):
        raise Unreadable("Key, Item or ExpressionAttributeNames is not a map")
    attributes = set(key) | {str(v) for v in names.values()}
    attributes |= set(body.get("AttributeUpdates", {})) | set(body.get("Expected", {}))
    attributes |= {str(a) for a in body.get("AttributesToGet", [])}
    context: dict = {"dynamodb:Attributes": sorted(attributes)}
    if isinstance(key.get("pk"), dict) and "S" in key["pk"]:
        context["dynamodb:LeadingKeys"] = [str(key["pk"]["S"])]
    for parameter in ("ReturnValues", "Select"):
        if parameter in body:
            context[f"dynamodb:{parameter}"] = str(body[parameter])
    if read and "Select" not in body:
        # As IAM reads a read with no Select: a projection asks for SPECIFIC_ATTRIBUTES; none, for the whole item.
        projected = body.get("ProjectionExpression") or body.get("AttributesToGet")
        whole = "ALL_PROJECTED_ATTRIBUTES" if body.get("IndexName") else "ALL_ATTRIBUTES"
        context["dynamodb:Select"] = "SPECIFIC_ATTRIBUTES" if projected else whole
    if str(body.get("ReturnValuesOnConditionCheckFailure", "NONE")).upper() != "NONE":
        # IAM has no condition key for it, and it returns the whole item: the worker never asks for it.
        raise Unreadable("ReturnValuesOnConditionCheckFailure asks for the whole item back")
    return context


def dynamodb_requests(operation: str, body: dict, region: str) -> list[IamRequest]:
    """What IAM authorizes for one DynamoDB API call (``operation`` without the target's prefix)."""
    if operation == "TransactWriteItems":
        found = []
        for item in body.get("TransactItems", []):
            if not isinstance(item, dict) or len(item) != 1:
                raise Unreadable("a TransactItems entry is not one action")
            ((kind, part),) = item.items()
            if kind not in PER_TRANSACT_ITEM or not isinstance(part, dict):
                raise Unreadable(f"a TransactItems entry {kind!r} is no write action")
            found.append(
                IamRequest(
                    f"dynamodb:{PER_TRANSACT_ITEM[kind]}",
                    table_arn(region, str(part.get("TableName", ""))),
                    dynamodb_context(part),
                )
            )
        if not found:
            raise Unreadable("a TransactWriteItems with no item")
        return found
    if operation == "TransactGetItems":
        gets = [i.get("Get") for i in body.get("TransactItems", []) if isinstance(i, dict)]
        if not gets or not all(isinstance(g, dict) for g in gets):
            raise Unreadable("a TransactGetItems entry is not one Get")
        return [
            IamRequest("dynamodb:GetItem", table_arn(region, str(g.get("TableName", ""))), dynamodb_context(g, True))
            for g in gets
        ]
    if operation in ("BatchGetItem", "BatchWriteItem"):
        tables = body.get("RequestItems", {})
        return [IamRequest(f"dynamodb:{operation}", table_arn(region, str(t))) for t in tables] or [
            IamRequest(f"dynamodb:{operation}", "*")
        ]
    table = body.get("TableName")
    if not table:
        return [IamRequest(f"dynamodb:{operation}", "*")]  # ListTables and the like
    return [
        IamRequest(
            f"dynamodb:{operation}",
            table_arn(region, str(table), body.get("IndexName")),
            dynamodb_context(body, read=operation in READS),
        )
    ]


def requests_of(method: str, path: str, headers: Mapping[str, str], body: bytes) -> list[IamRequest]:
    """What IAM authorizes for one HTTP request to S3 or DynamoDB; :class:`Unreadable` for anything else.

    ``headers``: lower-case names, each once. A DynamoDB table's ARN is in the region the request is signed for."""
    service, signed_region = service_of(path, headers)
    if service == "s3":
        return s3_requests(method, path, headers, body)
    if method != "POST":
        raise Unreadable(f"a DynamoDB call is a POST, not {method}")
    try:
        payload = json.loads(body or b"{}")
    except ValueError as err:
        raise Unreadable(f"a DynamoDB body that is not JSON: {err}") from err
    if not isinstance(payload, dict):
        raise Unreadable("a DynamoDB body that is not a JSON object")
    return dynamodb_requests(headers["x-amz-target"][len(DYNAMODB_TARGET) :], payload, signed_region)
