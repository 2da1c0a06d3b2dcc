"""``data.source=clicklog``: the entity-structured click-log simulator.

``world`` (entities, their attributes and the day's popularity), ``sampling`` (weighted draws by
group), ``teacher`` (the hidden click model), ``counters`` (the dense features a logging pipeline
would know), ``writer`` (rows into the splits' npy files) and ``generate`` (config, hash and the
day-by-day simulation). ``slipstream-data clicklog`` runs it.
"""
