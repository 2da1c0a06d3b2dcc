"""What the commands print besides errors: each slipstream-data subcommand's own examples, and
the dataset line logged once per node."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from slipstream_rec import data_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", list(data_cli.SUBCOMMANDS))
def test_each_subcommand_help_shows_its_own_examples(command, capsys):
    with pytest.raises(SystemExit) as e:
        data_cli.main([command, "--help"])
    assert e.value.code == 0
    examples = capsys.readouterr().out.split("examples:", 1)[1]
    shown = {line.split()[1] for line in examples.splitlines() if line.strip().startswith("slipstream-data ")}
    assert shown == {command}, shown
    assert "slipstream-train" in examples  # and how to train on the result


def test_npy_directory_is_resolved_and_logged_once_on_local_rank_0(monkeypatch, caplog, tmp_path):
    import slipstream_rec.job as job_module
    from slipstream_rec.config import load_config
    from tests._fixtures import write_dataset

    path = write_dataset(tmp_path / "d", {"train": 64, "val": 16, "test": 16})
    job = load_config(["data.source=npy", f"data.path={path}"])
    monkeypatch.setattr(job_module.dist, "barrier", lambda: None)
    with caplog.at_level(logging.INFO, logger="slipstream_rec"):
        assert job_module.prepare_data(job, SimpleNamespace(local_rank=0)) == path
    assert sum("using npy directory" in r.getMessage() for r in caplog.records) == 1


def test_train_help_lists_every_option_of_every_group_with_its_description(capsys):
    from slipstream_rec import train

    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    listed = out.split("config groups", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows, group = {}, None
    for line in listed:
        if line.startswith("    "):  # "    [*]option  description"
            option, _, text = line.strip().partition(" ")
            rows[(group, option.lstrip("*"))] = text.strip()
        else:
            group = line.strip().rstrip(":")
    conf = ROOT / "conf"
    files = {(p.parent.name, p.stem): p for p in conf.glob("*/*.yaml")}
    assert set(rows) == set(files), set(rows) ^ set(files)
    for key, path in files.items():
        comment = " ".join(
            l.lstrip("#").strip() for l in path.read_text().split("\n\n")[0].splitlines()
            if l.startswith("#") and not l.startswith("# @package")
        )  # fmt: skip
        text = rows[key]
        assert 20 <= len(text) <= 100 and comment.startswith(text.removesuffix("...")), (key, text)
    assert "*serve" in out and "*clicklog" in out and "*dlrm_criteo_kaggle" in out  # defaults marked
