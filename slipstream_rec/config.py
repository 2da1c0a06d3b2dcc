"""The job's configuration: component dataclasses composed by Hydra from conf/.

Each component owns its dataclass (model/config.py, data/config.py, ...). Here they are joined
into ``JobConfig`` and registered in Hydra's ConfigStore as the schema of conf/config.yaml, so
that a mistyped key or a wrongly typed value fails at composition, before any process starts.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slipstream_rec.data.config import DataConfig
from slipstream_rec.model.config import ModelConfig
from slipstream_rec.optim import OptimConfig
from slipstream_rec.sharding.config import ShardingConfig
from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.training.config import TrainerConfig


@dataclass
class JobConfig:
    """One training job. Every field is a config group under conf/."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    slipstream: SlipstreamConfig = field(default_factory=SlipstreamConfig)
    # Name of the experiment (set by conf/experiment/*.yaml); recorded in summary.json.
    experiment: Optional[str] = None


SCHEMA_NAME = "slipstream_job"
ConfigStore.instance().store(name=SCHEMA_NAME, node=JobConfig)


class ConfigError(ValueError):
    """A configuration that cannot be composed or validated; the message names key and fix."""


def config_dir() -> Path:
    """conf/ of this checkout (or $SLIPSTREAM_CONF_DIR, or ./conf for an installed package)."""
    candidates = [
        os.environ.get("SLIPSTREAM_CONF_DIR"),
        str(Path(__file__).resolve().parents[1] / "conf"),
        str(Path.cwd() / "conf"),
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "config.yaml").is_file():
            return Path(candidate).resolve()
    raise ConfigError(
        "cannot find conf/config.yaml next to the package or in the working directory; "
        "run from the repository root or set SLIPSTREAM_CONF_DIR"
    )


def compose_config(overrides: Sequence[str] = (), config_name: str = "config"):
    """Compose conf/<config_name>.yaml with Hydra overrides; returns the DictConfig."""
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_explain(e, overrides)) from e


def load_config(overrides: Sequence[str] = (), config_name: str = "config") -> JobConfig:
    """Compose and convert to typed dataclasses; raises ConfigError with a readable message."""
    cfg = compose_config(overrides, config_name)
    try:
        job = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_explain(e, overrides)) from e
    assert isinstance(job, JobConfig)
    job.trainer.validate()
    job.slipstream.validate()
    return job


def to_yaml(job: JobConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(job))


def config_hash(job: JobConfig) -> str:
    return hashlib.sha256(to_yaml(job).encode()).hexdigest()[:16]


def _explain(error: Exception, overrides: Sequence[str]) -> str:
    message = str(error).strip()
    cause = error.__cause__
    while cause is not None:  # Hydra wraps the OmegaConf error that names the key
        message += f"\n  caused by: {str(cause).strip()}"
        cause = cause.__cause__
    return (
        f"invalid configuration: {message}\n"
        f"  overrides: {' '.join(overrides) or '(none)'}\n"
        "  fix: check the key and value against `slipstream-train --cfg` (all keys and defaults) "
        "or the dataclasses in slipstream_rec/*/config.py; choose a group option from conf/<group>/"
    )


def group_options(group: str) -> List[str]:
    """The options of a config group, e.g. ``group_options("sharding")``."""
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
