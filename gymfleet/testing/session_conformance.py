"""NeMo-Gym's `nemo_gym.testing.session_conformance`: the Environment Server session contract, checked in process.

`check_resources_session_contract(app, seed, keeps_state=...)` drives a folder's FastAPI app (from
`setup_webserver()`) through `/seed_session` and `/close_session` and raises AssertionError naming the step that
broke the contract: a seed and a repeated seed both answer 200 with the seeded session's id; a close and a repeated
close both answer 200 naming it; a close of a session never seeded answers 200. With `keeps_state`, a seed after its
session closed, and one after a close of a never-seeded id, must be refused (4xx/5xx): the close is final.
"""

from __future__ import annotations

from typing import Any

from gymfleet.serving.nemo_gym_types import (
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)


def check_resources_session_contract(app: Any, seed: ResourcesSeedSessionRequest, *, keeps_state: bool) -> None:
    """Check `app`'s session contract with `seed` (whose `resources_session_id` the app must not have seen).

    Raises:
        AssertionError: the step that broke the contract, with the status and body the app answered.
    """
    from fastapi.testclient import TestClient

    client = TestClient(app, raise_server_exceptions=False)
    session_id = seed.resources_session_id
    other = seed.model_copy(update={"resources_session_id": f"{session_id}-never-seeded"})

    def post(route: str, body: Any, step: str) -> Any:
        answer = client.post(route, json=body.model_dump(mode="json"))
        assert answer.status_code == 200, f"{step}: {route} answered {answer.status_code} {answer.text}"
        return answer.json()

    def close_body(request: ResourcesSeedSessionRequest) -> ResourcesCloseSessionRequest:
        return ResourcesCloseSessionRequest(resources_session_id=request.resources_session_id,
                                            episode_id=request.episode_id)

    for step in ("seed", "repeated seed"):
        seeded = ResourcesSeedSessionResponse.model_validate(post("/seed_session", seed, step))
        assert seeded.resources_session_id == session_id, f"{step} answered for {seeded.resources_session_id!r}"
    for step in ("close", "repeated close"):
        closed = ResourcesCloseSessionResponse.model_validate(post("/close_session", close_body(seed), step))
        assert closed.resources_session_id == session_id, f"{step} answered for {closed.resources_session_id!r}"
    post("/close_session", close_body(other), "close of a never-seeded session")
    if keeps_state:
        for late in (seed, other):
            answer = client.post("/seed_session", json=late.model_dump(mode="json"))
            assert answer.status_code >= 400, (
                f"a seed after close recreated session {late.resources_session_id!r} ({answer.status_code})")
