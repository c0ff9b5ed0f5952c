"""Covering arrays for the CPU tier's compile checks: a few combinations of template parameters in which
every value of every parameter, and every pair of values of two parameters, appear at least once.

A compile failure tied to one value or to a pair of values shows in such a set; one that needs three
particular values at once may not. The GPU tier compiles and runs the full products (every conv3d kernel
shape, every scan dtype, mode and schedule), so the CPU tier checks the sources compile for sm_80 and
sm_90a without compiling each of hundreds of instantiations twice.
"""

from __future__ import annotations

import itertools


def pairwise(*values: list) -> list[tuple]:
    """A small list of tuples (one value per parameter) covering every pair of values of every two
    parameters; greedy, deterministic (each step takes the first tuple of the full product that covers the
    most pairs still uncovered)."""
    uncovered = {(i, a, j, b) for i, j in itertools.combinations(range(len(values)), 2)
                 for a in values[i] for b in values[j]}
    uncovered |= {(i, a) for i in range(len(values)) for a in values[i]}  # single values (one parameter)
    product = list(itertools.product(*values))

    def pairs(combo):
        return ({(i, combo[i], j, combo[j]) for i, j in itertools.combinations(range(len(combo)), 2)}
                | {(i, a) for i, a in enumerate(combo)})

    chosen = []
    while uncovered:
        best = max(product, key=lambda combo: len(pairs(combo) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen
