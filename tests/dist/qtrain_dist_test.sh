#!/usr/bin/env bash
# qtrain as two ranks (the environment torchrun sets, without torchrun) on the small CNN W8A8
# recipe with min/max calibration, from the float checkpoint of a one-process run:
#   - the calibration dump equals the one-process run's bit for bit (same thread count),
#   - report.json records world_size 2, rank 1 leaves no files behind,
#   - a rank whose peer never comes fails within QFORGE_DIST_TIMEOUT_S, naming itself.
set -euo pipefail
QTRAIN=$1
QDUMP=$2
ROOT=$3
cd "$ROOT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
small=(--set data.max_train_examples=1024 --set data.max_eval_examples=256 --set train.epochs=1
       --set calibrate.batches=5 --set quantize.activations.observer=minmax --set model.checkpoint="$work/fp32.h5")
"$QTRAIN" --recipe recipes/fmnist_cnn_int8.yaml --out "$work/one" "${small[@]}" > "$work/one.log" 2>&1 ||
  { cat "$work/one.log"; exit 1; }
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
       echo $((20000 + RANDOM % 20000)))
before=$(ls /tmp | grep -c '^qtrain-rank-' || true)
pids=()
for r in 0 1; do
  WORLD_SIZE=2 RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port QFORGE_DIST_TIMEOUT_S=120 \
    "$QTRAIN" --recipe recipes/fmnist_cnn_int8.yaml --out "$work/two" "${small[@]}" > "$work/rank$r.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do wait "${pids[$i]}" || { echo "rank $i failed:"; cat "$work/rank$i.log"; exit 1; }; done
diff_out=$("$QDUMP" diff "$work/one/calibration.h5" "$work/two/calibration.h5" 2>&1)
[ "$diff_out" = "no differences" ] || { echo "calibration differs from one process:"; echo "$diff_out" | head; exit 1; }
grep -q '"world_size": 2' "$work/two/report.json" || { echo "report.json lacks world_size 2"; exit 1; }
after=$(ls /tmp | grep -c '^qtrain-rank-' || true)
[ "$after" -le "$before" ] || { echo "rank 1 left its private directory in /tmp"; exit 1; }
# A lone rank: the group never forms; a clear error within the timeout, not a hang.
start=$(date +%s)
if WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port QFORGE_DIST_TIMEOUT_S=3 \
     "$QTRAIN" --recipe recipes/fmnist_cnn_int8.yaml --out "$work/lone" "${small[@]}" > "$work/lone.log" 2>&1; then
  echo "a rank without its peer succeeded"; exit 1
fi
grep -q "rank 0/2 could not join" "$work/lone.log" || { echo "no clear error:"; cat "$work/lone.log"; exit 1; }
[ $(( $(date +%s) - start )) -lt 60 ] || { echo "took too long"; exit 1; }
echo "qtrain over 2 ranks: calibration bit-identical to one process; lone rank refused"
