"""The WorkBench toolkits over the workplace's record tables: analytics (website visits), project management (tasks)
and the customer relationship manager, with NeMo-Gym's names, arguments and messages (`tools.py` registers them).
"""

from __future__ import annotations

import re
from typing import Any

from resources_servers.workplace_assistant.tables import (
    Workplace,
    keep,
    regex_mask,
)
from resources_servers.workplace_assistant.toolkit import (
    Toolkit,
    delete_row,
    missing_id_or_field,
    next_id,
    paginate,
    quoted,
    records,
)

PLOT_VALUES = ("total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral",
               "visits_search_engine", "visits_social_media")
PLOT_TYPES = ("bar", "line", "scatter", "histogram")
LISTS = ("Backlog", "In Progress", "In Review", "Completed")
BOARDS = ("Back end", "Front end", "Design")
STATUSES = ("Qualified", "Won", "Lost", "Lead", "Proposal")
PRODUCTS = ("Software", "Hardware", "Services", "Consulting", "Training")
CRM_FIELDS = ("customer_name", "assigned_to_email", "customer_email", "customer_phone", "last_contact_date",
              "product_interest", "status", "notes", "follow_up_by")
ASSIGNEE_PATTERN = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$")

LIST_MESSAGE = "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'."
BOARD_MESSAGE = "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'."
ASSIGNEE_MESSAGE = "Assignee email not valid. Please choose from the list of team members."


class AnalyticsTool(Toolkit):
    def get_visitor_information_by_id(self, visitor_id=None):
        if not visitor_id:
            return "Visitor ID not provided."
        rows = [row for row in self.w.visits.rows if row["visitor_id"] == visitor_id]
        if not rows:
            return "Visitor not found."
        if self.w.durations_as_float:
            rows = [{**row, "session_duration_seconds": float(row["session_duration_seconds"])} for row in rows]
        return records(rows)

    def create_plot(self, time_min=None, time_max=None, value_to_plot=None, plot_type=None):
        if not time_min:
            return "Start date not provided."
        if not time_max:
            return "End date not provided."
        if value_to_plot not in PLOT_VALUES:
            return f"Value to plot must be one of {quoted(PLOT_VALUES)}"
        if plot_type not in PLOT_TYPES:
            return "Plot type must be one of 'bar', 'line', 'scatter', or 'histogram'"
        path = f"plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png"
        self.w.plots.append({"file_path": path}, "count")
        return path

    def _visits(self, time_min, time_max) -> list[dict[str, Any]]:
        rows = self.w.visits.rows
        if time_min:
            rows = [row for row in rows if row["date_of_visit"] >= time_min]
        if time_max:
            rows = [row for row in rows if row["date_of_visit"] <= time_max]
        return rows

    @staticmethod
    def _per_date(rows: list[dict[str, Any]], value) -> dict[str, Any]:
        counts: dict[str, Any] = {}
        for row in sorted(rows, key=lambda row: row["date_of_visit"]):
            counts[row["date_of_visit"]] = counts.get(row["date_of_visit"], 0) + value(row)
        return counts

    def total_visits_count(self, time_min=None, time_max=None):
        return self._per_date(self._visits(time_min, time_max), lambda row: 1)

    def engaged_users_count(self, time_min=None, time_max=None):
        return self._per_date(self._visits(time_min, time_max), lambda row: int(row["user_engaged"]))

    def traffic_source_count(self, time_min=None, time_max=None, traffic_source=None):
        rows = self._visits(time_min, time_max)
        if traffic_source:
            return self._per_date(rows, lambda row: int(row["traffic_source"] == traffic_source))
        return self._per_date(rows, lambda row: 1)

    def get_average_session_duration(self, time_min=None, time_max=None):
        if not time_min and not time_max:
            self.w.durations_as_float = True  # quirk Q9: the unbounded call converts the column for good
        rows = self._visits(time_min, time_max)
        sums = self._per_date(rows, lambda row: int(float(row["session_duration_seconds"])))
        counts = self._per_date(rows, lambda row: 1)
        return {date: total / counts[date] for date, total in sums.items()}


def _task_value_problem(workplace: Workplace, field: str, value: Any) -> str | None:
    if field == "board" and value not in BOARDS:
        return BOARD_MESSAGE
    if field == "list_name" and value not in LISTS:
        return LIST_MESSAGE
    if field == "assigned_to_email":
        members = {cell.lower() for cell in workplace.tasks.values("assigned_to_email") if isinstance(cell, str)}
        if value not in members:
            return ASSIGNEE_MESSAGE
    return None


