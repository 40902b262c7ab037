"""The workplace's tables: loading from CSV, row labels, per-session copies, timestamps, and the reward's equality.

A `Table` is a column tuple, a list of row dicts (column -> value; `None` is a missing cell) and a parallel list of
row labels (NeMo-Gym's pandas index, which the reward compares). Rows are never mutated in place: an update swaps in
a new dict, so a session's copy of a table is two list copies and shares every untouched row with the loaded data.

`Workplace` holds one rollout's state: the five compared tables (emails, calendar, plots, tasks, CRM), the
read-only visits table and company directory, and the flag of quirk Q9 (durations turned to floats).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from dateutil import parser as _dateutil_parser  # pandas parses non-ISO date text with dateutil too

NOW = "2023-11-30 23:59:00"
"""The environment's frozen clock: the `sent_datetime` of every email sent during a rollout."""

FILES = {
    "emails": "emails.csv",
    "calendar": "calendar_events.csv",
    "tasks": "project_tasks.csv",
    "crm": "customer_relationship_manager_data.csv",
    "visits": "analytics_data.csv",
}
"""Table name -> CSV file in `data_dir` (WorkBench's names). The directory is `raw/email_addresses.csv`."""
DIRECTORY_FILE = "raw/email_addresses.csv"
COMPARED = ("emails", "calendar", "plots", "tasks", "crm")
"""Tables the reward compares, in the reference's order."""
CASE_SENSITIVE_COLUMNS = frozenset({"status", "list_name", "board"})
"""Columns the reward compares as stored; every other column is lowercased, and non-strings become missing."""
MISSING_MASK_ERROR = "Cannot mask with non-boolean array containing NA / NaN values"


