"""Strict reading of one YAML mapping: known keys only, each typed, each error naming its field."""

import difflib

from planner.errors import InputError

__all__ = ["Fields", "closest"]

_MISSING = object()
CLOSE = 0.75  # difflib's similarity from which a name is taken for a misspelling of another


def closest(word, choices) -> str | None:
    """The one of ``choices`` that ``word`` looks misspelled from, if any (difflib's ratio >= ``CLOSE``)."""
    return next(iter(difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=CLOSE)), None)


# Keys of earlier file versions and their names now, so an old file gets a fix instead of a guess.
RENAMED = {"micro_batch": "micro_batch_size"}


class Fields:
    """A YAML mapping being read; ``finish()`` rejects whatever key nobody asked for.

    >>> f = Fields({"layers": 24}, "model"); f.int("layers"); f.finish()
    24
    """

    def __init__(self, mapping, where: str):
        if not isinstance(mapping, dict):
            raise InputError(f"expected a mapping of keys to values, got {type(mapping).__name__}", field=where)
        self._mapping = dict(mapping)
        self._seen: set = set()  # keys read
        self._asked: set = set()  # keys read or asked about (``has``): every key this mapping may hold
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        self._asked.add(key)
        return key in self._mapping

    def missing(self, key: str, fix: str = "add it", *, instead: tuple = ()) -> InputError:
        """``key`` is missing: the error, with the file's key it (or a key ``instead`` of it) looks
        misspelled as, if any."""
        others = [k for k in self._mapping if k != key and k not in instead]
        typo = next((found for wanted in (key, *instead) if (found := closest(wanted, others))), None)
        return InputError(f"is missing: {fix}" + (f" (the file has '{typo}': a misspelling of it?)" if typo else ""),
                          field=self.path(key))

    def raw(self, key: str, default=_MISSING):
        self._seen.add(key)
        self._asked.add(key)
        if key not in self._mapping or self._mapping[key] is None:
            if default is _MISSING:
                raise self.missing(key)
            return default
        return self._mapping[key]

    def str(self, key: str, default=_MISSING, *, choices=None) -> str:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise InputError(f"expected a non-empty string, got {value!r}", field=self.path(key))
        if choices is not None and value not in choices:
            raise InputError(f"{value!r} is not one of {', '.join(choices)}", field=self.path(key))
        return value

    def int(self, key: str, default=_MISSING, *, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"expected a whole number, got {value!r}", field=self.path(key))
        if value < minimum:
            raise InputError(f"must be at least {minimum}, got {value}", field=self.path(key))
        return value

    def float(self, key: str, default=_MISSING, *, low: float = 0.0, high: float = float("inf")) -> float:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"expected a number, got {value!r}", field=self.path(key))
        if not (low < value <= high):
            raise InputError(f"must lie in ({low:g}, {high:g}], got {value!r}", field=self.path(key))
        return float(value)

    def bool(self, key: str, default=_MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise InputError(f"expected true or false, got {value!r}", field=self.path(key))
        return value

    def list(self, key: str, default=_MISSING) -> list:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise InputError(f"expected a list, got {type(value).__name__}", field=self.path(key))
        return value

    def quantity(self, key: str, parser, default=_MISSING, **kwargs) -> float:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        return parser(value, field=self.path(key), **kwargs)

    def finish(self) -> None:
        unknown = sorted(str(k) for k in self._mapping if k not in self._seen)
        renamed = [k for k in unknown if RENAMED.get(k) in self._seen]
        if renamed:
            raise InputError(f"key '{renamed[0]}' is now called '{RENAMED[renamed[0]]}': rename it",
                             field=self.path(renamed[0]))
        if unknown:
            known = sorted(str(k) for k in self._asked)
            close = closest(unknown[0], known)
            raise InputError(
                f"unknown key '{unknown[0]}': " + (f"did you mean '{close}'? " if close else "")
                + f"remove it or check its spelling (known here: {', '.join(known)})",
                field=self.where or None,
            )
