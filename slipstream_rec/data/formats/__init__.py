"""Raw input formats read by the converter: Criteo TSV (``criteo``), CSV / TSV / Parquet with a
schema (``tabular``), MovieLens-1M (``movielens``) and the file reading they share
(``rawfiles``). Each is a ``convert.source.Source``.
"""
