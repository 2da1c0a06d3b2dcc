"""What can be checked about a job before any process group starts and any file is written.

``slipstream-train`` calls ``check_before_start`` on every rank right after composing the
config: a wrong ``data.path``, a missing raw input, a schema naming a column the file lacks, a
Criteo dataset not yet converted, or a batch size larger than a rank's share of the data then
fails in a second, with one line, instead of after the process group, the run directory and
the model exist; so does training a finished run directory again (``check_run_dir``). Everything here reads at most file headers and meta.json; nothing is
generated or converted (that stays in ``job.prepare_data``, where local rank 0 does it once).
Whatever cannot be known yet (a dataset converted on first use) is checked again where it is
used (``NpyBatchLoader``), with the same message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional, Tuple

from slipstream_rec.config import JobConfig


def world_size_from_env() -> int:
    """The world size torchrun / TorchX will give the process group (1 for a bare run)."""
    raw = os.environ.get("WORLD_SIZE", "1") or "1"
    try:
        return max(1, int(raw))
    except ValueError:
        raise ValueError(f"WORLD_SIZE={raw!r} is not a number. Fix: launch with torchrun, or unset it.") from None


def known_rows(job: JobConfig) -> Tuple[Optional[Dict[str, int]], str, str]:
    """(rows per split, or None where not known before conversion; what holds them; the fix that
    adds rows). Raises the data's own error for a missing path or input, or a bad setting."""
    from slipstream_rec.data.datasets import dataset_dir, normalize_data_config
    from slipstream_rec.data.meta import load_meta

    data = normalize_data_config(job.data)  # source, bad_rows, name, data.path set, synthetic
    if data.source == "synthetic":
        s = data.synthetic
        rows = {"train": s.num_train, "val": s.num_val, "test": s.num_test}
        return rows, "data.synthetic", "raise data.synthetic.num_train"
    if data.source == "npy":
        meta = load_meta(Path(data.path))  # type: ignore[arg-type]
        return meta.rows, f"data.path={data.path}", "use more data"
    if data.source == "movielens_1m":
        return None, "", ""  # locating the ratings may download them: left to prepare_data
    # criteo / tabular: validating the settings reads the inputs' headers (and names a missing
    # file or a column the file lacks); the directory name hashes settings and input sizes.
    path = dataset_dir(data)
    if path.is_dir():
        return load_meta(path).rows, str(path), "add rows to the input"
    if data.source == "criteo":
        raise ValueError(
            f"data.source=criteo: {path} is not converted yet. Fix: run `slipstream-data criteo` "
            f"with the same data overrides first (it can take hours and is resumable), then train."
        )
    return None, "", ""  # tabular: converted on first use, checked by the loader after


def fixed_run_dir(job: JobConfig) -> Optional[Path]:
    """The run directory known before the job starts: ``trainer.run_dir``, or ``runs/<id>`` under
    torchrun / TorchX with a rendezvous id; None where rank 0 picks a new timestamped one."""
    if job.trainer.run_dir:
        return Path(job.trainer.run_dir)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return Path(f"runs/{run_id}") if run_id not in ("", "none") else None


def check_run_dir(job: JobConfig) -> None:
    """A run directory another job trains into is refused (``run_lock``). A finished run (its
    summary.json written) is not trained again in place: resuming it would append a second
    final evaluation to its records, and a fresh start would overwrite them."""
    from slipstream_rec.run_lock import check_free

    run_dir = fixed_run_dir(job)
    if run_dir is None:
        return
    check_free(run_dir)
    if not (run_dir / "summary.json").is_file():
        return
    resume = job.trainer.resume
    what = (
        f"trainer.resume={resume} but {run_dir} holds a finished run (summary.json) that this run would overwrite"
        if resume != "auto"
        else f"trainer.run_dir={run_dir} holds a finished run (summary.json): training it again would "
        "append to its records"
    )
    raise ValueError(
        f"{what}. Fix: choose a new trainer.run_dir (to train on from its last checkpoint: "
        f"trainer.resume={run_dir / 'checkpoints'} with the new trainer.run_dir and more steps, a "
        f"larger trainer.max_steps or trainer.epochs), or delete {run_dir}"
    )


def policy_cannot_act(job: JobConfig, total_steps: int) -> Optional[str]:
    """Why the Slipstream policy cannot skip anything within ``total_steps`` steps, or None.

    A staleness policy skips only after its second snapshot (step count_steps +
    snapshot_interval, and not before warmup_steps); the random control after warmup_steps.
    """
    from slipstream_rec.slipstream.config import Policy

    s = job.slipstream
    if s.policy is Policy.off:
        return None
    if s.policy.tracks:
        first = max(s.count_steps + s.snapshot_interval, s.warmup_steps)
        why = (
            f"slipstream.count_steps={s.count_steps} + slipstream.snapshot_interval="
            f"{s.snapshot_interval}: the second snapshot, the first time a row's change is measured"
        )
        if s.warmup_steps > s.count_steps + s.snapshot_interval:
            why = f"slipstream.warmup_steps={s.warmup_steps}"
        count = max(1, total_steps // 4)
        scaled = f"slipstream.count_steps={count} slipstream.snapshot_interval={max(1, total_steps // 8)}"
        if count * s.count_fraction < 1:  # validate(): at least one counted step
            scaled += " slipstream.count_fraction=1.0"
        if s.warmup_steps >= total_steps:
            scaled += f" slipstream.warmup_steps={max(0, total_steps // 2)}"
    else:  # random: skips from warmup_steps on
        first, why = s.warmup_steps, f"slipstream.warmup_steps={s.warmup_steps}"
        scaled = f"slipstream.warmup_steps={total_steps // 2}"
    if total_steps > first:
        return None
    act = "skips nothing" if not s.policy.tracks else "skips no stale input" if s.policy.skips else "measures no row's change"
    if s.policy.skips and getattr(getattr(s, "action", None), "value", "skip") == "serve":
        act = "serves no stale input from its replica"
    return (
        f"{s.chosen} {act} in this run: it trains {total_steps} steps and the "
        f"policy acts from step {first} on ({why}). Fix: scale the policy to the run ({scaled}), "
        "train longer (trainer.epochs), or slipstream=off"
    )


def check_before_start(job: JobConfig, world_size: int) -> None:
    """Raise the first problem that would stop the job once started (see the module doc)."""
    check_run_dir(job)
    rows, where, more_rows = known_rows(job)
    if rows is None:
        return
    from slipstream_rec.data.loader import check_split_fits

    tr = job.trainer
    splits = [("train", True, tr.batch_size), ("val", False, tr.eval_batch_size or tr.batch_size)]
    if tr.test_at_end:
        splits.append(("test", False, tr.eval_batch_size or tr.batch_size))
    for split, train, batch_size in splits:
        if split in rows:
            check_split_fits(
                rows[split], split, batch_size=batch_size, world_size=world_size, train=train,
                where=where, more_rows=more_rows,
            )  # fmt: skip
