#!/usr/bin/env bash
# qtrain as two ranks (the environment torchrun sets, without torchrun) on the small CNN W8A8
# recipe with min/max calibration, from the float checkpoint of a one-process run:
#   - the calibration dump equals the one-process run's bit for bit (same thread count),
#   - report.json records world_size 2, rank 1 leaves no files behind (in its own $TMPDIR, so other
#     2-rank runs on the machine cannot change the count),
#   - float training over 2 ranks (SyncBatchNorm) writes the checkpoint once; a second 2-rank run
#     resumes from it on every rank and evaluates the same float accuracy,
#   - QAT over 2 ranks passes the replica check after every stage (observers included),
#   - ranks with different recipes are refused on every rank, naming the rank,
#   - a rank killed during float training stops the other with an error naming it; no
#     checkpoint (partial or not) appears,
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
mkdir "$work/tmp"
pids=()
for r in 0 1; do
  TMPDIR="$work/tmp" WORLD_SIZE=2 RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port QFORGE_DIST_TIMEOUT_S=120 \
    "$QTRAIN" --recipe recipes/fmnist_cnn_int8.yaml --out "$work/two" "${small[@]}" > "$work/rank$r.log" 2>&1 &
  pids+=($!)
done
# Rank 1's private directory lives in its $TMPDIR while it runs (seconds: training and calibration).
seen=""
while kill -0 "${pids[1]}" 2>/dev/null; do
  [ -n "$seen" ] || seen=$(ls "$work/tmp" | grep '^qtrain-rank-' || true)
  sleep 0.1
done
for i in 0 1; do wait "${pids[$i]}" || { echo "rank $i failed:"; cat "$work/rank$i.log"; exit 1; }; done
[ -n "$seen" ] || { echo "rank 1 made no private directory in its \$TMPDIR ($work/tmp)"; exit 1; }
diff_out=$("$QDUMP" diff "$work/one/calibration.h5" "$work/two/calibration.h5" 2>&1)
[ "$diff_out" = "no differences" ] || { echo "calibration differs from one process:"; echo "$diff_out" | head; exit 1; }
grep -q '"world_size": 2' "$work/two/report.json" || { echo "report.json lacks world_size 2"; exit 1; }
left=$(ls "$work/tmp")
[ -z "$left" ] || { echo "rank 1 left its private directory in \$TMPDIR: $left"; exit 1; }
# Runs qtrain as ranks 0 and 1 in the background; pids in $pids, logs $work/$1.rank{0,1}.log.
launch() {
  local name=$1; shift
  local p
  p=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
      echo $((20000 + RANDOM % 20000)))
  pids=()
  for r in 0 1; do
    local extra=()
    [ "$r" = 1 ] && [ -n "${RANK1_EXTRA:-}" ] && extra=($RANK1_EXTRA)
    WORLD_SIZE=2 RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p QFORGE_DIST_TIMEOUT_S=${TIMEOUT_S:-120} \
      "$QTRAIN" --recipe "${QTRAIN_RECIPE:-recipes/fmnist_cnn_int8.yaml}" --out "$work/$name" "$@" "${extra[@]}" \
      > "$work/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
}
float_line() { grep -E '^  float ' "$1" || { echo "no float metrics in $1:"; cat "$1"; exit 1; }; }

# Float training over 2 ranks with SyncBatchNorm: rank 0 writes the checkpoint; then a second
# 2-rank run resumes from it on both ranks.
dp=(--set data.max_train_examples=1024 --set data.max_eval_examples=256 --set train.epochs=1 --set calibrate.batches=2
    --set distributed.sync_batchnorm=true --set model.checkpoint="$work/dp.h5")
launch dptrain "${dp[@]}"
for i in 0 1; do wait "${pids[$i]}" || { echo "dptrain rank $i failed:"; cat "$work/dptrain.rank$i.log"; exit 1; }; done
[ -f "$work/dp.h5" ] || { echo "no float checkpoint after 2-rank training"; exit 1; }
# Progress, stage lines and notes are rank 0's; rank 1 prints only errors (none here).
[ ! -s "$work/dptrain.rank1.log" ] || { echo "rank 1 printed more than errors:"; head "$work/dptrain.rank1.log"; exit 1; }
grep -q '"sync_batchnorm": true' "$work/dptrain/report.json" || { echo "report.json lacks sync_batchnorm"; exit 1; }
sum_before=$(sha256sum "$work/dp.h5")
launch dpresume "${dp[@]}"
for i in 0 1; do wait "${pids[$i]}" || { echo "dpresume rank $i failed:"; cat "$work/dpresume.rank$i.log"; exit 1; }; done
grep -q "float weights loaded from $work/dp.h5" "$work/dpresume/report.json" ||
  { echo "the resumed run did not load the checkpoint:"; cat "$work/dpresume/report.json"; exit 1; }
