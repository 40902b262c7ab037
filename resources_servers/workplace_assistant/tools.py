"""The 27 WorkBench tools, with NeMo-Gym's names, arguments, messages and quirks (spec: workplace_assistant.md §1).

Each toolkit is a class whose methods are the tools without the toolkit prefix, so a wrong keyword argument fails
with the reference's own text (`EmailTool.get_email_information_by_id() got an unexpected keyword argument 'x'`).
`call(workplace, name, arguments)` runs one tool on one rollout's state; exceptions a tool does not catch itself
propagate to the caller (the HTTP route words them, the replay skips the call). `TOOL_SCHEMAS` are the function
definitions the dataset rows offer (our own descriptions; same names, arguments and types as NeMo-Gym's).
"""

from __future__ import annotations

import re
from typing import Any

from resources_servers.workplace_assistant.tables import (
    NOW,
    TimestampError,
    Workplace,
    compare_naive,
    keep,
    parse_timestamp,
    regex_mask,
)

EMAIL_FIELDS = "email_id, inbox/outbox, sender/recipient, subject, sent_datetime, body"
EVENT_FIELDS = ("event_id", "event_name", "participant_email", "event_start", "duration")
EVENT_UPDATABLE = EVENT_FIELDS[1:]
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


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def paginate(items: list, page: Any, page_size: Any) -> tuple[list, Any, Any]:
    """Pagination P: `(page of items, clamped page, total pages)`; no type or range checks (errors propagate)."""
    total = len(items)
    total_pages = (total + page_size - 1) // page_size
    page = max(1, min(page, total_pages)) if total_pages > 0 else 1
    start = (page - 1) * page_size
    end = min(start + page_size, total)
    return items[start:end], page, total_pages


def _records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]


def _next_id(workplace_table, column: str) -> str:
    return str(int(workplace_table.max_id(column)) + 1).zfill(8)


class _Toolkit:
    def __init__(self, workplace: Workplace):
        self.w = workplace


class CompanyDirectoryTool(_Toolkit):
    def find_email_address(self, name=""):
        if name == "":
            return "Name not provided."
        pattern = re.compile(name.lower(), re.IGNORECASE)
        return [address for address in self.w.directory if pattern.search(address)]


