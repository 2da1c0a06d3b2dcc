"""The serve action's local parts, in one process: replica, per-lookup split, served gradients.

Expected values come from plain Python loops over the samples and their ids (the independent
reference), never from the functions under test.
"""

from __future__ import annotations

import pytest
import torch

from slipstream_rec.slipstream.lockstep import lockstep
from slipstream_rec.slipstream.serve.push import ServedGradients, served_rows
from slipstream_rec.slipstream.serve.replica import StaleReplica
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.serve.split import ServePlan
from tests.slipstream._serving_case import DIM, FEATURES, REPLICA, ROWS, SAMPLES, _batch, _kjt, _replica, _replica_keys, _tables, _units


def _reference_pooled(samples, tables):
    out = torch.zeros(len(samples), len(FEATURES), DIM)
    for i, s in enumerate(samples):
        for f in range(len(FEATURES)):
            for row in s[f]:
                out[i, f] += tables[f][row]
    return out


FULLY_SERVED = [0, 1, 4]  # samples with lookups, every one of them a replica row


def _in_replica(f, row):
    return row in REPLICA[FEATURES[f]]


def _reference_parts(samples, tables):
    """Per bag, in plain loops: the replica part (sum of its replica rows) and the sharded ids."""
    local = torch.zeros(len(samples), len(FEATURES), DIM)
    sharded = [[[row for row in s[f] if not _in_replica(f, row)] for s in samples] for f in range(len(FEATURES))]
    for i, s in enumerate(samples):
        for f in range(len(FEATURES)):
            for row in s[f]:
                if _in_replica(f, row):
                    local[i, f] += tables[f][row]
    return local, sharded


@pytest.mark.parametrize("column_split", [False, True])
def test_replica_rows_membership_and_pooled_parts(column_split):
    replica, tables, index = _replica(column_split)
    assert replica.rows == 7 and replica.joined == 7 and replica.left == 0
    for key, value in zip(replica.keys.tolist(), replica.values):
        f = 0 if key < 6 else (1 if key < 15 else 2)
        row = key - [0, 6, 15][f]
        assert torch.equal(value, tables[f][row])  # full rows, columns assembled from the shards
    kjt = _kjt(SAMPLES)
    expected = [_in_replica(f, row) for f in range(len(FEATURES)) for s in SAMPLES for row in s[f]]
    flat = index.flat_keys(kjt)
    assert replica.contains(flat).tolist() == expected
    local = torch.tensor(expected)
    per_bag = torch.tensor([sum(_in_replica(f, row) for row in s[f]) for f in range(len(FEATURES)) for s in SAMPLES])
    pooled = replica.pooled(flat[local], per_bag)  # the bags in the KJT's order: feature-major
    reference, _ = _reference_parts(SAMPLES, tables)
    torch.testing.assert_close(pooled.view(len(FEATURES), len(SAMPLES), DIM).transpose(0, 1), reference)


def test_a_rebuild_reports_the_rows_that_joined_and_left():
    replica, tables, index = _replica()
    units = _units(tables)
    keys = torch.cat([index.to_flat(0, torch.tensor([0, 4])), index.to_flat(2, torch.tensor([1, 3]))])
    replica.rebuild(units, keys, {n: i for i, n in enumerate(FEATURES)})
    # before: a0 a1 a2 b0 b5 c1 c3; after: a0 a4 c1 c3
    assert (replica.joined, replica.left, replica.rows) == (1, 4, 4)
    left = torch.cat([index.to_flat(0, torch.tensor([1, 2])), index.to_flat(1, torch.tensor([0, 5]))])
    assert not replica.contains(left).any() and replica.contains(keys).all()


