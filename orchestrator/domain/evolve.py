"""``evolve``: ``dataclasses.replace`` for slotted records without ``__post_init__``, at about
a third of its cost.

A node record is copied with a change at every transition, usage fold and launch (71k times in
a replay of the ITP trace; twice that under ``trigger.spare_room``, which launches more, shorter
nodes). ``dataclasses.replace`` reads each field by name in Python and calls the generated
``__init__`` with keywords; a frozen class's ``__init__`` then sets each field through
``object.__setattr__``. Where the class has nothing for ``__init__`` to run (no
``__post_init__``, no ``init=False`` field, no ``InitVar``), the copy is the same object built by
reading every slot in one C call and writing each through its slot descriptor. Any other class
gets ``dataclasses.replace`` itself, so the answer is always what ``replace`` would give.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Copier:
    """One dataclass's slot readers and writers."""

    __slots__ = ("by_name", "cls", "read", "writers")

    def __init__(self, cls: type):
        names = [f.name for f in dataclasses.fields(cls)]
        self.cls = cls
        self.read = operator.attrgetter(*names)
        self.writers = [cls.__dict__[name].__set__ for name in names]
        self.by_name = dict(zip(names, self.writers, strict=True))

    def __call__(self, obj: Any, changes: dict[str, Any]) -> Any:
        new = object.__new__(self.cls)
        for write, value in zip(self.writers, self.read(obj), strict=True):
            write(new, value)
        by_name = self.by_name
        for name, value in changes.items():
            write = by_name.get(name)
            if write is None:
                raise TypeError(f"{self.cls.__name__}.__init__() got an unexpected keyword "
                                f"argument {name!r}")
            write(new, value)
        return new


_COPIERS: dict[type, Callable[[Any, dict[str, Any]], Any]] = {}


def _copier(cls: type) -> Callable[[Any, dict[str, Any]], Any]:
    fields = dataclasses.fields(cls)
    plain = (
        "__slots__" in cls.__dict__
        and not hasattr(cls, "__post_init__")
        and all(f.init for f in fields)
        # (InitVar and ClassVar pseudo-fields are listed here, not in fields(): play safe)
        and len(cls.__dataclass_fields__) == len(fields)
        and len(fields) > 1  # (attrgetter of one name gives the value, not a tuple)
        and all(f.name in cls.__dict__ for f in fields)
    )
    return _Copier(cls) if plain else (lambda obj, changes: dataclasses.replace(obj, **changes))


def evolve(obj: T, /, **changes: Any) -> T:
    """A copy of the dataclass instance ``obj`` with ``changes``, as ``dataclasses.replace``."""
    cls = type(obj)
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _copier(cls)
    return copier(obj, changes)


__all__ = ["evolve"]
