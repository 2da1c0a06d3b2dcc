"""Override keys against the schema (slipstream_rec/config_keys.py): unknown keys fail with or
without ``+``; Hydra's legitimate ``+`` uses on dict-typed fields keep working (and work
without ``+`` too); the suggestion is the closest existing key."""

from __future__ import annotations

import pytest

from slipstream_rec.config import ConfigError, JobConfig, load_config
from slipstream_rec.config_keys import resolve, schema_keys, suggest_key
from slipstream_rec.data.config import CategoricalEncoding
from slipstream_rec.sharding.config import ShardingKind


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_unknown_key_fails_with_any_prefix(prefix):
    with pytest.raises(ConfigError, match=r"trainer.bach_size is not a configuration key.*did you mean trainer.batch_size\?"):
        load_config([f"{prefix}trainer.bach_size=64"])


def test_unknown_top_level_key_and_deletion_fail():
    with pytest.raises(ConfigError, match="foo is not a configuration key"):
        load_config(["+foo=1"])
    with pytest.raises(ConfigError, match="trainer.nope is not a configuration key"):
        load_config(["~trainer.nope"])


@pytest.mark.parametrize(
    "overrides",
    [
        ["+sharding.table_overrides.t_cat_2=row_wise"],
        ["sharding.table_overrides.t_cat_2=row_wise"],
        ["sharding.table_overrides={t_cat_2: row_wise}"],
        ["+sharding.table_overrides={t_cat_2: row_wise}"],
    ],
)
def test_dict_field_takes_new_entries_with_or_without_plus(overrides):
    assert load_config(overrides).sharding.table_overrides == {"t_cat_2": ShardingKind.row_wise}


def test_dataclass_valued_dict_entries_are_typed_and_merge_like_hydra():
    job = load_config([
        "data=criteo_terabyte",
        "+data.criteo.feature_encoding.cat_1={mode: hash, max_size: 100}",
        "data.criteo.feature_encoding.cat_2.mode=hash",
        "data.criteo.feature_encoding.cat_2.max_size=50",
        "~data.criteo.feature_encoding.cat_0",
    ])  # fmt: skip
    enc = job.data.criteo.feature_encoding
    assert enc["cat_1"] == CategoricalEncoding(mode="hash", max_size=100)
    assert enc["cat_2"] == CategoricalEncoding(mode="hash", max_size=50)  # min_count: the default
    assert "cat_0" not in enc and enc["cat_9"].max_size == 40_000_000  # the file's entries stay


def test_dict_entry_values_are_still_type_checked():
    with pytest.raises(ConfigError, match=r"sharding.table_overrides.t_cat_2: Invalid value 'diagonal'"):
        load_config(["sharding.table_overrides.t_cat_2=diagonal"])
    with pytest.raises(ConfigError, match=r"modee"):
        load_config(["data.criteo.feature_encoding.cat_1.modee=hash"])


def test_group_overrides_and_plain_keys_pass_through_to_hydra():
    job = load_config(["experiment=smoke", "model=dlrm_small", "trainer.max_steps=3", "++trainer.seed=4"])
    assert job.experiment == "smoke" and job.trainer.max_steps == 3 and job.trainer.seed == 4


def test_unparsable_override_says_what_an_override_looks_like():
    with pytest.raises(ConfigError, match=r"cannot parse override 'job'.*key=value"):
        load_config(["job"])


def test_resolve_walks_dataclasses_dicts_and_lists():
    assert resolve("trainer.checkpoint.every_steps", JobConfig).ok
    assert resolve("data.synthetic.zipf_exponents.3", JobConfig).ok
    assert resolve("sharding.table_overrides.t_x", JobConfig).dict_field == "sharding.table_overrides"
    assert resolve("sharding.table_overrides", JobConfig).dict_field == "sharding.table_overrides"
    assert resolve("trainer.batch_size", JobConfig).dict_field is None
    bad = resolve("trainer.batch_size.x", JobConfig)
    assert not bad.ok and bad.bad_index == 2
    assert "trainer.checkpoint.keep_last" in set(schema_keys(JobConfig))


@pytest.mark.parametrize(
    "typo, expected",
    [
        ("trainer.bach_size", "trainer.batch_size"),
        ("batch_size", "trainer.batch_size"),
        ("trainer.checkpont.every_steps", "trainer.checkpoint.every_steps"),
        ("slipstream.target_skip_fractoin", "slipstream.target_skip_fraction"),
        ("data.tabular.lable_column", "data.tabular.label_column"),
    ],
)
def test_suggestions(typo, expected):
    assert suggest_key(typo, JobConfig) == expected


@pytest.mark.parametrize(
    "old, new",
    [
        ("slipstream.negative_downsampling=0.5", "downsampling.rate"),
        ("slipstream.negatives_per_click=20", "downsampling.negatives_per_click"),
        ("slipstream.downsampling_guard_steps=5", "downsampling.guard_steps"),
        ("slipstream.downsampling_max_noise=0.1", "downsampling.max_noise"),
    ],
)
def test_a_moved_key_is_refused_with_its_new_name(old, new):
    """Negative downsampling left slipstream.* for its own group (issue 28): the old key names
    the new one, which composes."""
    with pytest.raises(ConfigError, match=rf"{old.split('=')[0]} is not a configuration key.*did you mean {new}\?"):
        load_config([old])
    job = load_config([f"{new}={old.split('=')[1]}"])
    assert float(getattr(job.downsampling, new.split(".")[1])) == float(old.split("=")[1])