def _rebuilt(out, tables, sizes):
    """Exactness on the host: the sharded output (each slot's bag pooled from the full tables)
    put back by the inverse indices and added to the replica part: every bag's full pooled
    embedding if the split is right."""
    kjt = out.sparse_features
    lengths = kjt.lengths().tolist()
    values = kjt.values().tolist()
    inverse = kjt.inverse_indices()[1]
    rebuilt = torch.zeros(out.batch_size, len(FEATURES), DIM)
    at, pos = 0, 0
    for f, size in enumerate(sizes):
        bags = []
        for n in lengths[at : at + size]:
            bag = torch.zeros(DIM)
            for row in values[pos : pos + n]:
                bag += tables[f][row]
            pos += n
            bags.append(bag)
        at += size
        for i in range(out.batch_size):
            rebuilt[i, f] = bags[int(inverse[f, i])]
    return rebuilt + out.served.pooled.transpose(0, 1)


def test_split_serves_every_replica_lookup_and_packs_the_rest_per_feature():
    replica, tables, _ = _replica()
    plan = ServePlan(replica)
    batch = _batch(SAMPLES)
    local, sharded = _reference_parts(SAMPLES, tables)
    kept = [[i for i, ids in enumerate(sharded[f]) if ids] for f in range(len(FEATURES))]  # bags sent
    assert [len(k) for k in kept] == [1, 1, 0]  # a: sample 2 (a=3), b: sample 5 (b=8), c: none
    needed = plan.annotate(batch)
    assert needed == [2, 2, 1]  # each feature's kept bags and one empty bag
    # Another rank needed 3 slots of a: a sends 3, its kept bag first, then empty slots.
    sizes = [3, 2, 1]
    out = plan.split(batch, sizes)
    assert out.batch_size == 6 and out.sharded_sizes == sizes
    assert torch.equal(out.dense_features, batch.dense_features) and torch.equal(out.labels, batch.labels)
    lengths = []
    for f in range(len(FEATURES)):
        lengths += [len(sharded[f][i]) for i in kept[f]] + [0] * (sizes[f] - len(kept[f]))
    assert out.sparse_features.lengths().tolist() == lengths
    values = [row for f in range(len(FEATURES)) for i in kept[f] for row in sharded[f][i]]
    assert out.sparse_features.values().tolist() == values
    # every sample's bag: its kept slot, else the empty bag right after the kept ones
    inverse = [[kept[f].index(i) if i in kept[f] else len(kept[f]) for i in range(len(SAMPLES))] for f in range(3)]
    assert out.sparse_features.inverse_indices()[1].tolist() == inverse
    torch.testing.assert_close(out.served.pooled, local.transpose(0, 1))  # (F, B, D): the KJT's bag order
    torch.testing.assert_close(_rebuilt(out, tables, sizes), _reference_pooled(SAMPLES, tables))
    n_local = sum(_in_replica(f, row) for s in SAMPLES for f in range(len(FEATURES)) for row in s[f])
    assert plan.lookups_served == n_local == 16  # 3 + 4 + 2 + 5 + 2
    assert plan.samples_served == len(FULLY_SERVED)
    assert plan.slots_sent == sum(sizes) and plan.bags_split == len(SAMPLES) * len(FEATURES)
    assert plan.feature_served == [sum(_in_replica(f, r) for s in SAMPLES for r in s[f]) for f in range(3)]
    assert out.served.rows.counts.sum() == n_local and out.served.local is None


def test_a_data_parallel_feature_keeps_every_bag_in_place_and_counts_no_slots():
    replica, tables, _ = _replica()
    plan = ServePlan(replica, data_parallel=[False, True, False])
    batch = _batch(SAMPLES)
    _, sharded = _reference_parts(SAMPLES, tables)
    assert plan.annotate(batch) == [2, len(SAMPLES), 1]
    sizes = [2, len(SAMPLES), 1]
    out = plan.split(batch, sizes)
    b_lengths = out.sparse_features.lengths().tolist()[2 : 2 + len(SAMPLES)]
    assert b_lengths == [len(sharded[1][i]) for i in range(len(SAMPLES))]  # in place, emptied where served
    assert out.sparse_features.inverse_indices()[1][1].tolist() == list(range(len(SAMPLES)))
    torch.testing.assert_close(_rebuilt(out, tables, sizes), _reference_pooled(SAMPLES, tables))
    assert plan.slots_sent == 2 + 1 and plan.bags_split == len(SAMPLES) * 2


