"""The ClickHouse store: connection, schema migrations, and the batching writer."""
from __future__ import annotations

from gpuq.store.client import Dsn, Result, Store, connect, parse_dsn
from gpuq.store.migrate import migrate
from gpuq.store.schema import COLUMNS


def open_store(dsn: str, *, default_database: str = "gpuq", ttl_days: int = 90,
               migrate_schema: bool = True) -> Store:
    """Connect and bring the schema up to date."""
    store = connect(dsn, default_database)
    if migrate_schema:
        try:
            migrate(store, ttl_days)
        except Exception:
            store.close()
            raise
        store.use_database()
    return store


__all__ = ["COLUMNS", "Dsn", "Result", "Store", "connect", "migrate", "open_store", "parse_dsn"]
