"""Slipstream's serve action: stale lookups answered from a local replica, no sample dropped.

- ``split.py``: each batch's lookups split between the shards and the replica (the data side);
- ``replica.py``: the stale hot rows on every rank, kept fresh by syncs that send what moved;
- ``push.py``: the served lookups' row gradients, summed and pushed to the rows' owners;
- ``lever.py``: whether serving pays in this run, from timed windows (``serve_when=auto``), and
  ``lever_clock.py``: those windows timed, agreed and acted on after every step;
- ``server.py``: the replica, the split and the pushes of one rank, as the controller drives them
  (``NoServe``: the same calls where nothing is served).
"""

from slipstream_rec.slipstream.serve.server import WIRE_DTYPES, NoServe, StaleServer

__all__ = ["NoServe", "StaleServer", "WIRE_DTYPES"]
