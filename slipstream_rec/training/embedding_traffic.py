"""What the training collectives moved and what Slipstream served, as summary.json reports it.

Machine-independent counts (bytes from the tensors each collective was given), per trained
sample, for every policy, so ``off``, ``skip`` and ``serve`` compare directly.
``a2a_bytes_per_sample`` has one entry per kind of collective:

- ``input``, ``output``, ``gradient``: the embedding all-to-alls (ids in; pooled embeddings
  out; their gradients back), metered by ``SlipstreamShardedEBC``. ``output`` and ``gradient``
  are what the quantized comms' codec puts on the wire (``sharding.qcomms``: the meter's fp32
  bytes times the codec's factor, exact, see sharding/qcomms.py; with ``sharding.qcomms.when=auto``
  the bytes sent while the codecs were switched off at fp32, sharding/qcomms_switch.py); the
  ids are never quantized.
- ``push``: serve's all-gathers of the served samples' row gradients (slipstream/serve/push.py).
- ``replica``: serve's all-gathers that rebuild the replica of the stale rows (slipstream/serve/replica.py).
- ``control``: the lock-step agreements' all-reduces (slipstream/lockstep.py).
- ``tracking``: Slipstream's gathers that choose the hot set, agree on the snapshots' changes
  and choose T (slipstream/tracker.py, slipstream/threshold.py).
- ``dense``, ``data_parallel``: DDP's gradient all-reduces of the dense arch and of the
  data-parallel tables (``trainer.ddp_comm_hook``, training/comm_hooks.py).
- ``embedding``: input + output + gradient (what ``total`` was before the other kinds were
  counted); ``total``: every kind.

Each count includes a rank's share to itself; ``off_rank_bytes_per_sample`` has the same kinds
less that share, at the rate each collective sends (``off_rank_factors``, ``split_factors``):
what a network between the ranks carries, which the trainer's wire meter reads beside it
(training/wire_meter.py).

Not counted: the small collectives of setup, of the quality check and the downsampling guard,
of evaluation and of checkpoints.

The kinds metered outside the sharded module (push, control, tracking, dense, data_parallel) are kept in
the first sharded module's ``a2a_bytes`` beside its own, so a checkpoint carries them all.
"""

from __future__ import annotations

from typing import Any, Dict, List, MutableMapping

import torch
import torch.distributed as dist
from torch import nn

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.sharding.qcomms import wire_factor
from slipstream_rec.sharding.qcomms_switch import PLAIN
from slipstream_rec.sharding.sharded import SPLIT_COUNTS, SlipstreamShardedEBC

EMBEDDING_KINDS = ("input", "output", "gradient")
A2A_KINDS = EMBEDDING_KINDS + ("push", "replica", "control", "tracking", "dense", "data_parallel")


def _modules(model: nn.Module) -> List[SlipstreamShardedEBC]:
    return [m for m in model.modules() if isinstance(m, SlipstreamShardedEBC)]


def run_meter(model: nn.Module) -> MutableMapping[str, int]:
    """Where the kinds metered outside the sharded module add their bytes (see the module doc);
    a scratch dict for a model without Slipstream shards."""
    modules = _modules(model)
    return modules[0].a2a_bytes if modules else {}


def local_a2a_bytes(model: nn.Module, replica_sync_bytes: int = 0) -> Dict[str, int]:
    """This rank's bytes given to each kind of collective so far (local). ``replica`` is metered
    by serve's replica (``replica_sync_bytes``, Slipstream's ``stats.serving``), not the model."""
    totals = {k: 0 for k in A2A_KINDS}
    for m in _modules(model):
        factor = _codec_rates(m)
        for k in A2A_KINDS:
            totals[k] += _on_wire(m.a2a_bytes, k, factor.get(k, 1.0))
    totals["replica"] += int(replica_sync_bytes)
    return totals


def local_split_bytes(model: nn.Module) -> Dict[str, int]:
    """This rank's part of ``output`` and ``gradient`` that the row-wise shardings' reduce-scatters
    and all-gathers carried (``SPLIT_COUNTS``), at the codec's rate like theirs (local)."""
    totals = {k: 0 for k in SPLIT_COUNTS}
    for m in _modules(model):
        factor = _codec_rates(m)
        for k in SPLIT_COUNTS:
            totals[k] += _on_wire(m.a2a_bytes, k, factor[k.split("/")[0]])
    return totals


