"""Planning: paginated listing on moto_server, filters, sharding, and the manifest format."""

from __future__ import annotations

import json
import logging
import random
import uuid

import boto3
import pytest

from shardline.planning.inputs import (
    PlanFileError,
    S3Object,
    choose_instance_count,
    list_inputs,
    manifest_body,
    selected,
    write_manifest,
)
from tests.support.helpers import makespan


@pytest.mark.parametrize(
    ("key", "include", "exclude", "expected"),
    [
        ("part-1.parquet", ("*.parquet",), (), True),
        ("sub/part-1.parquet", ("*.parquet",), (), True),
        ("part-1.csv", ("*.parquet",), (), False),
        ("part-1.parquet", ("*",), ("part-1*",), False),
        ("_SUCCESS", ("*",), (), False),
        ("_shardline/manifests/x.manifest", ("*",), (), False),
        (".hidden.parquet", ("*",), (), False),
        ("dir/", ("*",), (), False),
    ],
)
def test_selected(key, include, exclude, expected):
    assert selected(key, include, exclude) is expected


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("/tmp/x.parquet", "absolute"),  # from prefix//tmp/x.parquet
        ("sub//x.parquet", "empty path segment"),
        ("sub/", "empty path segment"),
        ("", "empty key"),
        ("../x.parquet", "'..'"),
        ("sub/../../x.parquet", "'..'"),
        ("sub/..", "'..'"),
        ("./x.parquet", "'.'"),
        ("sub/./x.parquet", "'.'"),
        ("x\x00.parquet", "NUL"),
    ],
)
def test_unsafe_key_reason_refuses_keys_that_are_no_path_under_the_input_dir(key, why):
    from shardline.planning.inputs import unsafe_key_reason

    assert why in (unsafe_key_reason(key) or "")


@pytest.mark.parametrize("key", ["x.parquet", "dt=1/part-0.parquet", "a..b.parquet", "...", ".hidden", "a\\b.csv"])
def test_unsafe_key_reason_lets_ordinary_names_through(key):
    from shardline.planning.inputs import unsafe_key_reason

    assert unsafe_key_reason(key) is None


def test_path_escape_keys_are_not_planned_and_each_is_named_with_its_reason(aws_env, caplog):
    s3 = boto3.client("s3")
    bucket = f"raw-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    bad = {
        "dt=1//tmp/x.parquet": "absolute",
        "dt=1/a//b.parquet": "empty path segment",
        "dt=1/a/../../../escape.parquet": "'..'",
        "dt=1/./dot.parquet": "'.'",
    }
    for key in ["dt=1/part-0.parquet", "dt=1/sub/part-1.parquet", "dt=1/folder/", "dt=1/_SUCCESS", *bad]:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    with caplog.at_level(logging.WARNING, logger="shardline.planning.inputs"):
        found = list_inputs(s3, f"s3://{bucket}/dt=1/")
    assert [o.key for o in found] == ["dt=1/part-0.parquet", "dt=1/sub/part-1.parquet"]  # the rest go on
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key, why in bad.items():
        assert any(f"s3://{bucket}/{key}:" in w and why in w for w in warnings), (key, warnings)
    assert not any("folder/" in w or "_SUCCESS" in w for w in warnings)  # no news: never inputs


def test_listing_follows_every_page_and_filters(aws_env):
    s3 = boto3.client("s3")
    bucket = f"raw-{uuid.uuid4().hex[:8]}"  # moto_server lives for the session: keep tests apart
    s3.create_bucket(Bucket=bucket)
    for i in range(1050):  # ListObjectsV2 returns at most 1000 keys a page
        s3.put_object(Bucket=bucket, Key=f"dt=2026-11-22/part-{i:05d}.parquet", Body=b"x" * (i % 7))
    s3.put_object(Bucket=bucket, Key="dt=2026-11-22/_SUCCESS", Body=b"")
    s3.put_object(Bucket=bucket, Key="dt=2026-11-22/notes.txt", Body=b"")
    s3.put_object(Bucket=bucket, Key="dt=2026-11-23/part-0.parquet", Body=b"")
    found = list_inputs(s3, f"s3://{bucket}/dt=2026-11-22", include=("*.parquet",))
    assert len(found) == 1050
    assert found[0] == S3Object("dt=2026-11-22/part-00000.parquet", 0)
    assert [o.key for o in found] == sorted(o.key for o in found)


