"""features.py: which columns the model gets and why (pure policy, no files)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from shardline.errors import InputSchemaError, SetupError
from shardline.worker.model.features import (
    FROM_FILE_ORDER,
    FROM_MODEL,
    FROM_SPEC,
    ModelInputs,
    check_spec_against_model,
    choose_features,
    trial_columns,
)

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("f0", pa.float32()),
        ("flag", pa.bool_()),
        ("amount", pa.decimal128(10, 2)),
        ("count", pa.int32()),
        ("when", pa.timestamp("s")),
    ]
)
NO_NAMES = ModelInputs()


def choose(schema=SCHEMA, model=NO_NAMES, features=None, passthrough=("id",), where="f.parquet"):
    return choose_features(schema, model, features, passthrough, where)


# -- no names anywhere: input.features, or file_order said out loud --------------------------------------------


@pytest.mark.parametrize("model", [NO_NAMES, ModelInputs(count=4), ModelInputs(raw_columns=True)])
@pytest.mark.parametrize("passthrough", [(), ("id",), ("id", "name", "when")])
def test_a_model_without_names_never_takes_the_file_order_unasked(model, passthrough):
    # Even when the count fits: a file's column order says nothing about the training order.
    with pytest.raises(InputSchemaError) as info:
        choose(model=model, passthrough=passthrough)
    message = str(info.value)
    assert "records no feature names" in message
    assert "input.features" in message and "training order" in message
    assert "passthrough" not in message.replace("(not passthrough)", "")  # no advice that leaves order to the file


def test_file_order_takes_the_numeric_non_passthrough_columns_and_says_nothing_vouches_for_it():
    choice = choose(features="file_order", passthrough=("id", "name"))
    assert choice.columns == ("f0", "flag", "amount", "count")
    assert choice.source == FROM_FILE_ORDER
    assert choice.unused == ("when",)
    assert not choice.order_vouched
    assert "nothing checks" in choice.describe()
    # without passthrough, a numeric id is a feature too; strings and timestamps never are
    assert choose(features="file_order", passthrough=()).columns == ("id", "f0", "flag", "amount", "count")


def test_file_order_must_match_the_count_the_model_knows():
    model = ModelInputs(count=3, described_as="the model (Booster)")
    with pytest.raises(InputSchemaError) as info:
        choose(model=model, features="file_order")
    message = str(info.value)
    assert "the model (Booster) expects 3 features" in message
    assert "4 numeric column(s)" in message
    assert "skipped, not numeric: name, when" in message
    assert "input.features" in message and "input.passthrough" not in message


def test_file_order_for_a_script_with_a_text_body_gets_every_non_passthrough_column():
    choice = choose(model=ModelInputs(raw_columns=True), features="file_order")
    assert choice.columns == ("name", "f0", "flag", "amount", "count", "when")
    assert "every non-passthrough column" in choice.describe()


def test_file_order_without_any_numeric_feature_asks_for_features():
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with pytest.raises(InputSchemaError, match=r"input\.features \(--features\)"):
        choose(schema, features="file_order")


def test_file_order_leaves_a_model_with_names_to_its_names():
    model = ModelInputs(names=("count", "f0"))
    check_spec_against_model("file_order", model)
    assert choose(model=model, features="file_order").source == FROM_MODEL


# -- from the spec -------------------------------------------------------------------------------------------


def test_spec_features_keep_their_order():
    choice = choose(features=["count", "f0"])
    assert (choice.columns, choice.source) == (("count", "f0"), FROM_SPEC)
    assert choice.order_vouched
    assert choice.unused == ("name", "flag", "amount", "when")


def test_a_missing_spec_feature_names_the_column_and_lists_the_others():
    with pytest.raises(InputSchemaError) as info:
        choose(features=["f0", "f9"], where="dir/f.parquet")
    message = str(info.value)
    assert "'f9'" in message
    assert "dir/f.parquet" in message
    assert "columns present: id, name, f0" in message


def test_a_non_numeric_feature_names_the_column_and_its_type():
    with pytest.raises(InputSchemaError, match=r"feature column 'name' .* has type string"):
        choose(features=["f0", "name"])
    with pytest.raises(InputSchemaError, match=r"feature column 'when'"):
        choose(features=["when"], passthrough=())


def test_a_missing_passthrough_column_names_the_setting():
    with pytest.raises(InputSchemaError, match=r"passthrough column 'key' not found in f\.jsonl.*input\.passthrough"):
        choose(passthrough=("id", "key"), where="f.jsonl")


def test_a_long_column_listing_is_shortened():
    schema = pa.schema([(f"c{i}", pa.float64()) for i in range(30)])
    with pytest.raises(InputSchemaError) as info:
        choose(schema, features=["missing"], passthrough=())
    assert "c19, ... (10 more)" in str(info.value)
    assert "c20" not in str(info.value)


# -- from the model's own names --------------------------------------------------------------------------------


NAMED = ModelInputs(names=("count", "f0", "amount"), count=3, described_as="the model (Pipeline)")


def test_the_model_names_pick_their_columns_in_the_model_order_whatever_the_file_order():
    choice = choose(model=NAMED)
    assert (choice.columns, choice.source) == (("count", "f0", "amount"), FROM_MODEL)
    assert choice.order_vouched
    assert choice.unused == ("name", "flag", "when")
    reordered = pa.schema([SCHEMA.field(n) for n in reversed(SCHEMA.names)])
    assert choose(reordered, model=NAMED).columns == ("count", "f0", "amount")


def test_a_missing_named_feature_fails_the_file_with_both_listings():
    schema = pa.schema([("id", pa.int64()), ("f0", pa.float32()), ("other", pa.float64())])
    with pytest.raises(InputSchemaError) as info:
        choose(schema, model=NAMED, where="day/part-1.parquet")
    message = str(info.value)
    assert "day/part-1.parquet lacks column(s) count, amount that the model (Pipeline) was fitted with" in message
    assert "columns present: id, f0, other" in message
    assert "The model's feature names: count, f0, amount" in message


def test_a_named_string_feature_is_refused_unless_the_model_takes_raw_columns():
    model = ModelInputs(names=("name", "f0"))
    with pytest.raises(InputSchemaError, match=r"'name' .* has type string; the model takes numbers only"):
        choose(model=model)
    raw = ModelInputs(names=("name", "f0"), raw_columns=True)
    assert choose(model=raw).columns == ("name", "f0")


def test_spec_features_must_be_the_model_names_as_a_set():
    check_spec_against_model(None, NAMED)
    check_spec_against_model(["f0", "amount", "count"], NAMED)  # same set, any order: the model's order wins
    with pytest.raises(SetupError) as info:
        check_spec_against_model(["f0", "amount", "label"], NAMED)
    message = str(info.value)
    assert "missing: count" in message
    assert "not in the model: label" in message
    assert "input.features" in message


def test_spec_features_must_match_the_count_a_model_without_names_wants():
    check_spec_against_model(["a", "b"], ModelInputs(count=2))
    with pytest.raises(SetupError, match=r"names 3 column\(s\), but the model expects 2"):
        check_spec_against_model(["a", "b", "c"], ModelInputs(count=2))


# -- a custom script's model: its recorded names decide, unless the script derives its features ----------------


SCRIPT = ModelInputs(names=("count", "f0"), raw_columns=True, from_script=True, width=2)
DERIVES = ModelInputs(names=("count", "f0"), raw_columns=True, from_script=True, names_are_hints=True)


def test_script_model_names_order_the_request_when_the_file_has_them_all():
    for model in (SCRIPT, DERIVES):
        choice = choose(model=model)
        assert (choice.columns, choice.source) == (("count", "f0"), FROM_MODEL)
        assert choice.order_note() == "Shardline sent the columns in the order the model recorded"
    assert choose(model=SCRIPT, features="file_order").columns == ("count", "f0")  # the names win over file_order


def test_script_input_features_in_another_order_than_the_model_recorded_is_refused_naming_both_orders():
    with pytest.raises(SetupError) as info:
        check_spec_against_model(["f0", "count"], SCRIPT)
    message = str(info.value)
    assert "input.features: f0, count; the model's recorded order: count, f0" in message
    check_spec_against_model(["count", "f0"], SCRIPT)  # the same order is fine
    assert choose(model=SCRIPT, features=["count", "f0"]).order_note().startswith("Shardline sent the columns in the")


def test_script_input_features_naming_another_set_is_refused_unless_the_script_derives_features():
    # The candidate list of a file with a renamed column, pasted as input.features.
    with pytest.raises(SetupError) as info:
        check_spec_against_model(["COUNT", "f0"], SCRIPT)
    message = str(info.value)
    assert "missing: count; not in the model: COUNT" in message
    assert "The model's recorded order: count, f0" in message
    assert "finds no key" in message and "model.derives_features: true" in message
    check_spec_against_model(["anything"], DERIVES)  # the script computes the model's columns itself
    choice = choose(model=DERIVES, features=["f0", "name"])
    assert (choice.source, choice.derived) == (FROM_SPEC, True)
    assert "the order the model gets them in is the script's" in choice.order_note()


def test_script_file_lacking_a_recorded_name_is_refused_with_the_models_order_and_the_way_out():
    schema = pa.schema([("id", pa.int64()), ("F0", pa.float32()), ("count", pa.int32()), ("raw", pa.string())])
    with pytest.raises(InputSchemaError) as info:
        choose(schema, model=SCRIPT)
    message = str(info.value)
    assert "lacks column(s) f0, which the model recorded as feature names" in message
    assert "The model's recorded order: count, f0" in message
    assert "finds no key 'f0'" in message and "model.derives_features: true" in message
    assert "the model's names first in its order: count, F0, raw" in message
    assert info.value.candidates == ("F0", "count", "raw")
    with pytest.raises(InputSchemaError, match="lacks column"):
        choose(schema, model=SCRIPT, features="file_order")  # file_order cannot stand in for a recorded name
    # A script that derives its features: the names are hints, and input.features or file_order decide.
    with pytest.raises(InputSchemaError, match=r"recorded feature names the file lacks \(f0; the script may"):
        choose(schema, model=DERIVES)
    assert choose(schema, model=DERIVES, features="file_order").columns == ("F0", "count", "raw")


def test_the_settings_trial_sends_as_many_columns_as_the_model_takes_its_names_first():
    candidates = ("extra", "F0", "count", "raw")
    assert trial_columns(SCRIPT, candidates) == ["count", "extra"]
    assert trial_columns(ModelInputs(width=3), candidates) == ["extra", "F0", "count"]
    assert trial_columns(ModelInputs(), candidates) == list(candidates)  # the width unknown: every candidate
