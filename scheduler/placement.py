"""Placement: all-or-nothing gang placement with best-fit bin-packing, by GPU type.

:class:`FreeIndex` is the cycle's working copy of free GPUs per node, indexed per GPU type by
free count: ``counts[type][f]`` is how many nodes of the type have ``f`` GPUs free, and a stack
per ``(type, f)`` (built on first use) yields such a node. So

* "how many pods of ``k`` GPUs fit on this type" is ``sum(counts[f] * (f // k))`` over
  ``f >= k``: O(GPUs per node), not O(nodes);
* best fit for one pod takes a node from the smallest non-empty bucket ``f >= k``;
* a gang fits iff that sum is at least its pod count (each pod placed by best fit uses exactly
  one such slot), so the check never places anything tentatively.

Tie-break among nodes with equal free count: the lowest node index on a fresh stack, then the
node that most recently reached that count (deterministic; no set or hash order involved). A fresh
stack starts from the snapshot's nodes-by-free-count levels when given (no pass over every node).

**Shares** (issue 19: a pod asking less than one GPU takes a share of one device, never two).
The free counts above are of *whole* free devices; a device that shares hold part of is kept
apart (:data:`scheduler.snapshot.Partial`, copied on the first share asked for in a cycle, so a
cluster without shares pays nothing), with per type a sorted list of (free share, node, slot).
A pod of share ``k`` goes to the partly used device with the least free share that holds it
(lowest node, then slot, on a tie), and only when none does opens a whole device, on the node a
one-GPU pod would take by best fit: partly used devices fill first, so whole devices stay whole
for whole gangs. Pods of one gang may share a device. Pods of equal share fit iff the devices'
``floor(free / k)`` sum to the pod count, so the check again places nothing tentatively.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from decimal import Decimal

from scheduler.model import Gpus, Placement, exact
from scheduler.snapshot import NO_PARTIAL, Cluster, Levels, Partial

_LOW = -1     # below every node index and slot: bisect keys (share, _LOW, _LOW)


class FreeIndex:
    __slots__ = ("_arrived", "_cluster", "_counts", "_levels", "_part", "_part_base", "_pl", "_stacks", "free",
                 "version")

    def __init__(self, cluster: Cluster, node_free: tuple[int, ...], levels: Levels | None = None,
                 partial: Partial = NO_PARTIAL) -> None:
        """``levels``: the snapshot's nodes by free count (:attr:`scheduler.snapshot.Occupancy.levels`),
        which spares a pass over every node; derived from ``node_free`` when not given.
        ``partial``: the devices shares hold part of (:attr:`scheduler.snapshot.Occupancy.partial`)."""
        self._cluster = cluster
        self.free = list(node_free)
        self.version = 0          # counts the changes: a reader's summary of the free GPUs is current while equal
        self._levels = levels
        self._part_base = partial
        self._part: dict[int, dict[int, Decimal]] | None = None        # working copy, on first use
        self._pl: dict[str, list[tuple[Decimal, int, int]]] = {}       # type -> (free, node, slot), sorted
        self._stacks: dict[tuple[str, int], list[int]] = {}
        self._arrived: dict[tuple[str, int], list[int]] = {}   # reached f before its stack existed
        if levels is not None:
            self._counts = {t: list(map(len, lv)) for t, lv in levels.items()}
            return
        self._counts = {}
        get = self.free.__getitem__
        for t, idxs in cluster.type_nodes.items():
            c = [0] * (cluster.type_cap[t] + 1)
            for f, n in Counter(map(get, idxs)).items():
                c[f] = n
            self._counts[t] = c

    def largest_free(self, gpu_type: str) -> int:
        c = self._counts.get(gpu_type)
        if c is None:
            return 0
        for f in range(len(c) - 1, 0, -1):
            if c[f]:
                return f
        return 0

    def largest_share(self, gpu_type: str) -> Gpus:
        """The most of one device free on the type: 1 when a whole device is, else the largest free
        share of a partly used one (0: none)."""
        if self.largest_free(gpu_type):
            return 1
        pl = self._plist(gpu_type)
        return pl[-1][0] if pl else 0

    def partial(self) -> Partial:
        """The devices shares hold part of now (the working copy; a reader must not keep it)."""
        return self._part_base if self._part is None else self._part

    def slots(self, gpu_type: str, gpus_per_pod: Gpus, enough: int) -> int:
        """Pods of ``gpus_per_pod`` GPUs that fit on free capacity of the type (stops at ``enough``)."""
        if isinstance(gpus_per_pod, Decimal):
            return self._share_slots(gpu_type, gpus_per_pod, enough)
        c = self._counts.get(gpu_type)
        if c is None or gpus_per_pod <= 0:
            return 0
        total = 0
        for f in range(gpus_per_pod, len(c)):
            if c[f]:
                total += c[f] * (f // gpus_per_pod)
                if total >= enough:
                    break
        return total

    def fits(self, gpu_type: str, gpus_per_pod: Gpus, pods: int) -> bool:
        return self.slots(gpu_type, gpus_per_pod, pods) >= pods

    def place(self, gpu_type: str, gpus_per_pod: Gpus, pods: int) -> Placement | None:
        """Take GPUs for the gang by best fit, or take nothing and return ``None``."""
        if isinstance(gpus_per_pod, Decimal):
            return self._place_shares(gpu_type, gpus_per_pod, pods)
        if not self.fits(gpu_type, gpus_per_pod, pods):
            return None
        self.version += 1
        c = self._counts[gpu_type]
        taken: dict[int, int] = {}
        for _ in range(pods):
            for f in range(gpus_per_pod, len(c)):
                if c[f]:
                    i = self._pick(gpu_type, f)
                    self._move(i, gpu_type, f - gpus_per_pod)
                    taken[i] = taken.get(i, 0) + gpus_per_pod
                    break
        nodes = self._cluster.nodes
        return Placement(gpu_type, tuple((nodes[i].name, n) for i, n in sorted(taken.items())))

    def take(self, placement: Placement) -> None:
        self._shift(placement, -1)

    def release(self, placement: Placement) -> None:
        self._shift(placement, 1)

    def _shift(self, placement: Placement, sign: int) -> None:
        self.version += 1
        if placement.shares:
            self._shift_shares(placement, sign)
            return
        index = self._cluster.node_index
        t = placement.gpu_type
        for name, n in placement.nodes:
            i = index[name]
            new = self.free[i] + sign * int(n)        # a whole gang: ints
            if new < 0 or new > self._cluster.nodes[i].gpus:
                raise ValueError(f"node {name}: free GPUs would be {new}")
            self._move(i, t, new)

    # -- shares ---------------------------------------------------------------------------------

    def _shares(self) -> dict[int, dict[int, Decimal]]:
        part = self._part
        if part is None:
            part = self._part = {i: dict(d) for i, d in self._part_base.items()}
        return part

    def _plist(self, gpu_type: str) -> list[tuple[Decimal, int, int]]:
        pl = self._pl.get(gpu_type)
        if pl is None:
            nodes = self._cluster.nodes
            pl = self._pl[gpu_type] = sorted(
                (1 - u, i, slot) for i, d in self.partial().items() if nodes[i].gpu_type == gpu_type
                for slot, u in d.items())
        return pl

    def _share_slots(self, gpu_type: str, k: Decimal, enough: int) -> int:
        """Pods of share ``k`` that fit: ``floor(1 / k)`` on each whole free device, ``floor(free / k)``
        on each partly used one."""
        c = self._counts.get(gpu_type)
        if c is None or k <= 0:
            return 0
        total = sum(f * n for f, n in enumerate(c)) * int(1 // k)
        if total >= enough:
            return total
        pl = self._plist(gpu_type)
        for j in range(bisect_left(pl, (k, _LOW, _LOW)), len(pl)):
            total += int(pl[j][0] // k)
            if total >= enough:
                break
        return total

    def _place_shares(self, gpu_type: str, k: Decimal, pods: int) -> Placement | None:
        if self._share_slots(gpu_type, k, pods) < pods:
            return None
        self.version += 1
        part, pl, c = self._shares(), self._plist(gpu_type), self._counts[gpu_type]
        held: dict[tuple[int, int], Decimal] = {}
        for _ in range(pods):
            j = bisect_left(pl, (k, _LOW, _LOW))
            if j < len(pl):                          # best fit among the partly used devices
                f, i, slot = pl.pop(j)
            else:                                    # a whole device, on the best-fit node
                f = Decimal(1)
                i = self._pick(gpu_type, next(n for n in range(1, len(c)) if c[n]))
                self._move(i, gpu_type, self.free[i] - 1)
                d = part.setdefault(i, {})
                slot = 0
                while slot in d:
                    slot += 1
            part.setdefault(i, {})[slot] = 1 - (f - k)
            insort(pl, (f - k, i, slot))
            held[(i, slot)] = held.get((i, slot), Decimal(0)) + k
        return self._share_placement(gpu_type, held)

    def _share_placement(self, gpu_type: str, held: dict[tuple[int, int], Decimal]) -> Placement:
        nodes = self._cluster.nodes
        per: dict[int, Decimal] = {}
        for (i, _), a in held.items():
            per[i] = per.get(i, Decimal(0)) + a
        return Placement(gpu_type, tuple((nodes[i].name, exact(g)) for i, g in sorted(per.items())),
                         tuple((nodes[i].name, slot, a) for (i, slot), a in sorted(held.items())))

    def _shift_shares(self, placement: Placement, sign: int) -> None:
        """Give back (``sign`` 1) or take again (-1) the shares of ``placement``, on its own slots."""
        index, t = self._cluster.node_index, placement.gpu_type
        part, pl = self._shares(), self._plist(t)
        for name, slot, amt in placement.shares:
            i = index[name]
            d = part.setdefault(i, {})
            used = d.get(slot)
            if used is not None:
                del pl[bisect_left(pl, (1 - used, i, slot))]
            elif sign > 0:
                raise ValueError(f"node {name}: device slot {slot} holds no share to give back")
            else:
                if self.free[i] < 1:
                    raise ValueError(f"node {name}: no whole free device for slot {slot}")
                self._move(i, t, self.free[i] - 1)
                used = Decimal(0)
            used = used - sign * amt
            if used < 0 or used > 1:
                raise ValueError(f"node {name}: device slot {slot} would hold {used} of one GPU")
            if used == 0:
                del d[slot]
                self._move(i, t, self.free[i] + 1)
            else:
                d[slot] = used
                insort(pl, (1 - used, i, slot))

    def _pick(self, gpu_type: str, f: int) -> int:
        free = self.free
        st = self._stacks.get((gpu_type, f))
        if st is None:
            if self._levels is None:
                st = [i for i in reversed(self._cluster.type_nodes[gpu_type]) if free[i] == f]
            else:
                # the nodes at f when the cycle began plus those that reached f since; entries no
                # longer at f are skipped below, like the ones that leave f later
                came = self._arrived.get((gpu_type, f))
                base = self._levels[gpu_type][f]
                st = sorted((*base, *came), reverse=True) if came else list(reversed(base))
            self._stacks[(gpu_type, f)] = st
        while free[st[-1]] != f:
            st.pop()
        return st[-1]

    def _move(self, i: int, gpu_type: str, new: int) -> None:
        c = self._counts[gpu_type]
        c[self.free[i]] -= 1
        c[new] += 1
        self.free[i] = new
        self._note(i, gpu_type, new)

    def _note(self, i: int, gpu_type: str, new: int) -> None:
        """Node ``i`` reached ``new`` free GPUs: it goes on top of that count's stack (the tie-break
        among equal nodes, :meth:`_pick`), or is noted for the stack not built yet."""
        st = self._stacks.get((gpu_type, new))
        if st is not None:
            st.append(i)
        elif self._levels is not None:
            self._arrived.setdefault((gpu_type, new), []).append(i)

    def trial(self, gpu_type: str, gpus_per_pod: Gpus, pods: int) -> Trial:
        """A :class:`Trial` of victims given back for a gang of ``pods`` x ``gpus_per_pod`` on
        ``gpu_type``; the index is not touched until the trial is settled."""
        return Trial(self, gpu_type, gpus_per_pod, pods)


class Trial:
    """A victim search's view of a :class:`FreeIndex` (:func:`scheduler.preemption.plan`): victims'
    placements given back (:meth:`release`) and taken again (:meth:`take`) on an overlay of just
    the nodes and devices they hold, and whether one gang (``pods`` x ``k`` on ``gpu_type``) fits,
    kept as the pods still short, which each change moves by the slots that its own devices gain
    or lose. So a candidate costs a few lookups: no sorted list of partly used devices updated and
    no fit counted again over the type (issue 19: a preemptor that needs whole devices took the
    shares on them one victim at a time, each release a bisection and an insertion into the type's
    list of partly used devices, each check a count over that list; the Alibaba replay spent most
    of its core time there, docs/PERFORMANCE.md).

    The slots of a gang of whole GPUs are ``floor(free / k)`` per node and of a share ``k``
    ``floor(free / k)`` per device (a whole free device has 1 free): :meth:`FreeIndex.slots`
    summed, so one node's or device's change moves the sum by its own difference. The gang fits
    when none are short; a trial only ever takes back what it gave back, so its free capacity is
    never below the index's and a gang that fits at the start fits throughout (nothing to count).

    The index changes only when the trial is settled, as if every change had been made on it:
    :meth:`commit` makes them on it, in order; :meth:`abandon` undoes them, which leaves the free
    counts and devices as they are, and adds only the bookkeeping that the changes and their undoing
    would leave behind: each node that reached a free count goes on top of that count's stack
    (:meth:`FreeIndex._note`, the best fit's tie-break among equal nodes)."""

    __slots__ = ("_free", "_index", "_k", "_moves", "_ops", "_per", "_short", "_t", "_track", "_used")

    def __init__(self, index: FreeIndex, gpu_type: str, k: Gpus, pods: int) -> None:
        self._index = index
        self._t = gpu_type
        self._k = k
        self._short = pods - index.slots(gpu_type, k, pods)   # exact while > 0 (slots stops at pods)
        self._track = self._short > 0
        self._per = int(1 // k) if isinstance(k, Decimal) else 0     # a share's slots on a whole device
        self._free: dict[int, int] = {}                              # node -> whole free devices now
        self._used: dict[tuple[int, int], Decimal | None] = {}       # (node, slot) -> share held; None: whole
        self._moves: list[tuple[int, str, int]] = []                 # (node, type, free count reached)
        self._ops: list[tuple[Placement, int]] = []

    def fits(self) -> bool:
        return self._short <= 0

    def moved(self) -> bool:
        """Did some node's count of whole free devices change (a whole gang given back, or a
        device's last share)? Otherwise :meth:`abandon` has nothing to do."""
        return bool(self._moves)

    def release(self, placement: Placement) -> None:
        self._shift(placement, 1)

    def take(self, placement: Placement) -> None:
        self._shift(placement, -1)

    def commit(self) -> None:
        """Make every change on the index, in the order made."""
        shift = self._index._shift
        for placement, sign in self._ops:
            shift(placement, sign)

    def abandon(self) -> None:
        """Undo every change (the last first) and settle: the index as it was, but for the stacks'
        bookkeeping that the changes and their undoing leave. Changes that reached no new free
        count (shares given back from devices that other shares still hold) leave none, and their
        undoing none either: nothing to do."""
        if not self._moves:
            return
        for placement, sign in self._ops[::-1]:
            self._shift(placement, -sign)
        note = self._index._note
        for i, t, new in self._moves:
            note(i, t, new)

    def _whole(self, i: int, t: str, delta: int) -> None:
        """Node ``i`` gains ``delta`` whole free devices."""
        free = self._free
        f = free.get(i)
        if f is None:
            f = self._index.free[i]
        new = free[i] = f + delta
        self._moves.append((i, t, new))
        if self._track and t == self._t:
            k = self._k
            if type(k) is int:
                self._short -= new // k - f // k
            else:
                self._short -= delta * self._per

    def _shift(self, placement: Placement, sign: int) -> None:
        self._ops.append((placement, sign))
        index = self._index
        node_index, t = index._cluster.node_index, placement.gpu_type
        if not placement.shares:
            for name, n in placement.nodes:
                self._whole(node_index[name], t, sign * int(n))       # a whole gang: ints
            return
        used_of, part = self._used, index.partial()
        k = self._k
        count = self._track and t == self._t and type(k) is not int
        for name, slot, amt in placement.shares:
            i = node_index[name]
            key = (i, slot)
            if key in used_of:
                u = used_of[key]
            else:
                d = part.get(i)
                u = None if d is None else d.get(slot)
            # a device's slots: whole, counted by _whole; partly used, floor(free / k), counted here
            if u is None:
                if sign > 0:
                    raise ValueError(f"node {name}: device slot {slot} holds no share to give back")
                self._whole(i, t, -1)
                after = -sign * amt
                gained = 0
            else:
                after = u - sign * amt
                gained = -int((1 - u) // k) if count else 0
            if after < 0 or after > 1:
                raise ValueError(f"node {name}: device slot {slot} would hold {after} of one GPU")
            if after == 0:
                used_of[key] = None
                self._whole(i, t, 1)
            else:
                used_of[key] = after
                if count:
                    gained += int((1 - after) // k)
            self._short -= gained


def node_slots(cluster: Cluster, gpu_type: str, gpus_per_pod: Gpus) -> int:
    """Pods of ``gpus_per_pod`` GPUs that fit on the type's nodes when all are empty (a share of
    ``k``: ``floor(1 / k)`` to a device)."""
    if type(gpus_per_pod) is not int:
        per = int(1 // gpus_per_pod)
        return sum(n * g * per for g, n in cluster.type_sizes.get(gpu_type, ()))
    return sum(n * (g // gpus_per_pod) for g, n in cluster.type_sizes.get(gpu_type, ()))
