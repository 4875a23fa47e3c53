#!/usr/bin/env bash
# Chaos test of checkpoints (docs/checkpoints.md): a run without interruption, then the
# same run with a random rank killed (kill -9) at a random step and restarted, several times;
# the final checkpoint must equal the first run's bitwise, and each killed job must end
# within 60 s. Needs scripts/setup.sh's .venv/.
# usage: scripts/chaos.sh [--np N] [--partitions K] [--steps S] [--every E] [--kills X]
#                         [--sift] [--seed SEED] [--workdir DIR]
# defaults: 4 ranks as 2 stages x 2 replicas, 24 steps, a checkpoint every 3, 3 kills.
# tests/tfsift/checkpoint/test_chaos.py runs a shortened form (2 ranks, 8 steps, 1 kill).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NP=4 K=2 STEPS=24 EVERY=3 KILLS=3 SIFT="" SEED="" WORK=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np) NP="$2"; shift 2 ;;
    --partitions) K="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --every) EVERY="$2"; shift 2 ;;
    --kills) KILLS="$2"; shift 2 ;;
    --sift) SIFT="--sift"; shift ;;
    --seed) SEED="$2"; shift 2 ;;
    --workdir) WORK="$2"; shift 2 ;;
    *) echo "chaos.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$SEED" ]] && RANDOM="$SEED"
[[ -x "$ROOT/.venv/bin/python" ]] || { echo "chaos.sh: run scripts/setup.sh first" >&2; exit 2; }
WORK="${WORK:-$(mktemp -d -t tfsift-chaos-XXXXXX)}"
mkdir -p "$WORK"
export PATH="$ROOT/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3 OMP_NUM_THREADS=1 \
  TF_NUM_INTEROP_THREADS=1 TF_NUM_INTRAOP_THREADS=1 \
  PYTHONPATH="$ROOT:$ROOT/tests:$ROOT/tests/mpi_scripts${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
train() {  # train DIR [extra flags]: one job, resuming from DIR's newest checkpoint
  local dir="$1"; shift
  tfsift run -np "$NP" tests/mpi_scripts/checkpoint_train.py "$dir" "$K" "$STEPS" "$EVERY" \
    $SIFT "$@"
}
newest() {  # the step after DIR's newest checkpoint (0 if none)
  local last
  last=$(find "$1" -maxdepth 1 -name 'ckpt-*' -printf '%f\n' 2>/dev/null | sed 's/ckpt-//' \
    | sort -n | tail -1)
  echo $(( ${last:-"-1"} + 1 ))
}

echo "chaos: work directory $WORK; uninterrupted reference run"
train "$WORK/reference" >"$WORK/reference.log" 2>&1 || { cat "$WORK/reference.log"; exit 1; }

for kill in $(seq 1 "$KILLS"); do
  first=$(newest "$WORK/chaos")
  (( first < STEPS - 1 )) || break
  victim=$(( RANDOM % NP ))
  target=$(( first + RANDOM % (STEPS - 1 - first) ))  # a step this run has yet to finish
  progress="$WORK/progress-$kill"
  mkdir -p "$progress"
  train "$WORK/chaos" --progress "$progress" >"$WORK/chaos-$kill.log" 2>&1 &
  job=$!
  while kill -0 "$job" 2>/dev/null; do  # wait until the victim has finished step `target`
    [[ -s "$progress/rank$victim" ]] || { sleep 0.05; continue; }
    read -r pid step <"$progress/rank$victim"
    (( step >= target )) && break
    sleep 0.05
  done
  if ! kill -0 "$job" 2>/dev/null; then
    echo "chaos: the job ended before step $target"; cat "$WORK/chaos-$kill.log"; exit 1
  fi
  kill -9 "$pid" || true
  killed=$(date +%s%N)
  status=0
  wait "$job" || status=$?
  took=$(( ($(date +%s%N) - killed) / 1000000 ))
  echo "chaos: kill $kill: rank $victim (pid $pid) after step $step (resumed at $first);" \
    "the job ended $(( took / 1000 )).$(printf %03d $(( took % 1000 ))) s later, status $status"
  if (( status == 0 || took >= 60000 )); then
    echo "chaos: a killed job must fail, within 60 s"; cat "$WORK/chaos-$kill.log"; exit 1
  fi
done

echo "chaos: final run from step $(newest "$WORK/chaos")"
train "$WORK/chaos" >"$WORK/chaos-final.log" 2>&1 || { cat "$WORK/chaos-final.log"; exit 1; }

# The final checkpoints must hold equal arrays (weights, optimizer, every rank's own state:
# BatchNorm statistics, sifting, random generators); only NumPy is needed to read them.
python - "$WORK/reference/ckpt-$((STEPS - 1))" "$WORK/chaos/ckpt-$((STEPS - 1))" <<'EOF'
import sys
from pathlib import Path

import numpy as np

want, got = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted(p.name for p in want.glob("*.npz"))
assert names == sorted(p.name for p in got.glob("*.npz")), "the checkpoints hold other files"
differ = []
for name in names:
    a, b = np.load(want / name), np.load(got / name)
    assert a.files == b.files, (name, a.files, b.files)
    # __tree__ is the JSON structure of a rank's state; it also holds timings, which differ
    differ += [f"{name}:{k}" for k in a.files if k != "__tree__" and not np.array_equal(a[k], b[k])]
if differ:
    sys.exit(f"chaos: FAILED, these differ from the uninterrupted run: {differ}")
print(f"chaos: OK, final weights, optimizer and rank states equal the uninterrupted run's ({names})")
EOF
