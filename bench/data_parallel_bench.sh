#!/usr/bin/env bash
# Data parallelism (pipeline.replicas): Tandem's ring all-reduce and replicas: 2 speed-up against
# PyTorch (gloo all_reduce, DistributedDataParallel), measured side by side in one run on
# 127.0.0.1.
#
#   bench/data_parallel_bench.sh [--allreduce] [--no-speedup] [--small] [--steps N] [--m N]
#                                [--vocab N] [--only tandem|torch] [--check-loss]
#                                [--sizes-mib LIST] [--repeats N] [--torch2 PYTHON]
#                                [--job-timeout S] [--keep] [--print-spec] [--shard]
#                                [--python PYTHON]
#
# Needs a built tree (build/bin/tandem-coordinator, tandem-worker, tandem and, for
# --allreduce, bench_allreduce; this script does not build) and Debian's python3-torch for
# /usr/bin/python3.
#
# default (speed-up): starts one coordinator (no --data-root: jobs in memory) and two
#   tandem-worker processes with --threads 1, then trains, 3 steps each (--steps; the first is
#   a warm-up, figures are medians of the rest), the GPT of bench/torch_pipeline.py: n_layer 4,
#   n_head 12, d_model 768, seq_len 256, vocab 256 (untied head), micro-batch 4:
#     Tandem stages 1, replicas 1, M micro-batches (--m, default 4), on one worker;
#     Tandem stages 1, replicas 2, M micro-batches per replica (global batch 2 x M x 4), on two;
#     bench/torch_ddp.py: DDP over 2 processes (gloo, no_sync for all but the last micro-batch)
#     and 1 process without DDP, both on the R=2 job's global batch.
#   Prints step times, tokens/s, Tandem's R=2 over R=1 throughput speed-up (tokens/s; ideal 2)
#   and step-time ratio at equal per-replica work (ideal 1), Tandem R=2 step / DDP step (the
#   same global batch), the share of the gradient reduction the step waited for (sum of
#   StepSummary.stage_reduce_exposed_seconds / sum of stage_reduce_seconds over the measured
#   steps), and the gradient bytes reduced per step (StepSummary.reduced_bytes, summed over the
#   gang). About 3 min on the 2-core dev machine.
# --check-loss: also runs Tandem stages 1, replicas 1 with 2 x M micro-batches (the R=2 job's
#   global batch, which the job's data and learning do not depend on R for) and prints the
#   largest loss difference against R=2; and the DDP peer's against its one process.
# --allreduce: also (first) runs build/bin/bench_allreduce --sizes-mib 16,64,256 --repeats 5
#   (2 ranks of Tandem's Gloo ring all-reduce on 127.0.0.1; skipped, saying so, when the
#   program is not built) and bench/torch_allreduce.py (torch.distributed.all_reduce over gloo,
#   2 processes) on the same sizes, and prints size | Tandem GB/s | torch GB/s | ratio
#   (algorithm bandwidth, bytes / median seconds / 1e9; ratio = Tandem / torch).
#   --sizes-mib LIST, --repeats N change both. About 1 min.
# --shard: also runs Tandem stages 1, replicas 2 with optimizer.shard_state (ZeRO stage 1) and
#   prints each worker's AdamW state bytes (StepSummary.stage_memory.optimizer_bytes) against
#   the unsharded replicas 2 run's, the step-time ratio and the largest loss difference.
# --python PYTHON: the interpreter of the first PyTorch peer (default /usr/bin/python3, with
#   Debian's python3-torch), e.g. /tmp/torch2/bin/python where Debian's torch is not installed.
# --torch2 PYTHON: also run the PyTorch parts (torch_ddp.py, torch_allreduce.py) with PYTHON,
#   an interpreter with a PyPI torch 2.x (e.g. /tmp/torch2/bin/python), in extra rows.
# --small: the speed-up part on small shapes (n_layer 2, d_model 256, n_head 4, seq_len 128,
#   vocab 256, micro-batch 4; a smoke test, about a minute). --no-speedup skips the speed-up
#   part; --only tandem|torch runs one side; --job-timeout S bounds each Tandem job and each
#   PyTorch run (default 1200 s); --keep keeps the run directory (logs, specs, status JSON);
#   --print-spec prints the Tandem spec of the default R=2 job and exits. Every result goes,
#   one JSON line per run (per size for the all-reduce), to <run dir>/results.jsonl, and the
#   summary ends with one JSON line.
#
# Tandem's figures come from `tandem status JOB -o json` (tandem.v1.Job.history, printed with
# the proto field names): step_seconds, stage_reduce_seconds, stage_reduce_exposed_seconds,
# reduced_bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
bin="${TANDEM_BIN:-$root/build/bin}"  # TANDEM_BIN: another build's programs
py=/usr/bin/python3

