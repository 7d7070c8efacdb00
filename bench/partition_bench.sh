#!/usr/bin/env bash
# Profile-guided partitioning against the uniform cut, and predicted against measured step
# time, on a model whose head dominates: GPT-2 width (d_model 768, 12 heads) at reduced depth
# (n_layer 6), vocab 50304 untied, seq_len 128, micro-batch 4, on 2 workers (--threads 1).
#
#   ./scripts/build.sh && bench/partition_bench.sh [--steps N] [--runs N] [--keep]
#                                                  [--profile-max-age AGE]  # 60-100 min
#   bench/partition_bench.sh --smollm2 [--steps N] [--keep]                  # about 8 min
#
# Starts a real coordinator (with a data root, so the profile is cached after the first job;
# with --profile-max-age AGE, e.g. 150s, a job is planned on costs measured at most AGE before
# it, its own or a recent job's, not the first job's) and two workers on 127.0.0.1, then runs,
# 8 steps each (figures are medians of the steady steps 1-6: step 0 warms up, and the last also
# waits for its own update): partition profile and partition uniform with 1f1b at M=8; then
# with the profile zb_h1, zb_h2, zb_auto and gpipe at M=8 and 1f1b at M=4 and M=16;
# pipeline.plan: auto at the same global batch as the first (the planner profiles every split
# of it); and the planner's five best candidates for that batch (`tandem plan -o json`), each as
# written. Then (--runs 2, the default) every one of them again, in reverse order, so that a
# job early in the first pass is late in the second: this shared 2-vCPU VM has bursts of 1-4 s
# in which both workers run 40-90% slower, and stretches of minutes some 5% slower, that hit a
# job at random (docs/benchmarks.md, "host bursts"); each configuration is judged on the faster
# of its two runs, the other shown beside it, and the spread between the two is this machine's
# drift, the floor under every prediction; before the first job and after the last, 30 s of
# bench_host_drift say how far the host's own GEMM speed moved meanwhile. Prints per job the
# cut, the measured step, the step the plan predicted from the profile
# (Job.predicted_step_seconds) and their ratio, split into the pipeline phase (predicted,
# replayed on the step's measured costs, measured) and the update phase; the profiled cut's speed-up over the uniform one; zb_auto against the best
# hand-crafted schedule; and whether the planner's pick ran within 2% of the fastest of its top
# five, with the share of jobs within 3%. Each job after the first is priced on a profile over
# a minute old, so the coordinator speed-checks it first (--profile-speed-check): the "speed"
# column is what that found, the model's forward + backward now over the profile's (each layer
# kind timed again); "*" marks a job priced at it (every round of the check beyond 2% on one
# side).
#
# --smollm2: instead, a SmolLM2-135M-shaped llama (preset smollm2-135m: 30 blocks, d_model 576,
# 9 heads, 3 kv heads, SwiGLU 1536, vocab 49152 tied) at seq_len 256, micro-batch 1, M 4,
# 1f1b on the same 2 workers with the profiled partition only: its cut, tokens/s, and the
# measured step against the predicted one.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/build/bin"
steps=8 keep=0 smollm2=0 max_age= runs=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --runs) runs="$2"; shift ;;
    --smollm2) smollm2=1 ;;
    --keep) keep=1 ;;
    --profile-max-age) max_age="$2"; shift ;;
    *) echo "partition_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
case "$runs" in 1 | 2) ;; *) echo "partition_bench.sh: --runs takes 1 or 2, not '$runs'" >&2; exit 2 ;; esac
for b in tandem-coordinator tandem-worker tandem; do
  [ -x "$bin/$b" ] || { echo "partition_bench.sh: build first ($bin/$b missing)" >&2; exit 1; }
done
run="$(mktemp -d /tmp/tandem-partbench-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "run directory: $run" >&2; else rm -rf "$run"; fi
}
trap cleanup EXIT
source scripts/local-cluster.sh
local_cluster_start "$bin" "$run" "$run" --data-root "$run/store" \
  ${max_age:+--profile-max-age "$max_age"} || [ "$?" = 2 ]
if [ -n "$max_age" ]; then
  echo "profiles are measured again once older than $max_age (tandem-coordinator --profile-max-age)" >&2
