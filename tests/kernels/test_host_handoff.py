"""The hand-off kernels' split (`kernels.host_handoff`): the stage kernel hands the host the
same misses as `split_misses`, its torch form, stages exactly the pairs whose entry is then
the host's, and `add_out` adds the host's sum and puts the table back. Under the interpreter on
the CPU; on CUDA where the device tests run."""
import pytest
import torch

from ninfer_engine.kernels.host_handoff import add_out, split_misses, stage_pairs

HOST = 9  # the host's entry (a layer's zero row, after its slots)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _table():
    """8 experts: 0, 2 and 5 resident (slots 0-2), the rest read in place (-1 - e); column 8
    the shared expert's row."""
    slot = {0: 0, 2: 1, 5: 2}
    return torch.tensor([slot.get(e, -1 - e) for e in range(8)] + [3], device=DEVICE)


def _stage(ids, table, split, rows=2):
    k = ids.numel() // rows
    H = 4
    y = torch.arange(rows * H, dtype=torch.float32, device=DEVICE).view(rows, H)
    weights = torch.linspace(0.1, 0.9, ids.numel(), device=DEVICE)
    stages = (torch.zeros(rows * H, device=DEVICE),
              torch.full((rows * k,), -7, dtype=torch.long, device=DEVICE),
              torch.zeros(rows * k, device=DEVICE),
              torch.full((rows * k,), -7, dtype=torch.long, device=DEVICE))
    need = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    stage_pairs(y, ids, weights, table, HOST, stages, need, split)
    return stages, need, y, weights


def _collect(ids, table, need):
    """`add_out` over 1,500 values (two programs: the first also restores); whether it added."""
    out = torch.arange(1500, dtype=torch.float32, device=DEVICE)
    acc = torch.ones(1500, device=DEVICE)
    add_out(out, acc, need, ids, table, HOST)
    if torch.equal(acc, out + 1):
        return True
    assert torch.equal(acc, torch.ones_like(acc))
    return False


@pytest.mark.parametrize("ids,counts", [
    ([1, 0, 3, 4, 2, 6], [0, 1, 1, 2, 2]),     # 4 misses → 2: experts 1 and 3
    ([1, 0, 3, 4, 2, 6], [0, 0, 0, 0, 0]),     # none taken: nothing staged
    ([1, 0, 3, 4, 2, 6], [0, 9]),              # past the end: the last entry, capped by m
    ([3, 8, 3, 1, 3, 8], [0, 1, 1, 1, 1, 1]),  # a picked expert's later pairs go too
    ([0, 2, 8, 5, 0, 8], [0, 1]),              # no misses at all
])
def test_the_stage_kernel_hands_the_host_what_split_misses_does(ids, counts):
    ids = torch.tensor(ids, device=DEVICE)
    split = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    want = _table()
    split_misses(ids, want, split, HOST)
    misses = int((_table()[ids] < 0).sum())
    assert int((want == HOST).sum()) == min(counts[min(misses, len(counts) - 1)], misses)
    table = _table()
    (x, sids, sweights, sentries), need, y, weights = _stage(ids, table, split)
    assert torch.equal(table, want)
    host = bool((want[ids] == HOST).any())
    assert int(need) == host
    if host:  # the rows and every pair staged, with the entries after the split
        assert torch.equal(x, y.view(-1)) and torch.equal(sids, ids)
        assert torch.equal(sweights, weights) and torch.equal(sentries, want[ids])
    else:  # nothing staged
        assert (sids == -7).all() and (sentries == -7).all()
    assert _collect(ids, table, need) == host
    assert torch.equal(table, _table())


def test_collecting_leaves_a_layer_that_handed_nothing_over_alone():
    """`need` 0: nothing added, and the table is not read or written (an entry that looks like
    the host's stays: `add_out` only undoes what this layer's split wrote)."""
    table = _table()
    table[4] = HOST
    ids = torch.tensor([4, 1], device=DEVICE)
    assert not _collect(ids, table, torch.zeros(1, dtype=torch.int32, device=DEVICE))
    assert int(table[4]) == HOST


def test_without_a_split_the_stage_kernel_only_reads_the_table():
    table = _table()
    table[6] = HOST  # an entry the host's (as a caller's table may hold)
    ids = torch.tensor([6, 1, 3, 0], device=DEVICE)
    (_, sids, _, sentries), need, _, _ = _stage(ids, table, None)
    assert torch.equal(table[:6], _table()[:6]) and int(need) == 1
    assert torch.equal(sentries, table[ids]) and torch.equal(sids, ids)
