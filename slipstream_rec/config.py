"""The job's configuration: component dataclasses composed by Hydra from conf/.

Each component owns its dataclass (model/config.py, data/config.py, ...). Here they are joined
into ``JobConfig`` and registered in Hydra's ConfigStore as the schema of conf/config.yaml, so
that a mistyped key or a wrongly typed value fails at composition, before any process starts.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slipstream_rec.config_keys import UnknownKeyError, apply_dict_overrides, split_overrides
from slipstream_rec.data.config import DataConfig
from slipstream_rec.model.config import ModelConfig
from slipstream_rec.optim import OptimConfig
from slipstream_rec.sharding.config import ShardingConfig
from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.training.config import DownsamplingConfig, TrainerConfig


@dataclass
class JobConfig:
    """One training job. Every field is a config group under conf/."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    slipstream: SlipstreamConfig = field(default_factory=SlipstreamConfig)
    downsampling: DownsamplingConfig = field(default_factory=DownsamplingConfig)
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
    """Compose conf/<config_name>.yaml with Hydra overrides; returns the DictConfig.

    Every override key is first checked against the schema (``config_keys``): an unknown key
    fails here, with or without ``+``, suggesting the closest existing key; overrides of
    dict-typed fields are merged after Hydra's composition (Hydra refuses new dict entries).
    """
    conf = config_dir()
    try:
        for_hydra, dict_overrides = split_overrides(overrides, JobConfig, conf)
    except UnknownKeyError as e:
        raise ConfigError(f"invalid configuration: {e}") from e
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=for_hydra)
        apply_dict_overrides(cfg, dict_overrides)
        return cfg
    except (HydraException, OmegaConfBaseException, ValueError) as e:  # Hydra raises all three
        raise ConfigError(_explain(e)) from e


def load_config(overrides: Sequence[str] = (), config_name: str = "config") -> JobConfig:
    """Compose, convert to typed dataclasses and validate the values checked at composition.

    Raises ``ConfigError`` (a ValueError) whose message is one line naming the key and the fix.
    """
    cfg = compose_config(overrides, config_name)
    try:
        job = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_explain(e)) from e
    assert isinstance(job, JobConfig)
    try:
        job.trainer.validate()
        job.slipstream.validate()
        job.downsampling.validate()
        job.optim.validate()
        job.model.validate()
        job.sharding.qcomms.validate()
        for direction in ("forward", "backward"):
            if job.slipstream.serves and getattr(job.sharding.qcomms, direction).value == "int8":
                # int8 rows of 32 values need the sharded batch to be a multiple of 32; serve
                # sends a different number of samples through the shards every step
                raise ValueError(
                    f"sharding.qcomms.{direction}=int8 cannot run with slipstream.action=serve: its "
                    "sharded batch size changes every step and int8 quantizes 32 values at a time. "
                    f"Fix: sharding.qcomms.{direction}=fp16, or slipstream=off"
                )
        if job.slipstream.serves and job.trainer.pipeline.value != "sparse_dist":
            # refused here, before anything runs (the Trainer asserts it where it wires the push)
            raise ValueError(
                f"trainer.pipeline={job.trainer.pipeline.value} cannot run slipstream.action=serve: "
                "the served samples' gradients are pushed between backward and optimizer step of the "
                "sparse_dist pipeline. Fix: trainer.pipeline=sparse_dist, or another slipstream policy"
            )
    except ValueError as e:  # the component's message names its key and the fix
        raise ConfigError(f"invalid configuration: {e}") from e
    return job


def to_yaml(job: JobConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(job))


# Where a run is written and what it continues from, not how it trains: left out of the hash, so
# that a resume into a new trainer.run_dir (the finished-run refusal's advice) is not taken for
# "another configuration".
LOCATION_KEYS = ("trainer.run_dir", "trainer.resume", "trainer.checkpoint.dir")


def config_hash(job: JobConfig) -> str:
    """The training configuration's hash (``LOCATION_KEYS`` excluded)."""
    tree = OmegaConf.to_container(OmegaConf.structured(job), enum_to_str=True)
    for key in LOCATION_KEYS:
        *parents, last = key.split(".")
        node = tree
        for p in parents:
            node = node[p]
        node.pop(last)
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(tree)).encode()).hexdigest()[:16]