class ProjectManagementTool(Toolkit):
    def get_task_information_by_id(self, task_id=None, field=None):
        if problem := missing_id_or_field(task_id, field, "Task"):
            return problem
        row = self.w.tasks.first("task_id", task_id)
        if row is None:
            return "Task not found."
        return {field: row[field]} if field in frozenset(self.w.tasks.columns) else "Field not found."

    def search_tasks(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None, board=None):
        if not (task_name or assigned_to_email or list_name or due_date or board):
            return "No search parameters provided."
        if assigned_to_email and not ASSIGNEE_PATTERN.match(assigned_to_email):
            return "Invalid email format for assigned_to_email."
        table = self.w.tasks
        for column, value in (("task_name", task_name), ("assigned_to_email", assigned_to_email),
                              ("list_name", list_name), ("due_date", due_date), ("board", board)):
            if not value:
                continue
            if column == "assigned_to_email":
                wanted = value.lower()
                mask = [isinstance(row[column], str) and row[column].lower() == wanted for row in table.rows]
            else:
                mask = regex_mask(table, column, value, missing_raises=True)
            table = keep(table, mask)
        return records(table.rows)

    def create_task(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None, board=None):
        if not (task_name and assigned_to_email and list_name and due_date and board):
            return "Missing task details."
        assignee = assigned_to_email.lower()
        for field, value in (("assigned_to_email", assignee), ("list_name", list_name), ("board", board)):
            problem = _task_value_problem(self.w, field, value)
            if problem:
                return problem
        new_id = next_id(self.w.tasks, "task_id")
        self.w.tasks.append({"task_id": new_id, "task_name": task_name, "assigned_to_email": assignee,
                             "list_name": list_name, "due_date": due_date, "board": board}, "relabel")
        return new_id

    def delete_task(self, task_id=None):
        return delete_row(self.w.tasks, "task_id", task_id, "Task")

    def update_task(self, task_id=None, field=None, new_value=None):
        if not task_id or not field or not new_value:
            return "Task ID, field, or new value not provided."
        if field == "assigned_to_email":
            new_value = new_value.lower()
        problem = _task_value_problem(self.w, field, new_value)
        if problem:
            return problem
        if not self.w.tasks.has("task_id", task_id):
            return "Task not found."
        if field not in frozenset(self.w.tasks.columns):
            return "Field not valid."
        self.w.tasks.update("task_id", task_id, field, new_value)
        return "Task updated successfully."


def _date_within(cell: Any, bound: Any, is_min: bool) -> bool:
    """A plain string comparison (`"2023-11-09"` as a maximum excludes `"2023-11-09 23:59:00"`); missing: out."""
    if cell is None:
        return False
    return cell >= bound if is_min else cell <= bound


class CustomerRelationshipManagerTool(Toolkit):
    def search_customers(self, customer_name=None, customer_email=None, product_interest=None, status=None,
                         assigned_to_email=None, last_contact_date_min=None, last_contact_date_max=None,
                         follow_up_by_min=None, follow_up_by_max=None, page=1, page_size=5):
        texts = (("customer_name", customer_name), ("customer_email", customer_email),
                 ("product_interest", product_interest), ("status", status), ("assigned_to_email", assigned_to_email))
        dates = (("last_contact_date", last_contact_date_min, True),
                 ("last_contact_date", last_contact_date_max, False),
                 ("follow_up_by", follow_up_by_min, True), ("follow_up_by", follow_up_by_max, False))
        if not any(value for _, value in texts) and not any(value for _, value, _ in dates):
            return "No search parameters provided. Please provide at least one parameter."
        table = self.w.crm
        for column, value in texts:
            if value:
                table = keep(table, regex_mask(table, column, value, missing_raises=True))
        for column, bound, is_min in dates:
            if bound:
                table = keep(table, [_date_within(row[column], bound, is_min) for row in table.rows])
        shown, page, total_pages = paginate(table.rows, page, page_size)
        if not table.rows:
            return "No customers found."
        return {"customers": records(shown), "pagination": {
            "total_customers": len(table.rows), "page": page, "page_size": page_size, "total_pages": total_pages}}

    def update_customer(self, customer_id=None, field=None, new_value=None):
        if not customer_id or not field or not new_value:
            return "Customer ID, field, or new value not provided."
        if field == "status" and new_value not in STATUSES:
            return f"Status not valid. Please choose from: {quoted(STATUSES)}"
        if field == "product_interest" and new_value not in PRODUCTS:
            return f"Product interest not valid. Please choose from: {quoted(PRODUCTS)}"
        if field in ("customer_email", "assigned_to_email"):
            new_value = new_value.lower()
        if not self.w.crm.has("customer_id", customer_id):
            return "Customer not found."
        if field not in frozenset(self.w.crm.columns):
            return f"Field not valid. Please choose from: {quoted(CRM_FIELDS)}"
        self.w.crm.update("customer_id", customer_id, field, new_value)
        return "Customer updated successfully."

    def add_customer(self, customer_name=None, assigned_to_email=None, status=None, customer_email=None,
                     customer_phone=None, last_contact_date=None, product_interest=None, notes="", follow_up_by=None):
        if not customer_name or not assigned_to_email or not status:
            return "Please provide all required fields: customer_name, assigned_to_email, status."
        new_id = next_id(self.w.crm, "customer_id")
        self.w.crm.append({
            "customer_id": new_id, "assigned_to_email": assigned_to_email.lower(), "customer_name": customer_name,
            "customer_email": customer_email.lower() if customer_email else customer_email,
            "customer_phone": customer_phone, "last_contact_date": last_contact_date,
            "product_interest": product_interest, "status": status, "follow_up_by": follow_up_by, "notes": notes,
        }, "relabel")
        return new_id

    def delete_customer(self, customer_id=None):
        return delete_row(self.w.crm, "customer_id", customer_id, "Customer")
