"""A cron report: at the top of every hour (Paris time), a report of the orders of the
hour that ended, published once however many workers run.

``record`` keeps each order (an in-memory list stands in for the service's database);
the ``hourly-report`` schedule's function builds the report of the hour before its
tick, and the message is published to ``reports`` exactly once per tick by the worker
that owns the group's schedules; ``deliver`` sends it on. ``catch_up="all"``: after an
outage, the report of every missed hour is published, oldest first.

    streamworks worker examples.cron_report.app:app

``python -m examples.cron_report.demo`` runs it on an embedded Redis, moving time on.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel

from streamworks import App, Tick

app = App("reporting")
app.stream("orders", shards=4)
app.stream("reports", shards=1)


class Order(BaseModel):
    id: str
    amount: int  # cents
    placed_at: datetime


class HourlyReport(BaseModel):
    start: datetime
    end: datetime
    orders: int
    revenue: int


orders: list[Order] = []  # stands in for the service's database
delivered: list[HourlyReport] = []  # and for the mailbox the reports go to


@app.handler("orders")
async def record(order: Order) -> None:
    orders.append(order)


@app.schedule(
    "hourly-report", stream="reports", cron="0 * * * *", tz="Europe/Paris", catch_up="all"
)
def hourly(tick: Tick) -> HourlyReport:
    # tick.at is the nominal time of the tick (09:00:00 sharp), however late it runs.
    start = tick.at - timedelta(hours=1)
    hour = [o for o in orders if start <= o.placed_at < tick.at]
    return HourlyReport(
        start=start, end=tick.at, orders=len(hour), revenue=sum(o.amount for o in hour)
    )


@app.handler("reports")
async def deliver(report: HourlyReport) -> None:
    delivered.append(report)