def test_empty_prefix_lists_nothing(aws_env):
    s3 = boto3.client("s3")
    bucket = f"empty-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    assert list_inputs(s3, f"s3://{bucket}/nothing/") == []


def test_by_key_order_is_sagemakers_sharded_by_s3_key():
    from shardline.contract import deal as dealt
    from shardline.planning.inputs import manifest_order

    objects = [S3Object(f"k{i:02d}", 1) for i in range(7)]
    shards = dealt(manifest_order(reversed(objects), 3, "by_key"), 3)
    assert [[o.key for o in s] for s in shards] == [["k00", "k03", "k06"], ["k01", "k04"], ["k02", "k05"]]


def test_choose_instance_count_never_exceeds_files():
    assert choose_instance_count(8, 3) == 3
    assert choose_instance_count(2, 100) == 2
    assert choose_instance_count(4, 0) == 1


def test_manifest_format_is_sagemakers(aws_env):
    body = manifest_body("s3://raw/dt=2026-11-22", ["dt=2026-11-22/a.parquet", "dt=2026-11-22/sub/b.parquet"])
    assert json.loads(body) == [{"prefix": "s3://raw/dt=2026-11-22/"}, "a.parquet", "sub/b.parquet"]
    with pytest.raises(ValueError, match="is not under"):
        manifest_body("s3://raw/dt=2026-11-22/", ["other/c.parquet"])
    s3 = boto3.client("s3")
    bucket = f"out-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    write_manifest(s3, f"s3://{bucket}/_shardline/manifests/run/score/attempt-0001.manifest", body)
    stored = s3.get_object(Bucket=bucket, Key="_shardline/manifests/run/score/attempt-0001.manifest")["Body"].read()
    assert json.loads(stored)[1] == "a.parquet"


@pytest.mark.parametrize("key", ["dt=1//tmp/x.parquet", "dt=1/a/../../x.parquet", "dt=1/./x.parquet"])
def test_path_escape_key_is_refused_as_a_manifest_entry(key):
    with pytest.raises(ValueError, match="cannot be a manifest entry"):
        manifest_body("s3://raw/dt=1/", ["dt=1/ok.parquet", key])


def test_manifest_order_by_size_balances_a_round_robin_deal():
    from shardline.contract import deal as dealt
    from shardline.planning.inputs import manifest_order

    rng = random.Random(3)
    objects = [S3Object(f"f{i:03d}", rng.randint(1, 100)) for i in range(37)] + [S3Object("big", 400)]
    by_key = dealt(manifest_order(objects, 4, "by_key"), 4)
    by_size = dealt(manifest_order(objects, 4, "by_size"), 4)
    for shards in (by_key, by_size):
        assert sorted(o.key for s in shards for o in s) == sorted(o.key for o in objects)
    assert makespan(by_size) <= makespan(by_key)
    assert manifest_order(objects, 4, "by_key") == sorted(objects, key=lambda o: o.key)


# -- listing sub-prefixes in parallel -------------------------------------------------------------------------

NESTED_KEYS = [
    "top.parquet",  # right under the prefix, beside the folders
    "dt=2026-11-21/hour=00/part-0.parquet",
    "dt=2026-11-21/hour=00/part-1.parquet",
    "dt=2026-11-21/hour=01/part-0.parquet",
    "dt=2026-11-21/_SUCCESS",
    "dt=2026-11-22/hour=00/part-0.parquet",
    "dt=2026-11-22/hour=00/deeper/still/part-9.parquet",
    "dt=2026-11-22/folder/",  # a folder marker
    "dt=2026-11-22/ünïcode name+plus.parquet",
    "a+b/part-0.parquet",
    "a b/part-0.parquet",
    "dt=2026-11-22//tmp/escape.parquet",  # '//': an empty segment, refused
    "dt=2026-11-22/x/../../escape.parquet",  # '..', refused
    "dt=2026-11-22/./dot.parquet",  # '.', refused
]


def _bucket_with(keys: list[str], prefix: str = "in/") -> tuple[object, str]:
    s3 = boto3.client("s3")
    bucket = f"raw-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for key in keys:
        s3.put_object(Bucket=bucket, Key=prefix + key, Body=b"x" * (len(key) % 5))
    s3.put_object(Bucket=bucket, Key="elsewhere/part-0.parquet", Body=b"x")  # outside the prefix
    return s3, bucket


