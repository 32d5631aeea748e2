"""Bins of free GPUs for absorption: best fit in O(node size) per job.

:class:`Bins` holds the free GPUs of on-prem or burst nodes indexed by free room;
:class:`OwnedBins` is the same best fit for absorption under quotas alone, choosing among the
bins of some node classes (whose node it is) without asking bin by bin, and keeping the free
GPUs of each class (what tells absorption that only a project's own nodes are left to it).
"""

from __future__ import annotations

from collections.abc import Callable


class Bins:
    """Free GPUs per node, indexed by how many GPUs are free, so placing a job is O(node size).

    A job goes to the bin with the *least* free room that fits it (best fit), which keeps whole
    nodes free for wide jobs. ``total`` lets a full set of bins stop the work early.
    """

    __slots__ = ("_by_free", "free", "node_size", "owners", "total")

    def __init__(self, free: list[int], owners: list[str | None] | None = None, node_size: int = 0):
        self.free = list(free)
        self.owners = list(owners) if owners else [None] * len(self.free)
        self.node_size = node_size or max(self.free, default=0)
        self.total = sum(self.free)
        top = max(self.free, default=0)
        self._by_free: list[list[int]] = [[] for _ in range(top + 1)]
        for index in range(len(self.free) - 1, -1, -1):  # pop() then yields the lowest index first
            self._by_free[self.free[index]].append(index)

    def add(self, gpus: int, owner: str | None = None) -> None:
        """Open one more bin (a node about to be launched) with ``gpus`` free."""
        while len(self._by_free) <= gpus:
            self._by_free.append([])
        self.free.append(gpus)
        self.owners.append(owner)
        self.node_size = max(self.node_size, gpus)
        self._by_free[gpus].append(len(self.free) - 1)
        self.total += gpus

    def place(self, gpus: int) -> list[int] | None:
        """Place a job; return the indexes of the bins used, or None if it does not fit."""
        if 0 < gpus <= self.node_size:
            # :meth:`peek`'s choice and :meth:`_move` written out: absorption places up to tens
            # of thousands of one-node jobs a tick, and the calls were half the cost.
            if gpus > self.total:
                return None
            by_free = self._by_free
            for room in range(gpus, len(by_free)):
                bucket = by_free[room]
                if bucket:
                    index = bucket.pop()  # the last bin of the least room that fits
                    self.total -= gpus
                    self.free[index] = room - gpus
                    by_free[room - gpus].append(index)
                    return [index]
            return None
        used = self.peek(gpus)
        if not used:
            return used
        by_free = self._by_free
        # Multi-node job: whole free nodes, each emptied.
        for index in used:
            by_free[self.free[index]].remove(index)
            self._move(index, 0)
        return used

    def place_if(self, gpus: int, ok: Callable[[int], bool]) -> list[int] | None:
        """Place a one-node job (``gpus`` <= ``node_size``) on the bin :meth:`place` would pick
        among those ``ok`` accepts (asked in that order; the first yes is used)."""
        if not 0 < gpus <= self.node_size or gpus > self.total:
            return None
        by_free = self._by_free
        for room in range(gpus, len(by_free)):
            bucket = by_free[room]
            for position in range(len(bucket) - 1, -1, -1):
                index = bucket[position]
                if ok(index):
                    del bucket[position]
                    self.total -= gpus
                    self.free[index] = room - gpus
                    by_free[room - gpus].append(index)
                    return [index]
        return None

    def peek(self, gpus: int) -> list[int] | None:
        """The bins :meth:`place` uses for a job of ``gpus``, without placing it: the bin with the least room
        that fits a one-node job, or ``ceil(gpus / node_size)`` whole free nodes, lowest first."""
        if gpus <= 0:
            return []
        if gpus > self.total:
            return None
        by_free = self._by_free
        if gpus <= self.node_size:
            for room in range(gpus, len(by_free)):
                if by_free[room]:
                    return [by_free[room][-1]]
            return None
        needed = -(-gpus // self.node_size)
        # Counted first: a queue's wide jobs ask again and again while too few nodes are free.
        if sum(map(len, by_free[self.node_size:])) < needed:
            return None
        whole = [i for room in range(self.node_size, len(by_free)) for i in by_free[room]]
        return sorted(whole)[:needed]

    def copy(self) -> Bins:
        """An independent copy (to try a packing and keep it or not)."""
        other = Bins.__new__(Bins)
        other.free = list(self.free)
        other.owners = list(self.owners)
        other.node_size = self.node_size
        other.total = self.total
        other._by_free = [list(b) for b in self._by_free]
        return other

    def whole(self) -> int:
        """How many bins are whole free nodes (what a multi-node job can use)."""
        if not self.node_size:
            return 0
        return sum(len(b) for b in self._by_free[self.node_size:])

    def _move(self, index: int, room: int) -> None:
        self.total -= self.free[index] - room
        self.free[index] = room
        self._by_free[room].append(index)


class OwnedBins:
    """Burst bins of one absorption under quotas alone: :class:`Bins`' best fit, or the best fit
    among the bins of some classes (whose node it is, :meth:`NodeAdmitter.node_class`), each
    found without asking bin by bin.

    Each bucket of free room is kept whole and per class, in the order bins entered it (a
    stamp each), so the bin :meth:`Bins.place_if` would find scanning a bucket from its end is
    the latest-stamped last bin of an allowed class. Absorption only fills bins, so a bin leaves
    a room for good: an entry is live while its bin's free room is that room (dead ones are
    dropped when they reach the end). ``class_free``: the free GPUs of each class's bins.
    """

    __slots__ = ("_buckets", "_by_class", "_classes", "_seq", "_stamp", "class_free", "free",
                 "node_size", "total")

    def __init__(self, bins: Bins, classes: list[object]):
        self.free = list(bins.free)
        self.total = bins.total
        self.node_size = bins.node_size
        self._classes = classes
        self._buckets = [list(bucket) for bucket in bins._by_free]
        rooms = len(self._buckets)
        # Per class, per room: the class's bins that entered that room, in order.
        self._by_class: dict[object, list[list[int]]] = {}
        self._stamp = [0] * len(self.free)
        seq = 0
        for room, bucket in enumerate(self._buckets):
            for index in bucket:
                seq += 1
                self._stamp[index] = seq
                per_room = self._by_class.get(classes[index])
                if per_room is None:
                    per_room = self._by_class[classes[index]] = [[] for _ in range(rooms)]
                per_room[room].append(index)
        self._seq = seq
        self.class_free: dict[object, int] = {}
        for index, room in enumerate(self.free):
            self.class_free[classes[index]] = self.class_free.get(classes[index], 0) + room

    def place(self, gpus: int, allowed: tuple[object, ...] | None = None) -> int | None:
        """Place a one-node job on the bin :meth:`Bins.place` would pick (``allowed`` None), or
        :meth:`Bins.place_if` with ``ok(i)`` being ``classes[i] in allowed``; its index, or
        None. A class whose bins have fewer free GPUs in all than the job is not read."""
        if not 0 < gpus <= self.node_size or gpus > self.total:
            return None
        if allowed is None:
            return self._place_among([self._buckets], gpus)
        # the classes that may hold the job and have room enough for it in all
        class_free, by_class = self.class_free, self._by_class
        lists = [by_class[klass] for klass in allowed if class_free.get(klass, 0) >= gpus]
        return self._place_among(lists, gpus) if lists else None

    def rooms_of(self, allowed: tuple[object, ...]) -> list[list[list[int]]]:
        """The per-room bin lists of the classes in ``allowed`` that have bins, for
        :meth:`place_in` (a caller placing many jobs of one class set builds them once)."""
        return [self._by_class[klass] for klass in allowed if klass in self._by_class]

    def place_in(self, lists: list[list[list[int]]], gpus: int) -> int | None:
        """:meth:`place` with ``allowed`` given as :meth:`rooms_of` of it, for a one-node job
        (``0 < gpus <= node_size``): the same bin (a class without room enough holds no bin
        that fits, so reading its lists changes nothing but the dead entries dropped)."""
        return self._place_among(lists, gpus) if gpus <= self.total else None

    def _place_among(self, lists: list[list[list[int]]], gpus: int) -> int | None:
        """:meth:`place` among the bins of ``lists`` (per class, per room): the latest-stamped
        live bin of the smallest room that fits, as :meth:`Bins.place` picks."""
        free, stamp = self.free, self._stamp
        for room in range(gpus, len(self._buckets)):
            index = None
            for buckets in lists:
                entries = buckets[room]
                while entries and free[entries[-1]] != room:
                    entries.pop()
                if entries and (index is None or stamp[entries[-1]] > stamp[index]):
                    index = entries[-1]
            if index is not None:
                return self._take(index, gpus)
        return None

    def class_rooms(self, klass: object) -> list[list[int]]:
        """The live bins of ``klass`` per free room, each list in entry order (the last is the
        one :meth:`place` takes first): a copy, for :meth:`settle`."""
        free = self.free
        per_room = self._by_class.get(klass) or [[] for _ in self._buckets]
        return [[i for i in entries if free[i] == room] for room, entries in enumerate(per_room)]

    def settle(self, klass: object, rooms: list[list[int]], taken: list[tuple[int, int]]) -> None:
        """Adopt what was placed on ``klass``'s bins outside :meth:`place`: ``rooms`` its live
        bins per room after (from :meth:`class_rooms`, each placement popping a bin off the end
        of the smallest room that fits and pushing it onto its new room), ``taken`` each
        placement's (bin, GPUs) in order. The state is then what as many :meth:`place` calls
        with only ``klass`` allowed would leave."""
        free, stamp = self.free, self._stamp
        for index, gpus in taken:
            left = free[index] - gpus
            free[index] = left
            self.total -= gpus
            self.class_free[klass] -= gpus
            self._seq += 1
            stamp[index] = self._seq
            self._buckets[left].append(index)
        if klass in self._by_class:
            self._by_class[klass] = rooms

    def _take(self, index: int, gpus: int) -> int:
        free, stamp = self.free, self._stamp
        left = free[index] - gpus
        free[index] = left
        self.total -= gpus
        klass = self._classes[index]
        self.class_free[klass] -= gpus
        self._seq += 1
        stamp[index] = self._seq
        self._buckets[left].append(index)
        self._by_class[klass][left].append(index)
        return index
