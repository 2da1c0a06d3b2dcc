"""The gradients that served samples owe to their rows: summed locally, pushed at each snapshot.

A served sample (``serving.py``) reads its rows from the replica and sends nothing through the
shards, so its gradient for those rows does not reach them in its step. Dropping it would be
skipping again (measured: on ``clicklog_quick`` serving 32% of the samples without the push cost
0.0045 test AUC; with the tables frozen it cost nothing, so all of the loss was these gradients).
Instead each rank sums, per row, the gradient its served samples' pooled embeddings received
(SUM pooling: a row gets its bag's gradient once per occurrence), and at every snapshot, before
the rows are snapshotted and the replica rebuilt, pushes the sums through the sharded embedding
path as one batch of pseudo-samples: every summed row is one lookup of its own, and the backward
of that batch carries the sums. TorchRec then adds the ranks' contributions and divides by the
world size as for any batch, and the fused optimizer (or, for data-parallel tables, DDP and the
optimizer step that follows) applies them. A stale row's update is thus delayed by at most
``snapshot_interval`` steps and applied as one step of the summed gradient, instead of lost.
The push moves rows x D gradient values once per snapshot instead of per-sample pooled
embeddings every step; its bytes are counted with the rest (``a2a_bytes``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.slipstream.rows import RowIndex

__all__ = ["ServedGradients", "unpipelined"]


@contextmanager
def unpipelined(ebc: Any) -> Iterator[Any]:
    """``ebc`` with its plain forward for the duration, inside a step of TorchRec's pipeline.

    TrainPipelineSparseDist swaps the sharded module's ``forward`` for one that reads the
    pipelined batch's input-dist results, and each ``KJTAllToAll``'s for one that fuses the split
    exchange (torchrec/distributed/train_pipeline/utils.py: ``_rewrite_model``,
    ``_override_input_dist_forwards``); ``detach()`` undoes both but may not be called inside a
    step (its ``dequeue_batch`` needs the pipelined forward). These are instance attributes:
    removing them for the duration exposes the class methods, and they are put back after.
    """
    saved = []
    dists = [getattr(d, "_dist", None) for d in ebc._input_dists]
    for module in [ebc] + [d for d in dists if d is not None]:
        if "forward" in module.__dict__:
            saved.append((module, module.__dict__.pop("forward")))
    try:
        yield ebc
    finally:
        for module, forward in saved:
            module.forward = forward


class ServedGradients:
    """Per-row sums of the served samples' embedding gradients on this rank (sorted flat keys)."""

    def __init__(self, index: RowIndex, dim: int) -> None:
        self.index = index
        self.dim = int(dim)
        self.keys = torch.zeros(0, dtype=torch.int64)
        self.grads = torch.zeros(0, self.dim)
        self.pushes = 0  # pushes that moved at least one row (same count on every rank)
        self.rows_pushed = 0  # rows this rank pushed, all pushes

    @torch.no_grad()
    def add(self, kjt: KeyedJaggedTensor, bag_grads: torch.Tensor) -> None:
        """Add the gradient ``bag_grads`` (n, F, D) of the pooled embeddings of the served samples
        ``kjt`` (n samples, F features in the KJT's key order) to their rows. Local."""
        kjt = kjt.to(torch.device("cpu"))
        lengths = kjt.lengths().to(torch.int64)
        if not int(lengths.sum()):
            return
        device = bag_grads.device
        flat = self.index.flat_keys(kjt).to(device)
        per_bag = bag_grads.detach().float().transpose(0, 1).reshape(-1, self.dim)  # feature-major
        per_lookup = per_bag.repeat_interleave(lengths.to(device), dim=0)
        keys = torch.cat([self.keys.to(device), flat])
        grads = torch.cat([self.grads.to(device), per_lookup])
        unique, inverse = torch.unique(keys, return_inverse=True)
        self.keys = unique
        self.grads = torch.zeros(unique.numel(), self.dim, device=device).index_add_(0, inverse, grads)

    def push(self, ebc: Any, feature_names: List[str]) -> int:
        """Send the sums through the sharded EBC ``ebc`` and backward them, in the middle of a
        pipelined step (``unpipelined``); returns the pseudo-batch size (0: nothing on any rank,
        no forward)."""
        # Collective: ALL ranks enter one MAX all-reduce, and unless every rank has nothing, the
        # sharded forward and backward of a batch of the same size on every rank.
        keys, grads = self.keys.cpu(), self.grads
        feature, rows = self.index.from_flat(keys)  # sorted keys: grouped by feature, rows ascending
        per_feature = torch.bincount(feature, minlength=self.index.num_features)
        local = int(per_feature.max()) if keys.numel() else 0
        size = int(all_reduce_(torch.tensor([local], dtype=torch.int64), dist.ReduceOp.MAX).item())  # all ranks
        if size == 0:
            return 0
        position = {name: i for i, name in enumerate(self.index.feature_names)}
        order = [position[name] for name in feature_names]  # the KJT's key order
        starts = torch.cumsum(per_feature, 0) - per_feature
        lengths = torch.zeros(len(order), size, dtype=torch.int32)
        values, blocks = [], []
        for slot, f in enumerate(order):
            n, lo = int(per_feature[f]), int(starts[f])
            lengths[slot, :n] = 1
            values.append(rows[lo : lo + n])
            blocks.append((n, lo))
        device = grads.device
        kjt = KeyedJaggedTensor(
            keys=list(feature_names), values=torch.cat(values), lengths=lengths.view(-1), stride=size
        ).to(device)
        counting, ebc.counting = ebc.counting, False  # the pseudo-lookups are not data
        try:
            with unpipelined(ebc):
                pooled = ebc(kjt)
            out = pooled.values()  # (size, F * D) in pooled.keys() order
            grad = torch.zeros_like(out)
            slot_of = {name: slot for slot, name in enumerate(feature_names)}
            col = 0
            for key, width in zip(pooled.keys(), pooled.length_per_key()):
                assert width == self.dim, "one embedding dim for every table"
                n, lo = blocks[slot_of[key]]
                grad[:n, col : col + width] = grads[lo : lo + n]
                col += width
            torch.autograd.backward(out, grad)
        finally:
            ebc.counting = counting
        self.pushes += 1
        self.rows_pushed += int(keys.numel())
        self.keys, self.grads = torch.zeros(0, dtype=torch.int64), torch.zeros(0, self.dim, device=device)
        return size

    def state_dict(self) -> Dict[str, Any]:
        return {
            "keys": self.keys.cpu().clone(), "grads": self.grads.detach().cpu().clone(),
            "pushes": self.pushes, "rows_pushed": self.rows_pushed,
        }  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any], device: torch.device) -> None:
        self.keys = state["keys"].clone()
        self.grads = state["grads"].to(device)
        self.pushes, self.rows_pushed = int(state["pushes"]), int(state["rows_pushed"])
