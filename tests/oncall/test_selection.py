"""Which files a resubmission takes (``shardline.oncall.selection``): ``--all-failed``, ``--instance NAME`` and
``--file KEY`` over a step's files as the ledger holds them, and an instance's unclaimed files found from its
attempt's manifest. Pure: the files are values, the manifest is built by the planner's own function; no
server, no AWS."""

from __future__ import annotations

import json

import pytest

from shardline.decision.policy import UNSAFE_KEY_ERROR
from shardline.oncall import selection
from shardline.oncall.errors import BadRequest
from shardline.oncall.values import FileChoice, FileView
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import manifest_body

REF, STEP = "p/run-1", "score"
PREFIX = "s3://b/in/"


def f(name: str, status: str, attempt: int, host: str | None, error_class: str | None = None) -> FileView:
    return FileView(STEP, PREFIX + name, status, attempt, host, None, None, error_class, None)


# A step of three instances, resubmitted once: attempt 2 ran the 7 files attempt 1 left.
FILES = [
    f("a.parquet", "SUCCEEDED", 1, "algo-1"),  # done in attempt 1: never again
    f("b.parquet", "FAILED", 1, "algo-2"),  # failed in attempt 1 and was not part of attempt 2
    f("c.parquet", "SUCCEEDED", 2, "algo-2"),
    f("d.parquet", "FAILED", 2, "algo-2"),
    f("e.parquet", "RUNNING", 2, "algo-2"),  # its instance died while on it
    f("f.parquet", "FAILED", 2, "algo-1"),
    f("g.parquet", "PENDING", 2, "algo-3"),
    f("h.parquet", "PENDING", 2, None),  # never claimed: the manifest says where it went
    f("../evil.parquet", "FAILED", 2, None, UNSAFE_KEY_ERROR),  # refused by the planner: it can never run
]


def test_all_failed_takes_every_file_that_has_not_succeeded_in_any_attempt():
    plan = selection.choose_files(REF, STEP, 2, FILES, FileChoice(all_failed=True))
    assert plan.files == [
        PREFIX + n for n in ("b.parquet", "d.parquet", "e.parquet", "f.parquet", "g.parquet", "h.parquet")
    ]
    assert (plan.ref, plan.step, plan.reason) == (REF, STEP, "every file that has not succeeded")


def test_a_shard_takes_the_unfinished_or_failed_files_its_instance_had_in_the_newest_attempt():
    plan = selection.choose_files(REF, STEP, 2, FILES, FileChoice(instance="algo-2"))
    # b.parquet was algo-2's in attempt 1, another machine: not this instance's. c.parquet succeeded.
    assert plan.files == [PREFIX + "d.parquet", PREFIX + "e.parquet"]
    assert plan.reason == "the unfinished or failed files of instance algo-2 (attempt 2)"
    assert selection.choose_files(REF, STEP, 2, FILES, FileChoice(instance="algo-3")).files == [PREFIX + "g.parquet"]
    assert selection.choose_files(REF, STEP, 2, FILES, FileChoice(instance="algo-9")).files == []


def test_a_shard_takes_the_files_the_manifest_dealt_it_that_it_never_claimed():
    attempt = Attempt(
        pipeline="p",
        run_id="run-1",
        step=STEP,
        number=2,
        input_prefix=PREFIX,
        output_prefix="s3://b/out/",
        model_uri="s3://b/m.tar.gz",
        requested_instances=3,
    )
    keys = [f"in/{n}.parquet" for n in "bdefgh"]  # the order the planner dealt them in
    manifest = json.loads(manifest_body(PREFIX, keys))
    dealt = selection.dealt_hosts(manifest, attempt)
    # Round robin over 3 instances: entry j goes to algo-(j % 3 + 1).
    assert dealt == {
        PREFIX + "b.parquet": "algo-1",
        PREFIX + "d.parquet": "algo-2",
        PREFIX + "e.parquet": "algo-3",
        PREFIX + "f.parquet": "algo-1",
        PREFIX + "g.parquet": "algo-2",
        PREFIX + "h.parquet": "algo-3",
    }
    assert selection.needs_deal(FILES, 2)
    # h.parquet was never claimed, and the deal gave it to algo-3; a host the ledger recorded wins over the deal.
    plan = selection.choose_files(REF, STEP, 2, FILES, FileChoice(instance="algo-3"), dealt=dealt)
    assert plan.files == [PREFIX + "g.parquet", PREFIX + "h.parquet"]
    assert selection.choose_files(REF, STEP, 2, FILES, FileChoice(instance="algo-2"), dealt=dealt).files == [
        PREFIX + "d.parquet",
        PREFIX + "e.parquet",
    ]


