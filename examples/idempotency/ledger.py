"""Exactly-once *effects* on at-least-once delivery: a database unique constraint.

Delivery is at least once: a message can run twice (its worker crashed after the
side effect but before the ack; a producer retried a publish). The handler makes
that harmless by writing its effect in **one transaction** with a row whose primary
key is the event's id: a second run hits the constraint, inserts nothing, and
changes nothing. This works with any SQL database; SQLite (the standard library)
by default, PostgreSQL with ``psycopg`` when ``LEDGER_DATABASE_URL`` is a
``postgresql://`` URL::

    export LEDGER_DATABASE_URL=postgresql://app@db/ledger
    streamworks worker examples.idempotency.ledger:app

The handler is a plain ``def``: streamworks runs it in a worker thread, so the
blocking database driver does not stall the event loop.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from pydantic import BaseModel

from streamworks import App, Context

SCHEMA = (
    # The constraint that makes the handler idempotent: one row per payment.
    "CREATE TABLE IF NOT EXISTS payments ("
    " payment_id TEXT PRIMARY KEY, account TEXT NOT NULL, cents BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, cents BIGINT NOT NULL)",
)


class Payment(BaseModel):
    id: str
    account: str
    cents: int


class Ledger:
    """Account balances credited once per payment id.

    Args:
        url: ``sqlite:///path/to.db`` (or a plain path) or ``postgresql://...``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = url.startswith(("postgresql://", "postgres://"))
        # psycopg's parameters are %s, sqlite3's are ?.
        self._p = "%s" if self.postgres else "?"
        self._local = threading.local()  # one connection per worker thread
        self._lock = threading.Lock()
        self._opened: list[Any] = []

    def connect(self) -> Any:
        """A new DB-API connection (the caller closes it)."""
        if self.postgres:
            import psycopg

            return psycopg.connect(self.url)
        path = self.url.removeprefix("sqlite:///")
        # Autocommit mode: _Transaction issues BEGIN/COMMIT itself. Any thread may
        # close it (close() runs on the thread that stops the app).
        return sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connect()
            with self._lock:
                self._opened.append(conn)
        return conn

    def create_schema(self) -> None:
        with self._transaction() as cur:
            for statement in SCHEMA:
                cur.execute(statement)

    def credit(self, payment: Payment) -> bool:
        """Record the payment and credit its account, in one transaction. Returns
        False, changing nothing, when this payment id was already recorded."""
        p = self._p
        with self._transaction() as cur:
            cur.execute(
                f"INSERT INTO payments (payment_id, account, cents) VALUES ({p}, {p}, {p})"
                " ON CONFLICT (payment_id) DO NOTHING",
                (payment.id, payment.account, payment.cents),
            )
            if cur.rowcount == 0:
                return False  # a duplicate delivery: the first one's effect stands
            cur.execute(
                f"INSERT INTO balances (account, cents) VALUES ({p}, {p})"
                " ON CONFLICT (account) DO UPDATE SET cents = balances.cents + excluded.cents",
                (payment.account, payment.cents),
            )
        return True

    def balances(self) -> dict[str, int]:
        with self._transaction() as cur:
            cur.execute("SELECT account, cents FROM balances")
            return {account: int(cents) for account, cents in cur.fetchall()}

    def payments(self) -> int:
        with self._transaction() as cur:
            cur.execute("SELECT COUNT(*) FROM payments")
            return int(cur.fetchone()[0])

    def close(self) -> None:
        """Close every thread's connection (call it once no handler runs any more)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()
        self._local = threading.local()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._connection(), self.postgres)


class _Transaction:
    """BEGIN … COMMIT (ROLLBACK on an exception) around a cursor, for both drivers."""

    def __init__(self, conn: Any, postgres: bool) -> None:
        self.conn = conn
        self.postgres = postgres

    def __enter__(self) -> Any:
        self.cur = self.conn.cursor()
        if not self.postgres:  # psycopg opens the transaction itself
            self.cur.execute("BEGIN IMMEDIATE")  # take SQLite's write lock up front
        return self.cur

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            if self.postgres:
                if kind is None:
                    self.conn.commit()
                else:
                    self.conn.rollback()
            else:
                self.cur.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.cur.close()


def ledger_from_env() -> Ledger:
    return Ledger(os.environ.get("LEDGER_DATABASE_URL", "sqlite:///ledger.db"))


ledger = ledger_from_env()
app = App("ledger")
app.stream("payments", shards=4)
duplicates: list[str] = []


@app.handler("payments", ordering="key")
def credit(payment: Payment, ctx: Context) -> None:
    if not ledger.credit(payment):
        ctx.logger.info("payment %s already credited: duplicate delivery", payment.id)
        duplicates.append(payment.id)