speedup=1 allreduce=0 keep=0 print_spec=0 small_run=0 check_loss=0 shard=0 only=
steps=3 m=4 vocab='' torch2='' sizes=16,64,256 repeats=5 job_timeout=1200

while [ $# -gt 0 ]; do
  case "$1" in
    --allreduce) allreduce=1 ;;
    --no-speedup) speedup=0 ;;
    --small) small_run=1 ;;
    --check-loss) check_loss=1 ;;
    --shard) shard=1 ;;
    --keep) keep=1 ;;
    --print-spec) print_spec=1 ;;
    --steps) steps="$2"; shift ;;
    --m) m="$2"; shift ;;
    --vocab) vocab="$2"; shift ;;
    --torch2) torch2="$2"; shift ;;
    --python) py="$2"; shift ;;
    --sizes-mib) sizes="$2"; shift ;;
    --repeats) repeats="$2"; shift ;;
    --job-timeout) job_timeout="$2"; shift ;;
    --only) only="$2"; shift
      case "$only" in tandem|torch) ;; *) echo "data_parallel_bench.sh: --only tandem|torch" >&2; exit 2 ;; esac ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "data_parallel_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in steps m repeats job_timeout; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "data_parallel_bench.sh: --${v//_/-} must be a positive integer" >&2; exit 2; }
done

# Full shapes (bench/torch_pipeline.py's) and the small ones of --small.
L=4 D=768 H=12 SEQ=256 MB=4
if [ "$small_run" = 1 ]; then
  L=2 D=256 H=4 SEQ=128 MB=4
fi
vocab="${vocab:-256}"

# spec NAME STAGES REPLICAS M STEPS LAYERS D HEADS SEQ VOCAB MB [SHARD]: a Tandem job spec.
spec() {
  cat <<EOF
# Data-parallel benchmark job (bench/data_parallel_bench.sh): the shapes of bench/torch_ddp.py.
name: $1
steps: $5
seed: 1234
device: cpu
model:
  arch: gpt
  n_layer: $6
  n_head: $8
  d_model: $7
  seq_len: $9
  vocab_size: ${10}
  tie_embeddings: false
data:
  source: synthetic
optimizer:
  name: adamw
  lr: 0.0003
  weight_decay: 0.0
  warmup_steps: 0
  lr_schedule: constant
  grad_clip: 0.0
  shard_state: ${12:-false}
pipeline:
  stages: $2
  replicas: $3
  micro_batch_size: ${11}
  micro_batches: $4
  schedule: 1f1b
  partition: uniform
eval:
  every: 0
checkpoint:
  every: 0
EOF
}

if [ "$print_spec" = 1 ]; then
  spec dp-s1-r2 1 2 "$m" "$steps" $L $D $H $SEQ "$vocab" $MB
  exit 0
fi

# The report: Tandem's status JSON to a result line, tagging, and the summary tables.
read -r -d '' REPORT_PY <<'PY' || true
import json, os, statistics, sys
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from pipeline_report import tandem_record  # noqa: E402

def med(xs):
    xs = list(xs)
    return statistics.median(xs) if xs else None

def fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)

def floats(h, key):
    return [float(x) for x in h.get(key, [])]

