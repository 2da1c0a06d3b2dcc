"""Counting, per training step, the ops that would make the host wait for a CUDA device.

On a GPU the host queues kernels and runs ahead; an op that needs a value the device computed
(``.item()``, ``int()``/``float()``/``bool()`` of a tensor, ``.tolist()``, ``torch.equal``) or
whose output size depends on device data (``nonzero``, ``unique``, ``masked_select``,
boolean-mask indexing, ``repeat_interleave`` with tensor repeats and no ``output_size``,
``bincount``) blocks the host until the device queue drains, and the pipeline's overlap is lost.
On CPU nothing waits, so ``trainer.sync_audit=true`` counts those ops instead, with a
``TorchDispatchMode`` over every training step (evaluations and checkpoints excluded).

Each op counted is classified by where its tensors would live on a GPU, by taint: the model's
parameters and buffers (FBGEMM's weights and optimizer state included) and every batch the
pipeline copies to the device are *device* tensors, and so is every output of an op with a
device tensor among its inputs (and every argument such an op writes into: in-place ops,
``out=``, a collective's output buffers). An op with no device tensor among its inputs reads host memory
only: ``data`` inside the data side (while the pipeline pulls the next batch: loading,
classifying, splitting, the lock-step flag), ``host`` elsewhere in the step (a flag a gloo
collective returned, host-side bookkeeping). The others are device syncs, attributed to the
innermost library frame on the stack: ``torchrec`` (TorchRec's or FBGEMM's own code), ``ours``
(slipstream_rec) or ``other``. Factory functions (``torch.zeros(...,
device=...)``) are not tainted: the fake-device test (tests/training/test_fake_device.py) covers
the tensors a step creates. A copy of a device tensor to the host with ``.cpu()`` is counted
(``to_host``) and gives a host tensor (on CPU the call would return the tensor itself);
``.to(device)`` is not (on CPU the host and the training device are one: our code moves values
to the host with ``.cpu()``).

On a GPU the audit also turns on ``torch.cuda.set_sync_debug_mode("warn")`` and counts, per step,
the warnings CUDA itself raises for each synchronizing call (``cuda_syncs``): what really waited.

Results: ``<run_dir>/sync_audit_rank<r>.json``, per step its kinds (what else ran in it: a counted
step, a snapshot, a sync, a log line...) and its counts per class (docs/scale.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["SyncAudit", "CLASSES", "steady_means"]

CLASSES = ("data", "host", "torchrec", "ours", "other")

_aten = torch.ops.aten
# Ops that read a device value back or size their output from device data (each a host wait).
_ALWAYS = {
    _aten._local_scalar_dense.default,
    _aten.nonzero.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.masked_select.default,
    _aten.equal.default,
    _aten.bincount.default,
    _aten.is_nonzero.default,
}
_PACKAGE = os.sep + "slipstream_rec" + os.sep
_TORCHREC = (os.sep + "torchrec" + os.sep, os.sep + "fbgemm_gpu" + os.sep)
# TorchRec's data structures (KeyedJaggedTensor...): a sync inside one of their methods belongs
# to whoever called the method (our code asking a KJT for its lengths per key is our sync).
_TORCHREC_DATA = os.sep + os.path.join("torchrec", "sparse") + os.sep
_SELF = os.path.abspath(__file__)


def _is_sync(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in _ALWAYS:
        return True
    if func is _aten.index.Tensor:  # t[mask]: the output size is the mask's count
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or []))
    if func in (_aten.repeat_interleave.Tensor, _aten.repeat_interleave.self_Tensor):
        return kwargs.get("output_size") is None and (len(args) < 4 or args[-1] is None)
    return False


_TORCH = os.path.dirname(torch.__file__) + os.sep


def _where() -> str:
    """file:line of the innermost frame outside torch and this module (what asked for the op)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _SELF and not name.startswith(_TORCH):
            parts = name.split(os.sep)
            return f"{'/'.join(parts[-2:])}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _written(func: Any, args: tuple, kwargs: dict) -> List[torch.Tensor]:
    """The tensors ``func`` writes into (its schema's mutable arguments)."""
    out: List[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
        out += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return out


def _library_frame() -> str:
    """The class of the innermost frame that is TorchRec's/FBGEMM's or ours (torch's skipped;
    TorchRec's data structures count for their caller)."""
    frame = sys._getframe(1)
    in_data = False
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _SELF:
            if _TORCHREC_DATA in name:
                in_data = True
            elif any(mark in name for mark in _TORCHREC):
                return "torchrec"
            elif _PACKAGE in name:
                return "ours"
        frame = frame.f_back
    return "torchrec" if in_data else "other"


class _Mode(TorchDispatchMode):
    def __init__(self, audit: "SyncAudit") -> None:
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        audit = self.audit
        if not audit.active:
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        tainted = any(audit.is_device(t) for t in inputs)
        if tainted:  # the outputs, and the arguments an op writes into (out=, collectives)
            audit.taint(_written(func, args, kwargs))
            audit.taint(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        if _is_sync(func, args, kwargs):
            audit.count(tainted, str(func.overloadpacket.__name__))
        return out


class SyncAudit:
    """Counts the device-synchronizing ops of each training step (see the module docstring).

    ``with audit:`` turns the counter on; ``paused()`` leaves a stretch out (evaluation,
    checkpoint); ``end_step(step, kinds)`` closes the running step's counts.
    """

    def __init__(self, device_tensors: Iterable[torch.Tensor] = (), cuda: bool = False) -> None:
        # cuda: also count CUDA's own sync warnings (set_sync_debug_mode), on a GPU run
        self.cuda = cuda
        self._warnings: Optional[List[Any]] = None
        self._catcher: Any = None
        # keyed by identity (a WeakSet would compare tensors with ==, elementwise)
        self._device = WeakTensorKeyDictionary()
        self._storages: set = set()  # storage addresses of the model's own tensors
        self._held: List[torch.Tensor] = []
        self.taint(device_tensors)
        self.active = False
        self.in_data = False  # inside the data side (``data_side``)
        self._counts: Counter = Counter()
        self._ops: Counter = Counter()
        self.steps: List[Dict[str, Any]] = []
        self._mode: Optional[_Mode] = None
        self._tolist: Any = None
        self._cpu: Any = None

    # ---- taint ------------------------------------------------------------------------------
    def taint(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self._device[t] = True

    def is_device(self, t: torch.Tensor) -> bool:
        if t in self._device or (t._base is not None and t._base in self._device):
            return True
        return t.numel() > 0 and _storage(t) in self._storages

    def taint_module(self, module: torch.nn.Module) -> None:
        """Every parameter and buffer of ``module`` and its submodules: what lives on the
        training device (read from each module's own registry: TorchRec's sharded modules
        present their parameters differently, FBGEMM's weights and optimizer state included)."""
        for m in _all_modules(module):
            for t in [*m._parameters.values(), *m._buffers.values()]:
                if t is not None:
                    self.taint([t])
                    # views of it made outside any op (FBGEMM's split_embedding_weights); an
                    # empty tensor has no storage to tell it by
                    if t.numel():
                        self._storages.add(_storage(t))
                        # held, so that the address is never reused for another tensor while
                        # the audit runs (a module may replace a buffer)
                        self._held.append(t)

    def taint_batch(self, batch: Any) -> None:
        """A batch as the pipeline copied it to the device: every tensor its ``to()`` moves (a
        copy to ``meta`` shows which: the fields a batch keeps on the host stay host tensors)."""
        here = tree_flatten(_tensors_of(batch))[0]
        there = tree_flatten(_tensors_of(batch.to(torch.device("meta"))))[0]
        assert len(here) == len(there), "a batch's to() keeps its structure"
        self.taint(t for t, m in zip(here, there) if isinstance(t, torch.Tensor) and m.is_meta)

    @classmethod
    def for_run(cls, model: Any, pipeline: Any, device: torch.device) -> "SyncAudit":
        """trainer.sync_audit: an audit of ``model`` trained by ``pipeline`` on ``device``."""
        audit = cls(cuda=device.type == "cuda")
        audit.taint_module(model)
        audit.attach(pipeline)
        return audit

    def attach(self, pipeline: Any) -> None:
        """Taint each batch TorchRec's pipeline copies to the device (its copy_batch_to_gpu)."""
        copy = pipeline.copy_batch_to_gpu

        def copy_and_taint(*args: Any, **kwargs: Any) -> Any:
            batch, context = copy(*args, **kwargs)
            if batch is not None:
                self.taint_batch(batch)
            return batch, context

        pipeline.copy_batch_to_gpu = copy_and_taint

    # ---- counting ---------------------------------------------------------------------------
    def data_side(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` with every ``next`` counted as the data side."""
        while True:
            self.in_data = True
            try:
                batch = next(batches, None)
            finally:
                self.in_data = False
            if batch is None:
                return
            yield batch

    def count(self, tainted: bool, op: str) -> None:
        cls = _library_frame() if tainted else "data" if self.in_data else "host"
        self._counts[cls] += 1
        self._ops[f"{cls}:{op}@{_where()}"] += 1

    def __enter__(self) -> "SyncAudit":
        self._mode = _Mode(self)
        self._mode.__enter__()
        original = self._tolist = torch.Tensor.tolist
        audit = self

        def tolist(t: torch.Tensor) -> Any:  # not an aten op: counted here
            if audit.active:
                audit.count(audit.is_device(t), "tolist")
            return original(t)

        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
        self._cpu = torch.Tensor.cpu

        def to_host(t: torch.Tensor, out: torch.Tensor, op: str) -> torch.Tensor:
            # A copy of a device tensor to the host waits for the device (on CPU the call
            # returns the same tensor: cloned here so that the host copy is a host tensor).
            if not (audit.active and out.device.type == "cpu" and audit.is_device(t)):
                return out
            audit.count(True, op)
            with audit.paused():
                return out.clone()

        cpu = self._cpu
        torch.Tensor.cpu = lambda t, *a, **k: to_host(t, cpu(t, *a, **k), "to_host")  # type: ignore[method-assign]
        if self.cuda:
            self._catcher = warnings.catch_warnings(record=True)
            self._warnings = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
        torch.Tensor.cpu = self._cpu  # type: ignore[method-assign]
        if self._catcher is not None:
            torch.cuda.set_sync_debug_mode("default")
            self._catcher.__exit__(*exc)
            self._catcher = self._warnings = None
        assert self._mode is not None
        self._mode.__exit__(*exc)
        self._mode = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        was, self.active = self.active, False
        seen = len(self._warnings) if self._warnings is not None else 0
        try:
            yield
        finally:
            self.active = was
            if self._warnings is not None:  # CUDA's warnings of the stretch left out too
                del self._warnings[seen:]

    def end_step(self, step: int, kinds: Iterable[str]) -> None:
        record = {
            "step": step, "kinds": sorted(set(kinds)),
            "counts": {c: self._counts.get(c, 0) for c in CLASSES}, "ops": dict(self._ops),
        }  # fmt: skip
        if self._warnings is not None:
            record["cuda_syncs"] = sum("synchroniz" in str(w.message) for w in self._warnings)
            self._warnings.clear()
        self.steps.append(record)
        self._counts, self._ops = Counter(), Counter()

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({"classes": list(CLASSES), "steps": self.steps}, indent=1))


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (e.g. a fake tensor)
        return -1


def _all_modules(root: torch.nn.Module) -> List[torch.nn.Module]:
    """Every module reachable from ``root``: its submodules, and modules kept in plain lists,
    tuples and dicts (TorchRec's sharded modules keep their lookups, with FBGEMM's kernels, in a
    list, out of ``modules()``)."""
    seen: Dict[int, torch.nn.Module] = {}
    todo: List[Any] = [root]
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.nn.Module):
            if id(obj) in seen:
                continue
            seen[id(obj)] = obj
            todo.extend(obj._modules.values())
            todo.extend(v for v in vars(obj).values() if isinstance(v, (list, tuple, dict)))
        elif isinstance(obj, (list, tuple)):
            todo.extend(v for v in obj if isinstance(v, (torch.nn.Module, list, tuple, dict)))
        elif isinstance(obj, dict):
            todo.extend(v for v in obj.values() if isinstance(v, (torch.nn.Module, list, tuple, dict)))
    return list(seen.values())


def _tensors_of(obj: Any) -> Any:
    """The tensors inside a batch (dataclass fields, KJTs), as a nested list."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, KeyedJaggedTensor):
        return [obj.values(), obj.lengths(), obj.weights_or_none(), obj.offsets_or_none()]
    if hasattr(obj, "__dataclass_fields__"):
        return [_tensors_of(getattr(obj, f)) for f in obj.__dataclass_fields__]
    return []


def steady_means(steps: List[Dict[str, Any]], first_step: int) -> Dict[str, Dict[str, float]]:
    """Mean counts per class of the steps from ``first_step`` on, by kind ("plain": no kind) and
    over all of them ("all")."""
    groups: Dict[str, List[Dict[str, int]]] = {}
    for s in steps:
        if s["step"] < first_step:
            continue
        groups.setdefault("+".join(s["kinds"]) or "plain", []).append(s["counts"])
        groups.setdefault("all", []).append(s["counts"])
    return {
        kind: {c: sum(x[c] for x in rows) / len(rows) for c in CLASSES} | {"steps": len(rows)}
        for kind, rows in groups.items()
    }
