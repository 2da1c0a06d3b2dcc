"""Every config in conf/ composes into typed dataclasses; bad overrides fail loudly and clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slipstream_rec.config import ConfigError, JobConfig, group_options, load_config
from slipstream_rec.model.config import Arch
from slipstream_rec.sharding.config import ShardingKind

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ["model", "data", "sharding", "optim", "trainer", "slipstream", "experiment"]


def test_default_config_is_typed():
    job = load_config([])
    assert isinstance(job, JobConfig)
    assert job.model.arch is Arch.dlrm
    assert job.model.dense_arch_layer_sizes == [512, 256, 64, 16]  # the DLRM Criteo reference
    assert job.model.over_arch_layer_sizes == [512, 256, 1]
    assert job.sharding.type is ShardingKind.auto
    # the main job is the product: paper_plus's tracking serving the stale inputs, on the click log
    assert job.slipstream.policy.value == "paper_plus" and job.slipstream.action.value == "serve"
    assert not job.slipstream.quality_check
    assert job.data.source == "clicklog"


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group):
    options = group_options(group)
    assert options, f"conf/{group}/ is empty"
    for option in options:
        job = load_config([f"{group}={option}"])
        assert isinstance(job, JobConfig), (group, option)


@pytest.mark.parametrize("kind", [k.value for k in ShardingKind])
def test_every_sharding_type_has_a_config(kind):
    assert load_config([f"sharding={kind}"]).sharding.type is ShardingKind(kind)


def test_model_sizes_match_reference():
    dcn = load_config(["model=dlrm_dcn"]).model
    assert dcn.arch is Arch.dlrm_dcn and dcn.embedding_dim == 16
    small = load_config(["model=dlrm_small"]).model
    assert small.dense_arch_layer_sizes[-1] == small.embedding_dim


def test_mistyped_key_names_the_key():
    with pytest.raises(ConfigError) as e:
        load_config(["trainer.bach_size=64"])
    assert "bach_size" in str(e.value)
    assert "Fix:" in str(e.value) and "did you mean trainer.batch_size?" in str(e.value)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError) as e:
        load_config(["trainer.batch_size=many"])
    assert "batch_size" in str(e.value) and "many" in str(e.value)


def test_unknown_sharding_type_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        load_config(["sharding.type=diagonal"])
    message = str(e.value)
    assert "diagonal" in message and "row_wise" in message and "table_wise" in message


def test_unknown_group_option_fails():
    with pytest.raises(ConfigError) as e:
        load_config(["sharding=diagonal"])
    assert "diagonal" in str(e.value)


def test_invalid_value_fails_where_used():
    with pytest.raises(ValueError, match="trainer.batch_size"):
        load_config(["trainer.batch_size=0"])


def test_cli_rejects_typo_before_starting_processes():
    result = subprocess.run(
        [sys.executable, "-m", "slipstream_rec.train", "trainer.bach_size=64"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "bach_size" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_prints_composed_config():
    result = subprocess.run(
        [sys.executable, "-m", "slipstream_rec.train", "--cfg", "sharding=row_wise"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "type: row_wise" in result.stdout


def test_slipstream_policies_set_their_safeguards():
    from slipstream_rec.slipstream.config import Policy

    paper = load_config(["slipstream=paper"]).slipstream
    plus = load_config(["slipstream=paper_plus"]).slipstream
    track = load_config(["slipstream=track_only"]).slipstream
    assert paper.policy is Policy.paper and not paper.reactivate and paper.keep_probability == 0
    assert plus.reactivate and plus.refresh_threshold and plus.keep_probability > 0 and plus.max_skip_fraction < 1
    assert track.policy is Policy.track_only and not track.policy.skips and track.policy.tracks
    assert {k: v for k, v in vars(track).items() if k not in ("policy", "preset")} == {
        k: v for k, v in vars(plus).items() if k not in ("policy", "preset")
    }


def test_random_control_needs_its_fraction_and_only_it_takes_one():
    from slipstream_rec.slipstream.config import Policy

    rnd = load_config(["slipstream=random", "slipstream.random_skip_fraction=0.28"]).slipstream
    assert rnd.policy is Policy.random and rnd.policy.skips and not rnd.policy.tracks
    assert rnd.keep_probability == 0 and rnd.random_skip_fraction == 0.28
    assert load_config(["slipstream=random"]).slipstream.random_skip_fraction == 0.3  # the paper's D
    with pytest.raises(ValueError, match=r"slipstream.random_skip_fraction=0.0 .*slipstream=random"):
        load_config(["slipstream=random", "slipstream.random_skip_fraction=0"])
    with pytest.raises(ValueError, match=r"slipstream.random_skip_fraction=0.2 .*0 with every other"):
        load_config(["slipstream=paper_plus", "slipstream.random_skip_fraction=0.2"])
    with pytest.raises(ValueError, match=r"slipstream.random_skip_fraction=1.0 .*\[0, 1\)"):
        load_config(["slipstream=random", "slipstream.random_skip_fraction=1.0"])


def test_negative_sampling_is_uniform_negative_downsampling_with_slipstream_off():
    from slipstream_rec.slipstream.config import Policy

    job = load_config(["slipstream=negative_sampling"])
    assert job.slipstream.policy is Policy.off and job.slipstream.preset == "negative_sampling"
    assert job.downsampling.rate == pytest.approx(2 / 3, abs=1e-5)
    # a preset chooses its downsampling; the command line still overrides it
    assert load_config(["slipstream=off"]).downsampling.rate == 0.0
    assert load_config(["slipstream=serve"]).downsampling.rate == "auto"
    assert load_config(["slipstream=serve", "downsampling=off"]).downsampling.rate == 0.0
    assert load_config(["slipstream=paper_plus_negatives"]).downsampling.rate == pytest.approx(2 / 3, abs=1e-5)


def test_slipstream_counting_must_count_at_least_one_step():
    with pytest.raises(ValueError, match="slipstream.count_fraction"):
        load_config(["slipstream=paper_plus", "slipstream.count_steps=10", "slipstream.count_fraction=0.05"])


def test_unknown_policy_lists_the_policies():
    with pytest.raises(ConfigError) as e:
        load_config(["slipstream.policy=fast"])
    assert "paper_plus" in str(e.value) and "track_only" in str(e.value)


def test_serve_is_refused_with_the_base_pipeline_before_anything_runs():
    with pytest.raises(ConfigError) as e:
        load_config(["slipstream=serve", "trainer.pipeline=base"])
    assert "trainer.pipeline=base" in str(e.value) and "Fix: trainer.pipeline=sparse_dist" in str(e.value)
    for bad, key in [("slipstream.alpha=0.9", "slipstream.alpha"), ("slipstream.keep_probability=0.3", "slipstream.keep_probability"),
                     ("slipstream.replica_sync_steps=7", "slipstream.replica_sync_steps"),
                     ("slipstream.replica_sync_bound=-0.5", "slipstream.replica_sync_bound"),
                     ("slipstream.hot_refresh_steps=30", "slipstream.hot_refresh_steps")]:
        with pytest.raises(ConfigError) as e:
            load_config(["slipstream=serve", bad])
        assert key in str(e.value), (bad, str(e.value))
    with pytest.raises(ConfigError) as e:
        load_config(["slipstream=track_only", "slipstream.action=serve"])
    assert "slipstream.policy" in str(e.value)