def tandem(path, section, label):
    rec = tandem_record(path, section, label)
    job = json.load(open(path))
    spec = job.get("spec", {})
    pipe = spec.get("pipeline", {})
    hist = job.get("history", [])
    measured = hist[1:] if len(hist) > 1 else hist
    r = int(pipe.get("replicas", 1))
    sh = rec["shape"]
    tokens = r * sh["m"] * sh["mb"] * sh["seq"]
    red = [sum(floats(h, "stage_reduce_seconds")) for h in hist]
    exp = [sum(floats(h, "stage_reduce_exposed_seconds")) for h in hist]
    mred, mexp = red[1:] if len(red) > 1 else red, exp[1:] if len(exp) > 1 else exp
    rec.update({
        "mode": "dp" if r > 1 else "single",
        "replicas": r,
        "workers": int(pipe.get("stages", 1)) * r,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / rec["step_s"] if rec["step_s"] else None,
        "effective_batch": int(job.get("effective_batch", 0)),
        "reduce_s": red, "reduce_exposed_s": exp,
        "reduce_med_s": med(mred), "reduce_exposed_med_s": med(mexp),
        "exposed_share": sum(mexp) / sum(mred) if sum(mred) > 0 else None,
        "reduced_bytes": [int(h.get("reduced_bytes", 0)) for h in hist],
        # Replica 0's workers' AdamW state (the latest step carries stage_memory).
        "optimizer_bytes": sum(int(m.get("optimizer_bytes", 0))
                               for m in (hist[-1].get("stage_memory", []) if hist else [])),
        "stage_reduce_seconds": [floats(h, "stage_reduce_seconds") for h in hist],
        "stage_reduce_exposed_seconds": [floats(h, "stage_reduce_exposed_seconds")
                                         for h in hist],
    })
    print(json.dumps(rec))

def tag(section, label, peer):
    """Every JSON line of stdin, tagged (the all-reduce programs print one per size)."""
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("{"):
            rec = json.loads(line)
            rec.update({"section": section, "label": label})
            rec.setdefault("peer", peer)
            print(json.dumps(rec))

