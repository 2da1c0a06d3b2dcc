"""Messages name the Slipstream preset the user chose (issue 32): one policy has several presets
(``serve`` and ``paper_plus_negatives`` run policy paper_plus, ``negative_sampling`` runs policy
random), so a line naming only the policy names another option than the one chosen. And the
result line says which part of the skip fraction negative downsampling dropped, so that
``slipstream=off ... skip_fraction=0.371`` does not read as the baseline dropping 37%."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slipstream_rec.config import group_options, load_config
from slipstream_rec.preflight import policy_cannot_act


@pytest.mark.parametrize("preset", group_options("slipstream"))
def test_every_preset_names_itself(preset):
    assert load_config([f"slipstream={preset}"]).slipstream.chosen.startswith(f"slipstream={preset}")


@pytest.mark.parametrize("preset, policy", [("serve", "paper_plus"), ("paper_plus_negatives", "paper_plus")])
def test_the_short_run_warning_names_the_preset_not_its_policy(preset, policy):
    warning = policy_cannot_act(load_config([f"slipstream={preset}"]), 20)
    assert warning.startswith(f"slipstream={preset} (policy {policy}) "), warning


def test_the_run_and_result_lines_name_the_preset_and_what_downsampling_dropped(tmp_path):
    # the negative_sampling preset with the random control's skipping beside it: samples skipped
    # by both, and a preset whose name is not its policy's
    cmd = [sys.executable, "-m", "slipstream_rec.train", "experiment=smoke", "slipstream=negative_sampling",
           "slipstream.policy=random", "slipstream.random_skip_fraction=0.5", "downsampling.rate=0.5",
           "trainer.run_dir=runs/n", "trainer.progress_bar=false", "trainer.tensorboard=false"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WORLD_SIZE", "RANK")}
    r = subprocess.run(cmd, cwd=tmp_path, env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "runs/n/summary.json").read_text())
    started = next(l for l in r.stdout.splitlines() if l.startswith("run_dir="))
    assert started.endswith(" slipstream=negative_sampling (policy random)"), started
    done = next(l for l in r.stdout.splitlines() if l.startswith("done: "))
    assert done.startswith("done: slipstream=negative_sampling (policy random) "), done
    seen, dropped = summary["samples_seen"], summary["negative_downsampling"]["negatives_dropped"]
    assert 0 < dropped < summary["samples_skipped"]  # both skipped samples: downsampling and policy
    expected = (f"skip_fraction={summary['skip_fraction']:.3f} (downsampling.rate=0.5: {dropped / seen:.3f} "
                f"of the samples, non-clicks dropped; the policy: {summary['skip_fraction'] - dropped / seen:.3f})")
    assert expected in done, done
