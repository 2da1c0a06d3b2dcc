"""``python -m slipstream_rec.data.generated.clicklog``: simulate a click log and print its statistics."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import List, Optional

from slipstream_rec.data.generated.clicklog.generate import generate_dataset
from slipstream_rec.data.meta import META_FILE


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m slipstream_rec.data.generated.clicklog [--out DIR] [OVERRIDES]``: simulate a click log.

    Without --out: the cached ``data=clicklog`` dataset (with ``data.clicklog.*`` overrides);
    with --out: a fresh directory. Prints the path, rows, generation rows/s and the statistics.
    """
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", help="generate into this new directory instead of the cache")
    parser.add_argument("overrides", nargs="*", help="e.g. data.clicklog.rows_per_day=100000")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    from slipstream_rec.config import load_config
    from slipstream_rec.data.datasets import (
        ensure_dataset,  # the cache: this entry point only
    )

    data = load_config(["data=clicklog", *args.overrides]).data
    wall, cpu = time.perf_counter(), time.process_time()
    if args.out:
        path = Path(args.out)
        path.mkdir(parents=True)
        generate_dataset(data.clicklog, path)
    else:
        path = ensure_dataset(data)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    meta = json.loads((path / META_FILE).read_text())
    rows = sum(meta["rows"].values())
    print(json.dumps({
        "path": str(path), "rows": meta["rows"], "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
        "rows_per_second": round(rows / wall), "ctr": meta["ctr"], "teacher_auc": meta["teacher_auc"],
        "train_top_1pct_rows_lookup_share": meta["generator"]["train_top_1pct_rows_lookup_share"],
        "tables": dict(zip(meta["sparse_feature_names"], meta["num_embeddings_per_feature"])),
    }))


if __name__ == "__main__":
    main()
