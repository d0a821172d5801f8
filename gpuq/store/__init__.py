"""The ClickHouse store: connection, schema migrations, and the batching writer."""
from __future__ import annotations

from gpuq.store.client import Dsn, Result, Store, connect, parse_dsn
from gpuq.store.migrate import Retention, RetentionDays, migrate
from gpuq.store.schema import COLUMNS


def open_store(dsn: str, *, default_database: str = "gpuq", ttl_days: int = 90,
               migrate_schema: bool = True, retention: RetentionDays | None = None,
               cluster: str = "") -> Store:
    """Connect and bring the schema up to date. ``retention`` (``settings.store.retention``) sets
    each kind's TTL; without it ``ttl_days`` is the raw series' and the rest keep their defaults.
    ``cluster`` (``settings.store.cluster``): the schema on a ClickHouse cluster
    (:mod:`gpuq.store.cluster`)."""
    store = connect(dsn, default_database, cluster=cluster)
    if migrate_schema:
        try:
            migrate(store, ttl_days, retention)
        except Exception:
            store.close()
            raise
        store.use_database()
    return store


__all__ = ["COLUMNS", "Dsn", "Result", "Retention", "Store", "connect", "migrate", "open_store", "parse_dsn"]