def test_without_a_replica_every_lookup_goes_through_the_shards():
    plan = ServePlan(None)
    batch = _batch(SAMPLES)
    assert plan.annotate(batch) == [len(SAMPLES)] * len(FEATURES) and plan.width == 0
    out = next(lockstep(iter([batch]), plan=plan))  # one process: the agreement is local
    assert out is batch and out.served is None and plan.samples_served == 0 and plan.lookups_served == 0
    assert plan.slots_sent == plan.bags_split == len(SAMPLES) * len(FEATURES)


def test_one_process_lockstep_sends_exactly_the_needed_slots():
    replica, _, _ = _replica()
    plan = ServePlan(replica)
    out = next(lockstep(iter([_batch(SAMPLES)]), plan=plan))
    assert out.sharded_sizes == [2, 2, 1] and out.served.pooled.shape == (3, len(SAMPLES), DIM)


def test_served_gradients_sum_per_row_over_every_occurrence():
    index = RowIndex(FEATURES, ROWS)
    grads = ServedGradients(index, DIM)
    kjt = _kjt(SAMPLES)
    flat = index.flat_keys(kjt)
    local = torch.tensor([_in_replica(f, row) for f in range(len(FEATURES)) for s in SAMPLES for row in s[f]])
    bags = torch.repeat_interleave(torch.arange(kjt.lengths().numel()), kjt.lengths().long())
    g = torch.Generator().manual_seed(5)
    bag_grads = [torch.randn(len(FEATURES), len(SAMPLES), DIM, generator=g) for _ in range(2)]  # (F, B, D)
    replica, _, _ = _replica()
    pos = torch.searchsorted(replica.keys, flat[local])  # each served lookup's replica row
    for bg in bag_grads:  # two steps
        grads.add(served_rows(pos, bags[local], replica.keys), bg)
    expected = {}
    for bg in bag_grads:
        for i, s in enumerate(SAMPLES):
            for f in range(len(FEATURES)):
                for row in s[f]:
                    if _in_replica(f, row):  # only the served lookups owe their rows a gradient
                        key = int(index.offsets[f]) + row
                        expected[key] = expected.get(key, torch.zeros(DIM)) + bg[f, i]
    assert grads.keys.tolist() == sorted(expected)
    torch.testing.assert_close(grads.grads, torch.stack([expected[k] for k in sorted(expected)]))


