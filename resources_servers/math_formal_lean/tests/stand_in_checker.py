"""A stand-in Lean checker for tests: a real HTTP server speaking NeMo-Skills' sandbox `/execute` protocol.

It does not run Lean. It answers deterministically from markers in the program, so a test says what the "compiler"
does by what the proof contains:
- `COMPILE_ERROR` on a line: `failed`, with a Lean-style `<file>.lean:L:C: error:` line at that marker;
- `SLOW_PROOF`: `timeout` (the compile ran out of time: the proof's fault);
- `CHECKER_ERROR`: process_status `error` (the compiler could not run: the checker's fault);
- `CHECKER_500`: HTTP 500; `CHECKER_GARBAGE`: a JSON answer with no process_status;
- `HANG_CHECKER`: no answer for `hang_s` seconds;
- `SORRY_WARNING`: `completed`, with Lean's `declaration uses 'sorry'` warning;
- otherwise `completed` with no output.
`replay` maps a program's exact text to a recorded answer (NeMo-Gym's recorded rollouts), which wins over markers.
Every request body is kept in `requests`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

FILE = "/lean4/my_project/tmpstandin.lean"


def checker_app(replay: dict[str, dict[str, Any]] | None = None, hang_s: float = 30.0) -> FastAPI:
    app = FastAPI()
    app.state.requests = []
    replay = replay or {}

    @app.post("/execute")
    async def execute(request: Request) -> Any:
        body = await request.json()
        app.state.requests.append(body)
        program = body.get("generated_code", "")
        if program in replay:
            return replay[program]
        if "HANG_CHECKER" in program:
            await asyncio.sleep(hang_s)
        if "CHECKER_500" in program:
            return JSONResponse({"detail": "internal error"}, status_code=500)
        if "CHECKER_GARBAGE" in program:
            return {"result": "ok"}
        if "CHECKER_ERROR" in program:
            return {"process_status": "error", "stdout": "", "stderr": "lean: command not found"}
        if "SLOW_PROOF" in program:
            return {"process_status": "timeout", "stdout": "", "stderr": ""}
        for number, line in enumerate(program.split("\n"), 1):
            if "COMPILE_ERROR" in line:
                column = line.index("COMPILE_ERROR")
                return {"process_status": "failed", "stderr": "",
                        "stdout": f"{FILE}:{number}:{column}: error: unknown identifier 'COMPILE_ERROR'\n"}
        if "SORRY_WARNING" in program:
            return {"process_status": "completed", "stderr": "",
                    "stdout": f"{FILE}:1:8: warning: declaration uses 'sorry'\n"}
        return {"process_status": "completed", "stdout": "", "stderr": ""}

    return app
