"""A set of keys as one bound parameter, for statements over thousands of rows by key.

``column IN (:k1, :k2, ...)`` binds one parameter per key: SQLite refuses more than 32,766 and
the other readers of this package split their keys into lists of 500, a statement each.
:func:`among` binds the whole set as one value instead, so a read or a delete of 10,000 nodes'
rows is one statement on either database: a PostgreSQL array (``column = ANY(:keys)``), or on
SQLite a JSON array unpacked by ``json_each`` (built into SQLite since 3.38) in an ``IN``
subquery, which SQLite probes the column's index with, key by key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg


def among(dialect: str, column: sa.ColumnElement[Any], keys: Iterable[str]
          ) -> sa.ColumnElement[bool]:
    """``column`` is one of ``keys`` (strings), with ``keys`` bound as one parameter."""
    values = sorted(set(keys))
    if dialect == "postgresql":
        return column == sa.any_(sa.bindparam(None, values, type_=pg.ARRAY(sa.String())))
    each = sa.func.json_each(sa.bindparam(None, json.dumps(values), type_=sa.String())) \
        .table_valued("value")
    return column.in_(sa.select(each.c.value))


__all__ = ["among"]
