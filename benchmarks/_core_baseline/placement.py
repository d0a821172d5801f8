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
"""
from __future__ import annotations

from collections import Counter

from scheduler.model import Placement
from scheduler.snapshot import Cluster, Levels


class FreeIndex:
    __slots__ = ("_arrived", "_cluster", "_counts", "_levels", "_stacks", "free")

    def __init__(self, cluster: Cluster, node_free: tuple[int, ...], levels: Levels | None = None) -> None:
        """``levels``: the snapshot's nodes by free count (:attr:`scheduler.snapshot.Occupancy.levels`),
        which spares a pass over every node; derived from ``node_free`` when not given."""
        self._cluster = cluster
        self.free = list(node_free)
        self._levels = levels
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

    def slots(self, gpu_type: str, gpus_per_pod: int, enough: int) -> int:
        """Pods of ``gpus_per_pod`` GPUs that fit on free capacity of the type (stops at ``enough``)."""
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

    def fits(self, gpu_type: str, gpus_per_pod: int, pods: int) -> bool:
        return self.slots(gpu_type, gpus_per_pod, pods) >= pods

    def place(self, gpu_type: str, gpus_per_pod: int, pods: int) -> Placement | None:
        """Take GPUs for the gang by best fit, or take nothing and return ``None``."""
        if not self.fits(gpu_type, gpus_per_pod, pods):
            return None
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
        index = self._cluster.node_index
        t = placement.gpu_type
        for name, n in placement.nodes:
            i = index[name]
            new = self.free[i] + sign * n
            if new < 0 or new > self._cluster.nodes[i].gpus:
                raise ValueError(f"node {name}: free GPUs would be {new}")
            self._move(i, t, new)

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
        st = self._stacks.get((gpu_type, new))
        if st is not None:
            st.append(i)
        elif self._levels is not None:
            self._arrived.setdefault((gpu_type, new), []).append(i)


def node_slots(cluster: Cluster, gpu_type: str, gpus_per_pod: int) -> int:
    """Pods of ``gpus_per_pod`` GPUs that fit on the type's nodes when all are empty."""
    return sum(n * (g // gpus_per_pod) for g, n in cluster.type_sizes.get(gpu_type, ()))
