"""Planning a step: list its inputs, shard them, and write the attempt's manifest.

The sharding and manifest functions are pure; :func:`list_inputs` and
:func:`write_manifest` do the S3 IO, through a boto3 client the caller provides.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import gzip
import json
import logging
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from shardline import contract
from shardline.errors import PermanentError
from shardline.s3uri import parse_s3_uri

log = logging.getLogger(__name__)

# Refused keys are named one by one up to this many, then counted: a whole prefix of bad keys
# must not flood the task log.
NAMED_REFUSALS = 20
# Listing in parallel (see list_keys): threads within botocore's default pool of 10 connections per client;
# split prefixes level by level until this many list side by side, at most this deep, and never into more
# prefixes than MAX_PREFIXES (each costs at least one call, however few keys it holds).
LIST_THREADS = 8
FANOUT = 32
MAX_DEPTH = 6
MAX_PREFIXES = 2000
PAGE_KEYS = 1000  # what one ListObjectsV2 call returns at most (S3's own limit)
# A prefix longer than a page splits into at most this many key ranges, one probe each (_ranges_after).
MAX_RANGES = 64
MAX_CHAR = "\U0010ffff"  # sorts after every character a key may hold


@dataclasses.dataclass(frozen=True)
class S3Object:
    key: str  # the full object key
    size: int
    # As the listing gave it, unquoted: a plan file keeps it, so a replaced input is told apart. Not part of an
    # object's identity: the same key and size from another reading (a manifest, a record) is the same input.
    etag: str = dataclasses.field(default="", compare=False)


class PlanError(PermanentError, ValueError):
    """A manifest or plan file that would not say what was planned (a key outside its prefix, an unsafe one)."""


class PlanFileError(PermanentError):
    """A plan file the STEP item records is gone or damaged: the step's inputs cannot all be accounted for."""


MAX_NAME_BYTES = 255  # a folder name on Linux file systems (ext4, xfs): NAME_MAX
# A file's own name: the worker writes ".<name>.part0000.shardline-tmp" while it is incomplete (24 bytes more), and
# an output format may change the extension (.csv to .parquet, plus .gz).
MAX_FILE_NAME_BYTES = MAX_NAME_BYTES - 24 - 12
MAX_PATH_BYTES = 4000  # a path, within PATH_MAX (4096) once the input directory is in front


def unsafe_key_reason(relative_key: str) -> str | None:
    """Why a key, relative to its prefix, cannot be a file under the input directory; ``None`` when it can.

    SageMaker (and the local emulator) downloads each object to ``LocalPath/<relative key>``:
    an empty segment (``a//b``, a leading ``/``) makes that path absolute, and ``..`` climbs
    out of the directory. ``.`` is refused too: ``a/./b`` and ``a/b`` would be one file. A
    backslash is an ordinary character in a POSIX file name, so it is allowed.
    """
    if not relative_key:
        return "empty key"
    if "\x00" in relative_key:
        return "NUL character in the key"
    if relative_key.startswith("/"):
        return "absolute path (the key has '/' right after the prefix)"
    parts = relative_key.split("/")
    if "" in parts:
        return "empty path segment ('//' or a trailing '/')"
    if ".." in parts:
        return "'..' segment, which climbs out of the input directory"
    if "." in parts:
        return "'.' segment"
    longest = max(parts[:-1], key=lambda part: len(part.encode()), default="")
    if len(longest.encode()) > MAX_NAME_BYTES:
        return (
            f"a folder name of {len(longest.encode())} bytes ({longest[:40]}...), over the {MAX_NAME_BYTES} a "
            "name may have on the instance's disk"
        )
    if len(parts[-1].encode()) > MAX_FILE_NAME_BYTES:
        return (
            f"a file name of {len(parts[-1].encode())} bytes ({parts[-1][:40]}...), over the "
            f"{MAX_FILE_NAME_BYTES} the worker can write (the disk's {MAX_NAME_BYTES}, less room for its "
            "temporary name and another output extension)"
        )
    if len(relative_key.encode()) > MAX_PATH_BYTES:
        return f"a key of {len(relative_key.encode())} bytes, over the {MAX_PATH_BYTES} a file path may have"
    return None