fi

model_yaml() {
  if [ "$smollm2" = 1 ]; then
    printf 'model:\n  preset: smollm2-135m\n  seq_len: 256\n'
  else
    printf 'model:\n  arch: gpt\n  n_layer: 6\n  n_head: 12\n  d_model: 768\n  seq_len: 128\n'
    printf '  vocab_size: 50304\n  tie_embeddings: false\n'
  fi
}

spec() {  # NAME PARTITION SCHEDULE M [PLAN [MICRO_BATCH_SIZE [CHUNKS [STAGES [REPLICAS]]]]]
  cat <<YAML
name: $1
steps: $steps
seed: 1234
$(model_yaml)
data:
  source: synthetic
optimizer:
  lr: 0.0003
  lr_schedule: constant
pipeline:
  stages: ${8:-2}
  replicas: ${9:-1}
  micro_batch_size: ${6:-$mbs}
  micro_batches: $4
  schedule: $3
  chunks: ${7:-0}
  partition: $2
  plan: "$([ "${5:-}" = - ] || echo "${5:-}")"
YAML
}

: >"$run/results.jsonl"
pass=1
# NAME PARTITION SCHEDULE M [PLAN [MICRO_BATCH_SIZE [CHUNKS [STAGES [REPLICAS]]]]]; PLAN "-" is
# none. NAME names the configuration; its run in the second pass is the job NAME-r2.
job() {
  local name="$1" tag="$1" id
  [ "$pass" = 1 ] || tag="$1-r$pass"
  shift
  spec "$tag" "$@" >"$run/$tag.yaml"
  id="$("$bin/tandem" submit "$run/$tag.yaml")"
  echo "[$(date +%H:%M:%S)] $tag: $id" >&2
  "$bin/tandem" watch "$id" >"$run/$tag.watch" 2>&1 || { tail -3 "$run/$tag.watch" >&2; exit 1; }
  "$bin/tandem" status "$id" -o json >"$run/$tag.json"
  # The steady steps' timelines (trace steps count from 1: history step k is trace step k + 1),
  # to tell the steps a host burst hit from the quiet ones.
  "$bin/tandem" trace "$id" --steps "2..$((steps - 1))" -o "$run/$tag.trace.json" >/dev/null 2>&1 ||
    rm -f "$run/$tag.trace.json"
  # Its final checkpoint (1.4 GB on this model) is of no use here: fifteen of them filled a
  # 70 GB disk over a few runs with --keep.
  rm -rf "$run/store/checkpoints/$id"
  /usr/bin/python3 - "$run/$tag.json" "$name" "$run/coordinator.log" "$run/$tag.trace.json" \
    "$pass" >>"$run/results.jsonl" <<'PY'
import collections, json, os, statistics, sys
job = json.load(open(sys.argv[1]))
# Whether the speed check priced the job (the coordinator's log line for it says so).
checks = [l for l in open(sys.argv[3], errors="replace") if f"{job['id']}: speed check of" in l]
h = job["history"]
# Steady steps only: step 0 warms up, and the last one also waits for its own update (the
# others' updates run at the start of the next step).
steady = h[1:-1] if len(h) > 2 else h[1:] or h
measured = [float(s["step_seconds"]) for s in steady]
stages = job["stages"]
# Host bursts: on this shared 2-vCPU VM both workers now and then run 40-90% slower for 1-4 s
# at once (the VM's own: plain loops on both vCPUs see them too; the schedule is not
# involved, docs/benchmarks.md). A steady step is "disturbed" when one of its compute actions
# took at least 1.25x the median of the same rank, stage and kind over the job's steady steps
# (in jobs without a burst every action stayed under 1.21x); the median over the undisturbed steps, where at least 3,
# says what the job costs when the host leaves it alone. Reported beside the plain median,
# which stays the figure the targets are judged on.
quiet_s, disturbed = 0.0, -1
if os.path.exists(sys.argv[4]):
    t = json.load(open(sys.argv[4]))
    spans = [e for e in (t["traceEvents"] if isinstance(t, dict) else t)
             if e.get("ph") == "X" and e.get("cat") == "compute"
             and e.get("args", {}).get("kind") in ("F", "B", "I", "W")]
    by_key = collections.defaultdict(list)
    for e in spans:
        a = e["args"]
        by_key[(a.get("rank"), a.get("stage"), a["kind"])].append(e["dur"])
    median = {k: statistics.median(v) for k, v in by_key.items()}
    hit = {e["args"]["step"] for e in spans
           if e["dur"] >= 1.25 * median[(e["args"].get("rank"), e["args"].get("stage"),
                                         e["args"]["kind"])]}
    # Trace step numbers count from 1; history entry k is trace step k + 1.
    quiet = [float(s["step_seconds"]) for k, s in enumerate(h)
             if 1 <= k < len(h) - 1 and k + 1 not in hit]
    disturbed = len(steady) - len(quiet)
    quiet_s = statistics.median(quiet) if len(quiet) >= 3 else 0.0
print(json.dumps({
    "name": sys.argv[2],
    "run": int(sys.argv[5]),
    "partition": job["spec"]["pipeline"]["partition"],
    "schedule": job["spec"]["pipeline"]["schedule"],
    "m": int(job["spec"]["pipeline"]["micro_batches"]),
    "micro_batch_size": int(job["spec"]["pipeline"]["micro_batch_size"]),
    "chunks": int(job["spec"]["pipeline"].get("chunks", 0)),
    "plan": job.get("plan", ""),
    "cut": [[int(s.get("layer_begin", 0)), int(s["layer_end"])] for s in stages],
    "step_s": statistics.median(measured),
    "quiet_step_s": quiet_s,       # 0: fewer than 3 quiet steps (or no trace)
    "disturbed_steps": disturbed,  # -1: no trace
    "predicted_s": float(job.get("predicted_step_seconds", 0)),
    # The step in its phases: the pipeline (the slowest worker's RunStep), the update (the
    # slowest worker's optimizer update and gradient-norm pass, as the workers timed them) and
    # the coordinator's overhead (the calls beyond the slowest worker's time in them); and the
    # simulator replayed on each step's measured costs.
    "predicted_update_s": float(job.get("predicted_update_seconds", 0)),
    "update_s": statistics.median([float(s.get("max_worker_update_seconds", 0)) for s in steady]),
    "overhead_s": statistics.median([float(s.get("coordinator_overhead_seconds", 0)) for s in steady]),
    "exec_s": statistics.median([float(s.get("max_worker_exec_seconds", 0)) for s in steady]),
    "replayed_s": statistics.median([float(s.get("exec_replayed_seconds", 0)) for s in steady]),
    # The planner's speed check of the cached profile (0: none, the profile was fresh).
    "speed_ratio": float(job.get("profile_speed_ratio", 0)),
    "speed_priced": any(": priced at x" in l for l in checks),
    # The coordinator's check of the prediction over the same steady steps (Job.prediction_check):
    # whose miss a miss is. "-": no check (no prediction).
    "miss": (lambda c: c.get("miss", "PREDICTION_WITHIN").replace("PREDICTION_MISS_", "")
             .replace("PREDICTION_", "").lower().replace("_", " ") if c else "-")(
                 job.get("prediction_check")),
    "stage_predicted_ms": [1000 * float(s.get("predicted_seconds", 0)) for s in stages],
    "stage_measured_ms": [1000 * float(x) for x in h[-1].get("stage_seconds", [])],
    "losses": [float(s["loss"]) for s in h],
    "tokens_per_step": int(job["spec"]["pipeline"]["micro_batch_size"]) *
                       int(job["spec"]["pipeline"]["micro_batches"]) *
                       int(job["spec"]["model"]["seq_len"]),
}))
PY
}

