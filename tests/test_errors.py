"""The bad-input table: every bad config value, missing path or unreadable input is one line on
stderr and exit code 2, names the key or file and the fix, shows no traceback, and is found
before any process group starts and before the run directory exists.

Most cases call the entry points in-process (``slipstream_rec.train.main``,
``slipstream_rec.data_cli.main``) with ``init_distributed`` replaced by a tripwire, so "before any
process group" is checked directly; two cases run the installed commands as a user would.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

import slipstream_rec.distributed as distributed
from slipstream_rec import train
from slipstream_rec.config import ConfigError
from slipstream_rec import data_cli

from tests.data._clicks import make_clicks, write_csv

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCHEMA = """\
label_column: click
dense_columns: [price, views]
categorical_columns: [user, item]
multi_hot_columns: [tags]
"""


class ProcessGroupStarted(Exception):
    """Raised by the tripwire: the command got past every check to init_distributed."""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory (runs/ and data/ land here) with the tripwire in place."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def tripwire(*args, **kwargs):
        raise ProcessGroupStarted()

    monkeypatch.setattr(distributed, "init_distributed", tripwire)
    return tmp_path


def one_error_line(capsys, prog: str = "slipstream-train") -> str:
    """stderr holds exactly one line, the error; returns it."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def train_fails(capsys, *argv: str) -> str:
    rc = train.main(list(argv))
    assert rc == 2
    return one_error_line(capsys)


def nothing_written(workdir: Path) -> None:
    assert not (workdir / "runs").exists(), "the run directory was created before the check"


# -- configuration values ---------------------------------------------------------------------


def test_typo_with_plus_is_rejected_with_the_closest_key(workdir, capsys):
    line = train_fails(capsys, "+trainer.bach_size=64")
    assert "trainer.bach_size" in line and "did you mean trainer.batch_size?" in line
    nothing_written(workdir)


def test_typo_without_plus_suggests_the_key_not_the_append_hint(workdir, capsys):
    line = train_fails(capsys, "trainer.bach_size=64")
    assert "did you mean trainer.batch_size?" in line and "append" not in line


def test_key_under_the_wrong_group_names_the_right_one(workdir, capsys):
    line = train_fails(capsys, "trainer.target_skip_fraction=0.5")
    assert "did you mean slipstream.target_skip_fraction?" in line


def test_unknown_group_option_suggests_the_closest(workdir, capsys):
    line = train_fails(capsys, "sharding=rowwise")
    assert "did you mean sharding=row_wise?" in line and "table_wise" in line


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.batch_size=0", "trainer.batch_size=0"),
        ("slipstream.target_skip_fraction=-0.5", "slipstream.target_skip_fraction=-0.5"),
        ("trainer.batch_size=many", "trainer.batch_size"),
        ("slipstream.policy=fast", "slipstream.policy"),
        ("sharding.qcomms.forward=fp8", "sharding.qcomms.forward"),
        ("sharding.qcomms.backward=int8", "sharding.qcomms.backward=int8 cannot run with slipstream.action=serve"),
        ("trainer.ddp_comm_hook=fp8", "trainer.ddp_comm_hook"),
    ],
)
def test_bad_value_names_the_key(workdir, capsys, override, key):
    line = train_fails(capsys, override)
    assert key in line
    nothing_written(workdir)


def test_bad_data_setting_is_found_before_the_process_group(workdir, capsys):
    line = train_fails(capsys, "data.bad_rows=maybe")
    assert "data.bad_rows='maybe'" in line and "Fix:" in line
    nothing_written(workdir)


# -- paths and inputs -------------------------------------------------------------------------


def test_missing_data_path_names_it_and_writes_nothing(workdir, capsys):
    line = train_fails(capsys, "data.source=npy", f"data.path={workdir / 'nope'}")
    assert str(workdir / "nope") in line and "data.path" in line
    nothing_written(workdir)


def test_missing_tabular_input_names_the_file(workdir, capsys):
    line = train_fails(capsys, "data=tabular", "data.tabular.inputs=[missing.csv]")
    assert "missing.csv" in line and "does not exist" in line
    nothing_written(workdir)
    assert not (workdir / "data").exists()


def _convert_small_csv(workdir: Path, capsys, rows: int = 200) -> tuple[Path, str]:
    (workdir / "clicks.yaml").write_text(SCHEMA)
    write_csv(workdir / "clicks.csv", make_clicks(rows, seed=3))
    rc = data_cli.main(["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv", "--out", "data/clicks", "--no-progress"])
    assert rc == 0
    return workdir / "data" / "clicks", capsys.readouterr().out


