"""What the planner evicts: its two choices, apart from its bookkeeping.

``Victims`` orders the evictable blobs by their next need, furthest first (Belady's rule: the
blob needed last is the one whose space is free the longest), then the largest, then by name, so
every plan is the same on every run. ``cheapest_window`` answers the other question: where a blob
goes when the pool's free space is in pieces (nothing moves once placed): the run of consecutive
blocks, free or evictable, that is cheapest to clear.
"""
import heapq

__all__ = ["Victims", "cheapest_window"]


class Victims:
    """The evictable blobs, furthest next need first. A blob is (re-)entered with ``key`` when
    its next need changes; older entries of it become stale (their number is no longer its
    entry's) and are skipped when popped, which keeps re-keying a push instead of a search."""

    def __init__(self):
        self._heap: list[tuple] = []     # (-need, -nbytes, name, entry number)
        self._entry: dict[str, int] = {}  # name -> its live entry's number
        self._entries = 0
        self.need: dict[str, float] = {}  # name -> its next need, as keyed

    def key(self, name: str, need: float, nbytes: int) -> None:
        self._entries += 1
        self._entry[name] = self._entries
        self.need[name] = need
        heapq.heappush(self._heap, (-need, -nbytes, name, self._entries))

    def discard(self, name: str) -> None:
        """``name`` is no longer evictable (it was evicted): its entries go stale."""
        self._entry.pop(name, None)

    def next(self, protect, after: float, skipped: list) -> str | None:
        """The evictable blob with the furthest next need if it is needed after ``after``, else
        None. Protected blobs popped on the way go to ``skipped``, for ``restore`` to put back
        once the caller is done evicting. The caller evicts the blob returned (and ``discard``s
        it) before asking for the next one."""
        heap, entry = self._heap, self._entry
        while heap:
            top = heap[0]
            if entry.get(top[2]) != top[3]:
                heapq.heappop(heap)           # stale: re-keyed since, or evicted
                continue
            if -top[0] <= after:
                return None
            heapq.heappop(heap)
            if top[2] in protect:
                skipped.append(top)
                continue
            return top[2]
        return None

    def restore(self, skipped: list) -> None:
        for top in skipped:
            heapq.heappush(self._heap, top)


def cheapest_window(lengths: list, costs: list, size: int, unmovable: float):
    """``(first, last)`` block indices of the cheapest run of consecutive blocks (``lengths``
    bytes, ``costs`` to clear each; ``unmovable`` for a block no window may span) that covers
    ``size`` bytes, dropping blocks from its start that it does not need; None if there is none.
    Ties go to the lowest run. One pass: a sliding window per run of blocks between unmovable
    ones."""
    best = None
    left, covered, cost = 0, 0, 0.0
    for right, (length, block_cost) in enumerate(zip(lengths, costs)):
        if block_cost == unmovable:            # no window spans it
            left, covered, cost = right + 1, 0, 0.0
            continue
        covered += length
        cost += block_cost
        while covered - lengths[left] >= size:   # drop blocks the window does not need
            covered -= lengths[left]
            cost -= costs[left]
            left += 1
        if covered >= size and (best is None or cost < best[0] - 1e-12):
            best = (cost, left, right)
    return None if best is None else best[1:]
