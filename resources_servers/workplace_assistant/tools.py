"""The 27 WorkBench tools, with NeMo-Gym's names, arguments, messages and quirks (spec: workplace_assistant.md §1).

Each toolkit is a class whose methods are the tools without the toolkit prefix, so a wrong keyword argument fails
with the reference's own text (`EmailTool.get_email_information_by_id() got an unexpected keyword argument 'x'`).
`call(workplace, name, arguments)` runs one tool on one rollout's state; exceptions a tool does not catch itself
propagate to the caller (the HTTP route words them, the replay skips the call). `TOOL_SCHEMAS` are the function
definitions the dataset rows offer (our own descriptions; same names, arguments and types as NeMo-Gym's).

This module holds the directory, email and calendar toolkits and the registry; the toolkits over the record tables
(analytics, project management, CRM) are in `record_tools.py`, what they all share in `toolkit.py`.
"""

from __future__ import annotations

import re
from typing import Any

from resources_servers.workplace_assistant.record_tools import (  # noqa: F401  (the value lists: re-exported)
    BOARDS,
    LISTS,
    PRODUCTS,
    STATUSES,
    AnalyticsTool,
    CustomerRelationshipManagerTool,
    ProjectManagementTool,
)
from resources_servers.workplace_assistant.tables import (
    NOW,
    TimestampError,
    Workplace,
    keep,
    parse_timestamp,
    regex_mask,
)
from resources_servers.workplace_assistant.toolkit import (
    Toolkit,
    at_or_after,
    delete_row,
    missing_id_or_field,
    next_id,
    paginate,
    records,
)

EMAIL_FIELDS = "email_id, inbox/outbox, sender/recipient, subject, sent_datetime, body"
EVENT_FIELDS = ("event_id", "event_name", "participant_email", "event_start", "duration")
EVENT_UPDATABLE = EVENT_FIELDS[1:]


class CompanyDirectoryTool(Toolkit):
    def find_email_address(self, name=""):
        if name == "":
            return "Name not provided."
        pattern = re.compile(name.lower(), re.IGNORECASE)
        return [address for address in self.w.directory if pattern.search(address)]


class EmailTool(Toolkit):
    def get_email_information_by_id(self, email_id=None, field=None):
        try:
            if problem := missing_id_or_field(email_id, field, "Email"):
                return problem
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
            return {"emails": records(shown), "pagination": {
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
            return delete_row(self.w.emails, "email_id", email_id, "Email")
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


class CalendarTool(Toolkit):
    def get_event_information_by_id(self, event_id=None, field=None):
        if problem := missing_id_or_field(event_id, field, "Event"):
            return problem
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
            dated = [item for item in dated if at_or_after(item[0], bounds["time_min"])]
        if "time_max" in bounds:
            dated = [item for item in dated if at_or_after(bounds["time_max"], item[0])]
        if not dated:
            return "No events found."
        dated.sort(key=lambda item: item[0], reverse=True)  # stable: ties keep table order
        shown, page, total_pages = paginate([row for _, row in dated], page, page_size)
        return {"events": records(shown), "pagination": {
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
        new_id = next_id(self.w.calendar, "event_id")
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


TOOLKITS: dict[str, type[Toolkit]] = {
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
