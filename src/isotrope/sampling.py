"""Samples of a stream of unknown length in one pass and bounded memory: uniform (``reservoir_sample``) and
fair across groups (``fair_sample``: one huge file cannot crowd out the others). Ingestion, reshaping and the
evaluation harness fit encoders on them."""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Sequence
from itertools import islice
from typing import TypeVar

T = TypeVar("T")


def reservoir_sample(items: Iterable[str], size: int, seed: int = 0) -> list[str]:
    """A uniform sample of ``size`` items from a stream of unknown length (Algorithm R)."""
    iterator = iter(items)
    sample = list(islice(iterator, size))
    rng = random.Random(seed)
    for seen, item in enumerate(iterator, start=size + 1):
        slot = rng.randrange(seen)
        if slot < size:
            sample[slot] = item
    return sample


def fair_level(counts: Sequence[int], size: int) -> int:
    """The largest per-group cap L with ``sum(min(count, L)) <= size`` (max-min fair shares of ``size``)."""
    ordered = sorted(counts)
    used = 0
    for index, count in enumerate(ordered):
        remaining = len(ordered) - index
        if count * remaining > size - used:  # this group and every larger one get the even share of what is left
            return (size - used) // remaining
        used += count
    return max(ordered, default=size)


def fair_sample(items: Iterable[tuple[Hashable, T]], size: int, seed: int = 0) -> list[T]:
    """A sample of ``size`` items from a stream of ``(group, item)`` in which every group gets a fair share.

    Shares are max-min fair: a group with fewer items than its share gives them all and the rest is
    split evenly among the larger groups, so one huge file cannot crowd out the others. Each group
    keeps a uniform reservoir (Algorithm R) whose capacity only shrinks as groups arrive; memory stays
    within ``size`` plus a tenth. Groups keep their order of arrival.
    """
    rng = random.Random(seed)
    counts: dict[Hashable, int] = {}
    reservoirs: dict[Hashable, list[T]] = {}
    caps: dict[Hashable, int] = {}  # a group's capacity; new groups get ``level``
    level, held, slack = size, 0, max(size // 10, 1)

    def shrink() -> None:
        nonlocal level, held
        level = fair_level(list(counts.values()), size)
        spare = size - sum(min(count, level) for count in counts.values())
        for group, reservoir in reservoirs.items():
            # the integer remainder goes one each to the first groups that hold more than the level
            caps[group] = level + 1 if spare > 0 and len(reservoir) > level else level
            spare -= caps[group] > level
            if len(reservoir) > caps[group]:
                reservoirs[group] = rng.sample(reservoir, caps[group])
        held = sum(map(len, reservoirs.values()))

    for group, item in items:
        seen = counts[group] = counts.get(group, 0) + 1
        reservoir = reservoirs.setdefault(group, [])
        cap = caps.setdefault(group, level)
        if len(reservoir) < cap:
            reservoir.append(item)
            held += 1
            if held > size + slack:
                shrink()
        else:
            slot = rng.randrange(seen)
            if slot < cap:
                reservoir[slot] = item
    if held > size:
        shrink()
    return [item for reservoir in reservoirs.values() for item in reservoir]
