"""The tools over real HTTP on WorkBench's tables (spec §6 outputs, §3 route behaviour), sessions, and the data."""

from __future__ import annotations

import filecmp
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, serve
from resources_servers.workplace_assistant.generate import write_tables
from resources_servers.workplace_assistant.tables import load_workplace
from resources_servers.workplace_assistant.tests.conftest import NEMO_GYM_ROWS, WORKBENCH_CSV, make_server


@pytest.fixture
def client(workbench):
    url, _ = workbench
    with httpx.Client(base_url=url, timeout=30) as seeded:
        assert seeded.post("/seed_session", json=NEMO_GYM_ROWS[0]).json() == {}
        yield seeded


def out(client: httpx.Client, tool: str, **arguments):
    answer = client.post(f"/{tool}", json=arguments)
    assert answer.status_code == 200, answer.text
    return answer.json()["output"]


def _ids(items: list[dict], key: str) -> list[str]:
    return [item[key] for item in items]


def test_spec_outputs_on_fresh_state(client):
    assert out(client, "company_directory_find_email_address") == "Name not provided."
    assert out(client, "company_directory_find_email_address", name="a.c") == ["aisha.chen@atlas.com"]
    page = out(client, "email_search_emails", query="carlos", page=99)
    assert page["pagination"] == {"total_emails": 21, "page": 5, "page_size": 5, "total_pages": 5}
    assert _ids(page["emails"], "email_id") == ["00000280"]
    dated = out(client, "email_search_emails", query="carlos", date_min="2023-11-01", date_max="2023-11-10")
    assert _ids(dated["emails"], "email_id") == ["00000382", "00000312"]
    events = out(client, "calendar_search_events", query="sync up", page=2, page_size=3)
    assert events["pagination"]["total_pages"] == 4 and _ids(events["events"], "event_id") == [
        "00000291", "00000053", "00000297"]
    assert out(client, "analytics_get_average_session_duration", time_min="2023-11-25", time_max="2023-11-27") == {
        "2023-11-25": 20.857142857142858, "2023-11-26": 25.0, "2023-11-27": 22.333333333333332}
    assert len(out(client, "project_management_search_tasks", due_date="2023-11")) == 73
    crm = out(client, "customer_relationship_manager_search_customers", status="won", product_interest="SERV")
    assert _ids(crm["customers"], "customer_id") == ["00000009", "00000069", "00000123", "00000112", "00000023"]
    zero = out(client, "email_search_emails", page_size=0)
    assert zero == "Error searching emails: integer division or modulo by zero"


def test_state_changes_persist_within_the_session(client):
    sent = out(client, "email_send_email", recipient="Kim@Atlas.com", subject="Hi", body="Yo")
    assert sent == "Email sent successfully."
    assert out(client, "email_get_email_information_by_id", email_id="500", field="sender/recipient") == {
        "sender/recipient": "kim@atlas.com"}
    assert out(client, "email_get_email_information_by_id", email_id="00000500", field="subject") == "Email not found."
    assert out(client, "calendar_create_event", event_name="a", participant_email="b@c.com",
               event_start="Dec 1 2023 10am", duration="30") == "00000300"
    assert out(client, "calendar_create_event", event_name="a", participant_email="b@c.com",
               event_start="tomorrow", duration="30") == "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."
    def duration():
        return out(client, "analytics_get_visitor_information_by_id", visitor_id="0860")[0]["session_duration_seconds"]

    assert duration() == "4"
    out(client, "analytics_get_average_session_duration")
    assert duration() == 4.0, "quirk Q9: the unbounded average turns durations into floats for the session"


def test_route_errors_read_like_the_reference(client):
    assert out(client, "foo") == "Error executing tool 'foo': 'foo'"
    assert out(client, "email_get_email_information_by_id", useless_argument=1) == (
        "Error executing tool 'email_get_email_information_by_id': EmailTool.get_email_information_by_id() got an "
        "unexpected keyword argument 'useless_argument'")
    assert out(client, "company_directory_find_email_address", name="(") == (
        "Error executing tool 'company_directory_find_email_address': "
        "missing ), unterminated subpattern at position 0")
    assert out(client, "customer_relationship_manager_add_customer", customer_name="Kim",
               assigned_to_email="a@atlas.com", status="Lead", notes=None) == "00000200"
    assert out(client, "customer_relationship_manager_search_customers", customer_name="Kim")["customers"][0][
        "notes"] == "", "a null argument is dropped over HTTP, so the default applies"
    for body in ([1], "x"):
        assert client.post("/email_send_email", json=body).status_code == 422
    assert client.post("/email_send_email", content=b"").status_code == 422
    assert client.post("/email_send_email", content=b"{bad").status_code == 422


def test_tools_need_a_seeded_session_and_verify_drops_it(workbench):
    url, server = workbench
    with httpx.Client(base_url=url, timeout=30) as fresh:
        answer = fresh.post("/email_delete_email", json={"email_id": "00000057"})
        assert answer.status_code == 400
        assert answer.json() == {"detail": "Session not initialized. Please call seed_session first."}
        fresh.post("/seed_session", json=NEMO_GYM_ROWS[0])
        assert fresh.post("/email_delete_email", json={"email_id": "00000057"}).json() == {
            "output": "Email deleted successfully."}
        with httpx.Client(base_url=url, timeout=30) as other:
            other.post("/seed_session", json=NEMO_GYM_ROWS[0])
            assert other.post("/email_delete_email", json={"email_id": "00000057"}).json()["output"] == (
                "Email deleted successfully."), "each session has its own tables"
        fresh.post("/seed_session", json=NEMO_GYM_ROWS[0])
        assert fresh.post("/email_delete_email", json={"email_id": "00000057"}).json()["output"] == (
            "Email deleted successfully."), "seeding again resets the state"
        before = len(server.sessions)
        fresh.post("/verify", json={**NEMO_GYM_ROWS[0], "response": make_response("x")})
        assert len(server.sessions) == before - 1
        assert fresh.post("/email_delete_email", json={"email_id": "00000057"}).status_code == 400


def test_a_session_dropped_past_max_sessions_ends_as_session_lost():
    server = make_server(data_dir=str(WORKBENCH_CSV), max_sessions=1)
    with serve(server.create_app()) as url, httpx.Client(base_url=url) as first, httpx.Client(base_url=url) as second:
        first.post("/seed_session", json=NEMO_GYM_ROWS[0])
        second.post("/seed_session", json=NEMO_GYM_ROWS[0])  # past max_sessions: first's tables are dropped
        answer = first.post("/email_delete_email", json={"email_id": "00000057"})
        assert (answer.status_code, answer.json()["error_type"]) == (410, "session_lost")
        assert out(second, "email_delete_email", email_id="00000057") == "Email deleted successfully."
        first.post("/seed_session", json=NEMO_GYM_ROWS[0])
        assert out(first, "email_delete_email", email_id="00000057") == "Email deleted successfully."


def test_default_data_is_the_seeded_generator_output(tmp_path: Path):
    write_tables(tmp_path)
    shipped = Path(__file__).parents[1] / "data" / "workplace"
    names = ["emails.csv", "calendar_events.csv", "project_tasks.csv", "customer_relationship_manager_data.csv",
             "analytics_data.csv", "raw/email_addresses.csv"]
    assert all(filecmp.cmp(tmp_path / name, shipped / name, shallow=False) for name in names)
    default = load_workplace(str(make_server().data_dir()))
    assert len(default.emails.rows) == 150 and default.calendar.labels == list(range(120))


def test_a_data_dir_without_the_tables_is_a_clear_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="has no emails.csv"):
        make_server(data_dir=str(tmp_path))
