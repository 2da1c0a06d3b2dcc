"""``slipstream-train [--nproc N] [--cfg] [OVERRIDE ...]``: compose the config, build, train, close.

``slipstream-train --self-check`` checks the installed torch / fbgemm / torchrec against the pins
and that fbgemm's operators load (``slipstream_rec.self_check``).

Works bare (one process), with ``--nproc N`` (N local ranks started by this command,
``slipstream_rec.launcher``), under ``torchrun`` and under TorchX
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
overrides are Hydra's: `group=option` picks a file from conf/<group>/, `group.key=value` sets a
field (every key and its value: --cfg). Examples:
  slipstream-train --nproc 2 sharding=row_wise trainer.max_steps=200
  slipstream-train experiment=smoke     # one process
  slipstream-train --cfg data=tabular   # the composed config, checked, nothing run
  slipstream-train --self-check      # is the torch/fbgemm/torchrec stack the pinned one, and does it load?
  torchrun --nnodes 2 --nproc_per_node 8 ... -m slipstream_rec.train OVERRIDES   # many nodes
A bad config value, missing path or unreadable input is one line and exit code 2 (--debug or
HYDRA_FULL_ERROR=1: the traceback); a lost or stuck rank is exit code 3; Ctrl-C is exit code 130
(one line: the step, the last checkpoint, how to resume).
"""


def options_help() -> str:
    """Every option of every config group with the first sentence of its file's comment."""
    from slipstream_rec.config import describe_options

    lines = ["config groups (group=option; the default is marked *):"]
    for group, options in describe_options().items():
        lines.append(f"  {group}:")
        width = max(len(o) for o in options) + 2
        lines += [f"    {o.ljust(width)}{text}" for o, text in options.items()]
    return "\n".join(lines) + "\n"


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


# Hydra's `--cfg job|hydra|all`: what `slipstream-train --cfg KIND` accepts (plain --cfg: job).
CFG_KINDS = ("job", "hydra", "all")


def _cfg_argument(argv: List[str]) -> List[str]:
    """``--cfg`` takes an optional KIND: ``--cfg job`` and ``--cfg`` followed by an override
    both work (argparse alone would take the override for the KIND)."""
    out: List[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--cfg":
            kind = argv[i + 1] if i + 1 < len(argv) and argv[i + 1] in CFG_KINDS else None
            out.append(f"--cfg={kind or 'job'}")
            i += 2 if kind else 1
            continue
        out.append(argv[i])
        i += 1
    return out


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = _Parser(
        prog="slipstream-train",
        # Not "skipping": the default preset (slipstream=serve) drops no input; the README's
        # "What and why" says the same, and tests/test_docs.py holds the two together.
        description="Sharded TorchRec DLRM training with Slipstream (arXiv 2404.04270): inputs that "
        "read only stale embedding rows are served from a local replica of those rows by default "
        "(slipstream=serve, nothing skipped) or skipped (slipstream=paper_plus); slipstream=off is "
        "the baseline.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="start N ranks on this machine (torch.distributed.run's API, as `torchrun "
        "--standalone`) after checking the config once; ends with rank 0's result line or one "
        "error line",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="M",
        help="with --nproc: restart the ranks up to M times after a failure (they resume from "
        "the newest checkpoint)",
    )
    parser.add_argument(
        "--cfg",
        choices=CFG_KINDS,
        metavar="[job]",
        help="run the checks a run runs before it starts, print the option chosen in each group "
        "and the composed, validated config, and exit, touching no data and no run directory "
        "(`job`: the keys this job reads; `all`: every key, the unused data sources' settings too; "
        "there is no Hydra runtime config: this program uses Hydra only to compose)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error (also HYDRA_FULL_ERROR=1); without it a bad "
        "config value, path or input is one line and exit code 2",
    )
    parser.add_argument(
        "--self-check",
        action="store_true",
        help="check the installed torch/fbgemm/torchrec against the pins in pyproject.toml, load "
        "fbgemm's operators, show the devices and backend, and exit (1 on a problem)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sharding=row_wise")
    args = parser.parse_args(_cfg_argument(list(argv or [])))
    if args.self_check and (args.cfg or args.overrides or args.nproc):
        parser.error("--self-check takes no overrides, no --cfg and no --nproc")
    if args.nproc is not None and args.nproc < 1:
        parser.error(f"--nproc {args.nproc}: give at least 1 rank")
    if args.max_restarts < 0 or (args.max_restarts and args.nproc is None):
        parser.error("--max-restarts M (M >= 0) goes with --nproc N; under torchrun use its own --max-restarts")
    if args.nproc is not None and "RANK" in os.environ:
        parser.error("--nproc starts its own ranks: under torchrun or TorchX leave it out")
    return args


class _Parser(argparse.ArgumentParser):
    """``--help`` lists the config groups' options, read from conf/ only when it is printed."""

    def format_help(self) -> str:
        self.epilog = options_help() + "\n" + USAGE_EPILOG
        return super().format_help()


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    is_rank0 = os.environ.get("RANK", "0") == "0"
    _quiet_libraries(is_rank0)
    if args.self_check:
        from slipstream_rec.self_check import main as self_check

        return self_check()
    from slipstream_rec.cli_errors import emit_error_line, run_cli
    from slipstream_rec.interrupt import EXIT_INTERRUPTED, Interrupted, install, restore

    previous = install()
    try:
        return run_cli("slipstream-train", lambda: _compose_check_run(args, is_rank0), args.debug)
    except Interrupted as e:  # Ctrl-C: where it stopped and how to go on, not a traceback
        emit_error_line(f"slipstream-train: {e.line()}")
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before the job ran (composing, checking, starting)
        emit_error_line("slipstream-train: interrupted before training started (nothing was trained)")
        return EXIT_INTERRUPTED
    finally:
        restore(previous)


def _compose_check_run(args: argparse.Namespace, is_rank0: bool) -> int:
    # Imports after logging is set up: torchrec logs while importing.
    from slipstream_rec.config import cfg_listing, load_config
    from slipstream_rec.preflight import check_before_start, world_size_from_env

    # Every rank composes and checks before any process group or file exists: a typo or a
    # wrong path fails in seconds on every rank, with one line, and leaves nothing behind.
    job = load_config(args.overrides)
    world_size = args.nproc or world_size_from_env()
    if args.cfg == "hydra":
        raise ValueError(
            "--cfg hydra: this program composes its config with Hydra's compose API and runs no "
            "Hydra app (no outputs/, no Hydra logging, no multirun), so there is no Hydra config "
            "to show. Fix: --cfg (or --cfg job) prints the job config"
        )
    check_before_start(job, world_size)  # --cfg too: it shows a config the run would accept
    if args.cfg:
        if is_rank0:
            print(cfg_listing(job, args.overrides, everything=args.cfg == "all"), end="")
        return 0
    if args.nproc is not None:  # checked once, here; then the ranks (which check again, quietly)
        from slipstream_rec.launcher import launch

        return launch(args.nproc, args.max_restarts, args.overrides, job)

    from slipstream_rec.cli_errors import emit_error_line
    from slipstream_rec.distributed import close_distributed, explain_collective_failure, init_distributed
    from slipstream_rec.job import run

    try:
        env = init_distributed(job.trainer.device, job.trainer.collective_timeout_s)
        run(job, env)
    except RuntimeError as e:
        explanation = explain_collective_failure(e, job.trainer.collective_timeout_s)
        if explanation is None:
            raise
        emit_error_line(f"slipstream-train: error: {explanation} ({' '.join(str(e).split())[:500]})")
        return 3
    finally:
        close_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
