"""The class's grades as CSV, as a spreadsheet reads them (``python -m distlab.grade export``)."""

from __future__ import annotations

import csv
import datetime


def times_with_their_zone(path: str, columns=("duedate", "timestamp")) -> None:
    """Write nbgrader's times as ISO 8601 with their offset: the gradebook keeps them in UTC
    without saying so (``2026-12-01 16:00:00``), which a reader in Berlin takes for local time.
    Afterwards: ``2026-12-01T16:00:00+00:00``, which spreadsheets and pandas read as UTC."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    if not rows:
        return
    for row in rows:
        for column in columns:
            if row.get(column):   # naive in the gradebook: UTC
                when = datetime.datetime.fromisoformat(row[column])
                row[column] = when.replace(tzinfo=when.tzinfo or datetime.timezone.utc).isoformat()
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerows(rows)