def _explain(error: Exception) -> str:
    """Hydra's / OmegaConf's error as one line: the key, what is wrong with it, the fix.

    Hydra wraps the OmegaConf error that names the key (``full_key: ...``) and adds advice of
    its own ("To append to your config use +key=value") that does not apply to a typed schema.
    """
    messages = []
    cause: Optional[BaseException] = error
    while cause is not None:
        messages.append(str(cause).strip())
        cause = cause.__cause__
    key = next((m.group(1) for m in map(_FULL_KEY.search, messages) if m), None)
    # The innermost message says what is wrong with the value; its first line is enough.
    what = next((m.splitlines()[0].strip() for m in reversed(messages) if m), type(error).__name__)
    where = f"{key}: " if key and key not in what else ""
    value = next((m.group(1) for m in map(_INVALID_VALUE.search, messages) if m), None)
    related = _RELATED_KEYS.get((key, value))
    if related:
        return f"invalid configuration: {where}{what.rstrip('.')}. Fix: {related}"
    return (
        f"invalid configuration: {where}{what.rstrip('.')}. Fix: check the value against "
        "`slipstream-train --cfg` (every key and its value) and the field's comment in "
        "slipstream_rec/*/config.py"
    )


_FULL_KEY = re.compile(r"full_key: (\S+)")
_INVALID_VALUE = re.compile(r"Invalid value '([^']*)'")
# A value that is valid for another key the user most likely meant: the fix names that key.
_RELATED_KEYS = {
    ("trainer.precision", "fp16"): (
        "fp16 is the storage type of the embedding rows: model.embedding_dtype=fp16 (docs/scale.md; "
        "the README's bf16 / fp16); trainer.precision sets the dense arithmetic: fp32, bf16 or auto"
    ),
}


def group_options(group: str) -> List[str]:
    """The options of a config group, e.g. ``group_options("sharding")``."""
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


def default_options() -> Dict[str, Optional[str]]:
    """group -> the option conf/config.yaml picks (None: no default, e.g. experiment), in order."""
    out: Dict[str, Optional[str]] = {}
    for entry in OmegaConf.load(config_dir() / "config.yaml").defaults:
        if not isinstance(entry, str):
            (group, option), = entry.items()
            out[str(group)] = None if option is None else str(option)
    return out


def option_summary(path: Path, width: int = 100) -> str:
    """The first sentence of the comment that opens a conf/ file (cut to ``width``), for
    ``--help``."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            words.append(line.lstrip("#").strip())
    text = " ".join(words)
    end = re.search(r"\.(\s+[A-Z]|$)", text)  # not "He et al. 2014" nor "day_0 .. day_23"
    text = text[: end.start()] if end else text
    return text if len(text) <= width else text[: width - 3].rsplit(" ", 1)[0] + "..."


def describe_options() -> Dict[str, Dict[str, str]]:
    """group -> option -> one line (the default first, marked ``*``), for ``--help``."""
    out: Dict[str, Dict[str, str]] = {}
    for group, default in default_options().items():
        options = sorted(group_options(group), key=lambda o: o != default)
        out[group] = {
            ("*" if o == default else "") + o: option_summary(config_dir() / group / f"{o}.yaml")
            for o in options
        }
    return out


def chosen_options(overrides: Sequence[str] = ()) -> Dict[str, Optional[str]]:
    """group -> the option the composed job uses (after overrides and experiment presets)."""
    conf = config_dir()
    for_hydra, _ = split_overrides(overrides, JobConfig, conf)
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=for_hydra, return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    return {group: choices.get(group) for group in default_options()}


# data.source -> the DataConfig block it reads (npy reads none of them)
_DATA_BLOCKS = {"synthetic": "synthetic", "clicklog": "clicklog", "criteo": "criteo", "tabular": "tabular", "movielens_1m": "movielens"}


def cfg_listing(job: JobConfig, overrides: Sequence[str] = (), everything: bool = False) -> str:
    """What ``--cfg`` prints: the option chosen in each group, then the job's config; without
    ``everything``, the settings blocks of the data sources the job does not read are left out
    (and named)."""
    chosen = " ".join(f"{g}={o}" for g, o in chosen_options(overrides).items() if o is not None)
    tree = OmegaConf.to_container(OmegaConf.structured(job), enum_to_str=True)
    header = [f"# options: {chosen}"]
    if not everything:
        unused = [b for src, b in _DATA_BLOCKS.items() if src != job.data.source]
        for block in unused:
            tree["data"].pop(block, None)
        header.append(
            f"# not shown: data.{', data.'.join(unused)} (not read with data.source="
            f"{job.data.source}; --cfg all shows every key)"
        )
    return "\n".join(header) + "\n" + OmegaConf.to_yaml(OmegaConf.create(tree))
