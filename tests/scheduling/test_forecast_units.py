"""forecast.Units keeps nodes by free count (#28): it must take and give exactly as the plain scan did."""

from __future__ import annotations

import random

import pytest

from scheduling.forecast import Units


class ScanUnits:
    """The reference: Units as it was before the free-count index, scanning every node at every step."""

    def __init__(self, free: dict[int, int], per_node: bool):
        self.free = dict(sorted(free.items()))
        self.total = sum(self.free.values())
        self.per_node = per_node

    def take(self, count: int):
        if self.per_node and count > 1:
            fitting = [(n, node) for node, n in self.free.items() if n >= count]
            if not fitting:
                return None
            _, node = min(fitting)
            taken = ((node, count),)
        elif self.total < count:
            return None
        else:
            taken, left = [], count
            for node, n in self.free.items():
                if n and left:
                    k = min(n, left)
                    taken.append((node, k))
                    left -= k
            taken = tuple(taken)
        for node, k in taken:
            self.free[node] -= k
        self.total -= count
        return taken

    def give(self, nodes) -> None:
        new = False
        for node, k in nodes:
            new = new or node not in self.free
            self.free[node] = self.free.get(node, 0) + k
            self.total += k
        if new:
            self.free = dict(sorted(self.free.items()))

    def fits(self, count: int) -> bool:
        if self.per_node and count > 1:
            return any(n >= count for n in self.free.values())
        return self.total >= count


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("per_node", [True, False])
def test_units_take_give_and_fit_as_the_scan_did(seed, per_node):
    rng = random.Random(seed)
    free = {rng.randrange(1, 400): rng.randrange(0, 9) for _ in range(rng.randrange(1, 60))}
    if not per_node:
        free = {0: sum(free.values())}
    fast, slow = Units(free, per_node), ScanUnits(free, per_node)
    held = []
    for step in range(400):
        if step % 50 == 0:  # a draw starts from a copy: the copy must behave alike and leave the original alone
            fast = fast.copy()
        count = rng.choice((1, 1, 2, 4, 8))
        assert fast.fits(count) == slow.fits(count)
        if held and rng.random() < 0.45:
            nodes = held.pop(rng.randrange(len(held)))
            fast.give(nodes)
            slow.give(nodes)
        elif rng.random() < 0.1:  # units of a node not seen yet (a holder's node)
            nodes = ((rng.randrange(400, 500), rng.randrange(1, 9)),)
            fast.give(nodes)
            slow.give(nodes)
        else:
            taken = fast.take(count)
            assert taken == slow.take(count)
            if taken is not None:
                held.append(taken)
        assert fast.free == slow.free
        assert list(fast.free) == list(slow.free)  # first-fit order: by node id
        assert fast.total == slow.total


def test_copy_leaves_the_original_unchanged():
    units = Units({1: 8, 2: 4}, True)
    copy = units.copy()
    assert copy.take(8) == ((1, 8),)
    assert units.take(4) == ((2, 4),)  # the best fit in the original, whose node 1 still has 8
    assert units.free == {1: 8, 2: 0}
    assert copy.free == {1: 0, 2: 4}
