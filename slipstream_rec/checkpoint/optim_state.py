"""One checkpoint name for a table's optimizer state, whichever way the table is sharded.

A table sharded table-/row-/column-wise is updated by FBGEMM's fused optimizer, whose state
is ``{"<table>.momentum1": (rows,) or (rows, dim)}``; a data-parallel table is updated by a
torch optimizer (``RowWiseAdagrad`` / ``Adagrad``) whose state is ``{"sum": (rows, 1) or
(rows, dim), "step": ()}``. The same accumulator under two names would stop a checkpoint from
moving a table between data-parallel and a fused sharding (the auto planner does exactly that
when the world size changes). So checkpoints store the data-parallel state under the fused
names: ``sum`` as ``<table>.momentum1`` (the row-wise ``(rows, 1)`` flattened to ``(rows,)``),
``step`` as ``<table>.step``. The renamed entries are views of the live tensors, so DCP loads
into them in place.
"""

from __future__ import annotations

from typing import Any, Dict, Set

TABLE_PREFIX = "embedding_bags."
STEP_SUFFIX = ".step"


def _table(param_key: str) -> str:
    # "...embedding_bags.t_cat_5.weight" -> "t_cat_5"
    return param_key.split(TABLE_PREFIX, 1)[1].rsplit(".", 1)[0]


def is_dp_table_state(param_key: str, state: Dict[str, Any]) -> bool:
    return TABLE_PREFIX in param_key and "sum" in state


def to_checkpoint(optim_state: Dict[str, Any]) -> Dict[str, Any]:
    """``optimizer.state_dict()`` with data-parallel table entries under the fused names."""
    out = dict(optim_state)
    state = dict(out["state"])
    for key, entry in state.items():
        if not is_dp_table_state(key, entry):
            continue
        table = _table(key)
        total = entry["sum"]
        renamed = {f"{table}.momentum1": total.view(-1) if total.dim() == 2 and total.shape[1] == 1 else total}
        if "step" in entry:
            renamed[f"{table}{STEP_SUFFIX}"] = entry["step"]
        state[key] = renamed
    out["state"] = state
    return out


def from_checkpoint(loaded: Dict[str, Any], live: Dict[str, Any]) -> Dict[str, Any]:
    """Undo ``to_checkpoint`` after DCP filled ``loaded`` (made by ``to_checkpoint(live)``)."""
    out = dict(loaded)
    state = dict(out["state"])
    for key, entry in live["state"].items():
        if not is_dp_table_state(key, entry):
            continue
        table = _table(key)
        restored = {"sum": entry["sum"]}  # the momentum1 view was filled in place
        if "step" in entry:
            restored["step"] = state[key].get(f"{table}{STEP_SUFFIX}", entry["step"])
        state[key] = restored
    out["state"] = state
    return out


def optional_keys(flat_keys: Set[str]) -> Set[str]:
    """Keys a checkpoint may lack: the step counters of data-parallel tables (a fused table has
    none; torch's Adagrad uses it only for lr decay, which the project does not set)."""
    return {k for k in flat_keys if k.startswith("optim.state.") and TABLE_PREFIX in k and k.endswith(STEP_SUFFIX)}
