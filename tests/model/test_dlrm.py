"""The DLRM task module: both interaction archs, weighted loss, config checks."""

from __future__ import annotations

import pytest
import torch

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.model.config import Arch, ModelConfig
from slipstream_rec.model.dlrm import build_model, embedding_bag_configs

FEATURES = ["a", "b", "c"]
ROWS = [10, 20, 30]


def _batch(n: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randint(0, r, (n,), generator=g) for r in ROWS], dim=1)
    return Batch(
        dense_features=torch.randn(n, 13, generator=g),
        sparse_features=make_kjt(FEATURES, ids),
        labels=torch.tensor([1.0, 0.0] * (n // 2)),
    )


@pytest.mark.parametrize("arch", list(Arch))
def test_forward_returns_pipeline_shaped_output(arch):
    cfg = ModelConfig(arch=arch, embedding_dim=4, dense_arch_layer_sizes=[8, 4],
                      over_arch_layer_sizes=[8, 1], dcn_num_layers=2, dcn_low_rank_dim=4)
    model = build_model(cfg, 13, FEATURES, ROWS, torch.device("cpu"), embedding_device=torch.device("cpu"))
    loss, (detached_loss, logits, labels, weights) = model(_batch())
    assert logits.shape == (6,) and labels.shape == (6,) and weights.shape == (6,)
    assert torch.isfinite(loss) and loss.requires_grad and not detached_loss.requires_grad
    loss.backward()
    table = model.model.sparse_arch.embedding_bag_collection.embedding_bags["t_a"].weight
    assert table.grad is not None and table.grad.abs().sum() > 0


def test_loss_is_the_weighted_mean_of_per_sample_bce():
    cfg = ModelConfig(embedding_dim=4, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1])
    model = build_model(cfg, 13, FEATURES, ROWS, torch.device("cpu"), embedding_device=torch.device("cpu"))
    batch = _batch()
    batch.weights = torch.tensor([1.0, 2.0, 0.0, 1.0, 4.0, 1.0])
    loss, (_, logits, labels, _) = model(batch)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    expected = (bce * batch.weights).sum() / batch.weights.sum()
    torch.testing.assert_close(loss.detach(), expected)


def test_tables_are_named_per_feature_on_meta_by_default():
    cfg = ModelConfig(embedding_dim=4, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1])
    tables = embedding_bag_configs(cfg, FEATURES, ROWS)
    assert [(t.name, t.num_embeddings, t.feature_names) for t in tables] == [
        ("t_a", 10, ["a"]), ("t_b", 20, ["b"]), ("t_c", 30, ["c"])
    ]
    model = build_model(cfg, 13, FEATURES, ROWS, torch.device("cpu"))
    assert model.model.sparse_arch.embedding_bag_collection.embedding_bags["t_a"].weight.is_meta


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(embedding_dim=8, dense_arch_layer_sizes=[16, 4]), "model.dense_arch_layer_sizes"),
        (dict(embedding_dim=4, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[8, 2]), "model.over_arch_layer_sizes"),
        (dict(embedding_dim=4, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[1]), "model.over_arch_layer_sizes"),
    ],
)
def test_inconsistent_sizes_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_model(ModelConfig(**kwargs), 13, FEATURES, ROWS, torch.device("cpu"))


def test_feature_and_table_counts_must_agree():
    with pytest.raises(ValueError, match="meta.json"):
        embedding_bag_configs(ModelConfig(), FEATURES, ROWS[:2])


def test_a_bag_of_ids_pools_to_the_sum_of_its_rows():
    """Multi-hot features: each sample's embedding is the sum of its ids' rows (DLRM's pooling),
    an empty bag gives zeros, checked against the table's weights by hand."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    cfg = ModelConfig(embedding_dim=4, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1])
    model = build_model(cfg, 13, FEATURES, ROWS, torch.device("cpu"), embedding_device=torch.device("cpu"))
    ebc = model.model.sparse_arch.embedding_bag_collection
    bags = {"a": [[1, 2, 2], [], [9]], "b": [[0], [5, 19], []], "c": [[29, 3, 7, 11], [4], [4, 4]]}
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES,
        values=torch.tensor([i for f in FEATURES for bag in bags[f] for i in bag]),
        lengths=torch.tensor([len(bag) for f in FEATURES for bag in bags[f]]),
    )
    pooled = ebc(kjt).to_dict()
    for f in FEATURES:
        weight = ebc.embedding_bags[f"t_{f}"].weight.detach()
        want = torch.stack([weight[bag].sum(0) if bag else torch.zeros(4) for bag in bags[f]])
        torch.testing.assert_close(pooled[f].detach(), want)
