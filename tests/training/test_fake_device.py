"""The per-step path with the model's tensors on a device that is not the host (``meta``).

No GPU runs here, so the parts of a training step are run with everything the model owns on
``meta``: a tensor there has a shape and a device but no data. Each of the failures a first GPU
run would hit then shows up on CPU: pinning a non-host tensor (the pipeline pins every batch on
CUDA), mixing host and device tensors in one op, and reading a device value back (``.item()``,
``unique``, boolean masks, ``nonzero``: meta has no values to read, so these raise). The data
side runs on the host as it does in training; the model side (forward, backward, the served
gradients, the lookup counting, the rows-updated measure, the downsampling guard's sums) on meta.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slipstream_rec.data.types import Batch
from slipstream_rec.model.config import ModelConfig
from slipstream_rec.model.dlrm import build_model
from slipstream_rec.training.downsampling import NegativeDownsampler
from slipstream_rec.slipstream.lockstep import lockstep
from slipstream_rec.slipstream.serve.server import StaleServer
from slipstream_rec.sharding.sharded import ShardUnit, SlipstreamShardedEBC
from tests.slipstream._serving_case import DIM, FEATURES, REPLICA, ROWS, SAMPLES, _batch

META = torch.device("meta")


@pytest.fixture
def strict_pinning(monkeypatch):
    """``Tensor.pin_memory`` as CUDA has it: only dense host tensors can be pinned (the CPU
    build cannot pin at all, so the real call is replaced by this check)."""

    def pin(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{t.device}' tensor: only dense CPU tensors can be pinned")
        return t

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)


def _server_on(device: torch.device) -> StaleServer:
    """A rank's serve state whose shards live on ``device``, with the replica of REPLICA."""
    units = [
        ShardUnit(f"t_{f}", f, "table_wise", 0, i, 0, 0, n, DIM, False, weights=torch.zeros(n, DIM, device=device))
        for i, (f, n) in enumerate(zip(FEATURES, ROWS))
    ]
    from slipstream_rec.slipstream.rows import RowIndex

    index = RowIndex(FEATURES, ROWS)
    tracker = SimpleNamespace(units=units, modules=[SimpleNamespace(use_variable_batch=lambda: None)], counting=True,
                              feature_index={f: i for i, f in enumerate(FEATURES)})  # fmt: skip
    server = StaleServer(tracker, index)  # no process group: the dim agreement is local
    keys = torch.cat([index.to_flat(i, torch.tensor(REPLICA[f])) for i, f in enumerate(FEATURES)])
    g = torch.Generator().manual_seed(1)
    # the rows as a rebuild would have copied them (a checkpoint's state takes the same path)
    server.replica.load_state_dict({
        "keys": keys.sort().values, "values": torch.randn(keys.numel(), DIM, generator=g),
        "rebuilds": 1, "sync_bytes": 0, "joined": keys.numel(), "left": 0,
    })  # fmt: skip
    return server


def _served_batch(server: StaleServer) -> Batch:
    """One batch through the data side as training runs it: annotate, agree, split."""
    (batch,) = list(lockstep(iter([_batch(SAMPLES)]), plan=server.plan))
    return batch


def test_a_served_batch_leaves_the_data_side_with_host_tensors_only_and_pins(strict_pinning):
    server = _server_on(META)
    batch = _served_batch(server)
    assert batch.served is not None and batch.served.pooled.shape[1] == len(SAMPLES)  # every bag's part
    pinned = batch.pin_memory()  # what Trainer._timed does on CUDA, every batch
    moved = pinned.to(META, non_blocking=True)  # the pipeline's copy to the device
    assert moved.served.pooled.is_meta and moved.sparse_features.inverse_indices()[1].is_meta
    assert moved.served.rows.bags.is_meta and moved.served.rows.offsets.is_meta
    # what stays on the host when the batch moves: the push's keys and the counts
    assert moved.served.rows.keys.device.type == "cpu" and moved.served.rows.counts.device.type == "cpu"


def test_forward_backward_and_served_gradients_on_the_device_read_nothing_back(strict_pinning):
    server = _server_on(META)
    batch = _served_batch(server).pin_memory().to(META)
    cfg = ModelConfig(embedding_dim=DIM, dense_arch_layer_sizes=[4, DIM], over_arch_layer_sizes=[4, 1])
    task = build_model(cfg, 2, FEATURES, ROWS, dense_device=META, embedding_device=META).train()
    loss, (_, logits, labels, _) = task(batch)  # the lookups of the sharded part, the served part
    loss.backward()
    server.after_backward(task, sync_step=False)  # the served rows' gradients summed, counted
    assert len(server.grads._parts) == 1 and server.grads._parts[0][1].is_meta
    keys, counts = server.take_counts()  # host: merged where they are
    assert keys.device.type == "cpu" and int(counts.sum()) == 16  # every lookup of a replica row
    guard = NegativeDownsampler(0.5, seed=0)
    guard.observe(logits, labels)  # held-out sums stay where the logits are
    assert guard._window.is_meta


def test_lookup_counting_and_the_rows_updated_measure_read_nothing_back():
    unit = ShardUnit("t_a", "a", "table_wise", 0, 0, 0, 0, 6, DIM, False, weights=torch.zeros(6, DIM, device=META))
    unit.add_counts(torch.tensor([0, 3, 3, 5], device=META))  # a counted step: no unique here
    kjt = _batch(SAMPLES).sparse_features.to(META)
    fake = SimpleNamespace(units=[unit], _rows_sum=0, _rows_measured=0)
    SlipstreamShardedEBC._measure_rows_updated(fake, [kjt])  # type: ignore[arg-type]
    assert fake._rows_measured == 1 and fake._rows_sum.is_meta


def test_batches_carry_their_lengths_per_key_so_torchrec_reads_nothing_back(tmp_path):
    # TorchRec's input dist asks a KJT for its lengths per key; one moved to the device without
    # them would sum its lengths there and read the sums back. On meta that read raises.
    from slipstream_rec.data.loader import NpyBatchLoader
    from tests._fixtures import write_dataset

    split = _served_batch(_server_on(META))  # the split's KJT: the sharded lookups, packed
    (loaded, *_) = list(NpyBatchLoader(write_dataset(tmp_path / "d", {"train": 64}), "train", batch_size=16, train=True))
    from slipstream_rec.data.batch_ops import select_kjt

    # the data side's row selections, of bags of several lengths
    sliced = select_kjt(_batch(SAMPLES).sparse_features, torch.tensor([4, 1, 2]))
    for kjt in (split.sparse_features, loaded.sparse_features, sliced):
        per_key = [int(part.sum()) for part in kjt.lengths().split(kjt.stride_per_key())]
        moved = kjt.to(META)
        assert moved.length_per_key() == per_key
        assert moved.offset_per_key() == [sum(per_key[:i]) for i in range(len(per_key) + 1)]