class EmailTool(_Toolkit):
    def get_email_information_by_id(self, email_id=None, field=None):
        try:
            if not email_id:
                return "Email ID not provided."
            if not field:
                return "Field not provided."
            row = self.w.emails.first("email_id", email_id)
            if row is None:
                return "Email not found."
            if field in frozenset(self.w.emails.columns):
                return {field: row[field]}
            return f"Field '{field}' not found. Available fields: {EMAIL_FIELDS}"
        except Exception as exc:
            return f"Error retrieving email information: {exc}"

    def search_emails(self, query="", date_min=None, date_max=None, page=1, page_size=5):
        try:
            words = query.lower().split()
            rows = [row for row in self.w.emails.rows
                    if all(word in f"{row['subject']} {row['body']} {row['sender/recipient']}".lower()
                           for word in words)]
            dated = [(parse_timestamp(row["sent_datetime"]), position, row) for position, row in enumerate(rows)]
            dated.sort(key=lambda item: (item[0], item[1]), reverse=True)  # newest first; ties: latest row first
            if date_min:
                low = parse_timestamp(date_min).date()
                dated = [item for item in dated if item[0].date() >= low]
            if date_max:
                high = parse_timestamp(date_max).date()
                dated = [item for item in dated if item[0].date() <= high]
            shown, page, total_pages = paginate([row for _, _, row in dated], page, page_size)
            if not dated:
                return "No emails found."
            return {"emails": _records(shown), "pagination": {
                "total_emails": len(dated), "page": page, "page_size": page_size, "total_pages": total_pages}}
        except Exception as exc:
            return f"Error searching emails: {exc}"

    def send_email(self, recipient=None, subject=None, body=None):
        if not recipient or not subject or not body:
            return "Recipient, subject, or body not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        try:
            emails = self.w.emails
            new_id = "1" if not emails.rows else str(int(emails.max_id("email_id")) + 1)  # not zero-padded (Q1)
            emails.append({"email_id": new_id, "inbox/outbox": "outbox", "sender/recipient": recipient.lower(),
                           "subject": subject, "sent_datetime": NOW, "body": body}, "relabel")
            return "Email sent successfully."
        except Exception as exc:
            return f"Error sending email: {exc}"

    def delete_email(self, email_id=None):
        try:
            if not email_id:
                return "Email ID not provided."
            if not self.w.emails.has("email_id", email_id):
                return "Email not found."
            self.w.emails.delete("email_id", email_id)
            return "Email deleted successfully."
        except Exception as exc:
            return f"Error deleting email: {exc}"

    def forward_email(self, email_id=None, recipient=None):
        if not email_id or not recipient:
            return "Email ID or recipient not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        try:
            row = self.w.emails.first("email_id", email_id)
            if row is None:
                return "Email not found."
            result = self.send_email(recipient.lower(), "FW: " + row["subject"], row["body"])
            if "Error" in result or "Invalid" in result:
                return result
            return "Email forwarded successfully."
        except Exception as exc:
            return f"Error forwarding email: {exc}"

    def reply_email(self, email_id=None, body=None):
        if not email_id or not body:
            return "Email ID or body not provided."
        try:
            row = self.w.emails.first("email_id", email_id)
            if row is None:
                return "Email not found."
            result = self.send_email(row["sender/recipient"], "RE: " + row["subject"], body)
            if "Error" in result or "Invalid" in result:
                return result
            return "Email replied successfully."
        except Exception as exc:
            return f"Error replying to email: {exc}"


def _event_id_ok(event_id: Any) -> bool:
    return isinstance(event_id, str) and len(event_id) == 8 and event_id.isdigit()


def _check_duration(duration: Any) -> str | None:
    try:
        minutes = int(duration)
    except ValueError:
        return "Invalid duration format. Expected a number of minutes."
    if minutes <= 0:
        return "Duration must be a positive number of minutes."
    return None


def _parses(value: Any) -> bool:
    try:
        parse_timestamp(value)
    except TimestampError:
        return False
    return True