[ "$(float_line "$work/dptrain.rank0.log")" = "$(float_line "$work/dpresume.rank0.log")" ] ||
  { echo "resumed float metrics differ:"; float_line "$work/dptrain.rank0.log"; float_line "$work/dpresume.rank0.log"; exit 1; }
[ "$(sha256sum "$work/dp.h5")" = "$sum_before" ] || { echo "the resumed run rewrote the checkpoint"; exit 1; }

# QAT over 2 ranks: the observers, live during QAT and its evaluation, see each rank's own shard;
# rank 0's are every rank's after each epoch and after the evaluation, so the replica check after
# every stage (quantization state included) passes and both ranks exit 0. From a one-process
# float checkpoint (from the 2-rank SyncBatchNorm one above, the weights differ after the QAT
# epoch: not solved, see docs/distributed.md).
qat=(--set data.max_train_examples=512 --set data.max_eval_examples=128 --set train.epochs=1 --set calibrate.batches=2
     --set qat.epochs=1 --set model.checkpoint="$work/qat_fp32.h5")
"$QTRAIN" --recipe recipes/fmnist_cnn_w4a8_qat.yaml --out "$work/qat_one" "${qat[@]}" > "$work/qat_one.log" 2>&1 ||
  { cat "$work/qat_one.log"; exit 1; }
QTRAIN_RECIPE=recipes/fmnist_cnn_w4a8_qat.yaml launch qat "${qat[@]}"
for i in 0 1; do wait "${pids[$i]}" || { echo "qat rank $i failed:"; cat "$work/qat.rank$i.log"; exit 1; }; done

# Different recipes on the two ranks: refused on both, naming rank 1.
RANK1_EXTRA="--set train.lr=0.003" launch mismatch "${dp[@]}"
for i in 0 1; do
  if wait "${pids[$i]}"; then echo "rank $i ran with a mismatched recipe"; exit 1; fi
  grep "the resolved recipe (with its --set overrides) differs between ranks: line [0-9]*: rank 0 has 'train: {.*lr: 0.002.*}'; rank 1 has 'train: {.*lr: 0.003.*}'" \
    "$work/mismatch.rank$i.log" || { echo "rank $i: no clear mismatch error:"; cat "$work/mismatch.rank$i.log"; exit 1; }
done

# Rank 1 killed during float training: rank 0 stops naming it; no checkpoint appears.
long=(--set data.max_train_examples=1024 --set data.max_eval_examples=256 --set train.epochs=200
      --set model.checkpoint="$work/killed.h5")
TIMEOUT_S=30 launch killed "${long[@]}"
for _ in $(seq 1 600); do grep -q "stage float" "$work/killed.rank0.log" && break; sleep 0.1; done
sleep 1
kill -9 "${pids[1]}"
start=$(date +%s)
if wait "${pids[0]}"; then echo "rank 0 finished although rank 1 was killed"; exit 1; fi
wait "${pids[1]}" 2>/dev/null || true
grep "rank(s) 1 did not answer" "$work/killed.rank0.log" || { echo "rank 0 did not name rank 1:"; cat "$work/killed.rank0.log"; exit 1; }
[ $(( $(date +%s) - start )) -lt 40 ] || { echo "rank 0 took too long to stop"; exit 1; }
[ ! -e "$work/killed.h5" ] || { echo "a checkpoint appeared although training failed"; exit 1; }
if ls -a "$work" | grep -q '^\.killed\.h5\.tmp'; then echo "a temporary checkpoint was left behind"; ls -a "$work"; exit 1; fi

# A lone rank: the group never forms; a clear error within the timeout, not a hang.
start=$(date +%s)
if WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port QFORGE_DIST_TIMEOUT_S=3 \
     "$QTRAIN" --recipe recipes/fmnist_cnn_int8.yaml --out "$work/lone" "${small[@]}" > "$work/lone.log" 2>&1; then
  echo "a rank without its peer succeeded"; exit 1
fi
grep -q "rank 0/2 could not join" "$work/lone.log" || { echo "no clear error:"; cat "$work/lone.log"; exit 1; }
[ $(( $(date +%s) - start )) -lt 60 ] || { echo "took too long"; exit 1; }
echo "qtrain over 2 ranks: calibration bit-identical to one process; resumed from the 2-rank checkpoint; mismatch refused; killed rank named; lone rank refused"