def test_parallel_listing_of_nested_sub_prefixes_equals_the_sequential_listing(aws_env):
    from shardline.planning.inputs import list_inputs_and_refusals

    s3, bucket = _bucket_with(NESTED_KEYS)
    uri = f"s3://{bucket}/in/"
    sequential = list_inputs_and_refusals(s3, uri, threads=1)
    for threads in (2, 8):
        assert list_inputs_and_refusals(s3, uri, threads=threads) == sequential  # same set, same order
    found, refused = sequential
    assert [o.key for o in found] == sorted(
        f"in/{k}"
        for k in NESTED_KEYS
        if k
        not in {
            "dt=2026-11-21/_SUCCESS",
            "dt=2026-11-22/folder/",
            "dt=2026-11-22//tmp/escape.parquet",
            "dt=2026-11-22/x/../../escape.parquet",
            "dt=2026-11-22/./dot.parquet",
        }
    )
    # Unsafe keys are still refused, each with its reason, in key order: the walk reached them through '//'
    # and '..' folders of their own.
    assert [(o.key, reason.split(" ")[0]) for o, reason in refused] == [
        ("in/dt=2026-11-22/./dot.parquet", "'.'"),
        ("in/dt=2026-11-22//tmp/escape.parquet", "empty"),
        ("in/dt=2026-11-22/x/../../escape.parquet", "'..'"),
    ]
    with_filters = {"include": ("*.parquet",), "exclude": ("part-1*",)}
    assert list_inputs_and_refusals(s3, uri, **with_filters) == list_inputs_and_refusals(
        s3, uri, **with_filters, threads=1
    )


def test_the_walk_lists_each_level_with_a_delimiter_and_each_key_once(aws_env):
    from shardline.planning.inputs import list_keys

    s3, bucket = _bucket_with(NESTED_KEYS)
    sequential = list_keys(s3, bucket, "in/", threads=1)
    walked = list_keys(s3, bucket, "in/", threads=4)
    assert walked.objects == sequential.objects
    assert len({o.key for o in walked.objects}) == len(walked.objects) == len(NESTED_KEYS)
    # One call per prefix (each fits a page), level by level: in/ (1); a b/, a+b/, dt=…21/, dt=…22/ (4);
    # 21/hour=00/, 21/hour=01/, 22//, 22/./, 22/folder/, 22/hour=00/, 22/x/ (7); 22//tmp/, 22/hour=00/deeper/,
    # 22/x/../ (3); 22/hour=00/deeper/still/, 22/x/../../ (2). Nine of them hold no folder.
    assert (walked.requests, walked.prefixes) == (17, 9)
    shallow = list_keys(s3, bucket, "in/", threads=4, max_depth=1)  # split once, then list each folder whole
    assert shallow.objects == sequential.objects
    assert shallow.requests == 1 + 4  # in/ with the delimiter, then its four folders whole
    assert shallow.prefixes == 4


def test_too_many_sub_prefixes_lists_their_parent_whole(aws_env):
    from shardline.planning.inputs import list_keys

    s3, bucket = _bucket_with([f"user={i}/part-0.parquet" for i in range(5)] + ["top.parquet"])
    listing = list_keys(s3, bucket, "in/", threads=4, max_prefixes=3)
    assert listing.objects == list_keys(s3, bucket, "in/", threads=1).objects
    assert len(listing.objects) == 6  # top.parquet was seen by the delimiter listing too, and kept once
    assert (listing.requests, listing.prefixes) == (2, 1)  # the delimiter listing, then in/ whole


def test_flat_keys_are_one_listing_at_no_extra_cost(aws_env):
    from shardline.planning.inputs import list_keys

    s3, bucket = _bucket_with([f"part-{i:03d}.parquet" for i in range(30)])
    listing = list_keys(s3, bucket, "in/")
    assert (listing.requests, listing.prefixes) == (1, 1)  # the delimiter listing found no folder: it was all
    assert listing.objects == list_keys(s3, bucket, "in/", threads=1).objects
    assert list_keys(s3, bucket, "nothing/") == list_keys(s3, bucket, "nothing/", threads=1)


# -- a prefix longer than a page: split by key range -------------------------------------------------------