class CalendarTool(_Toolkit):
    def get_event_information_by_id(self, event_id=None, field=None):
        if not event_id:
            return "Event ID not provided."
        if not field:
            return "Field not provided."
        if not _event_id_ok(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        if field not in EVENT_FIELDS:
            return f"Invalid field. Available fields are: {', '.join(EVENT_FIELDS)}"
        row = self.w.calendar.first("event_id", event_id)
        return "Event not found." if row is None else {field: row[field]}

    def search_events(self, query="", time_min=None, time_max=None, page=1, page_size=5):
        bounds = {}
        for name, value in (("time_min", time_min), ("time_max", time_max)):
            if value:
                try:
                    bounds[name] = parse_timestamp(value)
                except TimestampError:
                    return f"Invalid {name} format. Expected YYYY-MM-DD HH:MM:SS."
        table = self.w.calendar
        if query:
            names = regex_mask(table, "event_name", query, missing_raises=False)
            emails = regex_mask(table, "participant_email", query, missing_raises=False)
            table = keep(table, [a or b for a, b in zip(names, emails, strict=True)])
        dated = [(parse_timestamp(row["event_start"]), row) for row in table.rows]
        if "time_min" in bounds:
            dated = [item for item in dated if _at_or_after(item[0], bounds["time_min"])]
        if "time_max" in bounds:
            dated = [item for item in dated if _at_or_after(bounds["time_max"], item[0])]
        if not dated:
            return "No events found."
        dated.sort(key=lambda item: item[0], reverse=True)  # stable: ties keep table order
        shown, page, total_pages = paginate([row for _, row in dated], page, page_size)
        return {"events": _records(shown), "pagination": {
            "total_events": len(dated), "page": page, "page_size": page_size, "total_pages": total_pages}}

    def create_event(self, event_name=None, participant_email=None, event_start=None, duration=None):
        if not event_name:
            return "Event name not provided."
        if not participant_email:
            return "Participant email not provided."
        if not event_start:
            return "Event start not provided."
        if not duration:
            return "Event duration not provided."
        if not _parses(event_start):
            return "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."
        problem = _check_duration(duration)
        if problem:
            return problem
        email = participant_email.lower()
        new_id = _next_id(self.w.calendar, "event_id")
        self.w.calendar.append({"event_id": new_id, "event_name": event_name, "participant_email": email,
                                "event_start": event_start, "duration": duration}, "zero")
        return new_id

    def delete_event(self, event_id=None):
        if not event_id:
            return "Event ID not provided."
        if not _event_id_ok(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        if not self.w.calendar.has("event_id", event_id):
            return "Event not found."
        self.w.calendar.delete("event_id", event_id)
        return "Event deleted successfully."

    def update_event(self, event_id=None, field=None, new_value=None):
        if not event_id or not field or not new_value:
            return "Event ID, field, or new value not provided."
        if not _event_id_ok(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        if field not in EVENT_UPDATABLE:
            return f"Invalid field. Available fields are: {', '.join(EVENT_UPDATABLE)}"
        if field == "event_start" and not _parses(new_value):
            return "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."
        if field == "duration":
            problem = _check_duration(new_value)
            if problem:
                return problem
        if not self.w.calendar.has("event_id", event_id):
            return "Event not found."
        if field == "participant_email":
            new_value = new_value.lower()
        self.w.calendar.update("event_id", event_id, field, new_value)
        return "Event updated successfully."


def _at_or_after(moment, bound) -> bool:
    compare_naive(moment, bound)
    return moment >= bound


class AnalyticsTool(_Toolkit):
    def get_visitor_information_by_id(self, visitor_id=None):
        if not visitor_id:
            return "Visitor ID not provided."
        rows = [row for row in self.w.visits.rows if row["visitor_id"] == visitor_id]
        if not rows:
            return "Visitor not found."
        if self.w.durations_as_float:
            rows = [{**row, "session_duration_seconds": float(row["session_duration_seconds"])} for row in rows]
        return _records(rows)

    def create_plot(self, time_min=None, time_max=None, value_to_plot=None, plot_type=None):
        if not time_min:
            return "Start date not provided."
        if not time_max:
            return "End date not provided."
        if value_to_plot not in PLOT_VALUES:
            return f"Value to plot must be one of {_quoted(PLOT_VALUES)}"
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


class ProjectManagementTool(_Toolkit):
    def get_task_information_by_id(self, task_id=None, field=None):
        if not task_id:
            return "Task ID not provided."
        if not field:
            return "Field not provided."
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
        return _records(table.rows)

    def create_task(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None, board=None):
        if not (task_name and assigned_to_email and list_name and due_date and board):
            return "Missing task details."
        assignee = assigned_to_email.lower()
        for field, value in (("assigned_to_email", assignee), ("list_name", list_name), ("board", board)):
            problem = _task_value_problem(self.w, field, value)
            if problem:
                return problem
        new_id = _next_id(self.w.tasks, "task_id")
        self.w.tasks.append({"task_id": new_id, "task_name": task_name, "assigned_to_email": assignee,
                             "list_name": list_name, "due_date": due_date, "board": board}, "relabel")
        return new_id

    def delete_task(self, task_id=None):
        if not task_id:
            return "Task ID not provided."
        if not self.w.tasks.has("task_id", task_id):
            return "Task not found."
        self.w.tasks.delete("task_id", task_id)
        return "Task deleted successfully."

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


class CustomerRelationshipManagerTool(_Toolkit):
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
        return {"customers": _records(shown), "pagination": {
            "total_customers": len(table.rows), "page": page, "page_size": page_size, "total_pages": total_pages}}

    def update_customer(self, customer_id=None, field=None, new_value=None):
        if not customer_id or not field or not new_value:
            return "Customer ID, field, or new value not provided."
        if field == "status" and new_value not in STATUSES:
            return f"Status not valid. Please choose from: {_quoted(STATUSES)}"
        if field == "product_interest" and new_value not in PRODUCTS:
            return f"Product interest not valid. Please choose from: {_quoted(PRODUCTS)}"
        if field in ("customer_email", "assigned_to_email"):
            new_value = new_value.lower()
        if not self.w.crm.has("customer_id", customer_id):
            return "Customer not found."
        if field not in frozenset(self.w.crm.columns):
            return f"Field not valid. Please choose from: {_quoted(CRM_FIELDS)}"
        self.w.crm.update("customer_id", customer_id, field, new_value)
        return "Customer updated successfully."

    def add_customer(self, customer_name=None, assigned_to_email=None, status=None, customer_email=None,
                     customer_phone=None, last_contact_date=None, product_interest=None, notes="", follow_up_by=None):
        if not customer_name or not assigned_to_email or not status:
            return "Please provide all required fields: customer_name, assigned_to_email, status."
        new_id = _next_id(self.w.crm, "customer_id")
        self.w.crm.append({
            "customer_id": new_id, "assigned_to_email": assigned_to_email.lower(), "customer_name": customer_name,
            "customer_email": customer_email.lower() if customer_email else customer_email,
            "customer_phone": customer_phone, "last_contact_date": last_contact_date,
            "product_interest": product_interest, "status": status, "follow_up_by": follow_up_by, "notes": notes,
        }, "relabel")
        return new_id

    def delete_customer(self, customer_id=None):
        if not customer_id:
            return "Customer ID not provided."
        if not self.w.crm.has("customer_id", customer_id):
            return "Customer not found."
        self.w.crm.delete("customer_id", customer_id)
        return "Customer deleted successfully."


TOOLKITS: dict[str, type[_Toolkit]] = {
    "company_directory": CompanyDirectoryTool,
    "email": EmailTool,
    "calendar": CalendarTool,
    "analytics": AnalyticsTool,
    "project_management": ProjectManagementTool,
    "customer_relationship_manager": CustomerRelationshipManagerTool,
}
TOOL_NAMES = (
    "company_directory_find_email_address",
    "email_get_email_information_by_id", "email_search_emails", "email_send_email", "email_delete_email",
    "email_forward_email", "email_reply_email",
    "calendar_get_event_information_by_id", "calendar_search_events", "calendar_create_event",
    "calendar_delete_event", "calendar_update_event",
    "analytics_get_visitor_information_by_id", "analytics_create_plot", "analytics_total_visits_count",
    "analytics_engaged_users_count", "analytics_traffic_source_count", "analytics_get_average_session_duration",
    "project_management_get_task_information_by_id", "project_management_search_tasks",
    "project_management_create_task", "project_management_delete_task", "project_management_update_task",
    "customer_relationship_manager_search_customers", "customer_relationship_manager_update_customer",
    "customer_relationship_manager_add_customer", "customer_relationship_manager_delete_customer",
)
"""NeMo-Gym's registration order (also the order of every row's `tools`)."""
_REGISTRY = {
    name: (toolkit, name[len(prefix) + 1:])
    for name in TOOL_NAMES
    for prefix, toolkit in TOOLKITS.items()
    if name.startswith(prefix + "_")
}


def call(workplace: Workplace, name: str, arguments: dict[str, Any]) -> Any:
    """Run tool `name` with keyword `arguments` on `workplace`.

    Raises:
        KeyError: `name` is not one of the 27 tools (its text is the quoted name, as the reference's).
        Exception: whatever the tool does not catch itself (wrong argument names, regex errors, ...).
    """
    toolkit, method = _REGISTRY[name]
    return getattr(toolkit(workplace), method)(**arguments)
