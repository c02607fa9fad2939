"""The forecast's queue-line heads, kept so that a step looks only at those
that can win it (queueapp/policy/forecast.py)."""

from __future__ import annotations

import heapq

from queueapp.policy.score import Candidate, rank_key

# Rank keys this close (relative) may tie once the affinity bonus is added.
_KEY_ROUNDING = 1e-9


class Heads:
    """The current head of each queue line, in one max-heap of rank keys per model.

    Replaced heads stay in the heaps until they surface and are dropped
    (an entry counts only while its candidate is still its line's head).
    """

    def __init__(self, aging_divisor: float) -> None:
        self.aging_divisor = aging_divisor
        self.by_line: dict[tuple[int, int, str], Candidate] = {}
        self.by_lane: dict[tuple[int, int], set[tuple[int, int, str]]] = {}
        # (-key, job id, push counter, line, head): the counter breaks every
        # tie, so candidates are never compared.
        self.heaps: dict[str, list[tuple[float, int, int, tuple[int, int, str], Candidate]]] = {}
        # (wait deadline, push counter, line, head): the heads whose wait
        # bound passes, soonest first.
        self.deadlines: list[tuple[float, int, tuple[int, int, str], Candidate]] = []
        self.pushed = 0

    def __bool__(self) -> bool:
        return bool(self.by_line)

    def put(self, head: Candidate) -> None:
        """Make `head` its line's head (replacing the one before)."""
        line = head.line
        self.by_line[line] = head
        self.by_lane.setdefault(head.lane, set()).add(line)
        key = rank_key(
            band=head.band,
            tier_bonus=head.tier_bonus,
            eligible_at=head.eligible_at,
            aging_divisor=self.aging_divisor,
            shortness=head.shortness,
        )
        self.pushed += 1
        heap = self.heaps.setdefault(head.model, [])
        heapq.heappush(heap, (-key, head.job_id, self.pushed, line, head))
        if head.wait_deadline is not None:
            heapq.heappush(self.deadlines, (head.wait_deadline, self.pushed, line, head))

    def due(self, clock: float) -> list[Candidate]:
        """The heads whose wait bound has passed by `clock`."""
        found = []
        while self.deadlines and self.deadlines[0][0] <= clock:
            _, _, line, head = heapq.heappop(self.deadlines)
            if self.by_line.get(line) is head:
                found.append(head)
        return found

    def remove(self, head: Candidate) -> None:
        del self.by_line[head.line]
        self.by_lane[head.lane].discard(head.line)

    def in_lane(self, lane: tuple[int, int]) -> list[Candidate]:
        return [self.by_line[line] for line in self.by_lane.get(lane, ())]

    def contenders(self) -> list[Candidate]:
        """Per model, the heads with the highest key: one of them wins the step."""
        by_line = self.by_line
        found: list[Candidate] = []
        for heap in self.heaps.values():
            while heap and by_line.get(heap[0][3]) is not heap[0][4]:
                heapq.heappop(heap)  # a replaced head
            if not heap:
                continue
            top = -heap[0][0]
            floor = top - _KEY_ROUNDING * max(1.0, abs(top))
            # Every entry with a key within rounding of the top: in a heap
            # they form a subtree at the root, usually the root alone.
            below = [0]
            while below:
                index = below.pop()
                entry = heap[index]
                if -entry[0] < floor:
                    continue
                if by_line.get(entry[3]) is entry[4]:
                    found.append(entry[4])
                below.extend(child for child in (2 * index + 1, 2 * index + 2) if child < len(heap))
        return found
