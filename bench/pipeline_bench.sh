#!/usr/bin/env bash
# Pipeline speed-up, bubble and memory: Tandem against a hand-written PyTorch 1.13 pipeline
# (bench/torch_pipeline.py), measured side by side in one run on 127.0.0.1.
#
#   bench/pipeline_bench.sh [--bubble] [--memory] [--recompute] [--schedules] [--no-speedup] [--small]
#                           [--steps N]
#                           [--m N] [--vocab N] [--only tandem|torch] [--keep] [--print-spec]
#                           [--torch2 PYTHON]
#
# Needs a built tree (build/bin/tandem-coordinator, tandem-worker, tandem; this script does
# not build) and Debian's python3-torch for /usr/bin/python3. It starts one coordinator
# (no --data-root: jobs in memory, no checkpoints written) and two tandem-worker processes
# with --threads 1, then:
#
# default (speed-up), the issue's shapes: gpt, n_layer 4, n_head 12, d_model 768, seq_len 256,
#   vocab 256 (bytes; untied head), micro-batch 4, M 8, --steps 3 (the first is a warm-up;
#   figures are medians of the rest). Runs Tandem on 1 worker, Tandem on 2 workers (1f1b and
#   zb_h1), the PyTorch single process and the PyTorch 2-process 1f1b pipeline, and prints step
#   times, speed-ups (Tandem P2 vs P1, PyTorch P2 vs P1) and Tandem P2 / PyTorch P2.
#   About 3.5 min on the 2-core dev machine.
#   Why vocab 256: the issue's anchor (18.6 s single, 10.7-11.0 s 2-stage) fits a model whose
#   head costs next to nothing (8 x 4 blocks x ~0.5 s). A 50304-word untied head costs 2.3-2.9 s
#   per micro-batch, 5x a block: no cut at layer boundaries balances two stages then (the best,
#   embedding + 4 blocks | head, is bounded at about 1.66x); --vocab 50304 shows it (~8 min).
# --bubble: P=2 1f1b at M in {2,4,8,16} on the same shapes, 2 steps each: the measured bubble
#   (1 - sum(busy) / (P x slowest worker's exec)) against the simulator's prediction from the
#   step's measured action costs, both recorded by the coordinator in every StepSummary.
#   About 1.5 min.
# --memory: peak live activation bytes per rank, Tandem P=2 gpipe vs 1f1b vs zb_h1 at M=16
#   on the same shapes (2 steps), plus the PyTorch pipeline's peak RSS per rank, gpipe vs 1f1b,
#   at M=8 (2 steps each). About 3 min.
# --recompute: activation recomputation (pipeline.recompute: full) on the issue's shapes, P=2
#   1f1b at M=16, --steps steps each, with and without: stage 0's peak live activation bytes
#   and the step time, their ratios, and the largest loss difference (0: the same arithmetic);
#   then full under memory_budget_mb 420 (1F1B's stage 0 does not fit it without recomputation):
#   the coordinator drops the R's whose micro-batches the budget holds whole and places the rest
#   in idle slots where they fit; recompute: auto at the same budget (stage 0 recomputes, stage 1
#   does not), the plan's bytes per stage against the measured peaks on every Tandem job, and
#   the hand-written PyTorch pipeline without and with torch.utils.checkpoint on every module:
#   Tandem's recomputation overhead against PyTorch's. About 20 min on an idle 2-core machine.
# --torch2 PYTHON: also run, in the speed-up part, the torch.distributed.pipelining peer
#   (bench/torch_pipelining.py: the same model, seeds and data, one process and 2 processes
#   Schedule1F1B over gloo, one thread each) with PYTHON, an interpreter with a PyPI torch 2.x
#   (e.g. `/usr/bin/python3 -m venv /tmp/torch2 && /tmp/torch2/bin/pip install torch numpy`,
#   then --torch2 /tmp/torch2/bin/python), and print its rows and Tandem P2 / its P2 next to
#   the hand-written peer's. About 2 min more at the default shapes. --only torch runs both
#   PyTorch peers.
# --schedules: every schedule Tandem generates (tandem's AllScheduleNames: gpipe ... zb_auto) on
#   the issue's shapes, P=2, M=8, 2 steps each, one after the other: step time, measured bubble
#   and the simulator's prediction from the step's measured action costs (target within 0.03),
#   and stage 0's peak activation bytes. About 12 min on an idle 2-core machine.
# --small runs the default part on small balanced shapes (n_layer 4, d_model 256, n_head 4,
#   seq_len 128, vocab 256, micro-batch 4; a smoke test: under a minute);
# --no-speedup skips the default part; --keep keeps the run directory (logs, specs, JSON);
# --print-spec prints the Tandem spec of the default P=2 run (bench/pipeline_job.yaml) and
# exits. Every result also goes, one JSON line per run, to <run dir>/results.jsonl.
#
# Tandem's figures come from `tandem status JOB -o json` (tandem.v1.Job.history): step wall
# time, the slowest worker's exec time, per-rank busy time, measured and predicted bubble, and
# per-rank peak live activation bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
bin="${TANDEM_BIN:-$root/build/bin}"  # TANDEM_BIN: another build's programs (e.g. before/after a change)
py=/usr/bin/python3

