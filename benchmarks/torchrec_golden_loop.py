"""A plain TorchRec training loop, written the way TorchRec's golden training example is
(torchrec/examples/golden_training/train_dlrm.py): DLRM + DLRMTrain, the embedding optimizer
applied in backward, DMP with TorchRec's default sharders, a KeyedOptimizerWrapper for the dense
parameters, and TrainPipelineSparseDist stepping over TorchRec's own binary Criteo reader.

Run under torchrun; prints one JSON line with the measured throughput (rank 0), and with
``--test`` the test split's AUC, log loss and calibration after training (the model in eval
mode, TorchRec's reader over test_*.npy, the metrics gathered from every rank):

    torchrun --standalone --nproc_per_node 2 benchmarks/torchrec_golden_loop.py \
        --data DATASET_DIR --steps 300 --batch-size 2048 --sharding table_wise
    torchrun --standalone --nproc_per_node 2 benchmarks/torchrec_golden_loop.py \
        --data DATASET_DIR --steps 0 --sharding auto --seed 1 --test   # one epoch, then test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torchrec import EmbeddingBagCollection
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, InMemoryBinaryCriteoIterDataPipe
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

warnings.filterwarnings("ignore")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="dataset dir with train_{dense,sparse,labels}.npy and meta.json")
    p.add_argument("--steps", type=int, default=300, help="training steps (0: one whole epoch)")
    p.add_argument("--seed", type=int, default=0, help="rank r seeds its parameters with seed * 1000 + r")
    p.add_argument("--test", action="store_true", help="evaluate on the test split after training")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--sharding", default="table_wise", help="a sharding type, or auto")
    p.add_argument("--embedding-lr", type=float, default=0.05)
    p.add_argument("--dense-lr", type=float, default=0.01)
    # the model's sizes (defaults: the project's default model, dlrm_criteo_kaggle)
    p.add_argument("--dense-arch", default="512,256,64,16", help="bottom MLP layer sizes")
    p.add_argument("--over-arch", default="512,256,1", help="top MLP layer sizes")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--qcomms", default="", help="FWD:BWD precisions of TorchRec's quantized comms, e.g. "
                   "fp16:bf16 (its golden example's choice); empty: off")
    p.add_argument("--sync-audit", default=None, metavar="PREFIX",
                   help="count each step's device-synchronizing ops (slipstream_rec/training/sync_audit.py) "
                        "into PREFIX_rank<r>.json")
    args = p.parse_args()
    sizes = lambda text: [int(x) for x in text.split(",")]  # noqa: E731

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    meta = json.load(open(os.path.join(args.data, "meta.json")))
    names, rows = meta["sparse_feature_names"], meta["num_embeddings_per_feature"]

    torch.manual_seed(args.seed * 1000 + rank)
    # TorchRec's reader names the 26 sparse columns cat_0..cat_25 (DEFAULT_CAT_NAMES) whatever
    # the dataset calls them: column i feeds table i.
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=args.embedding_dim, num_embeddings=n,
                           feature_names=[DEFAULT_CAT_NAMES[i]])
        for i, (f, n) in enumerate(zip(names, rows))
    ]
    model = DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=13,
            dense_arch_layer_sizes=sizes(args.dense_arch),
            over_arch_layer_sizes=sizes(args.over_arch),
            dense_device=device,
        )
    )
    apply_optimizer_in_backward(
        RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": args.embedding_lr}
    )
    constraints = (
        None
        if args.sharding == "auto"
        else {t.name: ParameterConstraints(sharding_types=[args.sharding]) for t in tables}
    )
    # As TorchRec's golden example: the codec registry goes to the sharder, and the same sharder
    # to the planner (it costs the comms with the codec's element size) and to DMP.
    sharders = None
    if args.qcomms:
        fwd, bwd = args.qcomms.split(":")
        registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=CommType(fwd), backward_precision=CommType(bwd)), device=device
        )
        sharders = [EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)]
    planner = EmbeddingShardingPlanner(
        # local_world_size: on several nodes (torchrun --nnodes) the planner sees them, as the
        # golden example's get_local_size() does; on one node it equals the world size
        topology=Topology(
            world_size=world, local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)), compute_device="cpu"
        ),
        batch_size=args.batch_size,
        constraints=constraints,
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)
    optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=args.dense_lr),
    )
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device)

    split = lambda kind: [os.path.join(args.data, f"train_{kind}.npy")]  # noqa: E731
    datapipe = InMemoryBinaryCriteoIterDataPipe(
        "train", split("dense"), split("sparse"), split("labels"),
        batch_size=args.batch_size, rank=rank, world_size=world, drop_last=True,
    )
    loader = DataLoader(datapipe, batch_size=None, pin_memory=False, num_workers=0)
    it = iter(loader)
    audit = None
    if args.sync_audit:
        from slipstream_rec.training.sync_audit import SyncAudit

        audit = SyncAudit()
        audit.taint_module(dmp)
        audit.attach(pipeline)
        it = audit.data_side(it)

    steps = 0
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    with audit if audit is not None else contextlib.nullcontext():
        while args.steps == 0 or steps < args.steps:
            try:
                pipeline.progress(it)
            except StopIteration:
                break
            steps += 1
            if audit is not None:
                audit.end_step(steps, [])
    seconds = time.perf_counter() - start
    # every rank's process CPU seconds in the loop, summed (all ranks): as summary.json's
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.all_reduce(cpu)
    if audit is not None:
        audit.write(Path(f"{args.sync_audit}_rank{rank}.json"))
    result = {}
    if args.test:
        # the pipeline rewired the sparse modules' forward for pipelining: detach restores it
        result = evaluate_test(pipeline.detach(), args.data, args.batch_size, rank, world)  # all ranks
    if rank == 0:
        sharding = sorted({ps.sharding_type for mp in plan.plan.values() for ps in mp.values()})
        samples = steps * args.batch_size * world
        print(json.dumps({
            "runner": "torchrec_golden", "steps": steps, "samples": samples,
            "train_seconds": seconds, "train_cpu_seconds": float(cpu.item()),
            "samples_per_second": samples / seconds, "sharding": sharding,
            "qcomms": args.qcomms or None,
            **result,
        }), flush=True)
    dist.destroy_process_group()


@torch.no_grad()
def evaluate_test(dmp: torch.nn.Module, data: str, batch_size: int, rank: int, world: int) -> dict:
    """Test AUC, log loss, observed and mean predicted CTR over every rank's full batches (the
    reader drops each rank's last partial batch). Collective: all ranks enter."""
    from slipstream_rec.training.metrics import evaluate_predictions

    split = lambda kind: [os.path.join(data, f"test_{kind}.npy")]  # noqa: E731
    datapipe = InMemoryBinaryCriteoIterDataPipe(
        "train", split("dense"), split("sparse"), split("labels"),  # "train": the whole file, per rank
        batch_size=batch_size, rank=rank, world_size=world, drop_last=True,
    )
    dmp.eval()
    logits, labels = [], []
    for batch in DataLoader(datapipe, batch_size=None, pin_memory=False, num_workers=0):
        _, (_, batch_logits, batch_labels) = dmp(batch)
        logits.append(batch_logits.float().view(-1))
        labels.append(batch_labels.float().view(-1))
    metrics = evaluate_predictions(torch.cat(logits), torch.cat(labels))  # all ranks: gathers
    return {
        "test_auc": metrics["auc"], "test_logloss": metrics["logloss"], "test_ctr": metrics["ctr"],
        "test_predicted_ctr": metrics["predicted_ctr"], "test_samples": metrics["num_samples"],
    }


if __name__ == "__main__":
    main()
