"""Command-line override keys checked against the typed schema, before Hydra sees them.

Hydra alone has two gaps here: a mistyped key fails with the hint "To append to your config use
+trainer.bach_size=64", and following that hint composes without error while the key is
silently dropped when the config becomes dataclasses. So every ``key=value``, ``+key=value``,
``++key=value`` and ``~key`` override is resolved against the dataclasses of ``JobConfig``
here: an unknown key is an error that suggests the closest existing key ("did you mean
trainer.batch_size?"), and a ``group=option`` override names the closest option of the group.

Dict-typed fields (``sharding.table_overrides``, ``data.*.feature_encoding``) legitimately take
new keys. Hydra refuses those without ``+`` and cannot add an entry of a dataclass-valued dict
even with it, so such overrides are split off (``split_overrides``) and merged into the composed
config afterwards (``apply_dict_overrides``), with or without ``+``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict

# What a schema node is: a dataclass (named fields), a dict (any key), a list (int index), or a
# leaf (str, int, enum, ...) that has no keys below it.
_FIELDS, _DICT, _LIST, _LEAF, _ANY = "fields", "dict", "list", "leaf", "any"


class UnknownKeyError(ValueError):
    """An override names a key or group option the schema does not have; the message says which
    and suggests the closest one."""


@dataclass
class Resolved:
    """Where a dotted key lands in the schema."""

    ok: bool  # every segment exists (a dict field accepts any key below it)
    dict_field: Optional[str] = None  # the dotted path of the dict-typed field the key passes through
    bad_index: int = -1  # index of the first segment that does not exist (when not ok)
    siblings: Tuple[str, ...] = ()  # the keys that exist where the bad segment was


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap_optional(args[0])
    return tp


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _kind(tp: Any) -> Tuple[str, Any]:
    """(kind, what is below): fields -> {name: type}, dict/list -> value type."""
    tp = _unwrap_optional(tp)
    if tp is Any:
        return _ANY, None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _FIELDS, _field_types(tp)
    origin = typing.get_origin(tp)
    if origin in (dict, Dict):
        args = typing.get_args(tp)
        return _DICT, args[1] if len(args) == 2 else Any
    if origin in (list, List, tuple):
        args = typing.get_args(tp)
        return _LIST, args[0] if args else Any
    if tp in (dict,):
        return _DICT, Any
    if tp in (list,):
        return _LIST, Any
    return _LEAF, None


def resolve(key: str, root: type) -> Resolved:
    """Walk ``key`` (dotted) through the dataclass ``root``."""
    parts = key.split(".")
    tp: Any = root
    path: List[str] = []
    dict_field: Optional[str] = None
    for i, part in enumerate(parts):
        kind, below = _kind(tp)
        if kind == _ANY:
            return Resolved(True, dict_field)
        if kind == _FIELDS:
            if part not in below:
                return Resolved(False, dict_field, i, tuple(below))
            tp = below[part]
        elif kind == _DICT:
            dict_field = dict_field or ".".join(path)
            tp = below
        elif kind == _LIST:
            if not part.isdigit():
                return Resolved(False, dict_field, i, ())
            tp = below
        else:  # a leaf has no keys below it
            return Resolved(False, dict_field, i, ())
        path.append(part)
    if dict_field is None and _kind(tp)[0] == _DICT:
        dict_field = key  # the whole dict is assigned (sharding.table_overrides={...})
    return Resolved(True, dict_field)


def schema_keys(root: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the schema (dict fields as themselves, not their entries)."""
    kind, below = _kind(root)
    if kind != _FIELDS:
        return
    for name, tp in below.items():
        key = f"{prefix}{name}"
        yield key
        yield from schema_keys(_unwrap_optional(tp), key + ".")


# Keys that moved to another component: their new names, for the message that refuses the old.
MOVED = {
    "slipstream.negative_downsampling": "downsampling.rate",
    "slipstream.negatives_per_click": "downsampling.negatives_per_click",
    "slipstream.downsampling_guard_steps": "downsampling.guard_steps",
    "slipstream.downsampling_max_noise": "downsampling.max_noise",
}


