"""A run's rows in every table that holds any, found from the schema's foreign keys (a table added
later is counted without changing the tests), and rows that make a run complete: ranks, steps, spans,
batches, a capture request, a profile and its uploaded trace, a Flight Recorder dump, alerts and their deliveries."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Column, ColumnElement, Table, create_engine, func, or_, select

from bubblescope.backend.db.engine import build_session_factory, transaction
from bubblescope.backend.db.models import Alert, AlertDelivery, Base, Run
from tests.support import FILE_BODY, ingest_batch, post_gzip, profiled_trace, register, upload_profile_trace


def tables_of_a_run() -> list[tuple[Table, Column[Any], Table | None]]:
    """(table, column, via): a table whose ``column`` is a foreign key to ``runs`` (via None), or to such a table
    (via it). A table may come more than once (a profile's trace: its request's run, and the run it became)."""
    direct = {
        table for table in Base.metadata.sorted_tables for fk in table.foreign_keys if fk.column.table.name == "runs"
    }
    found: list[tuple[Table, Column[Any], Table | None]] = []
    for table in Base.metadata.sorted_tables:
        for fk in table.foreign_keys:
            if fk.column.table.name == "runs":
                found.append((table, fk.parent, None))
            elif fk.column.table in direct:
                found.append((table, fk.parent, fk.column.table))
    return found


def rows_of_run(db_url: str, run_id: int) -> dict[str, int]:
    """Rows per table that belong to the run ``run_id``, and ``runs`` itself."""
    engine = create_engine(db_url)
    conditions: dict[Table, list[ColumnElement[bool]]] = {}
    for table, column, via in tables_of_a_run():
        if via is None:
            conditions.setdefault(table, []).append(column == run_id)
        else:
            conditions.setdefault(table, []).append(column.in_(select(via.c.id).where(via.c.run_id == run_id)))
    counts: dict[str, int] = {}
    try:
        with engine.connect() as connection:
            counts["runs"] = connection.execute(select(func.count()).where(Run.id == run_id)).scalar_one()
            for table, conditions_of_table in conditions.items():
                counts[table.name] = connection.execute(
                    select(func.count()).select_from(table).where(or_(*conditions_of_table))
                ).scalar_one()
    finally:
        engine.dispose()
    return counts


def run_id_of(db_url: str, key: str) -> int:
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(select(Run.id).where(Run.key == key)).scalar_one())
    finally:
        engine.dispose()


def full_run(client: httpx.Client, db_url: str, batches: int = 4) -> str:
    """A run with a row in every table of a run (alerts written straight to the database)."""
    key = register(client, world_size=2)
    for rank in (0, 1):
        registered = client.put(f"/api/v1/runs/{key}/ranks/{rank}", json={"host": "node", "pid": 100 + rank})
        assert registered.status_code == 200, registered.text
    for seq in range(batches):
        stored = post_gzip(client, ingest_batch(key, seq=seq, spans=5, rank=seq % 2, step=seq))
        assert stored.status_code == 202, stored.text
    # A read settles the service's waiting revision bump (store.touch): none lands after a caller backdates the run.
    client.get(f"/api/v1/runs/{key}/analysis")
    captured = client.post(f"/api/v1/runs/{key}/capture", json={"steps": 2})
    assert captured.status_code == 201, captured.text
    profile = client.post(f"/api/v1/runs/{key}/profile", json={"steps": 1}).json()
    with tempfile.TemporaryDirectory() as folder:
        trace = profiled_trace(Path(folder), 0, profile["from_step"], 1)
        uploaded = upload_profile_trace(client, key, profile["id"], 0, trace)
    assert uploaded.status_code == 201, uploaded.text
    entry = {"collective_seq_id": 1, "profiling_name": "gloo:all_reduce", "process_group": ["0", "default_pg"]}
    dump = json.dumps({"version": "2.10", "entries": [entry]}).encode()
    dumped = client.post(
        f"/api/v1/runs/{key}/flight-recorder", params={"file": "rank0.json"}, headers=FILE_BODY, content=dump
    )
    assert dumped.status_code == 201, dumped.text
    engine = create_engine(db_url)
    now = datetime.now(timezone.utc)
    try:
        with transaction(build_session_factory(engine)) as session:
            alert = Alert(
                run_id=run_id_of(db_url, key),
                fingerprint=key[-16:],
                alertname="BubblescopeRunHung",
                severity="critical",
                labels={"run": key},
                annotations={"summary": "hung"},
                evidence_path=f"/runs/{key}",
                starts_at=now,
                updated_at=now,
            )
            session.add(alert)
            session.flush()
            session.add(
                AlertDelivery(
                    alert_id=alert.id, target="https://hooks.example.org/x", status="firing", next_attempt_at=now
                )
            )
    finally:
        engine.dispose()
    return key
