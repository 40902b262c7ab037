#!/usr/bin/env bash
# Collect rollouts from a gymfleet fleet with NeMo-Gym's own rollout clients (0.4.0, which POSTs /run to the agent
# named by agent_ref, and 0.7.0, which goes through the head server's environment_servers entries).
# Needs PyPI and a Python >= 3.13 (nemo-gym's requirement; 0.7.0 is installed with --ignore-requires-python on
# 3.13.0). Not part of the test suite: it downloads Ray and friends (~1 GB).
#   scripts/nemo_gym_interop.sh [python3.13]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-$(ls -d /root/.pyenv/versions/3.13*/bin/python 2>/dev/null | head -1)}"
WORK="${NEMO_GYM_INTEROP_DIR:-/tmp/nemo_gym_interop}"
mkdir -p "$WORK"
for version in 0.4.0 0.7.0; do
  venv="$WORK/venv-$version"
  [ -x "$venv/bin/ng_collect_rollouts" ] || { "$PY" -m venv "$venv" && "$venv/bin/pip" install -q --ignore-requires-python "nemo-gym==$version"; }
done
PORT=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cd "$ROOT"
ng_run "+config_paths=[configs/quickstart.yaml]" "+head_server.port=$PORT" > "$WORK/ng_run.log" 2>&1 &
FLEET=$!
trap 'kill $FLEET 2>/dev/null; wait $FLEET 2>/dev/null' EXIT
until grep -q "servers ready" "$WORK/ng_run.log"; do sleep 0.5; kill -0 $FLEET || { cat "$WORK/ng_run.log"; exit 1; }; done
for version in 0.4.0 0.7.0; do
  out="$WORK/rollouts-$version.jsonl"
  (cd "$WORK" && "$WORK/venv-$version/bin/ng_collect_rollouts" +agent_name=mcqa_simple_agent \
     "+input_jsonl_fpath=$ROOT/resources_servers/mcqa/data/example.jsonl" "+output_jsonl_fpath=$out" \
     "+head_server={host: 127.0.0.1, port: $PORT}" > "$WORK/collect-$version.log" 2>&1)
  python - "$out" "$version" <<'PY'
import json, sys
rewards = sorted((r["_ng_task_index"], r["reward"]) for r in map(json.loads, open(sys.argv[1])))
print(f"nemo-gym {sys.argv[2]} client: {len(rewards)} rollouts, rewards by task {rewards}")
assert [reward for _, reward in rewards] == [1.0, 0.0, 1.0, 0.0, 1.0], rewards
PY
done
