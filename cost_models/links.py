"""Link parameters of N devices described by levels, in memory linear in N.

A topology described by levels (``network.host``/``region``/``global`` and ``region_pairs``) gives
every pair of devices one of a few values: the host level between two devices of a host, the
region-to-region table (its diagonal: inside a region) between hosts, and the per-pair entries
(``network.pairs``) over both. ``LevelMatrix`` keeps exactly that: a host id and a region id per
device, the host value, the R x R table and a sparse dict of pair overrides, and looks entries up
by those keys. It indexes like the dense ``N x N`` array it stands for (``m[a, b]`` with integers,
arrays that broadcast, or ``np.ix_`` blocks, giving the same values), and shared NICs cap it
between hosts (``capped``) as ``cost_models.network.Network`` caps a dense matrix.
``np.asarray(m)`` materialises the dense matrix, for the models that need every pair at once (the
DTFM objective, CP-SAT on a few devices).
"""

from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["LevelMatrix", "take"]


@dataclass(frozen=True, kw_only=True, eq=False)
class LevelMatrix:
    """An ``N x N`` matrix whose entry ``[a, b]`` is, first match wins: ``diagonal`` where a == b;
    ``overrides[(a, b)]``; ``host_value`` where a and b share a host; ``table[region[a], region[b]]``;
    then, where a and b are on different hosts, at most ``egress[host[a]]`` and ``ingress[host[b]]``
    (inf: no cap)."""

    host: np.ndarray  # (N,) host id of each device, 0 .. H-1
    region: np.ndarray  # (N,) region id of each device, 0 .. R-1
    host_value: float
    table: np.ndarray  # (R, R)
    diagonal: float = 0.0
    overrides: dict = field(default_factory=dict)  # (a, b) -> value
    egress: np.ndarray | None = None  # (H,) cap of links leaving each host; None: none
    ingress: np.ndarray | None = None  # (H,) cap of links entering each host; None: none

    def __post_init__(self):
        keys = np.array(sorted(self.overrides), dtype=np.int64).reshape(-1, 2)
        n = self.host.shape[0]
        object.__setattr__(self, "_keys", keys[:, 0] * n + keys[:, 1])
        object.__setattr__(self, "_values", np.array([self.overrides[tuple(k)] for k in keys.tolist()], dtype=float))
        object.__setattr__(self, "_host_list", self.host.tolist())  # the simulator looks up one pair at a time
        object.__setattr__(self, "_region_list", self.region.tolist())

    @property
    def shape(self) -> tuple:
        return (self.host.shape[0], self.host.shape[0])

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.host.shape[0]

    def _one(self, a: int, b: int) -> np.float64:
        """Entry ``[a, b]`` of two integers: the same number as the vectorised lookup, without arrays."""
        if a == b:
            return np.float64(self.diagonal)
        ha, hb = self._host_list[a], self._host_list[b]
        value = self.overrides.get((a, b))
        if value is None:
            value = self.host_value if ha == hb else self.table[self._region_list[a], self._region_list[b]]
        if self.egress is not None and ha != hb:
            value = min(value, min(self.egress[ha], self.ingress[hb]))
        return np.float64(value)

    def __getitem__(self, key):
        a, b = key
        if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
            return self._one(int(a), int(b))
        scalar = np.ndim(a) == 0 and np.ndim(b) == 0 and not isinstance(a, slice) and not isinstance(b, slice)
        a = np.arange(self.shape[0])[a] if isinstance(a, slice) else np.asarray(a, dtype=np.int64)
        b = np.arange(self.shape[1])[b] if isinstance(b, slice) else np.asarray(b, dtype=np.int64)
        if isinstance(key[0], slice) or isinstance(key[1], slice):  # as numpy: the slice's axis stays apart
            a = a.reshape(a.shape + (1,) * b.ndim)
        a, b = np.broadcast_arrays(a, b)
        ha, hb = self.host[a], self.host[b]
        values = np.where(ha == hb, self.host_value, self.table[self.region[a], self.region[b]]).astype(float)
        if self._keys.size:
            flat = a.astype(np.int64) * self.shape[0] + b
            at = np.minimum(np.searchsorted(self._keys, flat), self._keys.size - 1)
            hit = self._keys[at] == flat
            values = np.where(hit, self._values[at], values)
        if self.egress is not None:
            cap = np.minimum(self.egress[ha], self.ingress[hb])
            values = np.where(ha != hb, np.minimum(values, cap), values)
        values = np.where(a == b, self.diagonal, values)
        return values[()] if scalar else values

    def __setitem__(self, key, value) -> None:
        """Set one entry (``m[a, b] = v`` with integers): a pair override."""
        a, b = (int(k) for k in key)
        self.overrides[(a, b)] = float(value)
        self.__post_init__()

    def copy(self) -> "LevelMatrix":
        return replace(self, overrides=dict(self.overrides))

    def __array__(self, dtype=None, copy=None):
        n = self.shape[0]
        dense = self[np.arange(n)[:, None], np.arange(n)[None, :]]
        return dense if dtype is None else dense.astype(dtype)

    def shifted(self, seconds: float, diagonal: float) -> "LevelMatrix":
        """Every off-diagonal entry plus ``seconds`` (a per-message overhead), ``diagonal`` on it."""
        return replace(self, host_value=self.host_value + seconds, table=self.table + seconds, diagonal=diagonal,
                       overrides={k: v + seconds for k, v in self.overrides.items()})

    def capped(self, egress: np.ndarray, ingress: np.ndarray, diagonal: float) -> "LevelMatrix":
        """Entries between hosts at most the sender host's ``egress`` and the receiver's ``ingress``."""
        return replace(self, egress=np.asarray(egress, dtype=float), ingress=np.asarray(ingress, dtype=float),
                       diagonal=diagonal, overrides=dict(self.overrides))

    def first_missing(self):
        """The first (a, b), a != b, whose entry is NaN, or None: O(N + R^2 + pairs)."""
        n = self.shape[0]
        members = {}  # (region, host) -> devices
        for d in range(n):
            members.setdefault((int(self.region[d]), int(self.host[d])), []).append(d)
        by_region = {}
        for (r, _), group in members.items():
            by_region.setdefault(r, []).append(group)

        def blocks():  # (senders, receivers) of each block of pairs a NaN level leaves to the overrides
            if np.isnan(self.host_value):
                yield from ((g, g) for groups in by_region.values() for g in groups if len(g) > 1)
            for ra, groups_a in by_region.items():
                for rb, groups_b in by_region.items():
                    if np.isnan(self.table[ra, rb]):
                        yield from ((ga, gb) for ga in groups_a for gb in groups_b if ga is not gb)

        for ga, gb in blocks():  # the first pair of the block no finite override fills
            for a in ga:
                for b in gb:
                    if a != b and not np.isfinite(self.overrides.get((a, b), np.nan)):
                        return a, b
        return None


def take(matrix, members):
    """The sub-matrix over ``members`` (device indices): a ``LevelMatrix`` stays one."""
    members = np.asarray(members, dtype=np.int64)
    if not isinstance(matrix, LevelMatrix):
        return matrix[np.ix_(members, members)]
    position = {int(m): k for k, m in enumerate(members.tolist())}
    overrides = {(position[a], position[b]): v for (a, b), v in matrix.overrides.items()
                 if a in position and b in position}
    return replace(matrix, host=matrix.host[members], region=matrix.region[members], overrides=overrides)