speedup=1 bubble=0 memory=0 recompute=0 schedules=0 keep=0 print_spec=0 small_run=0 only=
steps=3 m=8 vocab='' torch2=

while [ $# -gt 0 ]; do
  case "$1" in
    --bubble) bubble=1 ;;
    --memory) memory=1 ;;
    --recompute) recompute=1 ;;
    --schedules) schedules=1 ;;
    --no-speedup) speedup=0 ;;
    --small) small_run=1 ;;
    --keep) keep=1 ;;
    --print-spec) print_spec=1 ;;
    --steps) steps="$2"; shift ;;
    --m) m="$2"; shift ;;
    --vocab) vocab="$2"; shift ;;
    --torch2) torch2="$2"; shift ;;
    --only) only="$2"; shift
      case "$only" in tandem|torch) ;; *) echo "pipeline_bench.sh: --only tandem|torch" >&2; exit 2 ;; esac ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "pipeline_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# Full shapes (the issue's) and the small balanced shapes of --bubble / --memory.
L=4 D=768 H=12 SEQ=256 MB=4
SL=4 SD=256 SH=4 SSEQ=128 SV=256 SMB=4
if [ "$small_run" = 1 ]; then
  L=$SL D=$SD H=$SH SEQ=$SSEQ MB=$SMB
  vocab="${vocab:-$SV}"
fi
vocab="${vocab:-256}"

# spec NAME STAGES M SCHEDULE STEPS LAYERS D HEADS SEQ VOCAB MB [RECOMPUTE [PARTITION BUDGET_MB]]:
# a Tandem job spec (pipeline.recompute written only when not none, memory_budget_mb only when
# given, so older builds read the others' specs).
spec() {
  sed '/^$/d' <<EOF
# Pipeline benchmark job (bench/pipeline_bench.sh): the shapes of bench/torch_pipeline.py.
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
pipeline:
  stages: $2
  micro_batch_size: ${11}
  micro_batches: $3
  schedule: $4
  partition: ${13:-uniform}
$([ "${12:-none}" = none ] || echo "  recompute: ${12}")
$([ -z "${14:-}" ] || echo "  memory_budget_mb: ${14}")
eval:
  every: 0
checkpoint:
  every: 0
EOF
}

if [ "$print_spec" = 1 ]; then
  spec pipeline-p2-1f1b 2 "$m" 1f1b "$steps" $L $D $H $SEQ "$vocab" $MB
  exit 0
fi

for b in tandem-coordinator tandem-worker tandem; do
  [ -x "$bin/$b" ] || { echo "pipeline_bench.sh: $bin/$b is missing: build first (./scripts/build.sh)" >&2; exit 1; }
done
"$py" -c 'import torch' 2>/dev/null || {
  echo "pipeline_bench.sh: $py cannot import torch (apt-get install python3-torch)" >&2; exit 1; }
if [ -n "$torch2" ]; then
  "$torch2" -c 'import torch.distributed.pipelining' 2>/dev/null || {
    echo "pipeline_bench.sh: --torch2 $torch2 cannot import torch.distributed.pipelining" \
      "(a PyPI torch 2.x: pip install torch)" >&2; exit 1; }
fi

run="$(mktemp -d /tmp/tandem-pipebench-XXXXXX)"
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

source scripts/local-cluster.sh
local_cluster_start "$bin" "$run" "$run" ||
  { echo "pipeline_bench.sh: the coordinator and two workers did not come up" >&2; exit 1; }
log "coordinator $TANDEM_COORDINATOR, 2 workers (--threads 1); $("$bin/tandem" version)"

# tandem_run SECTION NAME STAGES M SCHEDULE STEPS LAYERS D HEADS SEQ VOCAB MB [RECOMPUTE]
tandem_run() {
  [ "$only" = torch ] && return 0
  local section="$1"; shift
  local name="$1" file="$run/$1.yaml"
  spec "$@" >"$file"
  "$bin/tandem" validate "$file" >/dev/null
  local job
  job="$("$bin/tandem" submit "$file")"
  log "tandem $name: job $job (P=$2, M=$3, $4, $5 steps)"
  if ! "$bin/tandem" watch "$job" >"$run/$name.watch.log" 2>&1; then
    echo "pipeline_bench.sh: Tandem job $name ($job) did not succeed:" >&2
    tail -n 5 "$run/$name.watch.log" >&2
    exit 1
  fi
  "$bin/tandem" status "$job" -o json >"$run/$name.status.json"
  "$py" bench/pipeline_report.py tandem "$run/$name.status.json" --section "$section" \
    --label "$name" | tee -a "$results" | cut -c1-160 >&2
}

