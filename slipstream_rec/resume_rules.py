"""What a resume from another run's checkpoint must say: which settings changed, and that it
would train nothing when the checkpoint is already at the planned number of steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from slipstream_rec.config import LOCATION_KEYS, JobConfig
from slipstream_rec.training.config import TrainerConfig


def _flat(tree: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: Dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_changes(checkpoint: Path, job: JobConfig) -> Optional[List[str]]:
    """``key: old -> new`` for every setting that differs from the config.yaml of the run that
    wrote ``checkpoint`` (``<run>/checkpoints/step_N``), the run's location keys left out;
    None where that file is not there (a checkpoint kept elsewhere)."""
    path = checkpoint.parent.parent / "config.yaml"
    if not path.is_file():
        return None
    old = _flat(OmegaConf.to_container(OmegaConf.load(path)))
    new = _flat(OmegaConf.to_container(OmegaConf.structured(job), enum_to_str=True))
    return [
        f"{k}: {old.get(k)} -> {new.get(k)}"
        for k in sorted(set(old) | set(new))
        if k not in LOCATION_KEYS and old.get(k) != new.get(k)
    ]


def check_trains_something(tr: TrainerConfig, checkpoint: Path, step: int, total_steps: int, batches: int) -> None:
    """A resume from a checkpoint at (or past) the planned last step would train nothing and
    print that run's figures as a new run's: refused, with the settings that train on."""
    if step < total_steps:
        return
    if tr.max_steps and tr.max_steps <= step:
        target = 2 * step
        fix = f"trainer.max_steps={target}"
        epochs = -(-target // max(1, batches))  # ceil: the epochs that hold target steps
        if epochs > tr.epochs:
            fix += f" trainer.epochs={epochs}"
    else:
        fix = f"trainer.epochs={step // max(1, batches) + 1}"
    raise ValueError(
        f"trainer.resume={tr.resume}: {checkpoint} is at step {step} and this run plans "
        f"{total_steps} steps (trainer.epochs={tr.epochs}, trainer.max_steps={tr.max_steps}, "
        f"{batches} batches per epoch), so it would train nothing. Fix: train on with {fix}"
    )
