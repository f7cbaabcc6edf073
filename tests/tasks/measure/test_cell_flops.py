"""tasks/measure/cell_flops.py: the FLOP model of padded cell contexts and the batch sums,
against values computed by hand."""

from __future__ import annotations

import torch

from tasks.measure.cell_flops import CellMoments, FlopModel


def test_fit_recovers_the_three_numbers_and_refuses_a_count_of_another_form():
    true = FlopModel(linear=10, quadratic=4, constant=7)
    counts = {n: true.context(n) for n in (1, 2, 3, 4)}
    assert counts == {1: 21, 2: 43, 3: 73, 4: 111}
    assert FlopModel.fit(counts) == true
    assert FlopModel.fit({**counts, 4: 112}) is None  # one FLOP off at 4 cells
    cubic = {n: n**3 for n in (1, 2, 3, 4)}
    assert FlopModel.fit(cubic) is None


def test_moments_give_present_and_padded_flops_of_the_batches():
    # batch 1: contexts of 2 and 5 cells padded to 5; batch 2: one context of 3 cells
    b1 = torch.tensor([[False, False, True, True, True], [False] * 5])
    b2 = torch.tensor([[False, False, False]])
    m = CellMoments()
    m.add(b1)
    m.add(b2)
    assert (m.contexts, m.cells, m.cells_squared) == (3, 10, 4 + 25 + 9)
    assert (m.padded_cells, m.padded_cells_squared) == (13, 2 * 25 + 9)
    fm = FlopModel(linear=10, quadratic=4, constant=7)
    assert m.present_flops(fm) == fm.context(2) + fm.context(5) + fm.context(3) == 43 + 157 + 73
    assert m.padded_flops(fm) == 2 * fm.context(5) + fm.context(3) == 2 * 157 + 73
