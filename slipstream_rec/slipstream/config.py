"""Slipstream policy configuration (the stale-embedding skipping method, arXiv 2404.04270).

The policies in conf/slipstream/ only set these fields; the code reads the fields, never the
policy name, except to know whether to track and whether to skip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from slipstream_rec.validation import check_fields


class Policy(Enum):
    """Which Slipstream behaviour runs. ``off`` is a policy, not a separate code path."""

    off = "off"  # nothing tracked, nothing skipped: the baseline
    track_only = "track_only"  # all tracking and sync, nothing skipped: measures the overhead
    paper = "paper"  # the paper's artifact defaults: stale once = stale forever, one threshold
    paper_plus = "paper_plus"  # ours: re-activation, refreshed threshold, unbiased sampling, ceiling
    # The control: nothing tracked, a uniform random fraction of the samples is skipped. A
    # staleness policy is worth its cost only if it beats this at the same skip fraction.
    random = "random"

    @property
    def tracks(self) -> bool:
        return self not in (Policy.off, Policy.random)

    @property
    def skips(self) -> bool:
        return self in (Policy.paper, Policy.paper_plus, Policy.random)


class Action(Enum):
    """What a tracking policy does with an input whose lookups are all stale."""

    skip = "skip"  # drop it (the paper): no lookup, no communication, no dense compute
    # Answer its embeddings from the local replica of the stale rows (slipstream/serve/replica.py): no
    # embedding communication, and the dense network still trains on it. Nothing is dropped.
    serve = "serve"


class ServeWhen(Enum):
    """Whether ``serve`` serves wherever rows are stale, or only where it measures faster."""

    # Serve whenever rows are stale, whatever it costs: no decision depends on a clock, so two
    # runs with the same seed (and a run and its resume) train identically.
    always = "always"
    # Time steps with and without serving in the run and serve only while it pays; where it does
    # not, Slipstream stands down (no serving, counting or snapshots) and looks again rarely
    # (slipstream/serve/lever.py). Decisions follow measured time, so runs may differ.
    auto = "auto"


class SyncPrecision(Enum):
    """What serve's own collectives put on the wire for a row's values (``sync_precision``)."""

    fp32 = "fp32"  # 4 bytes a value: the pushed sums exact, the replica equal to its shards
    # 2 bytes a value: the pushed sums rounded to bf16 (as TorchRec's bf16 backward qcomms round
    # the sharded gradients); the replica sync sends bf16 differences from the copy every rank
    # holds, so its rounding does not accumulate
    bf16 = "bf16"
    # 1 byte a value and a 2-byte (bf16) scale a row (serve/wire_rows.py): each pushed sum and
    # each sync difference at one scale per row, its largest magnitude / 127 rounded up to a
    # bf16, every value within 1/254 (x 1 + 2^-7) of that (as TorchRec's row-wise INT8 comms);
    # at dim 16 a row's 18 bytes, at 128 130
    int8 = "int8"


class ChangeMetric(Enum):
    linf = "linf"  # largest absolute change of any element of the row (the paper's)
    rel_l2 = "rel_l2"  # L2 norm of the row's change / L2 norm of the row


@dataclass
class SlipstreamConfig:
    """Selects and tunes the Slipstream policy. Steps are training steps (global batches)."""

    # The conf/slipstream/ option these settings came from (each file sets its own name): what
    # messages call the policy, since one policy has several presets (serve and paper_plus are
    # both policy paper_plus; negative_sampling is policy random). "": none chosen.
    preset: str = ""
    # off, track_only, paper, paper_plus or random (the control).
    policy: Policy = Policy.off
    # What paper / paper_plus do with an input whose lookups are all stale: skip (drop it) or
    # serve (answer it from a local replica of the stale rows, train the dense layers on it).
    action: Action = Action.skip

    # --- hot-row discovery (on every shard, from what it looks up after the input all-to-all)
    # Lookups are counted during the first count_steps steps; hot rows are chosen at that step.
    count_steps: int = 100
    # Fraction of those steps whose lookups are counted (the artifact samples 5% of inputs).
    count_fraction: float = 0.05
    # Global memory budget for the hot rows, summed over all shards, in MiB (the artifact: 256).
    hot_budget_mb: float = 256.0
    # A row needs at least this many counted lookups to be hot.
    min_count: int = 2
    # Steps between two choices of the hot set after the first (a multiple of snapshot_interval;
    # 0: chosen once, at count_steps, as in the paper). Lookups go on being counted on
    # count_fraction of the steps, and at every such step the hot set is chosen again from the
    # lookups of the window since the last choice, within the same budget: rows join and leave
    # as the log drifts.
    hot_refresh_steps: int = 0

    # --- snapshots and staleness
    # Steps between snapshots of the hot rows; the first is taken when hot rows are chosen.
    snapshot_interval: int = 50
    # How a row's change between two snapshots is measured: linf (paper) or rel_l2.
    change_metric: ChangeMetric = ChangeMetric.linf
    # serve: steps between two pushes of the served samples' row gradients to the shards, each
    # followed by a fresh copy of the replica from the shards (a divisor of snapshot_interval;
    # 0: at every snapshot). Smaller: served inputs read rows fewer steps old and stale rows get
    # their served gradients sooner, for an all-gather of the replica and a push each time.
    replica_sync_steps: int = 0
    # serve: what a sync sends of the replica. A row is sent again only where its shard differs
    # from the replica's copy by more than this (largest absolute difference over a shard's
    # columns); rows that join the replica are sent whole. 0: every row that moved (only the
    # pushed rows move), so the replica equals the shards after each sync; larger: fewer bytes,
    # a served row then differs from its shard by at most this plus the pushes since the last
    # sync; -1: every row every sync (a full copy).
    replica_sync_bound: float = 0.0
    # serve: the precision of the values the push and the replica sync send (either way the
    # sync's positions travel as int32, and the push's keys too where every table's rows fit
    # under 2^31). fp32: exact. bf16: half the bytes; a pushed sum is rounded to bf16, and a
    # replica row is sent again only where it differs from its shard by more than the bound
    # plus bf16's resolution at the shard's value (2^-8 of it, per element), so that a served
    # row differs from its shard by at most that plus the pushes since the last sync. int8:
    # a row's values in a byte each at one bf16 scale (its largest magnitude / 127, rounded
    # up): a pushed sum within 1/254 (x 1 + 2^-7) of its largest element, a sync difference
    # likewise, the resend test as bf16's; at dim 16 a row's 18 bytes against bf16's 32, at
    # dim 128 130 against 256.
    sync_precision: SyncPrecision = SyncPrecision.fp32
    # --- does serving pay? (serve only; slipstream/serve/lever.py)
    # always: serve wherever rows are stale; auto: measure in the run whether a step with
    # serving is faster than one without (a window each, then re-checked) and serve only while
    # it is; where it is not, stand down (nothing served, counted or snapshotted) and look again
    # after serve_recheck_windows windows.
    serve_when: ServeWhen = ServeWhen.always
    # auto: steps per timed window (rounded up to a multiple of snapshot_interval); the first
    # window, timed without serving, is the wait from count_steps to the second snapshot.
    serve_window_steps: int = 50
    # auto: serving stays on only where a step with it takes at most (1 - this) of a step
    # without it (without: less the tracking, which standing down removes too). Below 0 it
    # tolerates a slower step: -1 serves up to twice as slow, -9 up to 10 times.
    serve_min_gain: float = 0.02
    # auto: windows before the first re-check of a decision (serving: one window without it;
    # stood down: tracking resumes to look again); each re-check that confirms it doubles the wait.
    serve_recheck_windows: int = 8
    # auto: the most a re-check may cost of the steps it waits for. Its window in the losing
    # state costs (slower / faster - 1) of a window, so the wait is at least that over this
    # many windows (0.01: serving 20% slower looks again after 20 windows at the soonest).
    serve_look_budget: float = 0.01
    # Re-decide staleness at every snapshot, so a stale row that moves again is re-activated.
    # false: a row found stale stays stale for the rest of training (the paper).
    reactivate: bool = True

    # --- threshold T (a hot row is stale when its change < T)
    # Target fraction D of the sampled upcoming hot inputs that T should make skippable.
    target_skip_fraction: float = 0.3
    # Upper bound on T, so that rows that still move are never called stale just to reach D.
    max_threshold: float = 0.1
    # Recompute T at every snapshot; false: T is chosen once, at the first opportunity (paper).
    refresh_threshold: bool = True
    # Upcoming samples per rank, taken from the look-ahead buffer, used to choose T.
    threshold_sample_size: int = 8192
    # Raw batches per rank held in the look-ahead buffer of the data stream.
    lookahead_batches: int = 4

    # --- input classifier and safeguards
    # Skip a sample when at least this fraction of its lookups hit stale rows (1.0: all, DLRM).
    alpha: float = 1.0
    # Keep each skippable sample with probability p and weight its loss 1/p (unbiased
    # gradient); 0 is the paper's pure skipping.
    keep_probability: float = 0.0
    # Skip only samples labelled 0 (no click): stale positives, the rare and informative class,
    # are always trained (negative downsampling restricted to stale inputs).
    negatives_only: bool = False
    # At most this fraction of the samples of each window may be skipped (1.0: no ceiling).
    max_skip_fraction: float = 1.0
    # Size, in classified samples per rank, of a ceiling window.
    window_samples: int = 65536
    # No skipping before this step, whatever the snapshots say (skipping also always waits for
    # two snapshots, the first moment a change can be measured).
    warmup_steps: int = 0

    # --- the quality check (slipstream/quality.py): the target D steered by measured quality
    # At every snapshot, before T is refreshed, score a held-out sample of upcoming inputs with
    # one no-grad forward and compare the log loss of the inputs the policy would skip at its
    # maximum rate (target_skip_fraction) with the others': while the skip candidates are not
    # measurably better predicted, lower D by quality_step (down to 0, no skipping); while they
    # are, raise it back (up to target_skip_fraction). Needs a tracking policy and refresh_threshold.
    quality_check: bool = False
    # Upcoming samples per rank scored at each snapshot (taken from the look-ahead buffer; at most
    # lookahead_batches * batch_size are there).
    quality_sample_size: int = 2048
    # Relative log-loss advantage the skip candidates need over the other inputs, on top of the
    # z standard errors (0: any measurable advantage; 0.1: their mean log loss at least 10% below
    # the others').
    quality_min_gain: float = 0.0
    # Standard errors of the difference that the advantage must clear.
    quality_z: float = 2.0
    # How much one decision moves D.
    quality_step: float = 0.1
    # Fewer skip candidates (or other inputs) than this, summed over ranks: no evidence that
    # skipping is safe, so D is lowered.
    quality_min_samples: int = 200

    # --- the control (policy random only)
    # Fraction of the samples skipped uniformly at random, whatever their lookups. Set it to the
    # skip fraction of the run it controls (benchmarks/slipstream_policies.py --random-control
    # does). negatives_only and max_skip_fraction apply as for the other policies.
    random_skip_fraction: float = 0.0

    def validate(self) -> None:
        checks = [
            ("count_steps", self.count_steps >= 1, "a positive step count"),
            ("count_fraction", 0 < self.count_fraction <= 1, "a fraction in (0, 1]"),
            ("min_count", self.min_count >= 1, "at least 1"),
            (
                "hot_refresh_steps",
                self.hot_refresh_steps >= 0 and self.hot_refresh_steps % self.snapshot_interval == 0,
                f"0 (choose the hot set once) or a multiple of slipstream.snapshot_interval={self.snapshot_interval}",
            ),
            ("snapshot_interval", self.snapshot_interval >= 1, "a positive step count"),
            (
                "replica_sync_steps",
                self.replica_sync_steps == 0
                or (self.replica_sync_steps >= 1 and self.snapshot_interval % self.replica_sync_steps == 0),
                f"0 (sync at every snapshot) or a divisor of slipstream.snapshot_interval={self.snapshot_interval}",
            ),
            (
                "replica_sync_bound",
                self.replica_sync_bound >= 0 or self.replica_sync_bound == -1,
                "0 or more (-1: a full copy at every sync)",
            ),
            ("serve_window_steps", self.serve_window_steps >= 4,
             "at least 4 steps (the first 2 of a window are not timed)"),
            ("serve_min_gain", -math.inf < self.serve_min_gain < 1,
             "a fraction below 1 (0.02: 2% faster; -1: serve up to twice as slow)"),
            ("serve_recheck_windows", self.serve_recheck_windows >= 1, "at least 1 window"),
            ("serve_look_budget", 0 < self.serve_look_budget <= 1, "a fraction in (0, 1] (0.01: 1% of the wait)"),
            (
                "serve_when",
                self.serve_when is ServeWhen.always or self.action is Action.serve,
                "always, or auto with slipstream=serve (slipstream.action=serve): it decides whether serving pays",
            ),
            ("target_skip_fraction", 0 <= self.target_skip_fraction <= 1, "a fraction in [0, 1]"),
            ("max_threshold", self.max_threshold >= 0, "0 or more"),
            ("threshold_sample_size", self.threshold_sample_size >= 1, "a positive sample count"),
            ("lookahead_batches", self.lookahead_batches >= 1, "at least 1 batch"),
            ("alpha", 0 < self.alpha <= 1, "a fraction in (0, 1]"),
            ("keep_probability", 0 <= self.keep_probability < 1, "a probability in [0, 1)"),
            ("max_skip_fraction", 0 <= self.max_skip_fraction <= 1, "a fraction in [0, 1]"),
            ("window_samples", self.window_samples >= 1, "a positive sample count"),
            ("warmup_steps", self.warmup_steps >= 0, "0 or more steps"),
            ("random_skip_fraction", 0 <= self.random_skip_fraction < 1, "a fraction in [0, 1)"),
            ("quality_sample_size", self.quality_sample_size >= 1, "a positive sample count"),
            ("quality_min_gain", 0 <= self.quality_min_gain < 1, "a fraction in [0, 1)"),
            ("quality_z", self.quality_z >= 0, "0 or more standard errors"),
            ("quality_step", 0 < self.quality_step <= 1, "a fraction in (0, 1]"),
            ("quality_min_samples", self.quality_min_samples >= 2, "at least 2 samples"),
            (
                "quality_check",
                not self.quality_check or (self.policy.tracks and self.refresh_threshold),
                "false, or a tracking policy (track_only, paper, paper_plus) with "
                "slipstream.refresh_threshold=true: it steers the threshold refreshed at every snapshot",
            ),
            (
                "random_skip_fraction",
                (self.random_skip_fraction > 0) == (self.policy is Policy.random),
                "a fraction > 0 with slipstream=random (the skip fraction of the run it controls, "
                "e.g. slipstream.random_skip_fraction=0.28), and 0 with every other policy, which "
                "skips by staleness",
            ),
        ]
        checks.append(
            (
                "count_fraction",
                self.count_steps * self.count_fraction >= 1,
                f"a fraction that counts at least one of the {self.count_steps} count_steps "
                "(or raise slipstream.count_steps)",
            )
        )
        if self.action is Action.serve:
            # Serving answers a sample only when every lookup is a replica row, trains every
            # sample at weight 1 and keeps the skip machinery out of it.
            why = "slipstream.action=serve"
            checks += [
                ("policy", self.policy in (Policy.paper, Policy.paper_plus),
                 f"paper or paper_plus with {why} (slipstream=serve): the others keep no stale set to serve"),
                ("alpha", self.alpha == 1.0, f"1.0 with {why}: a sample is served only when all of its lookups are stale"),
                ("keep_probability", self.keep_probability == 0, f"0 with {why}: nothing is dropped, so no sample is weighted back"),
                ("negatives_only", not self.negatives_only, f"false with {why}: served samples of both labels still train"),
                ("max_skip_fraction", self.max_skip_fraction == 1.0, f"1.0 with {why}: nothing is skipped"),
                ("quality_check", not self.quality_check, f"false with {why}: it steers how many inputs are dropped"),
            ]  # fmt: skip
        check_fields("slipstream", self, checks)

    @property
    def chosen(self) -> str:
        """``slipstream=<preset>`` as the user chose it, with the policy where its name differs
        (``slipstream=serve (policy paper_plus)``)."""
        name = self.preset or self.policy.value
        return f"slipstream={name}" + (f" (policy {self.policy.value})" if name != self.policy.value else "")

    @property
    def skips(self) -> bool:
        """Whether the policy drops inputs (a skipping policy whose action is skip)."""
        return self.policy.skips and self.action is Action.skip

    @property
    def serves(self) -> bool:
        return self.action is Action.serve

    @property
    def classifies(self) -> bool:
        """Whether each input is classified on the data side (skipped, or counted as what would
        be skipped): every policy but ``off``, and never under ``serve``, which drops nothing."""
        return self.policy is not Policy.off and not self.serves
