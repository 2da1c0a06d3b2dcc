"""A small click log with a multi-valued column and real signal, written as CSV / TSV / Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np

COLUMNS = ["click", "ts", "price", "views", "user", "item", "tags"]


def make_clicks(n: int, seed: int = 0) -> Dict[str, List[str]]:
    """Columns as text. Label ~ Bernoulli(sigmoid(user + item + sum of tag effects + dense)).

    Skewed (Zipf-like) users, items and tags, so that a few rows are hot; tags: 0-4 per row.
    """
    rng = np.random.default_rng(seed)
    zipf = lambda k, m: np.minimum(rng.zipf(1.4, m), k) - 1  # noqa: E731
    user = zipf(300, n)
    item = zipf(200, n)
    n_tags = rng.integers(0, 5, n)
    tag_vals = zipf(40, int(n_tags.sum()))
    eff_rng = np.random.default_rng(1234)
    u_eff, i_eff, t_eff = eff_rng.normal(0, 1.0, 300), eff_rng.normal(0, 1.0, 200), eff_rng.normal(0, 0.8, 40)
    views = rng.poisson(3, n)
    price = np.round(rng.lognormal(2, 1, n), 2)
    starts = np.concatenate([[0], np.cumsum(n_tags)])
    tag_sum = np.array([t_eff[tag_vals[starts[i] : starts[i + 1]]].sum() for i in range(n)])
    logit = -0.5 + u_eff[user] + i_eff[item] + tag_sum + 0.3 * np.log1p(views)
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    tags = ["|".join(f"t{v}" for v in tag_vals[starts[i] : starts[i + 1]]) for i in range(n)]
    return {
        "click": [str(c) for c in click],
        "ts": [str(1_600_000_000 + i * 10) for i in range(n)],
        "price": [f"{p}" for p in price],
        "views": [str(v) for v in views],
        "user": [f"u{u}" for u in user],
        "item": [f"item-{i}" for i in item],
        "tags": tags,
    }


def write_csv(path: Path, cols: Dict[str, List[str]], delimiter: str = ",", header: bool = True) -> Path:
    names = list(cols)
    lines = [delimiter.join(names)] if header else []
    lines += [delimiter.join(row) for row in zip(*cols.values())]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path, cols: Dict[str, List[str]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "click": pa.array([int(x) for x in cols["click"]], pa.int8()),
            "ts": pa.array([int(x) for x in cols["ts"]], pa.int64()),
            "price": pa.array([float(x) for x in cols["price"]], pa.float64()),
            "views": pa.array([int(x) for x in cols["views"]], pa.int32()),
            "user": pa.array(cols["user"]),
            "item": pa.array(cols["item"]),
            "tags": pa.array([t.split("|") if t else [] for t in cols["tags"]], pa.list_(pa.string())),
        }
    )
    pq.write_table(table, path, row_group_size=1000)
    return path