def _on_wire(meter: Dict[str, int], key: str, factor: float) -> int:
    """The bytes counted under ``key`` as sent: at the codec's ``factor``, but those sent while
    ``sharding.qcomms.when=auto`` had the codecs off (``PLAIN``), at fp32."""
    plain = meter.get(PLAIN + key, 0)
    return int(round((meter.get(key, 0) - plain) * factor)) + plain


def _codec_rates(m: SlipstreamShardedEBC) -> Dict[str, float]:
    """What the quantized comms' codec puts on the wire per fp32 byte the meter counted."""
    registry = m.qcomm_codecs_registry
    return {"output": wire_factor(registry, "forward"), "gradient": wire_factor(registry, "backward")}


def off_rank_factors(world: int) -> Dict[str, float]:
    """What share of the bytes counted for each kind leaves the rank (what a network carries),
    for ``world`` ranks with equal batches: the embedding all-to-alls keep 1/W on the rank (exact
    for the pooled embeddings and gradients; for the ids, the share of a rank's ids that its own
    shards hold, taken as 1/W; the row-wise shardings' reduce-scatters and all-gathers are
    ``split_factors``'); an all-reduce (a ring, gloo's and NCCL's) sends
    2(W-1)/W of its buffer; the replica's and the tracking's all-gathers send a rank's slice to
    each of the W-1 others; the push counts only what it sends to other ranks already."""
    if world <= 1:
        return {k: 0.0 for k in A2A_KINDS}
    a2a, ring = (world - 1) / world, 2 * (world - 1) / world
    return {
        "input": a2a, "output": a2a, "gradient": a2a, "push": 1.0, "replica": float(world - 1),
        "control": ring, "tracking": float(world - 1), "dense": ring, "data_parallel": ring,
    }  # fmt: skip


def reduce_scatter_rate(ranks: int, backend: str) -> float:
    """Share of its buffer a rank sends in a reduce-scatter over ``ranks``: NCCL's ring sends
    (n-1)/n; gloo's sends 2(n-1)/n, as much as its all-reduce (measured on loopback with 2 and 4
    ranks: 16 MB buffers, 16 and 24 MB sent per rank)."""
    if ranks <= 1:
        return 0.0
    return (2.0 if backend == "gloo" else 1.0) * (ranks - 1) / ranks