def test_a_steps_row_sums_equal_a_sequential_index_add_bit_for_bit():
    # many lookups per row in a random order: the grouping by row must keep batch order within
    # a row, so the sums round exactly as a one-thread index_add_ over the lookups does
    g = torch.Generator().manual_seed(11)
    num_bags, lookups, dim = 64, 900, 8
    keys = torch.arange(0, 400, 3)  # sorted flat keys of a replica
    pos = torch.randint(0, keys.numel() // 2, (lookups,), generator=g) * 2  # half the rows, uneven
    bags = torch.randint(0, num_bags, (lookups,), generator=g)
    bag_grads = torch.randn(num_bags, dim, generator=g) * torch.logspace(-4, 4, num_bags).unsqueeze(1)
    rows = served_rows(pos, bags, keys)
    assert torch.equal(rows.keys, keys[torch.unique(pos)])
    assert torch.equal(rows.counts, torch.bincount(pos)[torch.unique(pos)])
    sums = ServedGradients(RowIndex(["f"], [400]), dim)
    sums.add(rows, bag_grads.view(1, num_bags, dim))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        inverse = torch.searchsorted(torch.unique(pos), pos)
        expected = torch.zeros(rows.keys.numel(), dim).index_add_(0, inverse, bag_grads[bags])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(sums.grads, expected)


def _synced_replica(wire, column_split):
    """A replica of REPLICA's rows whose syncs send ``wire``, built once from fresh tables."""
    index = RowIndex(FEATURES, ROWS)
    tables = _tables()
    units = _units(tables, column_split)
    features = {n: i for i, n in enumerate(FEATURES)}
    replica = StaleReplica(index, DIM, torch.device("cpu"), wire)
    keys = _replica_keys(index)
    replica.rebuild(units, keys, features)
    return index, tables, units, features, replica, keys


@pytest.mark.parametrize("column_split", [False, True])
def test_a_bf16_sync_sends_differences_from_the_copy_and_not_its_own_rounding(column_split):
    index, tables, units, features, replica, keys = _synced_replica(torch.bfloat16, column_split)

    def shard(key):
        f, row = index.from_flat(key.view(1))
        return tables[int(f)][int(row)]

    # rows that join arrive as bf16 values: rounded, within 2^-8 of each value
    for k, v in zip(replica.keys, replica.values):
        assert torch.equal(v, shard(k).bfloat16().float())
    # a (column, width, rows) descriptor per shard (int64), a position per row per shard
    # (int32; b's 2 rows from both of its column shards when split), every value at 2 bytes
    shards, positions = (4, 9) if column_split else (3, 7)
    assert replica.sync_bytes == shards * 3 * 8 + positions * 4 + 7 * DIM * 2
    # nothing moved: the copies' rounding is not a move, nothing is sent again
    sent, nbytes = replica.rows_sent, replica.sync_bytes
    replica.rebuild(units, keys, features, bound=0.0)
    assert (replica.rows_sent, replica.sync_bytes) == (sent, nbytes)
    # b5 moves by 0.3 in one column: its difference from the copy is sent and added to the copy
    b5 = int(index.to_flat(1, torch.tensor([5])))
    before = dict(zip(replica.keys.tolist(), replica.values.clone()))[b5]
    tables[1][5, 2] += 0.3
    replica.rebuild(units, keys, features, bound=0.0)
    assert replica.rows_sent - sent == 1  # one slice: the shard holding column 2
    width = DIM if not column_split else DIM - 1
    assert replica.sync_bytes - nbytes == 3 * 8 + 4 + width * 2
    after = dict(zip(replica.keys.tolist(), replica.values))[b5]
    cols = slice(0, DIM) if not column_split else slice(1, DIM)
    expected = before.clone()
    expected[cols] = before[cols] + (tables[1][5, cols] - before[cols]).bfloat16().float()
    assert torch.equal(after, expected) and not torch.equal(after, tables[1][5].bfloat16().float())


@pytest.mark.parametrize("column_split", [False, True])
def test_an_int8_sync_sends_a_byte_a_value_and_a_scale_a_row_and_resends_its_rounding_until_below_2_to_the_minus_8(column_split):
    index, tables, units, features, replica, keys = _synced_replica(torch.int8, column_split)
    # each shard's slice of a row that joins arrives at its own scale: every value within 1/254
    # (x 1 + 2^-7, the scale's bf16) of the slice's largest magnitude
    slices = [(0, 1), (1, DIM)] if column_split else [(0, DIM)]
    for k, v in zip(replica.keys, replica.values):
        f, row = index.from_flat(k.view(1))
        shard = tables[int(f)][int(row)]
        for c0, c1 in slices if int(f) == 1 else [(0, DIM)]:
            assert float((v[c0:c1] - shard[c0:c1]).abs().max()) <= float(shard[c0:c1].abs().max()) / 254 * (1 + 2**-7) * 1.0001
    # a descriptor per shard (3 int64), a position per row per shard (int32), and per row of a
    # shard its values at a byte each plus its 2-byte (bf16) scale: a 3 rows and c 2 at DIM + 2,
    # b's 2 at DIM + 2 or, split, at 1 + 2 and DIM - 1 + 2
    shards, positions = (4, 9) if column_split else (3, 7)
    values = 5 * (DIM + 2) + (2 * (1 + 2) + 2 * (DIM - 1 + 2) if column_split else 2 * (DIM + 2))
    assert replica.sync_bytes == shards * 3 * 8 + positions * 4 + values
    # what the rounding left is sent again where it exceeds 2^-8 of the value, each time at a
    # 254th of what was left: within a few syncs nothing is sent and the copy is within it
    sent = []
    for _ in range(6):
        before = replica.rows_sent
        replica.rebuild(units, keys, features, bound=0.0)
        sent.append(replica.rows_sent - before)
    assert sent[-1] == 0 and sent == sorted(sent, reverse=True), sent
    for k, v in zip(replica.keys, replica.values):
        f, row = index.from_flat(k.view(1))
        shard = tables[int(f)][int(row)]
        assert bool(((v - shard).abs() <= shard.abs() * 2**-8).all())
    # b5 moves by 0.3 in one column: the shard's difference from the copy, at its own scale
    b5 = int(index.to_flat(1, torch.tensor([5])))
    before = dict(zip(replica.keys.tolist(), replica.values.clone()))[b5]
    tables[1][5, 2] += 0.3
    rows, nbytes = replica.rows_sent, replica.sync_bytes
    replica.rebuild(units, keys, features, bound=0.0)
    width = DIM if not column_split else DIM - 1
    assert replica.rows_sent - rows == 1 and replica.sync_bytes - nbytes == 3 * 8 + 4 + width + 2
    after = dict(zip(replica.keys.tolist(), replica.values))[b5]
    diff = tables[1][5] - before
    assert float((after - tables[1][5]).abs().max()) <= float(diff.abs().max()) / 254 * (1 + 2**-7) * 1.0001
    # the largest: within its step's half (the scale rounded up to a bf16)
    assert float(after[2] - before[2]) == pytest.approx(float(diff[2]), rel=(1 + 2**-7) / 254)


@pytest.mark.parametrize("column_split", [False, True])
def test_a_sync_sends_only_the_rows_that_moved_past_the_bound_and_the_rows_that_joined(column_split):
    replica, tables, index = _replica(column_split)
    units = _units(tables, column_split)
    features = {n: i for i, n in enumerate(FEATURES)}
    sent_before = replica.rows_sent
    # b5 moves by 0.5 in one column, c1 by 0.01; a row that joins (a4) is new to the replica
    tables[1][5, 2] += 0.5
    tables[2][1, 0] += 0.01
    keys = torch.cat([replica.keys, index.to_flat(0, torch.tensor([4]))]).sort().values
    replica.rebuild(units, keys, features, bound=0.1)
    held = {int(k): v for k, v in zip(replica.keys, replica.values)}
    b5, c1, a4 = int(index.to_flat(1, torch.tensor([5]))), int(index.to_flat(2, torch.tensor([1]))), 4
    assert torch.equal(held[b5], tables[1][5]) and torch.equal(held[a4], tables[0][4])
    assert held[c1][0] == tables[2][1, 0] - 0.01  # within the bound: the copy stays as it was
    # a4 whole, and b5 from the one shard whose columns moved (its column 2: the second
    # column shard when b is split)
    assert replica.rows_sent - sent_before == 2
    assert (replica.joined, replica.left) == (1, 0)
    # bound 0: every row that moved at all; -1: every row
    replica.rebuild(units, keys, features, bound=0.0)
    assert torch.equal(dict(zip(replica.keys.tolist(), replica.values))[c1], tables[2][1])
    before = replica.rows_sent
    replica.rebuild(units, keys, features, bound=0.0)
    assert replica.rows_sent == before  # nothing moved: nothing sent
    replica.rebuild(units, keys, features, bound=-1.0)
    # every row from every shard holding columns of it: 8 rows, b's 2 twice when b is split
    assert replica.rows_sent - before == keys.numel() + (2 if column_split else 0)


@pytest.mark.parametrize("column_split", [False, True])
def test_a_sync_of_the_suspect_rows_reads_only_them_and_every_data_parallel_row(column_split):
    replica, tables, index = _replica(column_split)
    units = _units(tables, column_split)
    units[-1].replicated = True  # c: data-parallel (every rank holds it: compared here, never sent)
    features = {n: i for i, n in enumerate(FEATURES)}
    b0, b5 = (int(index.to_flat(1, torch.tensor([r]))) for r in (0, 5))
    a1, c3 = int(index.to_flat(0, torch.tensor([1]))), int(index.to_flat(2, torch.tensor([3])))
    tables[1][0, 2] += 0.5  # b0: said to have moved
    tables[0][1, 0] += 0.5  # a1: moved, not said (what a push never does)
    tables[2][3, 1] += 0.5  # c3: a data-parallel row, not said
    sent, nbytes = replica.rows_sent, replica.sync_bytes
    keys = replica.keys.clone()
    suspects = torch.tensor(sorted([b0, b5, int(index.to_flat(1, torch.tensor([8])))]))  # b8: not a replica row
    replica.rebuild(units, keys, features, bound=0.0, suspects=suspects)
    held = {int(k): v for k, v in zip(replica.keys, replica.values)}
    assert torch.equal(held[b0], tables[1][0]) and torch.equal(held[c3], tables[2][3])
    assert held[a1][0] == tables[0][1, 0] - 0.5  # not read: left as it was
    assert torch.equal(held[b5], tables[1][5])  # read, did not move
    # b0 alone is sent, from the one shard holding its column 2; c3 is copied locally
    assert replica.rows_sent - sent == 1
    assert replica.sync_bytes - nbytes == 3 * 8 + 4 + (DIM - 1 if column_split else DIM) * 4
    assert (replica.joined, replica.left, replica.rows) == (0, 0, keys.numel())
    # a full comparison finds a1
    replica.rebuild(units, keys, features, bound=0.0)
    assert torch.equal(dict(zip(replica.keys.tolist(), replica.values.clone()))[a1], tables[0][1])
    # the rows change: a row that joins (a4) is sent whole though no suspect, a row that leaves
    # (b0) is gone, a held row that moved unsaid (a2) stays as it was, a suspect (b5) is read
    a2, a4 = (int(index.to_flat(0, torch.tensor([r]))) for r in (2, 4))
    a2_copy = dict(zip(replica.keys.tolist(), replica.values.clone()))[a2]
    tables[0][2, 1] += 0.25
    tables[1][5, 0] += 0.25
    new_keys = torch.tensor(sorted((set(keys.tolist()) - {b0}) | {a4}))
    sent = replica.rows_sent
    replica.rebuild(units, new_keys, features, bound=0.0, suspects=torch.tensor([b5]))
    held = {int(k): v for k, v in zip(replica.keys, replica.values)}
    assert sorted(held) == new_keys.tolist() and torch.equal(replica.joined_keys, torch.tensor([a4]))
    assert torch.equal(held[a4], tables[0][4]) and torch.equal(held[b5], tables[1][5])
    assert torch.equal(held[a2], a2_copy) and not torch.equal(held[a2], tables[0][2])
    # a4 whole from its one shard, b5 from the shard holding its column 0 (b's first when split)
    assert replica.rows_sent - sent == 2
    assert (replica.joined, replica.left) == (1, 1)


@pytest.mark.parametrize("dense", [True, False])
def test_locate_finds_exactly_the_replica_rows_after_every_rebuild(dense):
    replica, tables, index = _replica()
    if not dense:
        replica._where = None  # the binary search of a replica over too many rows for a map
    assert (replica._where is not None) == dense
    units = _units(tables)
    features = {n: i for i, n in enumerate(FEATURES)}
    every = torch.cat([torch.arange(index.num_rows), torch.tensor([0, 18])])  # 21 keys, repeats too
    for keys in ([0, 2, 7, 12, 17], [2, 3, 12, 18], []):  # rows join, leave, all leave
        keys = torch.tensor(keys, dtype=torch.int64)
        replica.rebuild(units, keys, features)
        flat = every[torch.randperm(every.numel(), generator=torch.Generator().manual_seed(1))].view(-1, 3)
        pos, found = replica.locate(flat)
        members = {int(k): i for i, k in enumerate(keys)}
        assert found.tolist() == [[int(k) in members for k in row] for row in flat]
        assert [p for p, f in zip(pos.view(-1).tolist(), found.view(-1).tolist()) if f] == [
            members[int(k)] for k in flat.view(-1) if int(k) in members]
