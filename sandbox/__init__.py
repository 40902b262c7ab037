"""The sandbox service: runs model-written code in bubblewrap sandboxes (see `sandbox.app`).

Modules: `app` (the server and its config), `runner` (limits, admission, one sandbox per request), `sessions`
(persistent sandboxes), `process` (talking to one sandbox), `isolation` (the bubblewrap command line), `launcher`
and `kernel` (the code that runs inside the sandbox), `models` (wire shapes and statuses), `admission` (the bounded
queue), `memory` (the watch on a run's total memory), `metrics` (Prometheus families).
"""