def split_factors(world: int, local: int, backend: str) -> Dict[str, float]:
    """The share of each ``SPLIT_COUNTS`` count that leaves the rank, with ``local`` ranks per
    node. ``row_wise``: its pooled output reduce-scattered over all ranks, its gradient
    all-gathered back (each rank's slice to the W-1 others). ``table_row_wise`` on N = W/L
    nodes: reduce-scattered within the node, then the node's 1/L of it all-to-all'ed across
    nodes, (N-1)/N leaving; backward, the all-to-all's (N-1)/N of the gradient, then the
    all-gather within the node, (L-1) of it. With one rank per node that is an all-to-all's;
    on one node, row-wise's."""
    if world <= 1:
        return {k: 0.0 for k in SPLIT_COUNTS}
    local = max(1, min(local, world))
    nodes = max(1, world // local)
    cross = (nodes - 1) / nodes
    return {
        "output/row_wise": reduce_scatter_rate(world, backend),
        "gradient/row_wise": float(world - 1),
        "output/table_row_wise": reduce_scatter_rate(local, backend) + cross / local,
        "gradient/table_row_wise": cross + (local - 1),
    }


def off_rank_bytes(
    sums: Dict[str, float], split: Dict[str, float], world: int, local: int, backend: str
) -> Dict[str, float]:
    """Every kind's bytes that left the ranks: each count at its collective's rate; ``output`` and
    ``gradient`` with their row-wise parts (``split``) at those shardings' rates and the rest at
    an all-to-all's."""
    factors, parts = off_rank_factors(world), split_factors(world, local, backend)
    out = {k: v * factors[k] for k, v in sums.items()}
    for kind in ("output", "gradient"):
        mine = {k: v for k, v in split.items() if k.startswith(f"{kind}/")}
        rest = sums[kind] - sum(mine.values())
        assert rest >= -1e-6 * max(1.0, sums[kind]), f"{kind}: its row-wise part exceeds it"
        out[kind] = max(0.0, rest) * factors[kind] + sum(v * parts[k] for k, v in mine.items())
    return out


def per_sample(totals: Dict[str, float], samples: float) -> Dict[str, float]:
    """Every kind's bytes divided by ``samples``, with the ``embedding`` and ``total`` sums."""
    out = {k: totals.get(k, 0) / samples if samples else 0.0 for k in A2A_KINDS}
    out["embedding"] = sum(out[k] for k in EMBEDDING_KINDS)
    out["total"] = sum(out[k] for k in A2A_KINDS)
    return {k: round(v, 3) for k, v in out.items()}


def embedding_traffic_summary(
    model: nn.Module, serving: Dict[str, Any], samples_trained: int, local_world_size: int
) -> Dict[str, Any]:
    """The summary's traffic and serving fields. Collective: all ranks enter one SUM all-reduce.
    ``serving``: what serving did on this rank (Slipstream's ``stats.serving``).
    ``local_world_size``: the ranks on this node (``DistEnv``), which the off-rank rates of the
    table-row-wise shardings depend on.

    Bytes per sample: every rank's sends summed, over the samples all ranks trained: a rank's
    mean sends per sample it trained. ``served_fraction``: lookups answered from the replica over
    the lookups of the samples trained (serve works per lookup, slipstream/serve/split.py);
    ``samples_served``: samples all of whose lookups were; ``slots_fraction``: bags sent through
    the shards (the sharded size S per feature, padding included) over all bags, what the
    pooled-embedding all-to-alls shrink by; ``served_by_feature``: each feature's share of
    lookups served (the ceiling of the output side is the least served feature). ``rows_updated_per_step``: distinct rows the shards of all ranks looked up
    (and so updated) in a step, averaged over the measured steps (every
    ``ROWS_UPDATED_EVERY``-th).
    """
    a2a = local_a2a_bytes(model, serving["sync_bytes"])
    rows = {"steps": 0, "rows": 0}
    for m in _modules(model):
        rows["steps"] = max(rows["steps"], m.rows_updated["steps"])
        rows["rows"] += m.rows_updated["rows"]
    c = serving["counters"]
    per_feature = [serving["feature_lookups"], serving["feature_served"]]
    features = len(per_feature[0])  # the same on every rank
    assert len(per_feature[1]) == features, "one count per feature"
    split = local_split_bytes(model)
    values = [float(a2a[k]) for k in A2A_KINDS] + [
        float(c["samples_served"]), float(c["lookups_served"]), float(c["lookups_split"]),
        float(c["slots_sent"]), float(c["bags_split"]), rows["rows"] / max(1, rows["steps"]),
    ] + [float(x) for x in per_feature[0] + per_feature[1]] + [float(split[k]) for k in SPLIT_COUNTS]  # fmt: skip
    total = all_reduce_(torch.tensor(values, dtype=torch.float64)).tolist()  # all ranks
    n = len(A2A_KINDS)
    sums = dict(zip(A2A_KINDS, total[:n]))
    served, lookups_served, lookups, slots, bags, rows_per_step = total[n : n + 6]
    seen, hit = total[n + 6 : n + 6 + features], total[n + 6 + features : n + 6 + 2 * features]
    split_sums = dict(zip(SPLIT_COUNTS, total[n + 6 + 2 * features :]))
    sync = sums["replica"]
    world = dist.get_world_size() if dist.is_initialized() else 1
    backend = str(dist.get_backend()) if dist.is_initialized() else "gloo"
    off_rank = off_rank_bytes(sums, split_sums, world, local_world_size, backend)
    return {
        "a2a_bytes_per_sample": per_sample(sums, samples_trained),
        # the same counts less what stays on each rank, at each collective's rate: what the
        # network carries, to set beside the bytes a NIC counts (summary.json wire)
        "off_rank_bytes_per_sample": per_sample(off_rank, samples_trained),
        # the row-wise shardings' part of output and gradient (reduce-scattered, all-gathered back)
        "row_wise_bytes_per_sample": {k: round(v / samples_trained, 3) if samples_trained else 0.0
                                      for k, v in split_sums.items()},  # fmt: skip
        "served_fraction": lookups_served / lookups if lookups else 0.0,
        "samples_served": int(served),
        "lookups_served": int(lookups_served),
        "slots_fraction": round(slots / bags, 4) if bags else 1.0,
        "served_by_feature": [round(h / s, 4) if s else 0.0 for s, h in zip(seen, hit)],
        "rows_updated_per_step": round(rows_per_step, 1),
        "replica": None
        if serving["replica"] is None
        else {
            **serving["replica"],
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
