"""model.feature_norm: the normalizations against torch's own modules, the unchanged model for
``none``, train/eval behaviour, observe_dense, checkpoints, config, and a 2-rank sharded step
against an unsharded reference (following tests/sharding/test_equivalence.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.model.config import Arch, FeatureNorm, ModelConfig
from slipstream_rec.model.dlrm import DLRMTask, build_model
from slipstream_rec.model.feature_norm import (
    GlobalBatchNorm,
    NormalizedInteraction,
    PerFeatureLayerNorm,
    observe_dense,
)
from tests._fixtures import FEATURES, LOCAL_BATCH, LR, ROWS, WORLD, _slice_batch
from tests.dist_harness import run_workers

CPU = torch.device("cpu")


def _cfg(norm: FeatureNorm, arch: Arch = Arch.dlrm) -> ModelConfig:
    return ModelConfig(
        arch=arch, embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1],
        dcn_num_layers=2, dcn_low_rank_dim=4, feature_norm=norm,
    )  # fmt: skip


def _model(norm: FeatureNorm, arch: Arch = Arch.dlrm, seed: int = 0) -> DLRMTask:
    torch.manual_seed(seed)
    return build_model(_cfg(norm, arch), 13, FEATURES, ROWS, CPU, embedding_device=CPU)


def _batch(n: int = 12, seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randint(0, r, (n,), generator=g) for r in ROWS], dim=1)
    return Batch(
        dense_features=torch.randn(n, 13, generator=g) * 3 + 1,
        sparse_features=make_kjt(FEATURES, ids),
        labels=torch.randint(0, 2, (n,), generator=g).float(),
    )


def _norm_buffers(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


# ---- the modules against torch's -------------------------------------------------------------


def test_per_feature_layer_norm_is_layer_norm_over_d_with_a_per_feature_affine():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 8, generator=g) * 4 + 2
    norm = PerFeatureLayerNorm((3, 8))
    with torch.no_grad():
        norm.weight.copy_(torch.rand(3, 8, generator=g) + 0.5)
        norm.bias.copy_(torch.randn(3, 8, generator=g))
    out = norm(x)
    for f in range(3):  # each feature: torch's LayerNorm(D) with that feature's affine
        ref = nn.LayerNorm(8)
        with torch.no_grad():
            ref.weight.copy_(norm.weight[f])
            ref.bias.copy_(norm.bias[f])
        torch.testing.assert_close(out[:, f], ref(x[:, f]))
    plain = PerFeatureLayerNorm((3, 8))(x)  # identity affine: every D-vector standardized
    torch.testing.assert_close(plain.mean(-1), torch.zeros(5, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(plain.var(-1, unbiased=False), torch.ones(5, 3), atol=1e-3, rtol=0)


def test_global_batch_norm_matches_batchnorm1d_in_train_and_eval():
    g = torch.Generator().manual_seed(0)
    norm = GlobalBatchNorm((3, 4))
    ref = nn.BatchNorm1d(12)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(3, 4, generator=g) + 0.5)
        norm.bias.copy_(torch.randn(3, 4, generator=g))
        ref.weight.copy_(norm.weight.reshape(-1))
        ref.bias.copy_(norm.bias.reshape(-1))
    for step in range(4):
        x = torch.randn(10, 3, 4, generator=g) * (step + 1) + 5.0
        torch.testing.assert_close(norm(x).reshape(10, -1), ref(x.reshape(10, -1)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(norm.running_mean.reshape(-1), ref.running_mean)
    torch.testing.assert_close(norm.running_var.reshape(-1), ref.running_var)
    assert int(norm.num_batches_tracked) == int(ref.num_batches_tracked) == 4

    norm.eval()
    ref.eval()
    before = norm.running_mean.clone(), norm.running_var.clone()
    x = torch.randn(7, 3, 4, generator=g)
    torch.testing.assert_close(norm(x).reshape(7, -1), ref(x.reshape(7, -1)), atol=1e-5, rtol=1e-5)
    assert torch.equal(norm.running_mean, before[0]) and torch.equal(norm.running_var, before[1])
    assert int(norm.num_batches_tracked) == 4


def test_a_batch_of_fewer_than_two_samples_moves_no_running_statistic():
    norm = GlobalBatchNorm((4,))
    norm(torch.randn(1, 4))
    norm.observe(torch.zeros(0, 4))
    assert torch.equal(norm.running_mean, torch.zeros(4)) and torch.equal(norm.running_var, torch.ones(4))
    assert int(norm.num_batches_tracked) == 0


# ---- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(Arch))
def test_none_is_torchrecs_model_bit_for_bit(arch):
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from slipstream_rec.model.dlrm import embedding_bag_configs

    cfg = _cfg(FeatureNorm.none, arch)
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(cfg, FEATURES, ROWS), device=CPU)
    common = dict(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8],
                  over_arch_layer_sizes=[16, 1], dense_device=CPU)  # fmt: skip
    if arch is Arch.dlrm_dcn:
        plain = DLRM_DCN(**common, dcn_num_layers=2, dcn_low_rank_dim=4)
    else:
        plain = DLRM(**common)
    ours = _model(FeatureNorm.none, arch)
    assert type(ours.model.inter_arch) is type(plain.inter_arch)
    theirs = plain.state_dict()
    assert list(ours.model.state_dict()) == list(theirs)
    assert all(torch.equal(v, theirs[k]) for k, v in ours.model.state_dict().items())
    batch = _batch()
    assert torch.equal(ours(batch)[1][1], plain(batch.dense_features, batch.sparse_features).squeeze(-1))


@pytest.mark.parametrize("arch", list(Arch))
@pytest.mark.parametrize("norm", [FeatureNorm.layer, FeatureNorm.batch])
def test_layer_and_batch_wrap_the_interaction_and_keep_every_other_weight(arch, norm):
    plain, model = _model(FeatureNorm.none, arch), _model(norm, arch)
    inter = model.model.inter_arch
    assert isinstance(inter, NormalizedInteraction)
    assert type(inter.interaction) is type(plain.model.inter_arch)
    expected = PerFeatureLayerNorm if norm is FeatureNorm.layer else GlobalBatchNorm
    assert isinstance(inter.dense_norm, expected) and isinstance(inter.sparse_norm, expected)
    assert inter.dense_norm.weight.shape == (8,) and inter.sparse_norm.weight.shape == (len(FEATURES), 8)
    # The norms draw no random numbers: every TorchRec weight equals the none model's.
    ours = model.state_dict()
    for key, value in plain.state_dict().items():
        key = key.replace("inter_arch.", "inter_arch.interaction.")
        assert torch.equal(ours[key], value), key

    batch = _batch()
    loss, (_, logits, _, _) = model(batch)
    assert logits.shape == (12,) and torch.isfinite(logits).all()
    assert not torch.allclose(logits, plain(batch)[1][1])  # the normalization changes the output
    loss.backward()
    for name in ("dense_norm", "sparse_norm"):
        module = getattr(inter, name)
        assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0, name
        assert module.bias.grad is not None and module.bias.grad.abs().sum() > 0, name


def test_batch_norm_model_uses_running_statistics_in_eval_and_updates_them_only_in_train():
    model = _model(FeatureNorm.batch)
    inter = model.model.inter_arch
    batch = _batch()
    train_logits = model(batch)[1][1]
    after_one = _norm_buffers(model)
    assert int(inter.dense_norm.num_batches_tracked) == 1
    assert not torch.equal(inter.sparse_norm.running_mean, torch.zeros(len(FEATURES), 8))

    model.eval()
    eval_logits = model(batch)[1][1]
    assert torch.equal(model(batch)[1][1], eval_logits)  # no state moves in eval
    assert all(torch.equal(v, after_one[k]) for k, v in _norm_buffers(model).items())
    assert not torch.allclose(eval_logits, train_logits)  # batch statistics vs running statistics
    # One sample in eval is normalized by the running statistics, independently of its batch.
    torch.testing.assert_close(model(_slice_rows(batch, 3))[1][1], eval_logits[3:4])


def _slice_rows(batch: Batch, row: int) -> Batch:
    ids = torch.stack([batch.sparse_features[f].values()[row] for f in FEATURES]).unsqueeze(0)
    return Batch(dense_features=batch.dense_features[row : row + 1], sparse_features=make_kjt(FEATURES, ids),
                 labels=batch.labels[row : row + 1])  # fmt: skip


def test_observe_dense_moves_only_the_dense_running_statistics():
    model = _model(FeatureNorm.batch)
    model(_batch(seed=2))  # some history in every buffer
    params = {k: v.clone() for k, v in model.named_parameters()}
    buffers = _norm_buffers(model)
    extra = torch.randn(9, 13) * 2 - 1
    observe_dense(model, extra)

    norm = model.model.inter_arch.dense_norm
    out = model.model.dense_arch(extra).detach()
    m = norm.momentum
    old_mean = buffers["model.inter_arch.dense_norm.running_mean"]
    old_var = buffers["model.inter_arch.dense_norm.running_var"]
    torch.testing.assert_close(norm.running_mean, (1 - m) * old_mean + m * out.mean(0))
    torch.testing.assert_close(norm.running_var, (1 - m) * old_var + m * out.var(0))
    assert int(norm.num_batches_tracked) == 2
    for key, value in _norm_buffers(model).items():
        if "sparse_norm" in key:
            assert torch.equal(value, buffers[key]), key
    assert all(torch.equal(v, params[k]) and v.grad is None for k, v in model.named_parameters())


@pytest.mark.parametrize("norm", [FeatureNorm.none, FeatureNorm.layer])
def test_observe_dense_needs_batch_norm(norm):
    with pytest.raises(ValueError, match=r"model\.feature_norm=batch"):
        observe_dense(_model(norm), torch.randn(4, 13))


@pytest.mark.parametrize("norm", [FeatureNorm.layer, FeatureNorm.batch])
def test_state_dict_round_trip_gives_identical_outputs(tmp_path, norm):
    model = _model(norm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for seed in range(3):  # move parameters and running statistics off their initial values
        optimizer.zero_grad()
        model(_batch(seed=seed))[0].backward()
        optimizer.step()
    model.eval()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    keys = [k for k in model.state_dict() if "_norm." in k]
    assert len(keys) == (4 if norm is FeatureNorm.layer else 10), keys

    other = _model(norm, seed=5)
    other.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    other.eval()
    batch = _batch(seed=9)
    assert torch.equal(other(batch)[1][1], model(batch)[1][1])


# ---- configuration --------------------------------------------------------------------------


def test_config_selects_the_norm_and_a_wrong_value_names_the_key():
    from slipstream_rec.config import ConfigError, load_config

    assert load_config([]).model.feature_norm is FeatureNorm.none
    assert load_config(["model.feature_norm=layer"]).model.feature_norm is FeatureNorm.layer
    assert load_config(["model=dlrm_dcn", "model.feature_norm=batch"]).model.feature_norm is FeatureNorm.batch
    with pytest.raises(ConfigError) as e:
        load_config(["model.feature_norm=group"])
    message = str(e.value)
    assert "feature_norm" in message and "group" in message and "batch" in message


# ---- 2 ranks: sharded step against the unsharded reference, then a DCP checkpoint ------------


def sharded_norm_worker(env, norm: str, arch: str, ckpt_dir: str):
    from slipstream_rec.checkpoint.config import CheckpointConfig
    from slipstream_rec.checkpoint.manager import Checkpointer
    from slipstream_rec.model.dlrm import embedding_bag_configs
    from slipstream_rec.optim import (
        EmbeddingOptimConfig,
        EmbeddingOptimizerKind,
        OptimConfig,
        build_optimizer,
        fuse_embedding_optimizer,
    )
    from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import shard_model
    from slipstream_rec.sharding.state import load_full_state_dict

    cfg = _cfg(FeatureNorm(norm), Arch(arch))
    tables = embedding_bag_configs(cfg, FEATURES, ROWS)
    torch.manual_seed(0)  # same reference on every rank
    ref = build_model(cfg, 13, FEATURES, ROWS, CPU, embedding_device=CPU)
    for module in ref.modules():
        if isinstance(module, GlobalBatchNorm):
            module.sync = False  # the reference sees the global batch in one forward, unsynced
    with torch.no_grad():  # norms off the identity, so that their affine is exercised
        for name, param in ref.named_parameters():
            if "_norm." in name:
                param.add_(torch.rand(param.shape) * 0.5)
    full = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    optim_cfg = OptimConfig(embedding=EmbeddingOptimConfig(type=EmbeddingOptimizerKind.sgd, lr=LR))

    def sharded(seed: int):
        torch.manual_seed(seed + env.rank)  # every weight must come from `full` or a checkpoint
        model = build_model(cfg, 13, FEATURES, ROWS, CPU)
        fuse_embedding_optimizer(model, optim_cfg.embedding)
        # all ranks: planning and DMP are collectives
        dmp = shard_model(model, ShardingConfig(type=ShardingKind.row_wise), tables, CPU, LOCAL_BATCH)
        return dmp, build_optimizer(dmp, optim_cfg)[0]

    dmp, optimizer = sharded(100)
    load_full_state_dict(dmp, full)
    lo, hi = env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH
    loss, (_, logits, _, _) = dmp(_slice_batch(lo, hi))  # all ranks: norms all-reduce here
    loss.backward()  # all ranks
    optimizer.step()

    # Reference: one forward of the global batch (batch statistics over all of it); the loss is
    # the sum of each rank's mean loss, whose gradient DDP averages (hence / WORLD below).
    global_batch = _slice_batch(0, WORLD * LOCAL_BATCH)
    ref_logits = ref.model(global_batch.dense_features, global_batch.sparse_features).squeeze(-1)
    bce = nn.functional.binary_cross_entropy_with_logits(ref_logits, global_batch.labels, reduction="none")
    sum(bce[r * LOCAL_BATCH : (r + 1) * LOCAL_BATCH].mean() for r in range(WORLD)).backward()

    torch.testing.assert_close(logits, ref_logits[lo:hi].detach(), rtol=1e-5, atol=1e-5)
    ref_params = dict(ref.named_parameters())
    checked = []
    for name, param in dmp.named_parameters():
        if "embedding_bags" in name:
            continue
        ref_name = next(n for n in ref_params if name.endswith(n))
        torch.testing.assert_close(param.grad, ref_params[ref_name].grad / WORLD, rtol=1e-4, atol=1e-6)
        checked.append(ref_name)
    assert sum("_norm." in n for n in checked) == 4, checked  # the norms' gains and biases
    # Running statistics: one update from the global batch, as the reference's one forward.
    running = {k: v for k, v in dmp.state_dict().items() if "running" in k or "num_batches" in k}
    if norm == "batch":
        assert len(running) == 6
        ref_state = ref.state_dict()
        for key, value in running.items():
            assert not torch.equal(value, full[key]), key
            torch.testing.assert_close(value, ref_state[key], rtol=1e-5, atol=1e-6)
    else:
        assert not running

    # DCP checkpoint through the project's Checkpointer; a differently initialized model loads it.
    meta = {"test": "feature_norm"}
    saver = Checkpointer(CheckpointConfig(), ckpt_dir, env, dmp, optimizer, meta)
    saver.save(1, {})  # all ranks
    dmp2, optimizer2 = sharded(200)
    loader = Checkpointer(CheckpointConfig(), ckpt_dir, env, dmp2, optimizer2, meta)
    loader.load(loader.find("auto"))  # all ranks
    dmp.eval()
    dmp2.eval()
    batch = _slice_batch(lo, hi)
    eval_logits = dmp(batch)[1][1]
    assert torch.equal(dmp2(batch)[1][1], eval_logits)
    loaded = {k: v for k, v in dmp2.state_dict().items() if "running" in k or "num_batches" in k}
    assert set(loaded) == set(running) and all(torch.equal(loaded[k], running[k]) for k in running)
    # Plain lists: tensors would go back through shared memory that dies with this process.
    return {k: v.tolist() for k, v in running.items()}, eval_logits.tolist()


@pytest.mark.parametrize("norm, arch", [("layer", "dlrm"), ("batch", "dlrm"), ("batch", "dlrm_dcn")])
def test_two_rank_sharded_step_matches_unsharded_reference_and_checkpoints(tmp_path, norm, arch):
    results = run_workers(sharded_norm_worker, WORLD, norm=norm, arch=arch, ckpt_dir=str(tmp_path / "ckpt"))
    (running0, _), (running1, _) = results
    # DDP does not broadcast buffers under DMP: the global-batch statistics keep them identical.
    assert set(running0) == set(running1)
    assert running0 == running1  # exact float equality, element by element
