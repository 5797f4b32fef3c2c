"""planning.py: classify, discover_inputs, plan_units and split_row_groups (unit), and a large
parquet file split by row group across two workers, then merged (end to end)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.contract import EXIT_OK
from shardline.worker.io.work_units import (
    MIN_SPLIT_BYTES,
    InputFile,
    classify,
    discover_inputs,
    plan_units,
    split_row_groups,
)
from tests.support.helpers import (
    check_outputs,
    describe,
    load_manifest,
    no_temp_files,
    reports_by_input,
    run_worker,
    xgboost_predict,
)

MB = 1024 * 1024

# -- classify / discover_inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.parquet", ("parquet", False)),
        ("a.pq", ("parquet", False)),
        ("A.PARQUET", ("parquet", False)),
        ("a.parquet.gz", ("parquet", True)),
        ("a.csv", ("csv", False)),
        ("a.CSV.GZ", ("csv", True)),
        ("a.jsonl", ("jsonl", False)),
        ("a.ndjson", ("jsonl", False)),
        ("a.jsonl.gz", ("jsonl", True)),
        ("part.2024.csv", ("csv", False)),
        ("a.json", None),
        ("a.txt", None),
        ("a.gz", None),
        ("a.tar.gz", None),
        ("parquet", None),
        ("_SUCCESS", None),
    ],
)
def test_classify(name, expected):
    assert classify(name) == expected


def test_discover_inputs_walks_sorted_and_skips_hidden_and_underscore(tmp_path):
    for name in [
        "b.csv",
        "a.parquet",
        "sub/c.jsonl.gz",
        "notes.txt",
        "_SUCCESS",
        ".hidden.csv",
        "_shardline/manifest.json",
        ".cache/x.parquet",
        "sub/_tmp/y.csv",
        "z/readme.md",
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"12345")
    files, ignored = discover_inputs(tmp_path)
    assert [f.relative_path for f in files] == ["a.parquet", "b.csv", "sub/c.jsonl.gz"]
    assert ignored == ["notes.txt", "z/readme.md"]
    c = files[2]
    assert (c.fmt, c.gzipped, c.size, c.path) == ("jsonl", True, 5, str(tmp_path / "sub" / "c.jsonl.gz"))


# -- plan_units -------------------------------------------------------------------------------------------


def _f(rel: str, size: int, fmt: str = "parquet", gz: bool = False) -> InputFile:
    return InputFile(rel, f"/data/{rel}", fmt, gz, size)


class Groups:
    """A row_group_sizes callback that records which files it was asked about."""

    def __init__(self, sizes: dict[str, list[int]]):
        self.sizes, self.asked = sizes, []

    def __call__(self, file: InputFile) -> list[int]:
        self.asked.append(file.relative_path)
        return self.sizes[file.relative_path]


def _covers_exactly_once(units, rel: str, n_groups: int) -> list[tuple[int, ...]]:
    parts = sorted((u for u in units if u.file.relative_path == rel), key=lambda u: u.part)
    assert [u.part for u in parts] == list(range(len(parts)))
    assert all(u.parts == len(parts) for u in parts)
    ranges = [u.row_groups for u in parts]
    flat = [g for r in ranges for g in r]
    assert flat == list(range(n_groups)), "row groups must be covered once each, in order"
    for r in ranges:
        assert list(r) == list(range(r[0], r[-1] + 1)), f"range {r} is not contiguous"
    return ranges


def test_a_file_much_larger_than_the_rest_is_split_into_contiguous_ranges():
    big_groups = [4 * MB] * 50  # 200 MiB in 50 row groups
    files = [_f("big.parquet", sum(big_groups))] + [_f(f"small-{i}.parquet", 5 * MB) for i in range(10)]
    groups = Groups({"big.parquet": big_groups})
    units = plan_units(files, 4, groups)
    assert groups.asked == ["big.parquet"], "only files worth splitting have their footer read"
    ranges = _covers_exactly_once(units, "big.parquet", 50)
    assert len(ranges) > 1
    big_parts = [u for u in units if u.file.relative_path == "big.parquet"]
    assert sum(u.est_bytes for u in big_parts) == sum(big_groups)
    assert all(u.is_split and "part" in u.label for u in big_parts)
    # small files are never split: one whole-file unit each
    for i in range(10):
        (unit,) = [u for u in units if u.file.relative_path == f"small-{i}.parquet"]
        assert (unit.parts, unit.row_groups, unit.is_split) == (1, None, False)
        assert unit.label == f"small-{i}.parquet"
    # largest first
    assert [u.est_bytes for u in units] == sorted((u.est_bytes for u in units), reverse=True)


def test_split_parts_have_similar_sizes():
    sizes = [3 * MB, 1 * MB, 2 * MB, 5 * MB, 1 * MB, 1 * MB, 4 * MB, 2 * MB] * 8
    units = plan_units([_f("big.parquet", sum(sizes))], 4, Groups({"big.parquet": sizes}))
    ranges = _covers_exactly_once(units, "big.parquet", len(sizes))
    totals = [sum(sizes[g] for g in r) for r in ranges]
    assert max(totals) <= 2 * min(totals)


@pytest.mark.parametrize(
    ("file", "workers"),
    [
        (_f("big.parquet", 400 * MB), 1),  # one worker: nothing to balance
        (_f("big.parquet.gz", 400 * MB, gz=True), 4),  # gzipped parquet cannot be read by row group
        (_f("big.csv", 400 * MB, fmt="csv"), 4),  # text formats have no row groups
        (_f("big.jsonl", 400 * MB, fmt="jsonl"), 4),
    ],
)
def test_files_that_cannot_or_need_not_be_split(file, workers):
    groups = Groups({file.relative_path: [MB] * 400})
    units = plan_units([file, _f("small.parquet", MB)], workers, groups)
    assert groups.asked == []
    assert [(u.file.relative_path, u.parts) for u in units] == [(file.relative_path, 1), ("small.parquet", 1)]


def test_small_files_are_never_split_even_when_alone():
    sizes = [MB // 4] * 40  # 10 MiB: below MIN_SPLIT_BYTES
    groups = Groups({"only.parquet": sizes})
    units = plan_units([_f("only.parquet", sum(sizes))], 8, groups)
    assert [(u.parts, u.row_groups) for u in units] == [(1, None)]
    assert groups.asked == []
    assert sum(sizes) < MIN_SPLIT_BYTES


def test_a_single_row_group_is_not_split():
    units = plan_units([_f("big.parquet", 400 * MB)], 4, Groups({"big.parquet": [400 * MB]}))
    assert [(u.parts, u.row_groups) for u in units] == [(1, None)]


def test_min_split_bytes_is_honoured():
    sizes = [100] * 30
    files = [_f("big.parquet", 3000), _f("a.parquet", 100), _f("b.parquet", 100)]
    # target part size = max(min_split_bytes, total / (workers x 2)) = max(1000, 800)
    units = plan_units(files, 2, Groups({"big.parquet": sizes}), min_split_bytes=1000)
    ranges = _covers_exactly_once(units, "big.parquet", 30)
    assert len(ranges) == 3  # ceil(3000 / 1000)
    assert [u.parts for u in units if u.file.relative_path != "big.parquet"] == [1, 1]
    # with the default threshold, a 3000-byte file is far too small to split
    assert all(u.parts == 1 for u in plan_units(files, 2, Groups({"big.parquet": sizes})))


def test_equal_files_are_not_split():
    files = [_f(f"{i}.parquet", 100 * MB) for i in range(8)]
    groups = Groups({f.relative_path: [MB] * 100 for f in files})
    units = plan_units(files, 4, groups)
    assert all(u.parts == 1 for u in units)
    assert len(units) == 8


def test_plan_units_of_nothing():
    assert plan_units([], 4, Groups({})) == []


# -- split_row_groups -------------------------------------------------------------------------------------


def test_split_row_groups_properties():
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(1, 40)
        sizes = [rng.choice([0, 1, 7, 100, rng.randint(1, 10_000)]) for _ in range(n)]
        parts = rng.randint(1, n + 3)
        ranges = split_row_groups(sizes, parts)
        assert len(ranges) == min(parts, n), (sizes, parts, ranges)
        assert all(ranges), (sizes, parts, ranges)
        assert [g for r in ranges for g in r] == list(range(n)), (sizes, parts, ranges)
        for r in ranges:
            assert list(r) == list(range(r[0], r[-1] + 1)), (sizes, parts, ranges)


@pytest.mark.parametrize(
    ("sizes", "parts", "expected"),
    [
        ([1, 1, 1, 1], 2, [(0, 1), (2, 3)]),
        ([1, 1, 1, 1, 1, 1], 3, [(0, 1), (2, 3), (4, 5)]),
        ([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2, [(0,), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)]),
        ([5], 3, [(0,)]),
        ([1, 2, 3], 1, [(0, 1, 2)]),
        ([1, 2, 3], 0, [(0, 1, 2)]),
        ([1, 1, 1], 5, [(0,), (1,), (2,)]),
    ],
)
def test_split_row_groups_examples(sizes, parts, expected):
    assert split_row_groups(sizes, parts) == expected


def test_split_row_groups_balances_uniform_groups():
    for n in range(1, 30):
        for parts in range(1, n + 1):
            lengths = [len(r) for r in split_row_groups([10] * n, parts)]
            assert len(lengths) == parts
            assert max(lengths) - min(lengths) <= 1, (n, parts, lengths)


# -- end to end: one large file split across two workers, then merged -------------------------------------

BIG_ROWS = 210_000  # ~28 MB of random float32: over 1.5 x MIN_SPLIT_BYTES, so it is split


@pytest.mark.slow
def test_large_parquet_file_is_split_and_merged(tmp_path, xgboost_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    synthetic.write_table(
        synthetic.make_table(BIG_ROWS, first_id=1000, seed=3), inputs / "big.parquet", "parquet", row_group_rows=10_000
    )
    synthetic.write_table(synthetic.make_table(1000, seed=4), inputs / "small.parquet", "parquet")
    big_meta = pq.read_metadata(inputs / "big.parquet")
    assert big_meta.num_row_groups == 21
    assert (inputs / "big.parquet").stat().st_size > 1.5 * MIN_SPLIT_BYTES, "the fixture must be big enough"

    result = run_worker(inputs, out, xgboost_model.parent, "--passthrough", "id", "--workers", "2")
    assert result.returncode == EXIT_OK, describe(result)
    assert "1 large file(s) split by row group" in result.stderr
    manifest = load_manifest(out)
    reports = reports_by_input(manifest)
    assert reports["big.parquet"]["tries"] >= 2, "each part of a split file is one try"
    assert reports["small.parquet"]["tries"] == 1
    check_outputs(inputs, out, manifest, xgboost_predict(xgboost_model))
    merged = pq.read_table(out / "big.parquet")
    assert merged.num_rows == BIG_ROWS == reports["big.parquet"]["rows_out"]
    np.testing.assert_array_equal(merged.column("id").to_numpy(), np.arange(1000, 1000 + BIG_ROWS))
    assert no_temp_files(out) == [], "part files must be removed after the merge"
    assert sorted(p.name for p in out.iterdir()) == ["_shardline", "big.parquet", "small.parquet"]