def test_the_deal_never_counts_more_instances_than_the_attempt_had_files():
    attempt = Attempt(
        pipeline="p",
        run_id="run-1",
        step=STEP,
        number=1,
        input_prefix=PREFIX,
        output_prefix="s3://b/out/",
        model_uri="s3://b/m.tar.gz",
        requested_instances=8,
    )
    dealt = selection.dealt_hosts(json.loads(manifest_body(PREFIX, ["in/x", "in/y"])), attempt)
    assert dealt == {PREFIX + "x": "algo-1", PREFIX + "y": "algo-2"}


def test_the_manifest_is_read_only_when_a_file_of_the_newest_attempt_was_never_claimed():
    claimed = [v for v in FILES if v.host is not None]
    assert not selection.needs_deal(claimed, 2)
    # An unclaimed file of an older attempt, or one that succeeded, needs no deal either.
    assert not selection.needs_deal([*claimed, f("old.parquet", "FAILED", 1, None)], 2)
    assert not selection.needs_deal([*claimed, f("x.parquet", "SUCCEEDED", 2, None)], 2)


def test_chosen_files_are_named_by_uri_or_by_key_under_the_input_prefix_and_succeeded_ones_are_dropped():
    plan = selection.choose_files(
        REF, STEP, 2, FILES, FileChoice(files=["d.parquet", PREFIX + "g.parquet", "a.parquet"])
    )
    assert plan.files == [PREFIX + "d.parquet", PREFIX + "g.parquet"]  # a.parquet succeeded: never again
    assert plan.reason == "the chosen files that have not succeeded"
    assert selection.choose_files(REF, STEP, 2, FILES, FileChoice(files=["/in/d.parquet"])).files == [
        PREFIX + "d.parquet"
    ]


def test_a_file_that_is_no_input_of_the_step_is_a_bad_request_that_says_where_to_look():
    with pytest.raises(BadRequest) as err:
        selection.choose_files(REF, STEP, 2, FILES, FileChoice(files=["d.parquet", "nope.parquet"]))
    assert str(err.value) == (
        "'nope.parquet' is not an input of step score; `shardline failed p/run-1 --step score` "
        "lists the files that can be resubmitted (pass one as --file, or use --all-failed)"
    )
    assert (err.value.http_status, err.value.exit_code) == (400, 2)
    with pytest.raises(BadRequest, match=r"^'x', 's3://other/d.parquet' are not an input of step score"):
        selection.choose_files(REF, STEP, 2, FILES, FileChoice(files=["x", "s3://other/d.parquet"]))


def test_a_relative_key_that_two_inputs_end_with_names_neither():
    files = [f("day=1/part.parquet", "FAILED", 1, "algo-1"), f("day=2/part.parquet", "FAILED", 1, "algo-1")]
    with pytest.raises(BadRequest, match=r"'part\.parquet' is not an input"):
        selection.choose_files(REF, STEP, 1, files, FileChoice(files=["part.parquet"]))
    assert selection.choose_files(REF, STEP, 1, files, FileChoice(files=["day=2/part.parquet"])).files == [
        PREFIX + "day=2/part.parquet"
    ]


@pytest.mark.parametrize(
    "choice",
    [
        {},
        {"all_failed": True, "instance": "algo-1"},
        {"instance": "algo-1", "files": ["x"]},
        {"all_failed": True, "files": ["x"]},
        {"all_failed": True, "rejects": True},
    ],
)
def test_exactly_one_way_of_choosing_is_taken(choice):
    with pytest.raises(BadRequest, match="exactly one of --all-failed, --instance NAME, --file KEY or --rejects"):
        selection.choose_files(REF, STEP, 2, FILES, FileChoice(**choice))
    with pytest.raises(BadRequest):
        FileChoice(**choice).check()


def test_nothing_left_to_choose_is_an_empty_plan_not_an_error():
    done = [f("a.parquet", "SUCCEEDED", 1, "algo-1")]
    assert selection.choose_files(REF, STEP, 1, done, FileChoice(all_failed=True)).files == []
    assert selection.choose_files(REF, STEP, 1, done, FileChoice(instance="algo-1")).files == []
    assert selection.choose_files(REF, STEP, 1, done, FileChoice(files=["a.parquet"])).files == []