@dataclass
class Table:
    """Rows with labels. `copy()` is cheap (rows are shared; updates replace a row's dict)."""

    columns: tuple[str, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    def copy(self) -> Table:
        return Table(self.columns, list(self.rows), list(self.labels))

    def positions(self, column: str, value: Any) -> list[int]:
        """Positions of the rows whose `column` equals `value` exactly (Python `==`; `"57"` is not `"00000057"`)."""
        return [index for index, row in enumerate(self.rows) if _equal(row[column], value)]

    def has(self, column: str, value: Any) -> bool:
        return any(_equal(row[column], value) for row in self.rows)

    def first(self, column: str, value: Any) -> dict[str, Any] | None:
        return next((row for row in self.rows if _equal(row[column], value)), None)

    def delete(self, column: str, value: Any) -> None:
        """Remove every matching row; the others keep their labels (gaps stay)."""
        keep = [index for index, row in enumerate(self.rows) if not _equal(row[column], value)]
        self.rows = [self.rows[index] for index in keep]
        self.labels = [self.labels[index] for index in keep]

    def update(self, column: str, value: Any, target: str, new_value: Any) -> None:
        """Set `target` to `new_value` (stored as received) on every row whose `column` equals `value`."""
        for index in self.positions(column, value):
            self.rows[index] = {**self.rows[index], target: new_value}

    def append(self, row: dict[str, Any], label: str) -> None:
        """Add a row at the end (missing columns are `None`). `label`: `relabel` numbers the whole table 0..n-1
        (emails, tasks, CRM), `zero` gives the new row label 0 (calendar), `count` the old row count (plots)."""
        count = len(self.rows)
        self.rows.append({column: row.get(column) for column in self.columns})
        if label == "relabel":
            self.labels = list(range(count + 1))
        else:
            self.labels.append(0 if label == "zero" else count)

    def values(self, column: str) -> list[Any]:
        return [row[column] for row in self.rows]

    def max_id(self, column: str) -> Any:
        """The lexicographic maximum of the id column (raises like the reference on an empty or mixed column)."""
        return max(self.values(column))


def _equal(cell: Any, value: Any) -> bool:
    try:
        return bool(cell == value)
    except (TypeError, ValueError):
        return False


def regex_mask(table: Table, column: str, pattern: Any, *, missing_raises: bool) -> list[bool]:
    """Which rows' `column` contains `pattern` (a case-insensitive regex). A missing or non-string cell is unknown:
    it does not match, or (`missing_raises`, as pandas masking does) raises `ValueError`."""
    compiled = re.compile(pattern, re.IGNORECASE)
    mask = []
    for row in table.rows:
        cell = row[column]
        if not isinstance(cell, str):
            if missing_raises:
                raise ValueError(MISSING_MASK_ERROR)
            mask.append(False)
        else:
            mask.append(compiled.search(cell) is not None)
    return mask


def keep(table: Table, mask: list[bool]) -> Table:
    """A table of the rows where `mask` holds (labels kept)."""
    return Table(
        table.columns,
        [row for row, hit in zip(table.rows, mask, strict=True) if hit],
        [label for label, hit in zip(table.labels, mask, strict=True) if hit],
    )


@dataclass
class Workplace:
    """One rollout's state."""

    emails: Table
    calendar: Table
    plots: Table
    tasks: Table
    crm: Table
    visits: Table
    directory: tuple[str, ...]
    durations_as_float: bool = False
    """Quirk Q9: after an unbounded average-duration call, the visits' durations read back as floats."""

    def copy(self) -> Workplace:
        return Workplace(
            emails=self.emails.copy(), calendar=self.calendar.copy(), plots=self.plots.copy(),
            tasks=self.tasks.copy(), crm=self.crm.copy(), visits=self.visits, directory=self.directory,
        )


def read_table(path: Path) -> Table:
    """A CSV with a header row, every cell text and empty cells missing; labels 0..n-1 in file order."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        try:
            columns = tuple(next(reader))
        except StopIteration:
            raise ValueError(f"{path} is empty; it needs a header row") from None
        rows = []
        for number, cells in enumerate(reader, start=2):
            if len(cells) != len(columns):
                raise ValueError(f"{path}:{number}: {len(cells)} cells, the header has {len(columns)}")
            rows.append({column: cell if cell != "" else None for column, cell in zip(columns, cells, strict=True)})
    return Table(columns, rows, list(range(len(rows))))


REQUIRED_COLUMNS = {
    "emails": ("email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body"),
    "calendar": ("event_id", "event_name", "participant_email", "event_start", "duration"),
    "tasks": ("task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board"),
    "crm": ("customer_id", "assigned_to_email", "customer_name", "customer_email", "customer_phone",
            "last_contact_date", "product_interest", "status", "follow_up_by", "notes"),
    "visits": ("date_of_visit", "visitor_id", "page_views", "session_duration_seconds", "traffic_source",
               "user_engaged"),
}


@lru_cache(maxsize=8)
def load_workplace(data_dir: str) -> Workplace:
    """The initial state from `data_dir` (cached: sessions take `copy()`s of it, never the original).

    Raises:
        FileNotFoundError: a table's file is missing (the message names it and the expected layout).
        ValueError: a table lacks a column the tools need.
    """
    root = Path(data_dir)
    tables = {}
    for name, filename in FILES.items():
        path = root / filename
        if not path.is_file():
            raise FileNotFoundError(
                f"workplace_assistant data_dir {root} has no {filename}; it needs {sorted(FILES.values())} "
                f"and {DIRECTORY_FILE} (WorkBench's layout)"
            )
        table = read_table(path)
        lacking = [column for column in REQUIRED_COLUMNS[name] if column not in table.columns]
        if lacking:
            raise ValueError(f"{path} lacks columns {lacking}")
        tables[name] = table
    tables["visits"].rows = [{**row, "user_engaged": row["user_engaged"] == "True"} for row in tables["visits"].rows]
    directory_path = root / DIRECTORY_FILE
    if not directory_path.is_file():
        raise FileNotFoundError(f"workplace_assistant data_dir {root} has no {DIRECTORY_FILE} (one address a line)")
    directory = tuple(line.strip() for line in directory_path.read_text(encoding="utf-8").splitlines() if line.strip())
    return Workplace(plots=Table(("file_path",)), directory=directory, **tables)


# ---- the reward's equality ----------------------------------------------------------------------------------------


def _normal(column: str, value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if column in CASE_SENSITIVE_COLUMNS:
        return value
    return value.lower() if isinstance(value, str) else None


def tables_equal(left: Table, right: Table) -> bool:
    """NeMo-Gym's check: same labels in the same order, and equal cells after lowercasing every column but
    `status`, `list_name` and `board`, where any non-string value counts as missing."""
    if left.columns != right.columns or len(left.rows) != len(right.rows) or left.labels != right.labels:
        return False
    for row_left, row_right in zip(left.rows, right.rows, strict=True):
        if row_left is row_right:
            continue
        for column in left.columns:
            if _normal(column, row_left[column]) != _normal(column, row_right[column]):
                return False
    return True


def differing_tables(left: Workplace, right: Workplace) -> list[str]:
    """Names of the compared tables that differ between two states (empty: the reward is 1.0)."""
    return [name for name in COMPARED if not tables_equal(getattr(left, name), getattr(right, name))]


# ---- timestamps (what pandas.Timestamp accepts) -------------------------------------------------------------------

_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?(Z|[+-]\d{2}:?\d{2})?"
)
_EARLIEST, _LATEST = datetime(1677, 9, 22), datetime(2262, 4, 11)
_EPOCH = datetime(1970, 1, 1)


class TimestampError(ValueError):
    """A value `pandas.Timestamp` would not accept."""


def parse_timestamp(value: Any) -> datetime:
    """`value` as pandas.Timestamp reads it: ISO text (`T` or a space, date only = midnight), other date text
    through dateutil (`MM/DD/YYYY`, month names), `now`/`today` (the real clock), numbers as nanoseconds since the
    epoch. Timezone-aware text gives an aware datetime.

    Raises:
        TimestampError: the value is not a timestamp (message as pandas words it for text).
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TimestampError(f"Cannot convert input [{value}] of type {type(value)} to Timestamp")
    if isinstance(value, int | float):
        try:
            return _bounded(_EPOCH + timedelta(microseconds=value / 1000), value)
        except (OverflowError, ValueError):
            raise TimestampError(f"Cannot convert input [{value}] to Timestamp: out of bounds") from None
    if value in ("now", "today"):
        return datetime.now()
    match = _ISO.fullmatch(value.strip())
    if match:
        try:
            return _bounded(_iso(match), value)
        except ValueError:
            pass
    if value.strip():
        default = datetime(datetime.now().year, 1, 1)
        try:
            return _bounded(_dateutil_parser.parse(value, default=default), value)
        except (ValueError, OverflowError, TypeError):
            pass
    raise TimestampError(f"Unknown datetime string format, unable to parse: {value}")


def _iso(match: re.Match) -> datetime:
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    micro = int((fraction or "0").ljust(6, "0")[:6])
    text = f"{year}-{month}-{day}T{hour or '00'}:{minute or '00'}:{second or '00'}.{micro:06d}"
    if zone:
        text += "+00:00" if zone == "Z" else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    return datetime.fromisoformat(text)


def _bounded(moment: datetime, value: Any) -> datetime:
    if not _EARLIEST <= moment.replace(tzinfo=None) <= _LATEST:
        raise TimestampError(f"Out of bounds nanosecond timestamp: {value}")
    return moment


def compare_naive(moment: datetime, bound: datetime) -> None:
    """Raise as pandas does when a naive timestamp meets an aware one."""
    if (moment.tzinfo is None) != (bound.tzinfo is None):
        raise TypeError("Cannot compare tz-naive and tz-aware timestamps")
