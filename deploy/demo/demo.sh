#!/usr/bin/env bash
# `make demo`: gpuq's main job end to end on the embedded store (chDB), on this machine:
#   1. a local Ray head with 4 logical H100 GPUs, one job holding 2 of them;
#   2. a dcgm-exporter page (recorded, deploy/demo/data) served over local HTTP;
#   3. `gpuq collect --once` into chdb://.gpuq/demo, then `gpuq query`, `gpuq queues`, `gpuq usage`;
#   4. `gpuq simulate` of the classic 60/40 scenario, and `--compare` with another quota;
#   5. the Alibaba trace imported and replayed;
#   6. `gpuq serve` with the dry-run actuator: workloads submitted over the API, `gpuq workloads`,
#      `gpuq explain`, then SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.venv/bin
DEMO=.gpuq/demo-run
TRACE=tests/data/traces/alibaba-gpu-v2023
rm -rf "$DEMO" .gpuq/demo && mkdir -p "$DEMO"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
port() { $BIN/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cleanup() {
  [ -n "${SERVE_PID:-}" ] && kill "$SERVE_PID" 2>/dev/null || true
  [ -n "${HTTP_PID:-}" ] && kill "$HTTP_PID" 2>/dev/null || true
  [ -n "${HOLD_PID:-}" ] && kill "$HOLD_PID" 2>/dev/null || true
  if [ -n "${RAY_PID:-}" ]; then          # only our own head: `ray stop` would stop every Ray here
    kill -TERM -- "-$RAY_PID" 2>/dev/null || true; sleep 2; kill -KILL -- "-$RAY_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT

say "1. a local Ray head (4 logical H100 GPUs) and a job holding 2 of them"
METRICS_PORT=$(port); DASH_PORT=$(port); GCS_PORT=$(port)
setsid $BIN/ray start --head --block --port "$GCS_PORT" --num-cpus 2 --num-gpus 4 \
  --resources '{"accelerator_type:H100": 4}' --metrics-export-port "$METRICS_PORT" \
  --dashboard-port "$DASH_PORT" --include-dashboard true --disable-usage-stats \
  --temp-dir /tmp/gpuq-demo-ray >"$DEMO/ray.log" 2>&1 &
RAY_PID=$!
for _ in $(seq 90); do curl -sf "http://127.0.0.1:$DASH_PORT/api/v0/nodes?limit=1" | grep -q ALIVE && break; sleep 1; done
NODE_IP=$(curl -sf "http://127.0.0.1:$DASH_PORT/api/v0/nodes?limit=1" | $BIN/python -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"]["result"][0]["node_ip"])')
$BIN/python - "$NODE_IP:$GCS_PORT" >"$DEMO/hold.log" 2>&1 <<'PY' &
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(num_gpus=2)
class Trainer:
    def ready(self): return True
t = Trainer.remote(); ray.get(t.ready.remote()); print("holding 2 GPUs", flush=True)
time.sleep(600)
PY
HOLD_PID=$!
for _ in $(seq 60); do grep -q holding "$DEMO/hold.log" 2>/dev/null && break; sleep 1; done
for _ in $(seq 60); do
  curl -s "http://$NODE_IP:$METRICS_PORT/metrics" | grep -q 'ray_resources{.*Name="GPU".*State="USED".*} 2' && break; sleep 1
done

say "2. a dcgm-exporter page served over local HTTP"
mkdir -p "$DEMO/dcgm" && cp deploy/demo/data/datadog-integrations-core-metrics.txt "$DEMO/dcgm/metrics"
HTTP_PORT=$(port)
$BIN/python -m http.server "$HTTP_PORT" --bind 127.0.0.1 --directory "$DEMO/dcgm" >/dev/null 2>&1 &
HTTP_PID=$!
API_PORT=$(port)
cat >"$DEMO/gpuq.yaml" <<YAML
store:
  dsn: chdb://.gpuq/demo
  spill_dir: $DEMO/spill
queues_file: $PWD/deploy/demo/queues.yaml
collector:
  ray:
    - cluster: demo
      dashboard_url: http://127.0.0.1:$DASH_PORT
      metrics_urls: [http://$NODE_IP:$METRICS_PORT/metrics]
  dcgm:
    - cluster: demo
      urls: [http://127.0.0.1:$HTTP_PORT/metrics]
scheduler:
  actuator: dry-run
  nodes_file: $PWD/deploy/demo/nodes.yaml
  preemption_delay_s: 5
api:
  port: $API_PORT
YAML
CFG=(--config "$DEMO/gpuq.yaml")
sleep 1

say "3. gpuq collect --once, then what landed in the store"
$BIN/gpuq collect --once "${CFG[@]}" --log-level WARNING
$BIN/gpuq query "${CFG[@]}" "SELECT node, resource, state, argMax(value, ts) AS value FROM ray_resources
  WHERE resource IN ('GPU', 'accelerator_type:H100') GROUP BY node, resource, state ORDER BY resource, state"
$BIN/gpuq query "${CFG[@]}" "SELECT node, gpu_model, pod, count() AS samples, countDistinct(metric) AS metrics
  FROM gpu_samples GROUP BY node, gpu_model, pod ORDER BY node"
$BIN/gpuq queues "${CFG[@]}" --show capacity

say "4. the classic 60/40 scenario through the scheduler core, and the same work under other quotas"
$BIN/gpuq simulate tests/scenarios/classic-60-40.yaml --out "$DEMO/classic"
grep '"preempt"' "$DEMO/classic/events.jsonl" | head -4
$BIN/gpuq simulate tests/scenarios/classic-60-40.yaml --compare deploy/demo/compare-queues.yaml

say "5. the Alibaba GPU trace (2,000 pods, time compressed 1000x) replayed"
$BIN/gpuq import-trace alibaba-v2023 "$TRACE" --out "$DEMO/trace.yaml" \
  --limit 2000 --time-scale 0.001 | tail -3
$BIN/gpuq simulate "$DEMO/trace.yaml" --out "$DEMO/trace"

say "6. gpuq serve (dry-run actuator): submit work over the API, ask why it waits"
$BIN/gpuq serve "${CFG[@]}" --no-collect --log-level WARNING &
SERVE_PID=$!
API="http://127.0.0.1:$API_PORT"
for _ in $(seq 60); do curl -sf "$API/healthz" >/dev/null && break; sleep 0.5; done
for i in 1 2 3; do
  curl -sf -X POST "$API/workloads" -H 'Content-Type: application/json' \
    -d "{\"id\": \"train-$i\", \"queue\": \"research.vision\", \"pods\": 1, \"gpus_per_pod\": 8, \"gpu_types\": [\"H100\"]}" >/dev/null
done
curl -sf -X POST "$API/workloads" -H 'Content-Type: application/json' \
  -d '{"id": "serve-1", "queue": "prod", "pods": 4, "gpus_per_pod": 8, "priority": 10}' >/dev/null
sleep 3
$BIN/gpuq workloads "${CFG[@]}"
$BIN/gpuq explain train-2 "${CFG[@]}"
curl -sf "$API/queues" | $BIN/python -c 'import json,sys; [print(r["queue"], r["gpu_type"], "allocated", r["allocated"], "guaranteed", r["guaranteed"]) for r in json.load(sys.stdin) if r["allocated"]]'
kill -TERM "$SERVE_PID"; wait "$SERVE_PID"; SERVE_PID=
$BIN/gpuq query "${CFG[@]}" "SELECT event, workload, queue, gpu_type FROM scheduler_events ORDER BY t, seq"
say "done: the store is in .gpuq/demo, the outputs in $DEMO"
