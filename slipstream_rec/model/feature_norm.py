"""Feature normalization before the DLRM interaction: Slipstream's accuracy recovery.

The Slipstream paper (arXiv 2404.04270) names feature normalization as its third part, applied so
that training only on the inputs that touch "hot" embeddings (and skipping the stale rest) costs
no accuracy; it does not say which normalization or where. Both options normalize the two inputs
of the interaction, the pooled embeddings (B, F, D) and the bottom-MLP output (B, D):

- ``layer``: each D-vector is standardized on its own (LayerNorm over D, one gain and bias per
  feature and dimension). Reading: skipping lets the magnitudes of rows drift apart (hot rows keep
  training, stale ones freeze), and the dot-product interaction is sensitive to scale; per-vector
  normalization puts fresh and stale embeddings on one scale. It does not depend on which samples
  are in the batch, so the skip decision cannot bias it.
- ``batch``: each (feature, dimension) channel is standardized over the batch (BatchNorm with
  running statistics used in eval). Reading: skipping changes the distribution of the inputs the
  top MLP is trained on; standardizing per channel keeps that distribution fixed. Its running
  statistics come from the trained (kept) samples only; ``observe_dense`` lets the bottom-MLP
  statistics also see the skipped samples, whose dense features are on the host without a lookup.

Distributed training: TorchRec's DMP wraps the dense part in DDP with ``broadcast_buffers=False``
(torchrec.distributed.model_parallel.DefaultDataParallelWrapper), so a plain ``nn.BatchNorm`` keeps
per-rank running statistics that drift apart, and ``torch.nn.SyncBatchNorm`` refuses CPU tensors.
``GlobalBatchNorm`` therefore reduces its batch moments over all ranks with one small all-reduce
per training forward (and its mirror in backward): every rank normalizes with the statistics of the
global batch and applies the same running update, so the running statistics are identical on every
rank by construction, and the sharded model equals the unsharded model on the global batch.

The modules are plain ``nn.Module``s composed into TorchRec's DLRM / DLRM_DCN by replacing
``dlrm.inter_arch`` with a wrapper that normalizes and then calls the original interaction; their
parameters and buffers are part of the model's ``state_dict`` and so of every checkpoint.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from slipstream_rec.model.config import FeatureNorm

# LayerNorm / BatchNorm defaults of torch.nn.
EPS = 1e-5
MOMENTUM = 0.1


class PerFeatureLayerNorm(nn.Module):
    """LayerNorm over the last dimension of (B, *shape), with a gain and bias for every element of
    ``shape``: for (F, D), each feature's D-vector is normalized on its own and has its own affine.
    """

    def __init__(self, shape: Sequence[int], eps: float = EPS, device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(*shape, device=device))
        self.bias = nn.Parameter(torch.zeros(*shape, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalized = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return normalized * self.weight + self.bias


class _AllReduceSum(torch.autograd.Function):
    """Sum over the default group, differentiable: the gradient of a sum over ranks is the sum of
    the ranks' gradients (the same function as torch.distributed.nn.functional.all_reduce, which is
    deprecated). Collective in forward and in backward."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _AllReduceSum.apply(grad)