if [ "$smollm2" = 1 ]; then
  mbs=1
  job smollm2-profile-1f1b-m4 profile 1f1b 4
  /usr/bin/python3 - "$run/results.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][0]
ratio = r["step_s"] / r["predicted_s"] if r["predicted_s"] else float("nan")
cut = " | ".join(f"[{a},{b})" for a, b in r["cut"])
print("== SmolLM2-135M-shaped llama (seq_len 256), 2 CPU workers, profiled partition, 1f1b M=4 ==")
print(f"cut {cut}; stage ms (pred / meas): "
      + ", ".join(f"{p:.0f}/{m:.0f}" for p, m in zip(r["stage_predicted_ms"], r["stage_measured_ms"])))
print(f"measured step {r['step_s']:.2f} s, predicted {r['predicted_s']:.2f} s, measured / predicted "
      f"{ratio:.3f} (target within 10%: {'PASS' if abs(ratio - 1) <= 0.10 else 'FAIL'})")
print(f"tokens/s {r['tokens_per_step'] / r['step_s']:.0f}; losses "
      + " ".join(f"{x:.3f}" for x in r["losses"]))
print(json.dumps({"partition_bench_smollm2": r}))
PY
  exit 0
fi
mbs=4
# The host's own drift before the first job and after the last (bench/host_drift.cc): the
# same GEMM on both cores for 30 s, the medians of its 10 s blocks against each other. Where
# they move by more than 3%, a prediction made minutes before its job cannot be judged to 3%.
drift() {
  if [ -x "$bin/bench_host_drift" ]; then
    "$bin/bench_host_drift" --seconds 30 --block 10 --target 0.03 >"$run/drift-$1.txt" 2>&1 || true
  fi
}
drift before