def test_batch_larger_than_a_small_dataset_names_the_largest_that_works(workdir, capsys, monkeypatch):
    from slipstream_rec.data.meta import load_meta

    path, out = _convert_small_csv(workdir, capsys)
    train_rows = load_meta(path).rows["train"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = train_fails(capsys, "data.source=npy", "data.path=data/clicks")
    assert "trainer.batch_size=2048 is too large" in line
    from slipstream_rec.data.batch_rule import suggested_batch_size

    suggested = suggested_batch_size(train_rows // 2, 2048)
    assert f"Fix: trainer.batch_size={suggested} ({train_rows // 2 // suggested} steps per epoch; at most {train_rows // 2} fits)" in line
    nothing_written(workdir)
    # The command slipstream-data printed for one process gets past every check.
    printed = next(l for l in out.splitlines() if l.startswith("train with: "))
    assert f"trainer.batch_size={suggested_batch_size(train_rows, 2048)}" in printed
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ProcessGroupStarted):
        train.main(printed.split()[3:])


def _complete_lines(gz: Path) -> int:
    n = 0
    try:
        with gzip.open(gz, "rb") as f:
            for _ in f:
                n += 1
    except EOFError:
        pass
    return n


def test_truncated_gzip_names_the_file_and_last_good_line_and_rerun_starts_cleanly(workdir, capsys):
    (workdir / "clicks.yaml").write_text(SCHEMA)
    plain = write_csv(workdir / "full.csv", make_clicks(20_000, seed=4))
    whole = gzip.compress(plain.read_bytes())
    gz = workdir / "clicks.csv.gz"
    gz.write_bytes(whole[: len(whole) // 2])
    argv = ["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv.gz", "--no-progress"]
    assert data_cli.main(argv) == 2
    line = one_error_line(capsys, "slipstream-data tabular")
    assert f"clicks.csv.gz is truncated or corrupt" in line
    assert f"after line {_complete_lines(gz)}, its last complete line" in line
    assert not list((workdir / "data").glob(".*.partial")), "a partial conversion was left behind"
    gz.write_bytes(whole)  # the fixed file: the same command now converts it
    assert data_cli.main(argv) == 0
    assert "rows: {'train'" in capsys.readouterr().out
    assert not list((workdir / "data").glob(".*.partial"))


def test_schema_typo_names_the_file_and_the_closest_key(workdir, capsys):
    (workdir / "clicks.yaml").write_text(SCHEMA.replace("label_column", "lable_column"))
    write_csv(workdir / "clicks.csv", make_clicks(50))
    assert data_cli.main(["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv"]) == 2
    line = one_error_line(capsys, "slipstream-data tabular")
    assert "clicks.yaml: lable_column is not a data.tabular key; did you mean label_column?" in line


def test_missing_schema_file_names_it(workdir, capsys):
    assert data_cli.main(["tabular", "--schema", "nope.yaml", "--input", "clicks.csv"]) == 2
    assert "--schema nope.yaml does not exist" in one_error_line(capsys, "slipstream-data tabular")


# -- --cfg, --debug ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--cfg"], ["--cfg", "job"], ["--cfg", "all"], ["--cfg", "trainer.max_steps=7"]])
def test_cfg_takes_hydras_argument_or_none(workdir, capsys, argv):
    assert train.main(argv + ["sharding=row_wise"]) == 0
    out = capsys.readouterr().out
    assert "type: row_wise" in out
    assert ("max_steps: 7" in out) == ("trainer.max_steps=7" in argv)
    nothing_written(workdir)


def test_cfg_hydra_says_in_one_line_there_is_none(workdir, capsys):
    line = train_fails(capsys, "--cfg", "hydra")
    assert "--cfg hydra" in line and "--cfg job" in line


def test_debug_and_hydra_full_error_show_the_traceback(workdir, monkeypatch):
    with pytest.raises(ConfigError, match="did you mean trainer.batch_size"):
        train.main(["--debug", "trainer.bach_size=64"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(FileNotFoundError, match="nope"):
        train.main(["data.source=npy", "data.path=nope"])


def test_a_library_error_is_one_line_that_says_where_and_how_to_see_more():
    from slipstream_rec.cli_errors import one_line

    try:
        int("x")
    except ValueError as e:
        # int() raises from C, so the innermost frame is this test file: outside the package.
        text = one_line(e)
    assert "invalid literal" in text and "--debug" in text and "test_errors.py" in text


# -- as a user runs them ----------------------------------------------------------------------


def _run(cmd: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WORLD_SIZE", "RANK")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_installed_commands_print_one_line_and_exit_2(tmp_path):
    r = _run([str(BIN / "slipstream-train"), "+trainer.bach_size=64"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert "did you mean trainer.batch_size?" in r.stderr
    r = _run([str(BIN / "slipstream-data"), "tabular", "--input", "nope.csv", "--no-progress",
              "data.tabular.categorical_columns=[a]"], tmp_path)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [l for l in r.stderr.splitlines() if "error:" in l]
    assert len(errors) == 1 and "nope.csv does not exist" in errors[0], r.stderr
    assert not (tmp_path / "runs").exists()


def test_under_torchrun_every_rank_stops_before_the_process_group(tmp_path):
    """2 ranks: the batch check uses torchrun's world size, and no rank gets to the run dir."""
    from tests._fixtures import write_dataset

    path = write_dataset(tmp_path / "d", {"train": 300, "val": 40, "test": 40})
    r = _run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "slipstream_rec.train",
              "data.source=npy", f"data.path={path}", "trainer.batch_size=200"], tmp_path)  # fmt: skip
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.startswith("slipstream-train: error:")]
    assert lines and all("Fix: trainer.batch_size=4 (37 steps per epoch; at most 150 fits)" in l for l in lines), r.stderr[-3000:]
    assert "slipstream_rec/" not in r.stderr, "a traceback from the project's code"  # torchrun adds its own
    assert not (tmp_path / "runs").exists()


# -- what a new user tripped on (issue 20): each is one line, exit 2, and writes nothing ----------


def test_data_path_without_data_source_npy_is_refused_not_ignored(workdir, capsys):
    line = train_fails(capsys, "data.path=data/clicks")
    assert "data.path=data/clicks is only read with data.source=npy" in line
    assert "Fix: add data.source=npy" in line
    nothing_written(workdir)
    assert not (workdir / "data").exists(), "the default dataset was generated"


def test_a_raw_file_as_data_path_is_named_with_the_conversion_command(workdir, capsys):
    write_csv(workdir / "clicks.csv", make_clicks(50))
    line = train_fails(capsys, "data.source=npy", "data.path=clicks.csv")
    assert "data.path=clicks.csv is a file, not a dataset directory" in line and "does not exist" not in line
    assert "`slipstream-data tabular --schema SCHEMA.yaml --input clicks.csv --out data/clicks`" in line
    nothing_written(workdir)


@pytest.mark.parametrize("override, key", [("optim.embedding.lr=-1", "optim.embedding.lr=-1.0"),
                                           ("optim.dense.lr=0", "optim.dense.lr=0.0"),
                                           ("model.embedding_dim=8", "model.embedding_dim=8")])  # fmt: skip
def test_model_and_optimizer_values_are_checked_before_the_process_group(workdir, capsys, override, key):
    line = train_fails(capsys, "experiment=smoke", override)
    assert key in line
    nothing_written(workdir)
    assert not (workdir / "data").exists()


YES_NO_SCHEMA = SCHEMA + "time_column: ts\nsplit:\n  method: time\n"


def _yes_no_csv(workdir: Path, rows: int = 20_000) -> None:
    """The README's schema with a label column of yes/no instead of 1/0."""
    (workdir / "clicks.yaml").write_text(YES_NO_SCHEMA)
    cols = make_clicks(rows, seed=5)
    cols["click"] = ["yes" if c == "1" else "no" for c in cols["click"]]
    write_csv(workdir / "clicks.csv", cols)


def _nothing_left_in_data(workdir: Path) -> None:
    left = sorted(p.name for p in (workdir / "data").iterdir()) if (workdir / "data").exists() else []
    assert left == [], f"a failed conversion left {left} in data/"


@pytest.mark.parametrize("split", ["time", "ordered"])
def test_a_yes_no_label_column_names_the_label_rule_that_reads_it(workdir, capsys, split):
    _yes_no_csv(workdir)
    argv = ["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv", "--out", "data/clicks",
            f"data.tabular.split.method={split}"]  # fmt: skip
    assert data_cli.main(argv) == 2  # with the progress bar, as a user runs it
    err = capsys.readouterr().err
    # tqdm ends its lines with \r, so split on \n only: the error must start a line of its own
    errors = [line for line in err.split("\n") if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("slipstream-data tabular: error: "), err[-2000:]
    assert "clicks.csv, line 2: bad label" in errors[0]
    assert "holds ['no', 'yes']" in errors[0] and "label_rule=binary" in errors[0]
    assert 'Fix: in the schema, label_rule: positive_values and label_positive_values: ["yes"]' in errors[0]
    _nothing_left_in_data(workdir)


def test_skipping_every_row_says_how_many_were_dropped_and_why(workdir, capsys):
    _yes_no_csv(workdir, rows=3000)
    argv = ["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv", "--no-progress", "data.bad_rows=skip"]
    assert data_cli.main(argv) == 2
    line = one_error_line(capsys, "slipstream-data tabular")
    assert "no rows found" in line and "data.bad_rows=skip dropped 3000 malformed row(s) ({'bad label': 3000})" in line
    assert "label_rule: positive_values" in line
    _nothing_left_in_data(workdir)


def test_the_fixed_schema_then_converts_and_leaves_no_lock_or_partial(workdir, capsys):
    _yes_no_csv(workdir, rows=3000)
    argv = ["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv", "--out", "data/clicks", "--no-progress"]
    # unquoted, YAML reads yes as the boolean true: said in one line, not converted to all-zero labels
    (workdir / "clicks.yaml").write_text(YES_NO_SCHEMA + "label_rule: positive_values\nlabel_positive_values: [yes]\n")
    assert data_cli.main(argv) == 2
    assert 'Fix: quote them, e.g. label_positive_values: ["yes"]' in one_error_line(capsys, "slipstream-data tabular")
    (workdir / "clicks.yaml").write_text(YES_NO_SCHEMA + 'label_rule: positive_values\nlabel_positive_values: ["yes"]\n')
    assert data_cli.main(argv) == 0
    assert sorted(p.name for p in (workdir / "data").iterdir()) == ["clicks"]
    from slipstream_rec.data.meta import load_meta

    meta = load_meta(workdir / "data" / "clicks")
    clicks = sum(c == "1" for c in make_clicks(3000, seed=5)["click"])
    assert round(sum(meta.ctr[s] * meta.rows[s] for s in meta.rows)) == clicks  # yes -> 1


def test_a_schema_list_given_as_text_shows_the_list_it_meant(workdir, capsys):
    (workdir / "clicks.yaml").write_text(SCHEMA.replace("dense_columns: [price, views]", "dense_columns: price, views"))
    write_csv(workdir / "clicks.csv", make_clicks(50))
    assert data_cli.main(["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv", "--no-progress"]) == 2
    line = one_error_line(capsys, "slipstream-data tabular")
    assert "clicks.yaml: dense_columns is the text 'price, views', not a list. Fix: dense_columns: [price, views]" in line
    assert "AnyNode" not in line


# -- what a new user tripped on (issue 32) ------------------------------------------------------


@pytest.mark.parametrize("value, rate", [("0", 0.0), ("0.0", 0.0), ("auto", "auto")])
def test_negative_downsampling_takes_a_whole_number_as_the_rate(workdir, value, rate):
    """The docs write `downsampling.rate=0` (none): the int 0 is the rate 0.0, not a type error."""
    from slipstream_rec.config import load_config

    got = load_config([f"downsampling.rate={value}"]).downsampling.rate
    assert got == rate and type(got) is type(rate)


def test_negative_downsampling_one_names_the_range_not_the_type(workdir, capsys):
    line = train_fails(capsys, "downsampling.rate=1")
    assert "downsampling.rate=1.0 is invalid" in line and "[0, 1)" in line
    assert "type hint" not in line
    nothing_written(workdir)


def test_an_error_shows_an_enum_as_the_value_the_user_wrote(workdir, capsys):
    line = train_fails(capsys, "trainer.precision=bf16", "trainer.pipeline=base")
    assert "trainer.precision=bf16 is invalid" in line and "<Precision" not in line


def test_precision_fp16_points_to_the_embedding_dtype(workdir, capsys):
    line = train_fails(capsys, "trainer.precision=fp16")
    assert "Fix:" in line and "model.embedding_dtype=fp16" in line
    from slipstream_rec.config import load_config

    assert load_config(["model.embedding_dtype=fp16"]).model.embedding_dtype.value == "fp16"  # the fix works


def test_cfg_runs_the_checks_the_run_runs(workdir, capsys):
    assert train.main(["--cfg", "data.path=data/clicks"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no config printed for a run that would be refused
    assert err.count("\n") == 1 and "data.path=data/clicks is only read with data.source=npy" in err


def test_one_batch_rule_gives_a_useful_number_of_steps(workdir, capsys, monkeypatch):
    """1,800 training rows: slipstream-data suggested 1024 (one step, 776 rows unused) and the
    trainer 1800 (one step). Both now suggest 64: 28 steps per epoch, 8 rows unused."""
    split = "time_column: ts\nsplit:\n  method: time\n  val_fraction: 0.05\n  test_fraction: 0.05\n"
    (workdir / "clicks.yaml").write_text(SCHEMA + split)
    write_csv(workdir / "clicks.csv", make_clicks(2000, seed=3))
    assert data_cli.main(["tabular", "--schema", "clicks.yaml", "--input", "clicks.csv", "--out", "data/clicks", "--no-progress"]) == 0
    from slipstream_rec.data.meta import load_meta

    assert load_meta(workdir / "data" / "clicks").rows["train"] == 1800
    printed = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("train with: "))
    assert printed.endswith(" trainer.batch_size=64"), printed
    line = train_fails(capsys, "data.source=npy", "data.path=data/clicks")
    assert "Fix: trainer.batch_size=64 (28 steps per epoch; at most 1800 fits)" in line
    with pytest.raises(ProcessGroupStarted):  # the printed command gets past every check
        train.main(printed.split()[3:])


def test_an_empty_data_path_directory_points_to_slipstream_data(workdir, capsys):
    (workdir / "data" / "clicks").mkdir(parents=True)
    line = train_fails(capsys, "data.source=npy", "data.path=data/clicks")
    assert "data.path=data/clicks is empty, not a converted dataset" in line
    command = "slipstream-data tabular --schema SCHEMA.yaml --input clicks.csv --out data/clicks"
    assert f"Fix: convert the click log first, `{command}`" in line and "data.source=synthetic" not in line
    nothing_written(workdir)
    # the fix, followed, converts into that (empty) directory; then the same training gets started
    (workdir / "clicks.yaml").write_text(SCHEMA)
    write_csv(workdir / "clicks.csv", make_clicks(3000, seed=3))
    argv = command.replace("SCHEMA.yaml", "clicks.yaml").split()[1:] + ["--no-progress"]
    assert data_cli.main(argv) == 0
    with pytest.raises(ProcessGroupStarted):
        train.main(["data.source=npy", "data.path=data/clicks", "trainer.batch_size=64"])


def test_a_data_path_of_raw_files_names_one_to_convert(workdir, capsys):
    (workdir / "raw").mkdir()
    write_csv(workdir / "raw" / "clicks.csv", make_clicks(50))
    line = train_fails(capsys, "data.source=npy", "data.path=raw")
    assert "data.path=raw holds raw input (clicks.csv)" in line
    assert "`slipstream-data tabular --schema SCHEMA.yaml --input raw/clicks.csv --out data/clicks`" in line
    assert line.endswith("then data.path=data/clicks")


def test_serve_when_auto_without_serving_names_the_preset_that_serves(workdir, capsys):
    line = train_fails(capsys, "slipstream=off", "slipstream.serve_when=auto")
    assert "slipstream.serve_when" in line and "slipstream=serve" in line
    nothing_written(workdir)


@pytest.mark.parametrize("override, hint", [
    ("slipstream.serve_window_steps=2", "at least 4 steps"),
    ("slipstream.serve_min_gain=1.5", "a fraction below 1"),
    ("trainer.precision_probe_steps=-1", "0 (no timing)"),
    ("sharding.qcomms.probe_steps=-2", "0 (no timing: the comms stay on)"),
    ("sharding.qcomms.min_gain=-1", "(-1, 1)"),
    ("sharding.qcomms.guard_every_steps=-5", "0 (no guard)"),
    ("sharding.qcomms.max_lost=2", "a share in [0, 1]"),
])  # fmt: skip
def test_the_levers_settings_are_checked_where_they_are_read(workdir, capsys, override, hint):
    line = train_fails(capsys, override)
    assert override.split("=")[0] in line and hint in line, line
    nothing_written(workdir)
