"""``slipstream-train [--cfg] [OVERRIDE ...]``: compose the config, build, train, close.

``slipstream-train --self-check`` checks the installed torch / fbgemm / torchrec against the pins
and that fbgemm's operators load (``slipstream_rec.self_check``).

Works bare (one process), under ``torchrun --nproc_per_node N`` and under TorchX
(``torchx run -s local_cwd launch/components.py:train -- OVERRIDE ...``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import List, Optional

USAGE_EPILOG = """\
overrides are Hydra's: `group=option` picks a file from conf/<group>/ (model, data, sharding,
optim, trainer, slipstream, experiment), `group.key=value` sets a field. Examples:
  slipstream-train sharding=row_wise trainer.max_steps=200
  torchrun --nproc_per_node 2 -m slipstream_rec.train experiment=smoke
  slipstream-train --self-check      # is the torch/fbgemm/torchrec stack the pinned one, and does it load?
"""


def _quiet_libraries(is_rank0: bool) -> None:
    """TorchRec and FBGEMM log at INFO on every step and rank; keep our lines readable."""
    # FBGEMM logs every library it loads on the root logger: keep the root at WARNING and give
    # our own package INFO on rank 0 only.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("slipstream_rec").setLevel(logging.INFO if is_rank0 else logging.WARNING)
    for name in ("torchrec", "fbgemm_gpu", "torch.distributed", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # The planner warns on the root logger for every data-parallel table (they have no spec).
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda r: not r.getMessage().startswith("Sharding spec not found"))
    warnings.filterwarnings("ignore", category=FutureWarning)
    # FBGEMM's dense (data-parallel) lookup op has no registered autograd kernel; it still works.
    warnings.filterwarnings("ignore", message=".*autograd kernel was not registered.*")
    warnings.filterwarnings("ignore", message=".*is_fx_tracing.*")


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="slipstream-train",
        description="Sharded TorchRec DLRM training with Slipstream stale-embedding skipping.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    parser.add_argument(
        "--self-check",
        action="store_true",
        help="check the installed torch/fbgemm/torchrec against the pins in pyproject.toml, load "
        "fbgemm's operators, show the devices and backend, and exit (1 on a problem)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sharding=row_wise")
    args = parser.parse_args(argv)
    if args.self_check and (args.cfg or args.overrides):
        parser.error("--self-check takes no overrides and no --cfg")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    is_rank0 = os.environ.get("RANK", "0") == "0"
    _quiet_libraries(is_rank0)
    if args.self_check:
        from slipstream_rec.self_check import main as self_check

        return self_check()

    # Imports after logging is set up: torchrec logs while importing.
    from slipstream_rec.config import ConfigError, load_config, to_yaml

    # Compose and validate before any process group exists: a typo fails fast on every rank.
    try:
        job = load_config(args.overrides)
    except ConfigError as e:
        print(f"slipstream-train: {e}", file=sys.stderr)
        return 2
    if args.cfg:
        if is_rank0:
            print(to_yaml(job), end="")
        return 0

    from slipstream_rec.distributed import close_distributed, explain_collective_failure, init_distributed
    from slipstream_rec.job import run

    try:
        env = init_distributed(job.trainer.device, job.trainer.collective_timeout_s)
        run(job, env)
    except ValueError as e:
        # Bad values found where they are used (they name the key and the fix).
        print(f"slipstream-train: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        explanation = explain_collective_failure(e, job.trainer.collective_timeout_s)
        if explanation is None:
            raise
        print(f"slipstream-train: error: {explanation}\n  ({str(e).strip()[:500]})", file=sys.stderr)
        return 3
    finally:
        close_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
