"""What the embedding path moved and what Slipstream served, as summary.json reports it.

Machine-independent counts (bytes from the tensors each embedding collective was given, see
``SlipstreamShardedEBC``), per trained sample, for every policy, so ``off``, ``skip`` and
``serve`` compare directly: ``a2a_bytes_per_sample`` = {input, output, gradient, total}.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from torch import nn

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.slipstream.sharded import SlipstreamShardedEBC

A2A_KINDS = ("input", "output", "gradient")


def _modules(model: nn.Module) -> List[SlipstreamShardedEBC]:
    return [m for m in model.modules() if isinstance(m, SlipstreamShardedEBC)]


def local_a2a_bytes(model: nn.Module) -> Dict[str, int]:
    """This rank's bytes given to each kind of embedding collective so far (local)."""
    totals = {k: 0 for k in A2A_KINDS}
    for m in _modules(model):
        for k in A2A_KINDS:
            totals[k] += m.a2a_bytes[k]
    return totals


def per_sample(totals: Dict[str, float], samples: float) -> Dict[str, float]:
    """{input, output, gradient, total} bytes divided by ``samples``."""
    out = {k: totals[k] / samples if samples else 0.0 for k in A2A_KINDS}
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}


def embedding_traffic_summary(model: nn.Module, controller: Any, samples_trained: int) -> Dict[str, Any]:
    """The summary's traffic and serving fields. Collective: all ranks enter one SUM all-reduce.

    Bytes per sample: every rank's sends summed, over the samples all ranks trained: a rank's
    mean sends per sample it trained. ``served_fraction``: samples answered from the replica over
    samples trained. ``rows_updated_per_step``: distinct rows the shards of all ranks looked up
    (and so updated) in a step, averaged over the measured steps (every
    ``ROWS_UPDATED_EVERY``-th).
    """
    a2a = local_a2a_bytes(model)
    rows = {"steps": 0, "rows": 0}
    for m in _modules(model):
        rows["steps"] = max(rows["steps"], m.rows_updated["steps"])
        rows["rows"] += m.rows_updated["rows"]
    server = controller.server
    replica = server.replica if server is not None else None
    c = controller.plan.counters()
    values = [float(a2a[k]) for k in A2A_KINDS] + [
        float(c["samples_served"]), float(c["lookups_served"]),
        rows["rows"] / max(1, rows["steps"]),
        float(replica.sync_bytes) if replica is not None else 0.0,
    ]  # fmt: skip
    total = all_reduce_(torch.tensor(values, dtype=torch.float64)).tolist()  # all ranks
    sums = dict(zip(A2A_KINDS, total[:3]))
    served, lookups_served, rows_per_step, sync = total[3:]
    return {
        "a2a_bytes_per_sample": per_sample(sums, samples_trained),
        "served_fraction": served / samples_trained if samples_trained else 0.0,
        "samples_served": int(served),
        "lookups_served": int(lookups_served),
        "rows_updated_per_step": round(rows_per_step, 1),
        "replica": None
        if replica is None
        else {
            "rows": replica.rows,
            "bytes_per_rank": replica.nbytes(),
            "rebuilds": replica.rebuilds,
            "pushes": server.grads.pushes,
            "rows_pushed_per_rank": server.grads.rows_pushed,
            "sync_bytes_per_sample": round(sync / samples_trained, 3) if samples_trained else 0.0,
        },
    }


def traffic_state(model: nn.Module) -> List[Dict[str, Any]]:
    """This rank's meters (for checkpoints: a resumed run reports the bytes of the whole run)."""
    return [
        {"a2a_bytes": dict(m.a2a_bytes), "rows_updated": dict(m.rows_updated), "calls": m.calls}
        for m in _modules(model)
    ]


def load_traffic_state(model: nn.Module, state: List[Dict[str, Any]]) -> None:
    modules = _modules(model)
    if len(state) != len(modules):  # another model: the meters start over
        return
    for m, s in zip(modules, state):
        m.a2a_bytes.update(s["a2a_bytes"])
        m.load_rows_updated(s["rows_updated"])
        m.calls = int(s["calls"])