# Each configuration as job's arguments (none holds a space; "-": no plan).
configs=(
  # The profiled job first: it measures (and caches) the profile, so the uniform job gets
  # predictions too.
  "profile-1f1b-m8 profile 1f1b 8"
  "uniform-1f1b-m8 uniform 1f1b 8"
  "profile-zb_h1-m8 profile zb_h1 8"
  "profile-zb_h2-m8 profile zb_h2 8"
  # zb_auto: built from this profile's per-stage costs (the head-heavy case), against the
  # hand-crafted schedules above at the same M.
  "profile-zb_auto-m8 profile zb_auto 8"
  "profile-gpipe-m8 profile gpipe 8"
  "profile-1f1b-m4 profile 1f1b 4"
  "profile-1f1b-m16 profile 1f1b 16"
  # The planner: the same global batch (8 x 4 sequences) split and scheduled as it predicts best.
  "auto-b32 profile 1f1b 8 auto"
)
for c in "${configs[@]}"; do
  # shellcheck disable=SC2086  # the words are job's arguments
  job $c
done
# The planner's five best candidates by prediction, each run as written: is the pick the
# fastest in practice, and how far is each prediction from its run?
"$bin/tandem" plan "$run/profile-1f1b-m8.yaml" -o json >"$run/search.json"
/usr/bin/python3 - "$run/search.json" >"$run/top.txt" <<'PY'
import json, sys
c = [x for x in json.load(open(sys.argv[1])).get("candidates", []) if x.get("feasible")]
for i, x in enumerate(c[:5]):
    print(i + 1, x["schedule"], x["micro_batches"], x["micro_batch_size"], x.get("chunks", 0),
          x.get("stages", 1), x.get("replicas", 1))
PY
while read -r rank sched m size chunks stages replicas; do
  c="top$rank-${stages}x$replicas-$sched-${m}x$size-v$chunks profile $sched $m - $size $chunks"
  configs+=("$c $stages $replicas")
  # shellcheck disable=SC2086
  job $c "$stages" "$replicas"