def summary(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    out = {"allreduce": None, "speedup": None}

    ar = [r for r in recs if r.get("section") == "allreduce"]
    if ar:
        labels = []
        for r in ar:
            if r["label"] not in labels:
                labels.append(r["label"])
        sizes = sorted({r["bytes"] for r in ar})
        get = lambda lab, b: next((r for r in ar if r["label"] == lab and r["bytes"] == b), None)
        peers = [lab for lab in labels if lab != "tandem"]
        print("== All-reduce: float32 sum, 2 ranks on 127.0.0.1, algorithm bandwidth = bytes / "
              "median time (GB = 1e9 B); ratio = Tandem / torch ==")
        head = f"{'size MiB':>8} | {'Tandem GB/s':>11}"
        for lab in peers:
            head += f" | {lab.replace('-', ' ') + ' GB/s':>15} | {'ratio':>5}"
        print(head)
        rows = []
        for b in sizes:
            t = get("tandem", b)
            line = f"{b / 2**20:>8.0f} | {fmt(t and t['gbps']):>11}"
            row = {"bytes": b, "tandem_gbps": t and t["gbps"], "tandem_s": t and t["seconds"]}
            for lab in peers:
                p = get(lab, b)
                ratio = p["seconds"] / t["seconds"] if p and t else None
                line += f" | {fmt(p and p['gbps']):>15} | {fmt(ratio, '.2f'):>5}"
                row[lab + "_gbps"] = p and p["gbps"]
                row[lab + "_ratio"] = ratio
            print(line)
            rows.append(row)
        if not any(r["label"] == "tandem" for r in ar):
            print("(Tandem: build/bin/bench_allreduce was not run)")
        out["allreduce"] = rows
        print()

    sp = [r for r in recs if r.get("section") == "speedup"]
    if sp:
        t1 = next((r for r in sp if r["label"] == "tandem-r1"), None)
        t2 = next((r for r in sp if r["label"] == "tandem-r2"), None)
        tc = next((r for r in sp if r["label"] == "tandem-r1-global"), None)
        torch_rows = []  # (name, single, ddp)
        for pfx in ("torch", "torch2"):
            s = next((r for r in sp if r["label"] == pfx + "-single"), None)
            d = next((r for r in sp if r["label"] == pfx + "-ddp"), None)
            if s or d:
                ver = ".".join((s or d)["peer"].split("-")[1].split(".")[:2])
                torch_rows.append((ver, s, d))
        shape = (t2 or t1 or next(r for r in sp))["shape"]
        keys = ("layers", "d", "heads", "mb", "seq", "m", "vocab", "steps")
        print("== Data-parallel speed-up: %s (m = micro-batches per replica) ==" % ", ".join(
            f"{k} {shape[k]}" for k in keys if k in shape))
        rows = []
        if t1:
            rows.append(("Tandem, replicas 1 (1 worker)", t1, None))
        if tc:
            rows.append((f"Tandem, replicas 1, {tc['shape']['m']} micro-batches", tc, None))
        if t2:
            su = t2["tokens_per_s"] / t1["tokens_per_s"] if t1 else None
            rows.append(("Tandem, replicas 2 (2 workers)", t2, su))
        for ver, s, d in torch_rows:
            if s:
                rows.append((f"PyTorch {ver}, 1 process (R=2's batch)", s, None))
            if d:
                su = d["tokens_per_s"] / s["tokens_per_s"] if s else None
                rows.append((f"PyTorch {ver} DDP, 2 processes", d, su))
        w = max(len(n) for n, _, _ in rows) + 1
        print(f"{'run':<{w}} {'batch':>5} {'step s':>8} {'tokens/s':>9} {'speed-up':>9}  "
              f"loss[0..]")
        for name, r, su in rows:
            batch = r.get("tokens_per_step", 0) // max(1, r["shape"]["seq"])
            print(f"{name:<{w}} {batch:>5} {fmt(r['step_s']):>8} {fmt(r['tokens_per_s'], '.0f'):>9}"
                  f" {(fmt(su, '.2f') + 'x') if su else '':>9}  "
                  + ", ".join("%.4f" % x for x in r["losses"][:4]))
        print("(batch: sequences per step; speed-up: tokens/s over the 1-worker / 1-process row)")
        res = {"shape": shape}
        if t1 and t2:
            su = t2["tokens_per_s"] / t1["tokens_per_s"]
            ratio = t2["step_s"] / t1["step_s"]
            print(f"Tandem replicas 2 vs 1: throughput speed-up {su:.2f}x (ideal 2.00x); step "
                  f"time at equal per-replica work {ratio:.3f} (R=2 {t2['step_s']:.3f} s / R=1 "
                  f"{t1['step_s']:.3f} s; ideal 1.000)")
            res.update({"tandem_r1_s": t1["step_s"], "tandem_r2_s": t2["step_s"],
                        "tandem_speedup": su, "tandem_step_ratio": ratio})
        for ver, s, d in torch_rows:
            if t2 and d:
                print(f"Tandem replicas 2 step / PyTorch {ver} DDP step (same global batch): "
                      f"{t2['step_s'] / d['step_s']:.3f}")
                res[f"tandem_over_ddp_{ver}"] = t2["step_s"] / d["step_s"]
            if s and d:
                res[f"ddp_{ver}_speedup"] = d["tokens_per_s"] / s["tokens_per_s"]
                res[f"ddp_{ver}_s"] = d["step_s"]
                res[f"single_{ver}_s"] = s["step_s"]
        if t2:
            n = len(t2["reduce_s"])
            print(f"Tandem replicas 2 gradient reduction (replica 0, summed over stages), per "
                  f"step: " + "; ".join(
                      f"{i}: {t2['reduce_s'][i]:.3f} s, exposed {t2['reduce_exposed_s'][i]:.3f} s"
                      + (" (warm-up)" if i == 0 and n > 1 else "") for i in range(n)))
            share = t2["exposed_share"]
            print(f"  exposed share, steps after the warm-up: sum exposed / sum reduce = "
                  f"{fmt(share)}" + (" (no reduction time recorded)" if share is None else ""))
            gang = t2["workers"]
            print(f"  reduced bytes per step (StepSummary.reduced_bytes, over the gang of {gang}): "
                  + ", ".join(str(b) for b in t2["reduced_bytes"])
                  + (f"; per worker {t2['reduced_bytes'][-1] // gang} B = "
                     f"{t2['reduced_bytes'][-1] / gang / 2**20:.2f} MiB" if t2["reduced_bytes"] else ""))
            grad = next((d["grad_bytes"] for _, _, d in torch_rows if d), None)
            if grad:
                print(f"  the model's fp32 gradient (torch peer's parameters): {grad} B = "
                      f"{grad / 2**20:.2f} MiB")
            res.update({"tandem_reduce_s": t2["reduce_med_s"],
                        "tandem_reduce_exposed_s": t2["reduce_exposed_med_s"],
                        "tandem_exposed_share": share, "tandem_reduced_bytes": t2["reduced_bytes"],
                        "model_grad_bytes": grad})
        for ver, s, d in torch_rows:
            if d and d.get("reduce_exposed_s") is not None:
                print(f"PyTorch {ver} DDP: last (synchronising) micro-batch {d['mb_sync_s']:.3f} s "
                      f"vs a no_sync one {d['mb_nosync_s']:.3f} s: ~{d['reduce_exposed_s']:.3f} s "
                      f"of all-reduce exposed per step (estimate; bucket {d['bucket_mb']:g} MiB)")
                res[f"ddp_{ver}_reduce_exposed_s"] = d["reduce_exposed_s"]
        def diff(a, b):
            n = min(len(a["losses"]), len(b["losses"]))
            return max(abs(x - y) for x, y in zip(a["losses"][:n], b["losses"][:n])) if n else None
        ts = next((r for r in sp if r["label"] == "tandem-r2-shard"), None)
        if ts and t2:
            ratio = ts["optimizer_bytes"] / t2["optimizer_bytes"] if t2["optimizer_bytes"] else None
            dl = diff(t2, ts)
            print(f"Tandem replicas 2, optimizer.shard_state: AdamW state per worker "
                  f"{ts['optimizer_bytes']} B vs {t2['optimizer_bytes']} B unsharded = "
                  f"{fmt(ratio)}x; step {fmt(ts['step_s'])} s vs {fmt(t2['step_s'])} s = "
                  f"{fmt(ts['step_s'] / t2['step_s'] if t2['step_s'] else None)}; losses max "
                  f"|diff| {dl:.2e}")
            res.update({"shard_optimizer_bytes": ts["optimizer_bytes"],
                        "unsharded_optimizer_bytes": t2["optimizer_bytes"],
                        "shard_state_ratio": ratio, "shard_step_s": ts["step_s"],
                        "shard_loss_diff": dl})
        if tc and t2:
            dl = diff(tc, t2)
            print(f"loss agreement Tandem replicas 2 vs replicas 1 on the same global batch: "
                  f"max |diff| {dl:.2e}")
            res["tandem_loss_diff"] = dl
        for ver, s, d in torch_rows:
            if s and d:
                dl = diff(s, d)
                print(f"loss agreement PyTorch {ver} DDP vs 1 process: max |diff| {dl:.2e}")
                res[f"torch_{ver}_loss_diff"] = dl
        out["speedup"] = res
        print()
    print(json.dumps({"data_parallel_bench": out}))

cmd = sys.argv[1]
if cmd == "tandem":
    tandem(*sys.argv[2:5])
elif cmd == "tag":
    tag(*sys.argv[2:5])
elif cmd == "summary":
    summary(sys.argv[2])
else:
    sys.exit("report: unknown command " + cmd)
PY
report() { "$py" -c "$REPORT_PY" "$@"; }

need_cluster=0
if [ "$speedup" = 1 ] && [ "$only" != torch ]; then need_cluster=1; fi
if [ "$need_cluster" = 1 ]; then
  for b in tandem-coordinator tandem-worker tandem; do
    [ -x "$bin/$b" ] || { echo "data_parallel_bench.sh: $bin/$b is missing: build first (./scripts/build.sh)" >&2; exit 1; }
  done
fi
"$py" -c 'import torch' 2>/dev/null || {
  echo "data_parallel_bench.sh: $py cannot import torch (apt-get install python3-torch)" >&2; exit 1; }
if [ -n "$torch2" ]; then
  "$torch2" -c 'import torch.distributed' 2>/dev/null || {
    echo "data_parallel_bench.sh: --torch2 $torch2 cannot import torch.distributed" >&2; exit 1; }
fi

run="$(mktemp -d /tmp/tandem-dpbench-XXXXXX)"
results="$run/results.jsonl"
: >"$results"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "run directory: $run" >&2; else rm -rf "$run"; fi
}
trap cleanup EXIT

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# ------------------------------------------------------------------ all-reduce
if [ "$allreduce" = 1 ]; then
  if [ "$only" != torch ]; then
    if [ -x "$bin/bench_allreduce" ]; then
      log "tandem all-reduce: bench_allreduce --sizes-mib $sizes --repeats $repeats"
      if timeout "$job_timeout" "$bin/bench_allreduce" --sizes-mib "$sizes" --repeats "$repeats" \
          >"$run/allreduce.tandem.log" 2>&1; then
        grep '^{' "$run/allreduce.tandem.log" >&2 || true
        report tag allreduce tandem tandem <"$run/allreduce.tandem.log" >>"$results"
      else
        echo "data_parallel_bench.sh: bench_allreduce failed (exit $?):" >&2
        tail -n 5 "$run/allreduce.tandem.log" >&2
        exit 1
      fi
    else
      log "tandem all-reduce: $bin/bench_allreduce is not built: skipped"
    fi
  fi
  if [ "$only" != tandem ]; then
    for p in "$py" ${torch2:+"$torch2"}; do
      label=torch; [ "$p" = "$py" ] || label=torch2
      log "$label all-reduce: $p bench/torch_allreduce.py --sizes-mib $sizes --repeats $repeats"
      timeout "$job_timeout" "$p" bench/torch_allreduce.py --sizes-mib "$sizes" \
        --repeats "$repeats" --timeout "$job_timeout" >"$run/allreduce.$label.log"
      cat "$run/allreduce.$label.log" >&2
      ver="$("$p" -c 'import torch; print(".".join(torch.__version__.split(".")[:2]))')"
      report tag allreduce "torch-$ver" torch <"$run/allreduce.$label.log" >>"$results"
    done
  fi
