"""CSV files as spreadsheets and other tools export them (issue 32): a byte-order mark (Excel's
"CSV UTF-8"), semicolons between fields (Excel where the decimal mark is a comma), a field
longer than Python's csv limit of 128 KiB, and columns that are empty in every row. Each
converts to the dataset the plain CSV gives, or names the file, line or column and the fix."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from slipstream_rec import data_cli
from slipstream_rec.data.meta import load_meta

from tests.data._clicks import make_clicks, write_csv

SCHEMA = """\
label_column: click
dense_columns: [price, views]
categorical_columns: [user, item]
multi_hot_columns: [tags]
"""


def _convert(tmp_path: Path, name: str, *extra: str) -> int:
    return data_cli.main(["tabular", "--schema", str(tmp_path / "clicks.yaml"), "--input", str(tmp_path / name),
                          "--out", str(tmp_path / "data" / name.split(".")[0]), "--no-progress", *extra])


def _arrays(path: Path) -> dict:
    return {p.name: np.load(p) for p in sorted(path.glob("*.npy"))}


@pytest.fixture
def plain(tmp_path):
    (tmp_path / "clicks.yaml").write_text(SCHEMA)
    write_csv(tmp_path / "plain.csv", make_clicks(1500, seed=5))
    assert _convert(tmp_path, "plain.csv") == 0
    return _arrays(tmp_path / "data" / "plain")


def _same_dataset(tmp_path: Path, name: str, plain: dict) -> None:
    got = _arrays(tmp_path / "data" / name.split(".")[0])
    assert sorted(got) == sorted(plain)
    for key, array in plain.items():
        np.testing.assert_array_equal(got[key], array, err_msg=key)


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path, plain, capsys):
    text = (tmp_path / "plain.csv").read_text()
    (tmp_path / "excel.csv").write_text(text.replace("\n", "\r\n"), encoding="utf-8-sig")  # what Excel writes
    assert _convert(tmp_path, "excel.csv") == 0, capsys.readouterr().err
    _same_dataset(tmp_path, "excel.csv", plain)


def test_semicolons_between_fields_are_found_in_the_header(tmp_path, plain, capsys):
    write_csv(tmp_path / "semi.csv", make_clicks(1500, seed=5), delimiter=";")
    assert _convert(tmp_path, "semi.csv") == 0, capsys.readouterr().err
    _same_dataset(tmp_path, "semi.csv", plain)


def test_the_schema_can_set_the_delimiter(tmp_path, plain, capsys):
    write_csv(tmp_path / "set.csv", make_clicks(1500, seed=5), delimiter=";")
    (tmp_path / "clicks.yaml").write_text(SCHEMA + "delimiter: ';'\n")
    assert _convert(tmp_path, "set.csv") == 0, capsys.readouterr().err
    _same_dataset(tmp_path, "set.csv", plain)


def test_a_header_of_one_column_asks_for_the_delimiter(tmp_path, capsys):
    (tmp_path / "clicks.yaml").write_text(SCHEMA)
    write_csv(tmp_path / "colons.csv", make_clicks(200, seed=5), delimiter=":")
    assert _convert(tmp_path, "colons.csv") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "reads as one column" in err[0] and "Fix: set data.tabular.delimiter" in err[0], err[0]
    (tmp_path / "clicks.yaml").write_text(SCHEMA + "delimiter: ':'\n")  # the fix, followed
    assert _convert(tmp_path, "colons.csv") == 0


def test_a_field_over_128_kib_is_read(tmp_path, capsys):
    """A long text column the schema does not use, and a long categorical value."""
    cols = make_clicks(800, seed=5)
    cols["notes"] = ["x" * 300_000 if i == 7 else "short" for i in range(800)]
    cols["item"][9] = "i" * 200_000
    path = tmp_path / "long.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(cols))
        w.writerows(zip(*cols.values()))
    (tmp_path / "clicks.yaml").write_text(SCHEMA)
    assert _convert(tmp_path, "long.csv") == 0, capsys.readouterr().err[-2000:]
    meta = load_meta(tmp_path / "data" / "long")
    assert sum(meta.rows.values()) == 800
    assert not list((tmp_path / "data").glob(".*partial"))


def test_a_line_the_csv_module_cannot_split_names_file_and_line_and_leaves_nothing(tmp_path, capsys):
    cols = make_clicks(300, seed=5)
    path = write_csv(tmp_path / "nul.csv", cols)
    lines = path.read_text().splitlines()
    lines[41] = lines[41].replace(",", ",x\ry", 1)  # a bare carriage return inside a field: _csv.Error
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "clicks.yaml").write_text(SCHEMA)
    assert _convert(tmp_path, "nul.csv") == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [l for l in err if "error:" in l]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    assert f"{path}, line 42: cannot be read as CSV" in errors[0] and "Fix:" in errors[0], errors[0]  # header: line 1
    assert not list((tmp_path / "data").glob(".*partial")), "the partial conversion was left behind"


def test_columns_empty_in_every_row_are_named_with_a_fix(tmp_path, capsys, caplog):
    cols = make_clicks(600, seed=5)
    cols["price"] = [""] * 600
    cols["item"] = [""] * 600
    write_csv(tmp_path / "empty.csv", cols)
    (tmp_path / "clicks.yaml").write_text(SCHEMA)
    with caplog.at_level("WARNING", logger="slipstream_rec"):
        assert _convert(tmp_path, "empty.csv") == 0
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    price = [l for l in lines if "'price'" in l]
    item = [l for l in lines if "'item'" in l]
    assert len(price) == 1 and "dense column 'price'" in price[0] and "Fix:" in price[0], lines
    assert len(item) == 1 and "categorical column 'item'" in item[0] and "Fix:" in item[0], lines
    assert not [l for l in lines if "'views'" in l or "'user'" in l or "'tags'" in l], lines