done <"$run/top.txt"
# The second pass, in reverse order: the first pass's last jobs run first, so that drift over
# the hour and bursts land on different configurations than before.
if [ "$runs" = 2 ]; then
  pass=2
  for ((i = ${#configs[@]} - 1; i >= 0; i--)); do
    # shellcheck disable=SC2086
    job ${configs[i]}
  done
fi

drift after
"$bin/tandem" plan "$run/profile-1f1b-m8.yaml" >"$run/plan.txt" 2>&1 || true
for when in before after; do
  [ -s "$run/drift-$when.txt" ] || continue
  echo "== the host $when the jobs =="
  cat "$run/drift-$when.txt"
done
echo
echo "== tandem plan (profile, 1f1b, M=8) =="
cat "$run/plan.txt"
echo
/usr/bin/python3 - "$run/results.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# Each configuration is judged on the faster of its runs (a host burst or a slow stretch only
# ever slows a run); the other is shown beside it.
by_name = {}
for r in runs:
    by_name.setdefault(r["name"], []).append(r)
rows = [min(rs, key=lambda r: r["step_s"]) for rs in by_name.values()]
def other(r):
    return [x for x in by_name[r["name"]] if x is not r]
print("== Partition: profile vs uniform; predicted vs measured step ==")
print(f"each configuration run {max(len(rs) for rs in by_name.values())} time(s), judged on its "
      f"faster run ('run': which; 'other run': the other's step and measured / predicted)")
print("pipeline: predicted (simulator on the profile) / replayed (simulator on the step's own")
print("measured costs) / measured (slowest worker's RunStep, its norm pass included); update:")
print("predicted / measured (the slowest worker's optimizer update + gradient-norm pass); ovh:")
print("the calls and the coordinator beyond the slowest worker's time in them (not predicted);")
print("speed: the planner's speed check of the cached profile, every layer kind timed again at")
print("planning against it ('*': priced at that speed, every round beyond 2% on one side; '-':")
print("the profile was fresh, no check); quiet: the steady steps a host burst hit (an action")
print("at 1.25x its job median or more) and measured / predicted over the others ('-': under 3);")
print("miss: the coordinator's check of the prediction, whose miss a miss beyond 3% is (costs:")
print("the stages ran off their profile; schedule: the schedule on its own costs did not give")
print("the measured pipeline; transfers: it did with the messages at their measured flights;")
print("update or calls: neither)")
print(f"{'job':<26} {'cut':<26} {'run':>3} {'measured s':>10} {'predicted s':>11} {'meas/pred':>9} "
      f"{'other run':>15} {'speed':>6}  "
      f"{'quiet':>11}  {'miss':>18}  {'pipeline pred/repl/meas':>24}  {'update pred/meas':>16}  "
      f"{'ovh ms':>6}  stage ms (pred / meas)")
for r in rows:
    ratio = r["step_s"] / r["predicted_s"] if r["predicted_s"] else float("nan")
    stages = ", ".join(f"{p:.0f}/{m:.0f}" for p, m in zip(r["stage_predicted_ms"], r["stage_measured_ms"]))
    cut = " | ".join(f"[{a},{b})" for a, b in r["cut"])
    pipe = f"{r['predicted_s'] - r['predicted_update_s']:.2f}/{r['replayed_s']:.2f}/{r['exec_s']:.2f}"
    upd = f"{r['predicted_update_s']:.3f}/{r['update_s']:.3f}"
    speed = (f"{r['speed_ratio']:.3f}" + ("*" if r.get("speed_priced") else "")
             if r.get("speed_ratio") else "-")
    quiet = "-"
    if r.get("disturbed_steps", -1) >= 0:
        q = (f"{r['quiet_step_s'] / r['predicted_s']:.3f}"
             if r.get("quiet_step_s") and r["predicted_s"] else "-")
        quiet = f"{r['disturbed_steps']} hit {q}"
    o = "-"
    for x in other(r):
        o = f"{x['step_s']:.3f} ({x['step_s'] / x['predicted_s'] if x['predicted_s'] else float('nan'):.3f})"
    print(f"{r['name']:<26} {cut:<26} {r.get('run', 1):>3} {r['step_s']:>10.3f} {r['predicted_s']:>11.3f} "
          f"{ratio:>9.3f} {o:>15} {speed:>6}  "
          f"{quiet:>11}  {r.get('miss', '-'):>18}  {pipe:>24}  {upd:>16}  "
          f"{1000 * r['overhead_s']:>6.1f}  {stages}")
u = next(r for r in rows if r["name"] == "uniform-1f1b-m8")
p = next(r for r in rows if r["name"] == "profile-1f1b-m8")
sp = u["step_s"] / p["step_s"]
pred = u["predicted_s"] / p["predicted_s"] if p["predicted_s"] else float("nan")
print(f"profiled cut vs uniform (1f1b, M=8): measured {sp:.2f}x faster (predicted {pred:.2f}x); "
      f"target >= 1.2x: {'PASS' if sp >= 1.2 else 'FAIL'}")
predicted = [r for r in rows if r["predicted_s"]]
worst = max(abs(r["step_s"] / r["predicted_s"] - 1) for r in predicted)
print(f"largest |measured / predicted - 1| over the jobs: {worst:.3f}; target <= 0.03: "
      f"{'PASS' if worst <= 0.03 else 'FAIL'}")
errors = [abs(r["step_s"] / r["predicted_s"] - 1) for r in predicted]
print(f"  jobs within 3%: {sum(e <= 0.03 for e in errors)} of {len(errors)}; median "
      f"|measured / predicted - 1| {statistics.median(errors):.3f}")
quiet = [abs(r["quiet_step_s"] / r["predicted_s"] - 1) for r in predicted if r.get("quiet_step_s")]
hit = sum(1 for r in predicted if r.get("disturbed_steps", -1) > 0)
if quiet:
    print(f"  jobs a host burst hit (a steady step with an action at 1.25x its median or more): "
          f"{hit} of {len(predicted)}; over each job's quiet steps, within 3%: "
          f"{sum(e <= 0.03 for e in quiet)} of {len(quiet)}, largest off {max(quiet):.3f}")
# The schedule model apart from the host's speed: the simulator replayed on each step's own
# measured costs against the measured pipeline.
replay = [abs(r["replayed_s"] / r["exec_s"] - 1) for r in predicted if r["exec_s"] > 0]
if replay:
    print(f"  the schedule on the steps' own costs: replay within 3% of the measured pipeline in "
          f"{sum(e <= 0.03 for e in replay)} of {len(replay)}; largest off {max(replay):.3f}")
# The drift: how far a configuration's two runs, on the same plan, differ (the slower over the
# faster), the floor under every prediction on this machine.
spread = [max(x["step_s"] for x in rs) / min(x["step_s"] for x in rs) - 1
          for rs in by_name.values() if len(rs) > 1 and len({x["plan"] for x in rs}) == 1]
if spread:
    print(f"  drift: a configuration's two runs differed by a median {statistics.median(spread):.3f} "
          f"(largest {max(spread):.3f}) over {len(spread)} configurations; the first pass's run "
          f"was the faster in {sum(r.get('run', 1) == 1 for r in rows if len(other(r)))} of "
          f"{sum(1 for r in rows if len(other(r)))}")
top = [r for r in rows if r["name"].startswith("top")]
if top:
    fastest = min(top, key=lambda r: r["step_s"])
    pick = top[0]
    print(f"the planner's top {len(top)} by prediction, run: the fastest measured is {fastest['name']} "
          f"({fastest['step_s']:.3f} s); the pick {pick['name']} ran {pick['step_s']:.3f} s, "
          f"{pick['step_s'] / fastest['step_s']:.3f}x of it; target <= 1.02: "
          f"{'PASS' if pick['step_s'] <= 1.02 * fastest['step_s'] else 'FAIL'}")
d = max(abs(a - b) / abs(b) for a, b in zip(u["losses"], p["losses"]))
print(f"losses uniform vs profiled cut: max relative difference {d:.1e}")
za = next((r for r in rows if r["name"] == "profile-zb_auto-m8"), None)
hand = [r for r in rows if r["name"] in ("profile-1f1b-m8", "profile-zb_h1-m8", "profile-zb_h2-m8",
                                         "profile-gpipe-m8")]
if za and hand:
    best = min(hand, key=lambda r: r["step_s"])
    print(f"zb_auto (built from the profile) at M=8: {za['step_s']:.3f} s against the best "
          f"hand-crafted, {best['schedule']} {best['step_s']:.3f} s: {za['step_s'] / best['step_s']:.3f}x "
          f"(predicted {za['predicted_s']:.3f} against {best['predicted_s']:.3f} s)")
a = next((r for r in rows if r["name"] == "auto-b32"), None)
if a:
    print(f"planner (pipeline.plan: auto, global batch 32): {a['plan']}")
    for x in other(a):
        if x["plan"] != a["plan"]:
            print(f"  (its other run planned otherwise: {x['plan']}, measured {x['step_s']:.3f} s)")
    print(f"  measured {a['step_s']:.3f} s against {p['step_s']:.3f} s for 1f1b 8 x 4 as written: "
          f"{p['step_s'] / a['step_s']:.2f}x; losses max relative difference "
          f"{max(abs(x - y) / abs(y) for x, y in zip(a['losses'], p['losses'])):.1e}")
print(json.dumps({"partition_bench": runs}))
PY
