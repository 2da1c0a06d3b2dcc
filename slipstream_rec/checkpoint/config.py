"""Checkpoint configuration: when to save, how many to keep, where, and whether to resume."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from slipstream_rec.validation import check_fields


@dataclass
class CheckpointConfig:
    """Sharded checkpoints (torch.distributed.checkpoint) of everything a run needs to continue."""

    # Save checkpoints (false: never save; resuming from existing ones still follows trainer.resume).
    enabled: bool = True
    # Save every this many training steps (0: no step trigger).
    every_steps: int = 0
    # Save when this many minutes of training (evaluation and saving excluded) have passed since
    # the last save (0: no time trigger). Rank 0's clock decides; it is consulted every
    # check_every_steps steps, so all ranks save at the same step.
    every_minutes: float = 5.0
    # How often (in steps) rank 0's clock is consulted for every_minutes (one tiny broadcast).
    check_every_steps: int = 20
    # Save when training ends (before the final evaluation), so a finished run resumes to its end.
    at_end: bool = True
    # Keep the newest this many complete checkpoints; older ones are deleted after a save completes.
    keep_last: int = 2
    # Directory of the checkpoints (null: <run_dir>/checkpoints). Must be shared by all nodes.
    dir: Optional[str] = None
    # Before loading, check every file's size and CRC32 against the checkpoint's manifest, and
    # skip (with a warning) a checkpoint that fails. Costs one read of the checkpoint on rank 0.
    verify: bool = True

    def validate(self) -> None:
        checks = [
            ("every_steps", self.every_steps >= 0, "0 (no step trigger) or a positive step count"),
            ("every_minutes", self.every_minutes >= 0, "0 (no time trigger) or positive minutes"),
            ("check_every_steps", self.check_every_steps > 0, "a positive step count"),
            ("keep_last", self.keep_last >= 1, "at least 1 (the newest checkpoint is always kept)"),
        ]
        check_fields("trainer.checkpoint", self, checks)
