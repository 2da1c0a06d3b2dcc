"""benchmarks/serve.py's settings: the reference ``off`` and what each setting adds, as parsed."""

from __future__ import annotations

import argparse

from benchmarks.serve import settings_from


def _args(**kw) -> argparse.Namespace:
    base = dict(off="slipstream=off", no_serve=False, setting=[], curve="")
    return argparse.Namespace(**{**base, **kw})


def test_off_is_slipstream_off_and_serve_is_added_unless_asked_not_to():
    assert settings_from(_args()) == {"off": ["slipstream=off"], "serve": ["slipstream=serve"]}
    assert settings_from(_args(no_serve=True)) == {"off": ["slipstream=off"]}


def test_the_reference_takes_the_overrides_off_gives():
    settings = settings_from(_args(
        off="slipstream=off,trainer.precision=fp32,sharding=table_wise", no_serve=True,
        setting=["init=slipstream=off,trainer.precision=fp32,sharding=row_wise"],
    ))  # fmt: skip
    assert settings == {
        "off": ["slipstream=off", "trainer.precision=fp32", "sharding=table_wise"],
        "init": ["slipstream=off", "trainer.precision=fp32", "sharding=row_wise"],
    }


def test_a_curve_adds_serve_at_each_target():
    assert settings_from(_args(no_serve=True, curve="0.5,0.7"))["serve_D0.7"] == [
        "slipstream=serve", "slipstream.target_skip_fraction=0.7",
    ]  # fmt: skip
