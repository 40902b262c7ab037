"""What every WorkBench toolkit shares: the `Toolkit` base (one rollout's `Workplace`), pagination and the small
helpers the tools word their answers with."""

from __future__ import annotations

from typing import Any

from resources_servers.workplace_assistant.tables import Workplace, compare_naive


def quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def paginate(items: list, page: Any, page_size: Any) -> tuple[list, Any, Any]:
    """Pagination P: `(page of items, clamped page, total pages)`; no type or range checks (errors propagate)."""
    total = len(items)
    total_pages = (total + page_size - 1) // page_size
    page = max(1, min(page, total_pages)) if total_pages > 0 else 1
    start = (page - 1) * page_size
    end = min(start + page_size, total)
    return items[start:end], page, total_pages


def records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]


def next_id(workplace_table, column: str) -> str:
    return str(int(workplace_table.max_id(column)) + 1).zfill(8)


class Toolkit:
    def __init__(self, workplace: Workplace):
        self.w = workplace


def missing_id_or_field(key: Any, field: Any, noun: str) -> str | None:
    """The reference's first checks of a `get_*_information_by_id` tool: its answer when the ID or the field is
    missing, else None."""
    if not key:
        return f"{noun} ID not provided."
    if not field:
        return "Field not provided."
    return None


def delete_row(table: Any, column: str, key: Any, noun: str) -> str:
    """The reference's delete tool: remove the row whose `column` is `key` from `table`, worded for `noun`."""
    if not key:
        return f"{noun} ID not provided."
    if not table.has(column, key):
        return f"{noun} not found."
    table.delete(column, key)
    return f"{noun} deleted successfully."


def at_or_after(moment, bound) -> bool:
    compare_naive(moment, bound)
    return moment >= bound