def suggest_key(key: str, root: type) -> Optional[str]:
    """The existing key closest to a mistyped ``key``, or None."""
    res = resolve(key, root)
    parts = key.split(".")
    if res.ok:
        return None
    if key in MOVED:
        return MOVED[key]
    if res.siblings:  # a typo at one level: keep the path around it (trainer.bach_size)
        match = difflib.get_close_matches(parts[res.bad_index], res.siblings, n=1, cutoff=0.6)
        if match:
            fixed = ".".join(parts[: res.bad_index] + match + parts[res.bad_index + 1 :])
            if resolve(fixed, root).ok:
                return fixed
            return ".".join(parts[: res.bad_index] + match)
    everything = list(schema_keys(root))
    tail = ".".join(parts[max(res.bad_index, 0) :])
    ends = [k for k in everything if k.endswith("." + tail) or k.endswith("." + parts[-1])]
    if ends:  # a key under another group (trainer.target_skip_fraction)
        return difflib.get_close_matches(key, ends, n=1, cutoff=0.0)[0]
    close = difflib.get_close_matches(key, everything, n=1, cutoff=0.75)
    return close[0] if close else None


def _parse(override: str) -> Override:
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(override)
    except HydraException as e:
        detail = str(e).strip().splitlines()[0]
        raise UnknownKeyError(
            f"cannot parse override {override!r} ({detail}). Fix: write key=value "
            f"(trainer.batch_size=64) or group=option (sharding=row_wise)"
        ) from None


def _is_hydra_own(o: Override) -> bool:
    """Keys Hydra interprets itself (package-qualified, hydra.*, sweeps): left to Hydra."""
    key = o.key_or_group
    return o.package is not None or key == "hydra" or key.startswith(("hydra.", "hydra/")) or o.is_sweep_override()


def split_overrides(
    overrides: Sequence[str], root: type, conf_dir: Path
) -> Tuple[List[str], List[Override]]:
    """Check every override; returns (overrides for Hydra, dict-field overrides to apply after).

    Raises ``UnknownKeyError`` naming the first unknown key or group option.
    """
    for_hydra: List[str] = []
    deferred: List[Override] = []
    for text in overrides:
        o = _parse(text)
        key = o.key_or_group
        if _is_hydra_own(o):
            for_hydra.append(text)
            continue
        if "." not in key and (conf_dir / key).is_dir():  # group=option
            _check_group_option(o, text, conf_dir)
            for_hydra.append(text)
            continue
        res = resolve(key, root)
        if not res.ok:
            hint = suggest_key(key, root)
            did_you_mean = f"did you mean {hint}? " if hint else ""
            raise UnknownKeyError(
                f"{key} is not a configuration key (override {text!r}); {did_you_mean}"
                f"Fix: `slipstream-train --cfg` prints every key with its value"
            )
        if res.dict_field is not None:
            deferred.append(o)
        else:
            for_hydra.append(text)
    return for_hydra, deferred


def _check_group_option(o: Override, text: str, conf_dir: Path) -> None:
    value = o.value()
    if o.type == OverrideType.DEL or value is None or not isinstance(value, str):
        return  # ~group, group=null and multi-select lists are Hydra's to judge
    group = o.key_or_group
    options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
    if value in options:
        return
    close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    did_you_mean = f"did you mean {group}={close[0]}? " if close else ""
    raise UnknownKeyError(
        f"{text!r}: conf/{group}/ has no option {value!r}; {did_you_mean}"
        f"Fix: one of {', '.join(options)}"
    )


def apply_dict_overrides(cfg: DictConfig, deferred: Sequence[Override]) -> None:
    """Merge the dict-field overrides into the composed ``cfg`` (in command-line order).

    A value is merged, as Hydra merges ``key={...}``: entries not named stay. ``~key`` removes
    an entry. OmegaConf converts every value to the field's type (an unknown enum value or a
    wrong type fails naming the key).
    """
    for o in deferred:
        parts = o.key_or_group.split(".")
        with open_dict(cfg):
            if o.type == OverrideType.DEL:
                parent = OmegaConf.select(cfg, ".".join(parts[:-1])) if len(parts) > 1 else cfg
                if isinstance(parent, DictConfig) and parts[-1] in parent:
                    del parent[parts[-1]]
                continue
            nested: Any = o.value()
            for part in reversed(parts):
                nested = {part: nested}
            cfg.merge_with(nested)
