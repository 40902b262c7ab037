"""Make the synthetic workplace (`data/workplace/`) and the example rows (`data/example.jsonl`), seeded.

    python -m resources_servers.workplace_assistant.generate [--seed 7]

The tables have WorkBench's layout, columns, id scheme (8-digit ids 0..n-1, in shuffled file order) and value sets
(lists, boards, statuses, products, traffic sources), so every tool behaves on them as on WorkBench's, but the
people, texts and numbers are our own. `TOOL_SCHEMAS` are the 27 function definitions the rows offer: NeMo-Gym's
names, argument names and types, our own descriptions.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from resources_servers.workplace_assistant.tables import FILES, REQUIRED_COLUMNS
from resources_servers.workplace_assistant.tools import BOARDS, LISTS, PRODUCTS, STATUSES, TOOL_NAMES

HERE = Path(__file__).resolve().parent
SEED = 7
SYSTEM_PROMPT = (
    "Today's date is Thursday, 2023-11-30 and the current time is 23:59:00. Remember the current date and time "
    "when answering queries. Meetings must not start before 9am or end after 6pm."
)
PEOPLE = ["ines.duarte", "tomas.berg", "priya.nair", "owen.gallagher", "mei.tanaka", "jonas.weber", "amara.okafor",
          "lucas.moreau", "sara.lindqvist", "diego.herrera", "hana.kowalski", "noah.bennett", "yara.haddad",
          "felix.brandt", "zoe.carter", "ravi.iyer", "elena.petrova", "kwame.asante", "julia.rossi", "sam.porter"]
OWNERS = ["ines.duarte", "mei.tanaka", "diego.herrera", "yara.haddad", "ravi.iyer"]
TOPICS = ["Quarterly Roadmap", "Vendor Onboarding", "Office Move", "Security Audit", "Hiring Plan", "Budget Review",
          "Customer Survey", "Release Retrospective", "Data Migration", "Training Week"]
EVENTS = ["standup", "design review", "one on one", "planning session", "vendor call", "budget sync",
          "hiring debrief", "demo day prep", "retro", "lunch and learn"]
VERBS = ["Refactor", "Document", "Test", "Design", "Optimize", "Fix", "Prototype", "Review"]
OBJECTS = ["login flow", "search page", "billing service", "onboarding wizard", "report export", "image cache",
           "settings panel", "notification queue", "audit log", "pricing table"]
COMPANIES = ["brightpath", "solarforge", "quillworks", "mapleai", "tidewater", "ironleaf", "nimbusgrid"]
CLIENT_FIRST = ["Avery", "Blake", "Casey", "Devon", "Emery", "Finley", "Gray", "Harper", "Indy", "Jules"]
CLIENT_LAST = ["Stone", "Rivers", "Hale", "Quinn", "Marsh", "Frost", "Lane", "Reyes", "Vance", "Wolfe"]
SOURCES = ["direct", "referral", "search engine", "social media"]


def _address(person: str) -> str:
    return f"{person}@atlas.com"


def _first(person: str) -> str:
    return person.split(".")[0].title()


def _shuffled_ids(rng: random.Random, count: int) -> list[str]:
    ids = [f"{number:08d}" for number in range(count)]
    rng.shuffle(ids)
    return ids


def emails(rng: random.Random, count: int = 150) -> list[dict[str, Any]]:
    start = datetime(2023, 10, 1, 8, 0, 0)
    seconds = sorted(rng.sample(range(61 * 24 * 3600 - 9 * 3600), count))
    rows = []
    for email_id, offset in zip(_shuffled_ids(rng, count), seconds, strict=True):
        person, topic = rng.choice(PEOPLE[:-1]), rng.choice(TOPICS)
        kind = rng.choice(["Update on", "Question about", "Notes from"])
        body = (f"Hi Sam,\\n\\n{rng.choice(['Sharing', 'Following up with', 'Attaching'])} my notes on the {topic}. "
                f"{rng.choice(['Let me know what you think.', 'Can we discuss this week?', 'No action needed.'])}"
                f"\\n\\nBest,\\n{_first(person)}")
        rows.append({"email_id": email_id, "inbox/outbox": "inbox", "sender/recipient": _address(person),
                     "subject": f"{kind} {topic}", "sent_datetime": str(start + timedelta(seconds=offset)),
                     "body": body})
    return rows


def calendar(rng: random.Random, count: int = 120) -> list[dict[str, Any]]:
    slots = set()
    while len(slots) < count:
        day = date(2023, 9, 1) + timedelta(days=rng.randrange(110))
        slots.add(datetime(day.year, day.month, day.day, 9) + timedelta(minutes=30 * rng.randrange(16)))
    return [{"event_id": event_id, "event_name": rng.choice(EVENTS), "participant_email": _address(rng.choice(PEOPLE)),
             "event_start": str(moment), "duration": rng.choice(["30", "60", "90", "120"])}
            for event_id, moment in zip(_shuffled_ids(rng, count), sorted(slots), strict=True)]


def tasks(rng: random.Random, count: int = 150) -> list[dict[str, Any]]:
    team = PEOPLE[:12]
    rows = [{"task_id": task_id, "task_name": f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}",
             "assigned_to_email": _address(rng.choice(team)), "list_name": rng.choice(LISTS),
             "due_date": str(date(2023, 11, 27) + timedelta(days=rng.randrange(17))), "board": rng.choice(BOARDS)}
            for task_id in _shuffled_ids(rng, count)]
    return sorted(rows, key=lambda row: row["due_date"])


def crm(rng: random.Random, count: int = 80) -> list[dict[str, Any]]:
    rows = []
    for customer_id in _shuffled_ids(rng, count):
        first, last, company = rng.choice(CLIENT_FIRST), rng.choice(CLIENT_LAST), rng.choice(COMPANIES)
        contacted = date(2023, 10, 1) + timedelta(days=rng.randrange(61))
        rows.append({
            "customer_id": customer_id, "assigned_to_email": _address(rng.choice(OWNERS)),
            "customer_name": f"{first} {last}", "customer_email": f"{first.lower()}.{last.lower()}@{company}",
            "customer_phone": f"555-{rng.randrange(1000):03d}-{rng.randrange(10000):04d}" if rng.random() < 0.5
            else "",
            "last_contact_date": f"{contacted} 23:59:00", "product_interest": rng.choice(PRODUCTS),
            "status": rng.choice(STATUSES),
            "follow_up_by": f"{contacted + timedelta(days=rng.randrange(7, 40))} 23:59:00",
            "notes": f"{contacted}: {rng.choice(['Had a call.', 'Sent a quote.', 'Saw the demo.'])} "
            if rng.random() < 0.75 else "",
        })
    return rows


def visits(rng: random.Random, count: int = 400) -> list[dict[str, Any]]:
    days = [date(2023, 9, 1) + timedelta(days=offset) for offset in range(91)]
    dates = days + [rng.choice(days) for _ in range(count - len(days))]  # every day has a visit
    rng.shuffle(dates)
    return [{"date_of_visit": str(day), "visitor_id": f"{rng.randrange(10000):04d}",
             "page_views": str(rng.randint(1, 12)), "session_duration_seconds": str(rng.randint(1, 60)),
             "traffic_source": rng.choice(SOURCES),
             "user_engaged": str(rng.random() < 0.5)} for day in dates]


def write_tables(folder: Path, seed: int = SEED) -> dict[str, list[dict[str, Any]]]:
    """Write the six tables under `folder`; returns them (name -> rows)."""
    rng = random.Random(seed)
    tables = {"emails": emails(rng), "calendar": calendar(rng), "tasks": tasks(rng), "crm": crm(rng),
              "visits": visits(rng)}
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        with (folder / FILES[name]).open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=REQUIRED_COLUMNS[name], lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    (folder / "raw" / "email_addresses.csv").write_text("\n".join(_address(person) for person in PEOPLE[:-1]) + "\n")
    return tables


# ---- tool definitions ---------------------------------------------------------------------------------------------

S, INT = "string", "integer"
_DATE = "Date text, YYYY-MM-DD."
_PAGE = {"page": (INT, "Page of results, from 1 (default 1)."), "page_size": (INT, "Results per page (default 5).")}
_SPECS: dict[str, tuple[str, dict[str, tuple[str, str]], tuple[str, ...]]] = {
    "company_directory_find_email_address": (
        "Look up coworkers' email addresses by (part of) their name.",
        {"name": (S, "Name or part of a name, e.g. 'ines'.")}, ()),
    "email_get_email_information_by_id": (
        "Read one field of an email by its id.",
        {"email_id": (S, "8-digit email id."), "field": (S, "Column to read, e.g. 'subject' or 'body'.")},
        ("email_id", "field")),
    "email_search_emails": (
        "Search emails by words in subject, body or address, newest first, optionally between two dates.",
        {"query": (S, "Words that must all appear."), "date_min": (S, "Earliest sent date. " + _DATE),
         "date_max": (S, "Latest sent date. " + _DATE), **_PAGE}, ()),
    "email_send_email": (
        "Send a new email.",
        {"recipient": (S, "Recipient's address."), "subject": (S, "Subject line."), "body": (S, "Message text.")},
        ("recipient", "subject", "body")),
    "email_delete_email": ("Delete an email by id.", {"email_id": (S, "8-digit email id.")}, ("email_id",)),
    "email_forward_email": (
        "Forward an email to someone.",
        {"email_id": (S, "8-digit email id."), "recipient": (S, "Address to forward to.")}, ("email_id", "recipient")),
    "email_reply_email": (
        "Reply to an email's sender.",
        {"email_id": (S, "8-digit email id."), "body": (S, "Reply text.")}, ("email_id", "body")),
    "calendar_get_event_information_by_id": (
        "Read one field of a calendar event by its id.",
        {"event_id": (S, "8-digit event id."), "field": (S, "Column to read, e.g. 'event_start'.")},
        ("event_id", "field")),
    "calendar_search_events": (
        "Search events by name or participant, latest first, optionally by start time.",
        {"query": (S, "Text in the event name or participant address."),
         "time_min": (S, "Earliest start, YYYY-MM-DD HH:MM:SS."),
         "time_max": (S, "Latest start, YYYY-MM-DD HH:MM:SS."),
         **_PAGE}, ()),
    "calendar_create_event": (
        "Create a calendar event; returns its id.",
        {"event_name": (S, "Event name."), "participant_email": (S, "Participant's address."),
         "event_start": (S, "Start, YYYY-MM-DD HH:MM:SS."), "duration": (S, "Length in minutes, e.g. '60'.")},
        ("event_name", "participant_email", "event_start", "duration")),
    "calendar_delete_event": ("Delete an event by id.", {"event_id": (S, "8-digit event id.")}, ("event_id",)),
    "calendar_update_event": (
        "Change one field of an event.",
        {"event_id": (S, "8-digit event id."),
         "field": (S, "One of event_name, participant_email, event_start, duration."), "new_value": (S, "New value.")},
        ("event_id", "field", "new_value")),
    "analytics_get_visitor_information_by_id": (
        "Website visits of one visitor.", {"visitor_id": (S, "4-digit visitor id.")}, ("visitor_id",)),
    "analytics_create_plot": (
        "Plot a website metric over a date range; returns the image path.",
        {"time_min": (S, "First date. " + _DATE), "time_max": (S, "Last date. " + _DATE),
         "value_to_plot": (S, "total_visits, session_duration_seconds, user_engaged, visits_direct, visits_referral, "
                              "visits_search_engine or visits_social_media."),
         "plot_type": (S, "bar, line, scatter or histogram.")},
        ("time_min", "time_max", "value_to_plot", "plot_type")),
    "analytics_total_visits_count": (
        "Visits per day.", {"time_min": (S, "First date. " + _DATE), "time_max": (S, "Last date. " + _DATE)}, ()),
    "analytics_engaged_users_count": (
        "Engaged visits per day.", {"time_min": (S, "First date. " + _DATE), "time_max": (S, "Last date. " + _DATE)},
        ()),
    "analytics_traffic_source_count": (
        "Visits per day from one traffic source.",
        {"time_min": (S, "First date. " + _DATE), "time_max": (S, "Last date. " + _DATE),
         "traffic_source": (S, "direct, referral, search engine or social media.")}, ()),
    "analytics_get_average_session_duration": (
        "Mean session length in seconds per day.",
        {"time_min": (S, "First date. " + _DATE), "time_max": (S, "Last date. " + _DATE)}, ()),
    "project_management_get_task_information_by_id": (
        "Read one field of a task by its id.",
        {"task_id": (S, "8-digit task id."), "field": (S, "Column to read, e.g. 'list_name'.")}, ("task_id", "field")),
    "project_management_search_tasks": (
        "Find tasks matching all the given fields.",
        {"task_name": (S, "Text in the task name."), "assigned_to_email": (S, "Assignee's address."),
         "list_name": (S, "Backlog, In Progress, In Review or Completed."), "due_date": (S, "Due date. " + _DATE),
         "board": (S, "Back end, Front end or Design.")}, ()),
    "project_management_create_task": (
        "Create a task; returns its id.",
        {"task_name": (S, "Task name."), "assigned_to_email": (S, "Assignee (a team member's address)."),
         "list_name": (S, "Backlog, In Progress, In Review or Completed."), "due_date": (S, "Due date. " + _DATE),
         "board": (S, "Back end, Front end or Design.")},
        ("task_name", "assigned_to_email", "list_name", "due_date", "board")),
    "project_management_delete_task": ("Delete a task by id.", {"task_id": (S, "8-digit task id.")}, ("task_id",)),
    "project_management_update_task": (
        "Change one field of a task.",
        {"task_id": (S, "8-digit task id."), "field": (S, "Column to change, e.g. 'list_name'."),
         "new_value": (S, "New value.")}, ("task_id", "field", "new_value")),
    "customer_relationship_manager_search_customers": (
        "Find customers matching all the given filters.",
        {"customer_name": (S, "Text in the name."), "customer_email": (S, "Text in the address."),
         "product_interest": (S, "Software, Hardware, Services, Consulting or Training."),
         "status": (S, "Qualified, Won, Lost, Lead or Proposal."), "assigned_to_email": (S, "Account owner."),
         "last_contact_date_min": (S, "Earliest last contact. " + _DATE),
         "last_contact_date_max": (S, "Latest last contact. " + _DATE),
         "follow_up_by_min": (S, "Earliest follow-up date. " + _DATE),
         "follow_up_by_max": (S, "Latest follow-up date. " + _DATE), **_PAGE}, ()),
    "customer_relationship_manager_update_customer": (
        "Change one field of a customer.",
        {"customer_id": (S, "8-digit customer id."), "field": (S, "Column to change, e.g. 'status'."),
         "new_value": (S, "New value.")}, ("customer_id", "field", "new_value")),
    "customer_relationship_manager_add_customer": (
        "Add a customer; returns its id.",
        {"customer_name": (S, "Name."), "assigned_to_email": (S, "Account owner's address."),
         "status": (S, "Qualified, Won, Lost, Lead or Proposal."), "customer_email": (S, "Customer's address."),
         "customer_phone": (S, "Phone number."), "last_contact_date": (S, "Last contact. " + _DATE),
         "product_interest": (S, "Software, Hardware, Services, Consulting or Training."),
         "notes": (S, "Notes."), "follow_up_by": (S, "Follow-up date. " + _DATE)},
        ("customer_name", "assigned_to_email", "status")),
    "customer_relationship_manager_delete_customer": (
        "Delete a customer by id.", {"customer_id": (S, "8-digit customer id.")}, ("customer_id",)),
}
if tuple(_SPECS) != TOOL_NAMES:
    raise RuntimeError("generate.py needs one tool definition per tool of tools.TOOL_NAMES, in that order")
TOOL_SCHEMAS = [
    {"type": "function", "name": name, "description": description, "strict": False,
     "parameters": {"type": "object", "additionalProperties": False, "required": list(required),
                    "properties": {arg: {"type": kind, "description": text} for arg, (kind, text) in args.items()}}}
    for name, (description, args, required) in _SPECS.items()
]


# ---- example rows -------------------------------------------------------------------------------------------------


def _call(name: str, **arguments: Any) -> dict[str, str]:
    return {"name": name, "arguments": json.dumps(arguments)}


def example_rows(tables: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Five tasks over the synthetic tables, each with its reference solution."""
    latest = max((row for row in tables["emails"] if row["sender/recipient"].startswith("priya.")),
                 key=lambda row: row["sent_datetime"])
    last_event = max(tables["calendar"], key=lambda row: row["event_start"])
    owner_leads = [row for row in tables["crm"]
                   if row["assigned_to_email"].startswith("mei.") and row["status"] == "Lead"]
    review = [row for row in tables["tasks"] if row["list_name"] == "In Review" and row["board"] == "Design"][:2]
    asks = [
        ("email", f"Reply to Priya's latest email ('{latest['subject']}') saying 'Thanks, I will read it tonight.'",
         [_call("email_reply_email", email_id=latest["email_id"], body="Thanks, I will read it tonight.")]),
        ("calendar", f"Rename my last event (the {last_event['event_name']} on {last_event['event_start'][:10]}) to "
                     "'Year-end wrap up'",
         [_call("calendar_update_event", event_id=last_event["event_id"], field="event_name",
                new_value="Year-end wrap up")]),
        ("customer_relationship_manager", "Mark all of Mei's leads as qualified in the crm.",
         [_call("customer_relationship_manager_update_customer", customer_id=row["customer_id"], field="status",
                new_value="Qualified") for row in owner_leads]),
        ("project_management", f"'{review[0]['task_name']}' and '{review[1]['task_name']}' (both in review on the "
                               "Design board) are done: move them to Completed.",
         [_call("project_management_update_task", task_id=row["task_id"], field="list_name", new_value="Completed")
          for row in review]),
        ("analytics", "Make a bar chart of total visits between November 1 and November 15.",
         [_call("analytics_create_plot", time_min="2023-11-01", time_max="2023-11-15", value_to_plot="total_visits",
                plot_type="bar")]),
    ]
    return [
        {"id": index, "category": f"workplace_assistant_{category}", "environment_name": "workplace_assistant",
         "ground_truth": calls,
         "responses_create_params": {"input": [{"role": "system", "content": SYSTEM_PROMPT},
                                               {"role": "user", "content": text}],
                                     "tools": TOOL_SCHEMAS, "parallel_tool_calls": False, "temperature": 1.0}}
        for index, (category, text, calls) in enumerate(asks)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=HERE / "data")
    args = parser.parse_args(argv)
    tables = write_tables(args.out / "workplace", args.seed)
    lines = [json.dumps(row, ensure_ascii=False) for row in example_rows(tables)]
    (args.out / "example.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
