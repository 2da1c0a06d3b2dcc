"""The trainer's clock: wall and CPU seconds inside training epochs, evaluations and checkpoints
taken out of both; CPU seconds count work, not waiting."""

from __future__ import annotations

import time

import pytest
import torch

from slipstream_rec.training.clock import TrainClock
from slipstream_rec.training.run_state import TrainState


def _burn(seconds: float) -> None:
    """Busy this thread for ``seconds`` of its CPU time."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def test_cpu_seconds_count_training_work_and_leave_out_waits_and_evaluations():
    state = TrainState()
    clock = TrainClock(state, torch.device("cpu"))
    clock.start_epoch()
    _burn(0.3)  # training work
    time.sleep(0.3)  # a wait (a collective's, a stolen core's): wall, no CPU
    with clock.paused("eval_seconds"):
        _burn(0.3)  # an evaluation: neither clock counts it
    assert clock.live_cpu() == pytest.approx(0.3, abs=0.05)
    clock.end_epoch()
    assert state.train_cpu_seconds == pytest.approx(0.3, abs=0.05)
    assert state.train_seconds == pytest.approx(0.6, abs=0.1)
    assert state.paused_cpu_seconds == pytest.approx(0.3, abs=0.05)
    # a second epoch adds to the first; between epochs nothing is counted
    _burn(0.2)
    clock.start_epoch()
    _burn(0.2)
    clock.end_epoch()
    assert state.train_cpu_seconds == pytest.approx(0.5, abs=0.06)