class GlobalBatchNorm(nn.Module):
    """BatchNorm over the batch dimension of (B, *shape): one mean, variance, gain and bias per
    element of ``shape`` (per feature and dimension for (F, D)).

    Training: normalizes with the batch's mean and biased variance and moves the running
    statistics towards them (momentum ``MOMENTUM``, unbiased variance), as ``nn.BatchNorm1d``
    does. Eval: normalizes with the running statistics and updates nothing. With ``sync`` and an
    initialized process group of more than one rank, the batch is the global batch: the training
    forward is a collective (one all-reduce, and one more in backward) that every rank enters at
    every training step, as it already enters the embedding all-to-alls of the same forward. A
    global batch of fewer than 2 samples leaves the running statistics unchanged (nn.BatchNorm
    raises instead; checking would cost a device sync every step on GPU).
    """

    def __init__(
        self,
        shape: Sequence[int],
        eps: float = EPS,
        momentum: float = MOMENTUM,
        device: Optional[torch.device] = None,
        sync: bool = True,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        # True: statistics over all ranks of the default process group (when there is one).
        # False: over this rank's batch only (an unsharded reference, or one-process inference).
        self.sync = sync
        self.weight = nn.Parameter(torch.ones(*shape, device=device))
        self.bias = nn.Parameter(torch.zeros(*shape, device=device))
        self.register_buffer("running_mean", torch.zeros(*shape, device=device))
        self.register_buffer("running_var", torch.ones(*shape, device=device))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long, device=device))

    def _synced(self) -> bool:
        return self.sync and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _batch_moments(self, x: torch.Tensor):
        """(mean, biased variance, sample count) of the (global) batch, per channel.

        Sums are taken around the running mean (a shift equal on every rank), which keeps the
        one-pass variance E[(x-s)^2] - E[x-s]^2 accurate once the running mean has settled.
        Collective when synced: all ranks.
        """
        flat = x.flatten(1).float()  # (B, channels); B may be 0 (observe on a rank with no rows)
        channels = flat.shape[1]
        shift = self.running_mean.reshape(-1).detach().float().clone()  # not a view: updated below
        centered = flat - shift
        count = torch.full((1,), float(flat.shape[0]), device=flat.device)
        stats = torch.cat([centered.sum(0), centered.square().sum(0), count])
        if self._synced():
            stats = _AllReduceSum.apply(stats)  # all ranks, every training forward
        n = stats[-1]
        centered_mean = stats[:channels] / n.clamp_min(1)
        var = (stats[channels : 2 * channels] / n.clamp_min(1) - centered_mean.square()).clamp_min(0)
        return shift + centered_mean, var, n

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor) -> None:
        # No Python branch on n (that would sync a GPU every step): a batch of < 2 moves nothing.
        step = torch.where(n >= 2, self.momentum, 0.0)
        unbiased = var * n / (n - 1).clamp_min(1)
        self.running_mean.lerp_(mean.reshape(self.running_mean.shape).to(self.running_mean.dtype), step)
        self.running_var.lerp_(unbiased.reshape(self.running_var.shape).to(self.running_var.dtype), step)
        self.num_batches_tracked.add_((n >= 2).long())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            mean, var, n = self._batch_moments(x)
            self._update_running(mean.detach(), var.detach(), n.detach())
            mean = mean.reshape(self.running_mean.shape)
            var = var.reshape(self.running_var.shape)
        else:
            mean, var = self.running_mean, self.running_var
        normalized = (x.float() - mean) * torch.rsqrt(var + self.eps)
        return (normalized * self.weight + self.bias).to(x.dtype)

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Move the running statistics towards the moments of ``x`` (B, *shape), as a training
        forward would, without producing an output or touching the parameters. Collective when
        synced: every rank calls it at the same point, with its own (possibly empty) rows."""
        mean, var, n = self._batch_moments(x)
        self._update_running(mean, var, n)


class NormalizedInteraction(nn.Module):
    """Normalizes the bottom-MLP output (B, D) and the pooled embeddings (B, F, D), then calls
    TorchRec's interaction (InteractionArch or InteractionDCNArch) unchanged.

    Has the interaction's call signature ``(dense_features, sparse_features)``, which is how
    ``DLRM.forward`` calls ``self.inter_arch``. Contains no sharded module, so TorchRec's pipeline
    tracer treats it as one leaf call.
    """

    def __init__(self, interaction: nn.Module, dense_norm: nn.Module, sparse_norm: nn.Module) -> None:
        super().__init__()
        self.interaction = interaction
        self.dense_norm = dense_norm
        self.sparse_norm = sparse_norm

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        # With GlobalBatchNorm each norm is a collective: all ranks run them in this order.
        return self.interaction(
            dense_features=self.dense_norm(dense_features),
            sparse_features=self.sparse_norm(sparse_features),
        )


def add_feature_norm(
    dlrm: nn.Module, kind: FeatureNorm, embedding_dim: int, device: Optional[torch.device] = None
) -> nn.Module:
    """Wrap ``dlrm.inter_arch`` (a TorchRec DLRM or DLRM_DCN) with ``kind``'s normalization, in
    place; ``none`` leaves the model untouched. Consumes no random numbers (norms start at the
    identity), so every other weight is the same as without normalization for the same seed."""
    if kind is FeatureNorm.none:
        return dlrm
    if isinstance(dlrm.inter_arch, NormalizedInteraction):
        raise ValueError("model.feature_norm: this DLRM's interaction is already normalized")
    num_features, dim = len(dlrm.sparse_arch.sparse_feature_names), embedding_dim
    if kind is FeatureNorm.layer:
        norm_class: type = PerFeatureLayerNorm
    elif kind is FeatureNorm.batch:
        norm_class = GlobalBatchNorm
    else:
        raise ValueError(f"model.feature_norm={kind!r}: use one of {[k.value for k in FeatureNorm]}")
    dense_norm = norm_class((dim,), device=device)  # bottom-MLP output (B, D)
    sparse_norm = norm_class((num_features, dim), device=device)  # pooled embeddings (B, F, D)
    dlrm.inter_arch = NormalizedInteraction(dlrm.inter_arch, dense_norm, sparse_norm)
    return dlrm


def _normalized_dlrm(model: nn.Module) -> nn.Module:
    """The DLRM inside ``model`` (a DLRM, DLRMTask or DMP) whose interaction is normalized."""
    for module in model.modules():
        inter = getattr(module, "inter_arch", None)
        if hasattr(module, "dense_arch") and isinstance(inter, NormalizedInteraction):
            return module
    raise ValueError(
        "observe_dense: the model has no normalized interaction; build it with model.feature_norm=batch"
    )


@torch.no_grad()
def observe_dense(model: nn.Module, dense_features: torch.Tensor) -> None:
    """Update only the running statistics of the bottom-MLP output's BatchNorm from extra samples
    (e.g. the inputs Slipstream skips: their dense features need no embedding lookup).

    Runs the bottom MLP on ``dense_features`` (N, num_dense) without gradient; no parameter and
    no other buffer changes. Updates whatever the model's mode (the caller decides when samples
    count). Collective (one all-reduce over the default group when there is more than one rank):
    every rank calls it at the same step, a rank with nothing to add passes 0 rows.
    """
    dlrm = _normalized_dlrm(model)
    norm = dlrm.inter_arch.dense_norm
    if not isinstance(norm, GlobalBatchNorm):
        raise ValueError(
            "observe_dense updates BatchNorm running statistics; this model has "
            f"{type(norm).__name__}. Build it with model.feature_norm=batch"
        )
    norm.observe(dlrm.dense_arch(dense_features))