fi

# ------------------------------------------------------------------ speed-up
if [ "$need_cluster" = 1 ]; then
  source scripts/local-cluster.sh
  local_cluster_start "$bin" "$run" "$run" ||
    { echo "data_parallel_bench.sh: the coordinator and two workers did not come up" >&2; exit 1; }
  log "coordinator $TANDEM_COORDINATOR, 2 workers (--threads 1); $("$bin/tandem" version)"
fi

# tandem_run NAME STAGES REPLICAS M STEPS LAYERS D HEADS SEQ VOCAB MB
tandem_run() {
  [ "$only" = torch ] && return 0
  local name="$1" file="$run/$1.yaml"
  spec "$@" >"$file"
  "$bin/tandem" validate "$file" >/dev/null
  local job rc=0
  job="$("$bin/tandem" submit "$file")"
  log "tandem $name: job $job (stages $2, replicas $3, M $4 per replica, $5 steps)"
  timeout "$job_timeout" "$bin/tandem" watch "$job" >"$run/$name.watch.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    [ "$rc" = 124 ] && { echo "data_parallel_bench.sh: job $job ran past --job-timeout $job_timeout s; cancelling" >&2;
                         "$bin/tandem" cancel "$job" >/dev/null 2>&1 || true; }
    echo "data_parallel_bench.sh: Tandem job $name ($job) did not succeed:" >&2
    tail -n 5 "$run/$name.watch.log" >&2
    exit 1
  fi
  grep -E '^ *(step|[0-9])' "$run/$name.watch.log" | tail -n "$5" | cut -c1-160 >&2 || true
  "$bin/tandem" status "$job" -o json >"$run/$name.status.json"
  report tandem "$run/$name.status.json" speedup "$name" >>"$results"
}