# torch_run SECTION NAME ARGS...
torch_run() {
  [ "$only" = tandem ] && return 0
  local section="$1" name="$2"; shift 2
  log "torch $name: bench/torch_pipeline.py $*"
  "$py" bench/torch_pipeline.py "$@" >"$run/$name.torch.log"
  grep '^step' "$run/$name.torch.log" >&2 || true
  tail -n 1 "$run/$name.torch.log" |
    "$py" bench/pipeline_report.py tag --section "$section" --label "$name" >>"$results"
}

# torch2_run SECTION NAME ARGS...: the torch.distributed.pipelining peer (--torch2 PYTHON).
torch2_run() {
  [ "$only" = tandem ] && return 0
  [ -n "$torch2" ] || return 0
  local section="$1" name="$2"; shift 2
  log "torch2 $name: $torch2 bench/torch_pipelining.py $*"
  "$torch2" bench/torch_pipelining.py "$@" >"$run/$name.torch2.log"
  grep '^step' "$run/$name.torch2.log" >&2 || true
  tail -n 1 "$run/$name.torch2.log" |
    "$py" bench/pipeline_report.py tag --section "$section" --label "$name" >>"$results"
}

full=(--layers $L --d $D --heads $H --mb $MB --seq $SEQ)
small=(--layers $SL --d $SD --heads $SH --mb $SMB --seq $SSEQ --vocab $SV)

if [ "$speedup" = 1 ]; then
  tandem_run speedup tandem-p1 1 "$m" 1f1b "$steps" $L $D $H $SEQ "$vocab" $MB
  tandem_run speedup tandem-p2-1f1b 2 "$m" 1f1b "$steps" $L $D $H $SEQ "$vocab" $MB
  tandem_run speedup tandem-p2-zb_h1 2 "$m" zb_h1 "$steps" $L $D $H $SEQ "$vocab" $MB
  torch_run speedup torch-single --single "${full[@]}" --vocab "$vocab" --m "$m" --steps "$steps"
  torch_run speedup torch-p2-1f1b --pipeline --schedule 1f1b "${full[@]}" --vocab "$vocab" \
    --m "$m" --steps "$steps"
  torch2_run speedup torch2-single --single "${full[@]}" --vocab "$vocab" --m "$m" \
    --steps "$steps"
  torch2_run speedup torch2-p2-1f1b --pipeline --schedule 1f1b "${full[@]}" --vocab "$vocab" \
    --m "$m" --steps "$steps"
fi

if [ "$bubble" = 1 ]; then
  for bm in 2 4 8 16; do
    tandem_run bubble "bubble-p2-m$bm" 2 "$bm" 1f1b 2 $L $D $H $SEQ "$vocab" $MB
  done
fi

if [ "$memory" = 1 ]; then
  for s in gpipe 1f1b zb_h1; do
    tandem_run memory "memory-p2-$s" 2 16 "$s" 2 $L $D $H $SEQ "$vocab" $MB
  done
  for s in gpipe 1f1b; do
    torch_run memory "memory-torch-$s" --pipeline --schedule "$s" "${full[@]}" --vocab "$vocab" \
      --m 8 --steps 2
  done
fi

if [ "$recompute" = 1 ]; then
  # partition: profile everywhere, so that every job has the plan's bytes per stage to set
  # against the measured peaks (the cut is the uniform one on these shapes).
  for rc in none full; do
    tandem_run recompute "recompute-p2-1f1b-$rc" 2 16 1f1b "$steps" $L $D $H $SEQ "$vocab" $MB \
      $rc profile
  done
  # recompute: auto under a budget that 1F1B's stage 0 (two micro-batches) does not fit without
  # recomputation and stage 1 (one) does: only stage 0 recomputes.
  tandem_run recompute "recompute-p2-1f1b-auto" 2 16 1f1b "$steps" $L $D $H $SEQ "$vocab" \
    $MB auto profile 420
  # Full recomputation under the same budget: the coordinator places the R's from the layer
  # profile (partition: profile): none where the budget holds the micro-batch's activations from
  # its F on, in idle slots where it holds them from there, else inside the backward.
  tandem_run recompute "recompute-p2-1f1b-full-idle" 2 16 1f1b "$steps" $L $D $H $SEQ "$vocab" \
    $MB full profile 420
  # The same pipeline in PyTorch, without and with torch.utils.checkpoint on every module.
  torch_run recompute recompute-torch-none --pipeline --schedule 1f1b "${full[@]}" \
    --vocab "$vocab" --m 16 --steps "$steps"
  torch_run recompute recompute-torch-checkpoint --pipeline --schedule 1f1b "${full[@]}" \
    --vocab "$vocab" --m 16 --steps "$steps" --checkpoint
fi

if [ "$schedules" = 1 ]; then
  for s in gpipe 1f1b interleaved_1f1b zb_h1 zb_v looped_bfs interleaved_zb zb_h2 dualpipe_v \
    v_half v_min zb_auto; do
    tandem_run schedules "schedule-p2-$s" 2 8 "$s" 2 $L $D $H $SEQ "$vocab" $MB
  done
fi

"$py" bench/pipeline_report.py summary "$results"
