"""tests/covering.py: the compile checks' covering arrays hold every value and every pair of values."""

import itertools

import pytest

from covering import pairwise

CASES = [
    [range(1, 8)] * 3,                                                   # conv3d kernel sides
    [range(4), (False, True), (1, 4), (False, True), (False, True), range(3)],  # the scan's knobs
    [(0, 1)],                                                            # one parameter
]


@pytest.mark.parametrize("values", CASES, ids=["conv3d", "scan", "single"])
def test_every_pair_is_covered(values):
    chosen = pairwise(*values)
    assert len(set(chosen)) == len(chosen)
    for i, j in itertools.combinations(range(len(values)), 2):
        assert {(c[i], c[j]) for c in chosen} == set(itertools.product(values[i], values[j]))
    for i, options in enumerate(values):
        assert {c[i] for c in chosen} == set(options)
    assert len(chosen) <= len(list(itertools.product(*values)))