def folder_clashes(relative_keys: Sequence[str]) -> dict[str, str]:
    """Keys that are also the folder of another key (``a/b`` and ``a/b/c``): on disk ``a/b`` cannot be both a
    file and a folder, so the download of one fails, and with it every attempt. Each such key, with the
    reason, naming one key under it."""
    under: dict[str, str] = {}
    for key in relative_keys:
        parts = key.split("/")
        for depth in range(1, len(parts)):
            under.setdefault("/".join(parts[:depth]), key)
    return {
        key: f"both a file and a folder: {under[key]} is under it, and a file cannot be a folder on the instance's disk"
        for key in relative_keys
        if key in under
    }


def _matches(relative_key: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    name = relative_key.rsplit("/", 1)[-1]

    def hit(patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatch(relative_key, p) or fnmatch.fnmatch(name, p) for p in patterns)

    return hit(include) and not hit(exclude)


def selected(relative_key: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if contract.is_reserved(relative_key) or relative_key.endswith("/") or unsafe_key_reason(relative_key):
        return False
    return _matches(relative_key, include, exclude)


def list_inputs(
    s3, prefix_uri: str, include: Sequence[str] = ("*",), exclude: Sequence[str] = (), *, threads: int = LIST_THREADS
) -> list[S3Object]:
    """Every selected object under the prefix, sorted by key. Follows ListObjectsV2 to the last page.

    A key that would land outside the input directory (see :func:`unsafe_key_reason`) is
    not planned, and a WARNING names it: no download of it could be safe, on either backend.
    Sub-prefixes are listed in parallel (see :func:`list_keys`); the result is the same.
    """
    return list_inputs_and_refusals(s3, prefix_uri, include, exclude, threads=threads)[0]


def list_inputs_and_refusals(
    s3, prefix_uri: str, include: Sequence[str] = ("*",), exclude: Sequence[str] = (), *, threads: int = LIST_THREADS
) -> tuple[list[S3Object], list[tuple[S3Object, str]]]:
    """:func:`list_inputs`, plus the selected keys refused as unsafe paths, each with its reason (by key)."""
    bucket, prefix = parse_s3_uri(prefix_uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    listing = list_keys(s3, bucket, prefix, threads=threads)
    found: list[S3Object] = []
    refused: list[tuple[S3Object, str]] = []
    for obj in listing.objects:
        relative = obj.key[len(prefix) :]
        if selected(relative, include, exclude):
            found.append(obj)
        elif (
            relative
            and not relative.endswith("/")  # folder markers are no inputs, and no news
            and (reason := unsafe_key_reason(relative))
            and _matches(relative, include, exclude)
        ):
            refused.append((obj, reason))
    clashes = folder_clashes([obj.key[len(prefix) :] for obj in found])
    if clashes:
        refused += [(obj, clashes[obj.key[len(prefix) :]]) for obj in found if obj.key[len(prefix) :] in clashes]
        found = [obj for obj in found if obj.key[len(prefix) :] not in clashes]
        refused.sort(key=lambda pair: pair[0].key)
    for obj, reason in refused[:NAMED_REFUSALS]:
        log.warning("not planning s3://%s/%s: %s", bucket, obj.key, reason)
    if refused:
        log.warning(
            "%d input key(s) under %s refused as unsafe paths and left out of the plan", len(refused), prefix_uri
        )
    log.info(
        "listed %d key(s) under %s: %d ListObjectsV2 request(s) over %d prefix(es)",
        len(listing.objects),
        prefix_uri,
        listing.requests,
        listing.prefixes,
    )
    return found, refused


@dataclasses.dataclass(frozen=True)
class Listing:
    objects: list[S3Object]  # every object under the prefix, sorted by key
    requests: int  # ListObjectsV2 calls it took
    prefixes: int  # prefixes listed to the end without a delimiter: how wide the listing fanned out


def list_keys(
    s3,
    bucket: str,
    prefix: str,
    *,
    threads: int = LIST_THREADS,
    fanout: int = FANOUT,
    max_depth: int = MAX_DEPTH,
    max_prefixes: int = MAX_PREFIXES,
    page_keys: int = PAGE_KEYS,
) -> Listing:
    """Every object under ``bucket``/``prefix``, sorted by key: the sub-prefixes listed in parallel.

    One prefix lists one page (1,000 keys) per round trip, because each page names the next:
    1M keys are 1,000 calls in a row. But the keys under ``p/`` are exactly the keys right
    under it plus those under each of its sub-prefixes (what a ``Delimiter='/'`` listing
    returns as CommonPrefixes), so those can be listed side by side. Level by level, each
    prefix is listed with the delimiter (its own keys, and its sub-prefixes for the next
    level) while there are fewer than ``fanout`` of them and the walk is less than
    ``max_depth`` levels deep; the last level is listed whole. A prefix longer than a page, flat keys
    above all, is split by key range and its ranges listed side by side (:func:`_list_prefix`);
    one that fits a page costs one call, as before. A level that would split
    into more than ``max_prefixes`` sub-prefixes (many tiny folders, each at least one
    call) is not split: its parents are listed whole instead. ``threads=1``: the plain
    sequential listing.
    """
    if threads <= 1:
        objects, _, requests = _list_prefix(s3, bucket, prefix, None, threads=1, page_keys=page_keys)
        return Listing(sorted(objects, key=lambda o: o.key), requests, 1)
    objects: list[S3Object] = []
    requests = leaves = 0
    frontier, depth = [prefix], 0

    def list_one(p: str, delimiter: str | None, width: int) -> tuple[list[S3Object], list[str], int]:
        # A long prefix's ranges share the threads its level leaves free (botocore keeps 10 connections).
        return _list_prefix(s3, bucket, p, delimiter, threads=max(1, threads // width), page_keys=page_keys)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        while frontier:
            split = len(frontier) < fanout and depth < max_depth
            delimiter, width = ("/" if split else None), len(frontier)
            listed = list(pool.map(lambda p, d=delimiter, w=width: list_one(p, d, w), frontier))
            below = [sub for _, subs, _ in listed for sub in subs]
            requests += sum(calls for _, _, calls in listed)
            if len(below) > max_prefixes:
                listed = list(pool.map(lambda p, w=width: list_one(p, None, w), frontier))
                requests += sum(calls for _, _, calls in listed)
                below = []
            leaves += sum(not subs for _, subs, _ in listed)
            objects.extend(o for found, _, _ in listed for o in found)
            frontier, depth = below, depth + 1
    # Each key came from exactly one prefix, so this is the sequential listing's order and set.
    objects.sort(key=lambda o: o.key)
    return Listing(objects, requests, leaves)


def _list_prefix(
    s3, bucket: str, prefix: str, delimiter: str | None, *, threads: int, page_keys: int
) -> tuple[list[S3Object], list[str], int]:
    """One prefix to its last page: its objects (all, or only those right under it with a delimiter), its
    sub-prefixes (with a delimiter), and the calls it took.

    A prefix longer than a page is split by key range (:func:`_ranges_after`) and the ranges are listed
    side by side: flat keys (``part-0000001`` ... ``part-1000000``) have no folders to split them by.
    """
    first = s3.list_objects_v2(
        Bucket=bucket, Prefix=prefix, MaxKeys=page_keys, **({"Delimiter": delimiter} if delimiter else {})
    )
    objects = [_object(item) for item in first.get("Contents", [])]
    subs = [common["Prefix"] for common in first.get("CommonPrefixes", [])]
    calls = 1
    if not first.get("IsTruncated"):
        return objects, subs, calls
    seen = [o.key for o in objects] + subs
    if not seen:  # a truncated page of nothing (S3 may send one): list the prefix as one chain
        return _list_range(s3, bucket, prefix, None, delimiter, page_keys)
    last = max(seen)  # every key up to here was on the first page (a sub-prefix stands for its keys)
    # Past a sub-prefix means past all of its keys: they are in it, and a listing that started among them
    # would name it again.
    resume = last + MAX_CHAR if last in subs else last
    ranges, probes = _ranges_after(s3, bucket, prefix, seen, last, resume) if threads > 1 else (None, 0)
    calls += probes
    ranges = ranges or [(prefix, resume)]  # no split: the rest is one chain of pages
    with ThreadPoolExecutor(max_workers=min(threads, len(ranges))) as pool:
        for found, below, taken in pool.map(lambda r: _list_range(s3, bucket, *r, delimiter, page_keys), ranges):
            objects.extend(found)
            subs.extend(below)
            calls += taken
    # S3 names a sub-prefix again when a range resumes among its keys (moto does not): keep each once.
    return objects, sorted(set(subs)), calls


def _object(item: dict) -> S3Object:
    return S3Object(item["Key"], item["Size"], (item.get("ETag") or "").strip('"'))


def _list_range(
    s3, bucket: str, prefix: str, start_after: str | None, delimiter: str | None, page_keys: int
) -> tuple[list[S3Object], list[str], int]:
    kwargs = {
        "Bucket": bucket,
        "Prefix": prefix,
        **({"Delimiter": delimiter} if delimiter else {}),
        **({"StartAfter": start_after} if start_after else {}),
    }
    objects: list[S3Object] = []
    subs: list[str] = []
    calls = 0
    for page in s3.get_paginator("list_objects_v2").paginate(**kwargs, PaginationConfig={"PageSize": page_keys}):
        calls += 1
        objects.extend(_object(item) for item in page.get("Contents", []))
        subs.extend(common["Prefix"] for common in page.get("CommonPrefixes", []))
    return objects, subs, calls


def _ranges_after(
    s3, bucket: str, prefix: str, seen: list[str], last: str, resume: str
) -> tuple[list[tuple[str, str | None]] | None, int]:
    """Split the keys under ``prefix`` after ``last`` into ranges that list side by side; and the probes it took.

    Each range is a longer prefix, ``shared + c``: ``shared`` is the longest prefix every key under
    ``prefix`` has (a binary search over the first page's common part), and ``c`` each character
    that follows it in some key. S3 orders keys by their UTF-8 bytes, which is Python's string order,
    so a probe (one key, ``StartAfter=shared + c + MAX_CHAR``) finds the first key past all of
    ``shared + c``: the next character, or none. A range all of whose keys were on the first page
    is left out; the one ``last`` falls in starts after ``resume``. None: no split (one chain, then).
    """
    probes = 0

    def first_key_after(start_after: str) -> str | None:
        nonlocal probes
        probes += 1
        page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, StartAfter=start_after, MaxKeys=1)
        contents = page.get("Contents", [])
        return contents[0]["Key"] if contents else None

    smallest, largest = min(seen), max(seen)  # the common part of sorted strings is that of the two ends
    differ = next((i for i, (a, b) in enumerate(zip(smallest, largest, strict=False)) if a != b), len(smallest))
    common = smallest[:differ]
    low, high = len(prefix), len(common)  # every key has common[:low]; the longest shared is at most high
    while low < high:
        middle = (low + high + 1) // 2
        if first_key_after(common[:middle] + MAX_CHAR) is None:
            low = middle
        else:
            high = middle - 1
    shared = common[:low]
    chars = sorted({key[len(shared)] for key in seen if len(key) > len(shared)})
    while chars:
        following = first_key_after(shared + chars[-1] + MAX_CHAR)
        if following is None:
            break
        if not following.startswith(shared) or len(following) == len(shared) or following[len(shared)] <= chars[-1]:
            return None, probes  # a key past MAX_CHAR: nothing to split safely by
        chars.append(following[len(shared)])
        if len(chars) > MAX_RANGES:
            return None, probes
    ranges: list[tuple[str, str | None]] = []
    for char in chars:
        child = shared + char
        head = last[: len(child)]
        if child < head:
            continue  # every key of it sorts before `last`: all on the first page
        ranges.append((child, resume if child == head else None))
    return (ranges or None), probes


def manifest_order(objects: Iterable[S3Object], instances: int, mode: str) -> list[S3Object]:
    """The order to list files in a manifest that is dealt round robin (entry j to instance j % n).

    ``by_key`` keeps key order (plain ShardedByS3Key). ``by_size`` balances bytes under
    that same deal: a round-robin deal fixes how many files each instance gets, so files
    go largest first to the least-loaded instance that still has room, and the manifest
    is then interleaved so the deal hands each instance exactly its bin.
    """
    ordered = sorted(objects, key=lambda o: o.key)
    if mode == "by_key" or instances <= 1 or len(ordered) <= instances:
        return ordered
    per, extra = divmod(len(ordered), instances)
    bins: list[list[S3Object]] = [[] for _ in range(instances)]
    loads = [0] * instances
    full_extra = 0  # bins that took one more file than `per`; only `extra` may
    for obj in sorted(ordered, key=lambda o: (-o.size, o.key)):
        room = [i for i in range(instances) if len(bins[i]) < per or (len(bins[i]) == per and full_extra < extra)]
        target = min(room, key=lambda i: (loads[i], i))
        full_extra += len(bins[target]) == per
        bins[target].append(obj)
        loads[target] += obj.size
    bins.sort(key=len, reverse=True)  # the deal's last, partial round goes to the first instances
    return [b[rnd] for rnd in range(per + 1) for b in bins if rnd < len(b)]


def choose_instance_count(requested: int, files: int) -> int:
    """Never more instances than files: an instance with no input would only cost money."""
    return max(1, min(requested, files))


def manifest_body(prefix_uri: str, keys: Iterable[str]) -> str:
    """A SageMaker ManifestFile: the common prefix, then each key relative to it.

    SageMaker downloads every entry to the input's LocalPath at its relative path, so the
    worker sees the same layout as under the prefix.
    """
    bucket, prefix = parse_s3_uri(prefix_uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    entries: list = [{"prefix": f"s3://{bucket}/{prefix}"}]
    for key in keys:
        if not key.startswith(prefix):
            raise PlanError(f"{key!r} is not under {prefix_uri!r}")
        relative = key[len(prefix) :]
        # list_inputs never plans such a key; one arriving here is a bug, and must not reach a manifest.
        if reason := unsafe_key_reason(relative):
            raise PlanError(f"{key!r} cannot be a manifest entry: {reason}")
        entries.append(relative)
    return json.dumps(entries)


def write_manifest(s3, manifest_uri: str, body: str) -> None:
    put_metadata(s3, manifest_uri, body.encode(), "application/json")


def put_metadata(s3, uri: str, body: bytes, content_type: str) -> None:
    """Write one of Shardline's own files under ``_shardline/``, tagged for the bucket's lifecycle rule
    (``contract.METADATA_TAGGING``). A caller whose role may write but not tag (a person's role running
    `shardline resubmit`) still writes it, untagged, and a WARNING says the lifecycle rule will not expire it."""
    bucket, key = parse_s3_uri(uri)
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type, Tagging=contract.METADATA_TAGGING)
    except Exception as err:
        if getattr(err, "response", {}).get("Error", {}).get("Code") != "AccessDenied":
            raise
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
        log.warning(
            "wrote %s without its lifecycle tag (%s): this role may not s3:PutObjectTagging there, so the "
            "bucket's expire-shardline-metadata rule will not remove it",
            uri,
            contract.METADATA_TAGGING,
        )


PLAN_FILE_VERSION = 1
# A plan file of a million inputs is about 2 MiB gzip'd and 60 MiB of JSON: these bounds leave room, and stop a
# file someone else wrote (or a gzip bomb) from taking the reader's memory.
MAX_PLAN_FILE_BYTES = 64 << 20
MAX_PLAN_FILE_INFLATED = 1 << 30


def plan_file_body(prefix_uri: str, objects: Sequence[S3Object]) -> bytes:
    """An attempt's plan file: every input it takes (anything with a ``key`` and a ``size``, such as an
    attempt's ``PlannedFile``), with its size, as gzip'd JSON.

    The ledger has no FILE item for an input until an instance claims it, so this file (written
    beside the manifest, before the job starts) is what readers take "planned, never claimed"
    from, and what a later attempt's sizes come from. A million keys are about 2 MB.
    """
    bucket, prefix = parse_s3_uri(prefix_uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    files, etags = [], []
    for o in objects:
        if not o.key.startswith(prefix):
            raise PlanError(f"{o.key!r} is not under {prefix_uri!r}")
        files.append([o.key[len(prefix) :], o.size])
        etags.append(getattr(o, "etag", "") or "")
    body = {"version": PLAN_FILE_VERSION, "prefix": f"s3://{bucket}/{prefix}", "files": files}
    if any(etags):  # each input's ETag as listed: an input replaced under its key after planning is late input
        body["etags"] = etags
    # Level 1: a tenth of level 6's time for about the same size on keys this alike.
    return gzip.compress(json.dumps(body, separators=(",", ":")).encode(), compresslevel=1, mtime=0)


def parse_plan_file(body: bytes, where: str, max_inflated: int = MAX_PLAN_FILE_INFLATED) -> list[tuple[str, int]]:
    """The inputs of a plan file (:func:`plan_file_body`) as (full s3:// URI, size) pairs.

    Raises :class:`PlanFileError` naming ``where`` (the file's URI) for a body that is not such a file.
    """
    return [(uri, size) for uri, size, _etag in parse_plan_file_versions(body, where, max_inflated)]


def parse_plan_file_versions(
    body: bytes, where: str, max_inflated: int = MAX_PLAN_FILE_INFLATED
) -> list[tuple[str, int, str]]:
    """The inputs of a plan file as (full s3:// URI, size, ETag) triples; the ETag is "" where the plan did not
    record one (an attempt planned from another attempt's files, or a plan file written before ETags were)."""
    try:
        if len(body) > MAX_PLAN_FILE_BYTES:
            raise ValueError(f"{len(body)} bytes, over the {MAX_PLAN_FILE_BYTES} a plan file can be")
        inflate = zlib.decompressobj(wbits=31)  # gzip, inflated no further than the cap: no gzip bomb
        text = inflate.decompress(body, max_inflated)
        if inflate.unconsumed_tail or not inflate.eof:
            raise ValueError(f"it inflates past {max_inflated >> 20} MiB, or is cut short")
        data = json.loads(text)
        prefix, files = data["prefix"], data["files"]
        if data.get("version") != PLAN_FILE_VERSION or not isinstance(prefix, str) or not isinstance(files, list):
            raise ValueError("unknown layout")
        etags = data.get("etags") or [""] * len(files)
        if not isinstance(etags, list) or len(etags) != len(files):
            raise ValueError("its etags do not match its files")
        return [(prefix + str(key), int(size), str(etag or "")) for (key, size), etag in zip(files, etags, strict=True)]
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError, AttributeError) as err:
        raise PlanFileError(
            f"{where} is not a Shardline plan file ({err}); it is written by the step's plan "
            "task beside the attempt's manifest and never edited"
        ) from err


def write_plan_file(s3, plan_file_uri: str, body: bytes) -> None:
    put_metadata(s3, plan_file_uri, body, "application/gzip")