# torch_ddp_run PYTHON LABEL ARGS...
torch_ddp_run() {
  [ "$only" = tandem ] && return 0
  local p="$1" label="$2"; shift 2
  log "$label: $p bench/torch_ddp.py $*"
  timeout "$job_timeout" "$p" bench/torch_ddp.py "$@" --timeout "$job_timeout" \
    >"$run/$label.log" 2>"$run/$label.err" ||
    { echo "data_parallel_bench.sh: torch_ddp.py $label failed:" >&2; tail -n 5 "$run/$label.err" >&2; exit 1; }
  grep '^step' "$run/$label.log" >&2 || true
  report tag speedup "$label" torch <"$run/$label.log" >>"$results"
}

if [ "$speedup" = 1 ]; then
  tandem_run tandem-r1 1 1 "$m" "$steps" $L $D $H $SEQ "$vocab" $MB
  tandem_run tandem-r2 1 2 "$m" "$steps" $L $D $H $SEQ "$vocab" $MB
  if [ "$shard" = 1 ]; then
    tandem_run tandem-r2-shard 1 2 "$m" "$steps" $L $D $H $SEQ "$vocab" $MB true
  fi
  if [ "$check_loss" = 1 ]; then
    tandem_run tandem-r1-global 1 1 $((2 * m)) "$steps" $L $D $H $SEQ "$vocab" $MB
  fi
  shape=(--n-layer "$L" --d-model "$D" --n-head "$H" --seq-len "$SEQ" --vocab "$vocab" --mb "$MB"
         --m "$m" --steps "$steps" --replicas 2)
  for p in "$py" ${torch2:+"$torch2"}; do
    label=torch; [ "$p" = "$py" ] || label=torch2
    torch_ddp_run "$p" "$label-ddp" --ddp "${shape[@]}"
    torch_ddp_run "$p" "$label-single" --single "${shape[@]}"
  done
fi

echo >&2
report summary "$results"