ODD_KEYS = [
    "",
    "0.parquet",
    "00.parquet",
    "9-last.csv",
    "A.parquet",
    "Z z.parquet",
    "_under.parquet",
    "a.parquet",
    "a/b.parquet",
    "a/c/d.parquet",
    "ab.parquet",
    "b~.parquet",
    "z.parquet",
    "~tilde.parquet",
    "é.parquet",
    "éa.parquet",
    "日本/x.parquet",
    "日本語.parquet",
    "\U0001f600.parquet",
]


def _count_calls(s3) -> list[dict]:
    calls: list[dict] = []
    s3.meta.events.register("before-parameter-build.s3.ListObjectsV2", lambda params, **_: calls.append(dict(params)))
    return calls


@pytest.mark.parametrize("page_keys", [1, 3, 7])
def test_flat_keys_longer_than_a_page_list_in_key_ranges_side_by_side(aws_env, page_keys):
    from shardline.planning.inputs import MAX_CHAR, list_keys

    s3, bucket = _bucket_with([f"part-{i:04d}.parquet" for i in range(0, 300, 3)])
    sequential = list_keys(s3, bucket, "in/", threads=1, page_keys=page_keys)
    calls = _count_calls(s3)
    split = list_keys(s3, bucket, "in/", threads=4, page_keys=page_keys)
    assert split.objects == sequential.objects and len(split.objects) == 100
    assert any(c.get("StartAfter", "").endswith(MAX_CHAR) for c in calls), "probes found the ranges"
    ranges = {c["Prefix"] for c in calls if "MaxKeys" not in c or c["MaxKeys"] == page_keys} - {"in/"}
    # part-0000 ... part-0297: every key shares in/part-0, then 0, 1 or 2 follows
    assert ranges == {"in/part-00", "in/part-01", "in/part-02"}, ranges


@pytest.mark.parametrize("page_keys", [1, 2, 5])
def test_a_split_listing_of_odd_keys_equals_the_sequential_one(aws_env, page_keys):
    """Keys of every kind of character (upper and lower case, '~', '_', accents, CJK, an emoji, a folder
    marker equal to the prefix itself): S3's order is the keys' UTF-8 bytes, the split must agree."""
    from shardline.planning.inputs import list_inputs_and_refusals, list_keys

    s3, bucket = _bucket_with(ODD_KEYS)
    sequential = list_keys(s3, bucket, "in/", threads=1, page_keys=page_keys)
    assert len(sequential.objects) == len(ODD_KEYS)
    for threads in (2, 8):
        walked = list_keys(s3, bucket, "in/", threads=threads, page_keys=page_keys)
        assert walked.objects == sequential.objects, threads
    assert list_inputs_and_refusals(s3, f"s3://{bucket}/in/") == list_inputs_and_refusals(
        s3, f"s3://{bucket}/in/", threads=1
    )


@pytest.mark.parametrize("page_keys", [2, 4, 9])
def test_folders_and_files_mixed_over_many_pages_list_each_key_once(aws_env, page_keys):
    """A delimiter listing longer than a page: its sub-prefixes are split by range too, and a range starting
    inside a sub-prefix the first page named does not name it twice."""
    from shardline.planning.inputs import list_keys

    keys = [f"{c}{i}/part-{j}.parquet" for c in "abcde" for i in range(4) for j in range(3)]
    keys += [f"{c}{i}.parquet" for c in "abcdef" for i in range(5)]
    s3, bucket = _bucket_with(keys)
    sequential = list_keys(s3, bucket, "in/", threads=1, page_keys=page_keys)
    walked = list_keys(s3, bucket, "in/", threads=4, page_keys=page_keys)
    assert walked.objects == sequential.objects
    assert len({o.key for o in walked.objects}) == len(walked.objects) == len(keys)


# -- the plan file: an attempt's inputs and sizes, what readers take "never claimed" from -----------------------


def test_a_plan_file_gives_back_every_input_and_its_size_as_full_uris():
    from shardline.planning.inputs import S3Object, parse_plan_file, plan_file_body

    objects = [S3Object("in/dt=1/part-0.parquet", 10), S3Object("in/ü/ä b.parquet", 0), S3Object("in/x", 2**40)]
    body = plan_file_body("s3://bkt/in", objects)
    assert parse_plan_file(body, "s3://bkt/m") == [
        ("s3://bkt/in/dt=1/part-0.parquet", 10),
        ("s3://bkt/in/ü/ä b.parquet", 0),
        ("s3://bkt/in/x", 2**40),
    ]
    assert plan_file_body("s3://bkt/in/", objects) == body  # deterministic: a re-plan of the same writes the same


