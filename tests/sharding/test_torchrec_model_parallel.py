"""TorchRec's own model-parallel equivalence suite, run on our sharder.

``torchrec.distributed.test_utils.test_model_parallel`` shards TorchRec's ``TestSparseNN`` (four
unweighted and two weighted tables, shared features, SUM and MEAN pooling) on 2 ranks, trains it
a few steps and checks the sharded model's predictions against the unsharded model's. Its tests
build their sharder with ``create_test_sharder``; here that returns ours
(``SlipstreamEmbeddingBagCollectionSharder``, restricted to one sharding type and kernel like
TorchRec's ``TestEBCSharder``), so every EBC the suite shards is a ``SlipstreamShardedEBC``.

On gloo TorchRec itself skips its row-wise and table-row-wise tests ("Gloo reduce_scatter_base
fallback not supported with async_op=True"); our own 2-process tests cover those sharding types
(tests/slipstream/, tests/sharding/test_plan.py).

The wheel does not ship ``torchrec.distributed.tests``, from which the suite's
``test_sharding`` module imports an EmbeddingCollection sharder for its sequence models; those
are not run here, so a stand-in that refuses to be built takes its place.

The whole hypothesis sweep is marked slow; the default suite runs one example of each test.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Dict, List, Optional

import pytest
import torch

pytest.importorskip("hypothesis")


def _stand_in_for_the_missing_module() -> None:
    name = "torchrec.distributed.tests.test_sequence_model"
    if name in sys.modules:
        return
    from torchrec.distributed.embedding import EmbeddingCollectionSharder

    class TestEmbeddingCollectionSharder(EmbeddingCollectionSharder):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("the sequence-model tests are not in the torchrec wheel and not run here")

    package = types.ModuleType("torchrec.distributed.tests")
    package.__path__ = []  # a package, for the import system
    module = types.ModuleType(name)
    module.TestEmbeddingCollectionSharder = TestEmbeddingCollectionSharder
    sys.modules.setdefault("torchrec.distributed.tests", package)
    sys.modules[name] = module


_stand_in_for_the_missing_module()

from torchrec.distributed.embedding_types import EmbeddingComputeKernel  # noqa: E402
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry  # noqa: E402
from torchrec.distributed.test_utils import test_model_parallel as suite  # noqa: E402
from torchrec.distributed.test_utils.test_sharding import SharderType  # noqa: E402
from torchrec.types import DataType  # noqa: E402

from slipstream_rec.sharding.sharder import SlipstreamEmbeddingBagCollectionSharder  # noqa: E402


class OneTypeSlipstreamSharder(SlipstreamEmbeddingBagCollectionSharder):
    """Ours, offering one sharding type and one kernel (what TorchRec's ``TestEBCSharder`` does
    to its stock sharder), so each test shards the way it names."""

    def __init__(self, sharding_type: str, kernel_type: str, fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:  # fmt: skip
        self._sharding_type, self._kernel_type = sharding_type, kernel_type
        super().__init__(fused_params or {}, qcomm_codecs_registry)

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return [self._sharding_type]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        return [self._kernel_type]

    def shard(self, *args: Any, **kwargs: Any) -> Any:
        module = super().shard(*args, **kwargs)
        SHARDED.append(type(module).__name__)
        return module


SHARDED: List[str] = []  # the sharded modules our sharder built, in this process


def create_our_sharder(sharder_type: str, sharding_type: str, kernel_type: str,
                       fused_params: Optional[Dict[str, Any]] = None, qcomms_config: Optional[QCommsConfig] = None,
                       device: Optional[torch.device] = None) -> OneTypeSlipstreamSharder:  # fmt: skip
    """``create_test_sharder``'s contract for an EBC, with our sharder (its learning rate too)."""
    assert sharder_type == SharderType.EMBEDDING_BAG_COLLECTION.value, f"{sharder_type}: only EBCs are ours"
    registry = get_qcomm_codecs_registry(qcomms_config, device=device) if qcomms_config is not None else {}
    fused = dict(fused_params or {})
    fused.setdefault("learning_rate", 0.1)
    return OneTypeSlipstreamSharder(sharding_type, kernel_type, fused, registry)


def run_one_rank(**kwargs: Any) -> None:
    """TorchRec's per-rank test body, reached through this module so that each spawned rank
    imports the stand-in above before TorchRec's ``test_sharding``."""
    from torchrec.distributed.test_utils.test_sharding import sharding_single_rank_test

    SHARDED.clear()
    sharding_single_rank_test(**kwargs)
    # TestSparseNN's two EBCs (unweighted and weighted) were sharded by ours
    assert SHARDED.count("SlipstreamShardedEBC") >= 2, SHARDED


class OurSharderOnGloo(suite._ModelParallelBase):
    """TorchRec's model-parallel tests, gloo backend, every EBC sharded by ours."""

    backend = "gloo"
    __test__ = False  # collected through its subclass (the sweep) and the examples below

    def setUp(self) -> None:
        super().setUp()
        original = suite.create_test_sharder
        suite.create_test_sharder = create_our_sharder
        self.addCleanup(setattr, suite, "create_test_sharder", original)

    def _test_sharding(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("test_callable", run_one_rank)
        super()._test_sharding(*args, **kwargs)


@pytest.mark.slow
class TestTorchRecsSweepOnOurSharder(OurSharderOnGloo):
    """Every example hypothesis draws for each of TorchRec's tests (its own settings)."""

    __test__ = True


EBC = SharderType.EMBEDDING_BAG_COLLECTION.value
FUSED = EmbeddingComputeKernel.FUSED.value
QCOMMS = QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)


@pytest.mark.parametrize(
    "test, example",
    [
        ("test_sharding_tw", dict(sharder_type=EBC, kernel_type=FUSED, qcomms_config=QCOMMS,
                                  apply_optimizer_in_backward_config=None, variable_batch_size=False,
                                  data_type=DataType.FP32)),
        ("test_sharding_tw", dict(sharder_type=EBC, kernel_type=FUSED, qcomms_config=QCOMMS,
                                  apply_optimizer_in_backward_config=None, variable_batch_size=True,
                                  data_type=DataType.FP32)),
        ("test_sharding_cw", dict(sharder_type=EBC, kernel_type=FUSED, qcomms_config=None,
                                  apply_optimizer_in_backward_config=None, variable_batch_size=False,
                                  data_type=DataType.FP32, allow_zero_batch_size=False)),
        ("test_sharding_dp", dict(sharder_type=EBC, kernel_type=EmbeddingComputeKernel.DENSE.value,
                                  apply_optimizer_in_backward_config=None, data_type=DataType.FP32)),
    ],
    ids=["table_wise_qcomms", "table_wise_qcomms_variable_batch", "column_wise", "data_parallel"],
)
def test_one_example_of_torchrecs_test_on_our_sharder(test, example):
    case = OurSharderOnGloo(test)
    OurSharderOnGloo.setUpClass()
    case.setUp()
    try:
        getattr(OurSharderOnGloo, test).hypothesis.inner_test(case, **example)
    finally:
        case.doCleanups()