def test_a_plan_file_refuses_a_key_outside_its_prefix():
    from shardline.planning.inputs import S3Object, plan_file_body

    with pytest.raises(ValueError, match="is not under"):
        plan_file_body("s3://bkt/in/", [S3Object("other/a.parquet", 1)])


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not gzip",
        __import__("gzip").compress(b"[1, 2]", mtime=0),
        __import__("gzip").compress(b'{"version": 9, "prefix": "s3://b/", "files": []}', mtime=0),
        __import__("gzip").compress(b'{"version": 1, "prefix": "s3://b/", "files": [1]}', mtime=0),
    ],
    ids=["empty", "not gzip", "not an object", "another version", "a file that is not a line"],
)
def test_a_damaged_plan_file_is_an_error_that_names_it(body):
    from shardline.planning.inputs import parse_plan_file

    with pytest.raises(PlanFileError, match=r"s3://b/m/attempt-0001.files.json.gz is not a Shardline plan file"):
        parse_plan_file(body, "s3://b/m/attempt-0001.files.json.gz")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("n" * 256 + "/a.parquet", "a folder name of 256 bytes"),
        ("a/" + "n" * 256 + ".parquet", "a file name of 264 bytes"),
        ("é" * 110 + ".csv", "a file name of 224 bytes"),  # 114 characters: bytes count, not characters
        ("/".join(["d" * 200] * 21), "over the 4000 a file path may have"),
    ],
)
def test_a_key_no_file_system_can_hold_is_unsafe(key, why):
    from shardline.planning.inputs import MAX_FILE_NAME_BYTES, unsafe_key_reason

    assert why in (unsafe_key_reason(key) or ""), key
    # A file name of the longest length planned still fits on disk as the worker's temporary name.
    name = "n" * (MAX_FILE_NAME_BYTES - len(".csv.gz")) + ".csv.gz"
    assert unsafe_key_reason(f"{'d' * 255}/{name}") is None
    assert len(f".{name[: -len('.csv.gz')]}.parquet.gz.part0000.shardline-tmp".encode()) <= 255


def test_a_key_that_is_also_a_folder_is_refused_alone_and_the_rest_are_planned(aws_env):
    """s3://b/in/a/b and s3://b/in/a/b/c.parquet cannot both land on disk (a/b would be a file and a folder):
    the file is refused, naming a key under it, and recorded per file; the step's other files run."""
    from shardline.planning.inputs import list_inputs_and_refusals

    s3 = boto3.client("s3")
    bucket = f"clash-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for key in ("in/a/b", "in/a/b/c.parquet", "in/x.parquet", "in/" + "n" * 300):
        s3.put_object(Bucket=bucket, Key=key, Body=b"1")
    found, refused = list_inputs_and_refusals(s3, f"s3://{bucket}/in/")
    assert [o.key for o in found] == ["in/a/b/c.parquet", "in/x.parquet"]
    reasons = {o.key: why for o, why in refused}
    assert set(reasons) == {"in/a/b", "in/" + "n" * 300}
    assert "both a file and a folder: a/b/c.parquet is under it" in reasons["in/a/b"]
    assert "a file name of 300 bytes" in reasons["in/" + "n" * 300]


def test_a_plan_file_is_read_within_bounds_so_a_gzip_bomb_is_refused():
    import gzip

    from shardline.planning import inputs

    bomb = gzip.compress(b'{"version": 1, "prefix": "s3://b/", "files": [' + b" " * (8 << 20) + b"]}")
    assert len(bomb) < 64 << 10
    with pytest.raises(PlanFileError, match="inflates past 1 MiB"):
        inputs.parse_plan_file(bomb, "s3://b/m/attempt-0001.files.json.gz", max_inflated=1 << 20)
    assert inputs.MAX_PLAN_FILE_INFLATED >= 256 << 20  # the real bound leaves a million inputs room
    fine = inputs.plan_file_body("s3://b/in/", [inputs.S3Object("in/a.parquet", 7)])
    assert inputs.parse_plan_file(fine, "s3://b/m/x") == [("s3://b/in/a.parquet", 7)]
