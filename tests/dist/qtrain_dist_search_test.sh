#!/usr/bin/env bash
# qtrain's search under a latency budget as two ranks (the environment torchrun sets), issue 39
# item 14: each rank used to time the kernels itself, so near the budget's boundary the ranks
# chose different widths and could exit 0 with different models. Here rank 0's latency cache
# makes the 2-bit kernels dear (1000 ms, over the 250 ms budget: no layer may take qint2) and
# rank 1's makes them the only cheap ones (every other kernel 1000 ms: one process reading it
# puts all four layers at qint2); a size budget keeps fc1 quantized either way. Rank 0's table
# decides for both: both ranks exit 0 (the pipeline compares the searched recipes across ranks
# and fails every rank when they differ), no layer is 2-bit, rank 0 timed nothing its table held,
# and rank 1 times nothing (a latency cache path it is given stays absent). One front point is
# calibrated and evaluated (search.evaluate_front=1), so those collectives run over two ranks.
set -euo pipefail
QTRAIN=$1
ROOT=$2
cd "$ROOT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
small=(--set data.max_train_examples=512 --set data.max_eval_examples=128 --set train.epochs=1
       --set calibrate.batches=2 --set search.batches=1 --set search.probes=4 --set search.evaluate_front=1
       --set 'search.budget={latency_ms: 250, size_ratio: 0.5}' --set model.checkpoint="$work/fp32.h5")
recipe=recipes/fmnist_cnn_mixed.yaml
run_one() {  # name, latency cache
  QFORGE_LATENCY_CACHE=$2 "$QTRAIN" --recipe $recipe --out "$work/$1" "${small[@]}" > "$work/$1.log" 2>&1 ||
    { echo "$1 failed:"; cat "$work/$1.log"; exit 1; }
}
# This machine's keys, then two tables built from them.
run_one measure "$work/measured.json"
table() { sed -E "/\|qint2 / s/: [0-9.e+-]+(,?)$/: $1\1/; /\|qint2 /! s/\"(.*\|.*)\": [0-9.e+-]+(,?)$/\"\1\": $2\2/" "$work/measured.json"; }
table 1000 1 > "$work/qint2_dear.json"
table 1 1000 > "$work/qint2_cheap.json"
grep -q '|qint2 .*: 1000' "$work/qint2_dear.json" || { echo "no qint2 entries rewritten:"; head "$work/qint2_dear.json"; exit 1; }
searched() { grep -v '^#' "$work/$1/recipe.searched.yaml"; }
two_bit() { searched "$1" | grep -c 'weights: qint2' || true; }
run_one alone_cheap "$work/qint2_cheap.json"
[ "$(two_bit alone_cheap)" = 4 ] || { echo "one process with rank 1's table: not every layer 2-bit:"; searched alone_cheap; exit 1; }

# Runs qtrain as ranks 0 and 1 with latency caches $2 and $3; pids in $pids, logs $work/$1.rank{0,1}.log.
launch() {
  local p
  p=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
      echo $((20000 + RANDOM % 20000)))
  local caches=("$2" "$3")
  pids=()
  for r in 0 1; do
    WORLD_SIZE=2 RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p QFORGE_DIST_TIMEOUT_S=120 QFORGE_LATENCY_CACHE=${caches[$r]} \
      "$QTRAIN" --recipe $recipe --out "$work/$1" "${small[@]}" > "$work/$1.rank$r.log" 2>&1 &
    pids+=($!)
  done
}
launch two "$work/qint2_dear.json" "$work/qint2_cheap.json"
for i in 0 1; do wait "${pids[$i]}" || { echo "rank $i failed:"; cat "$work/two.rank$i.log"; exit 1; }; done
[ "$(two_bit two)" = 0 ] || { echo "the 2-rank choice is not rank 0's table's:"; searched two; exit 1; }
grep -q "search chose .* (.*; 0 timed," "$work/two.rank0.log" ||
  { echo "rank 0 timed kernels its table holds:"; cat "$work/two.rank0.log"; exit 1; }
# Rank 1 times nothing: pointed at a latency cache that does not exist, it leaves none behind
# (a rank that timed would save every kernel it timed there).
launch absent "$work/qint2_dear.json" "$work/absent.json"
for i in 0 1; do wait "${pids[$i]}" || { echo "rank $i failed:"; cat "$work/absent.rank$i.log"; exit 1; }; done
[ ! -e "$work/absent.json" ] || { echo "rank 1 timed kernels and wrote its latency cache"; exit 1; }

# A bad file on rank 0 only (its latency cache, which no other rank reads): rank 0 fails in the
# search, and rank 1, waiting for rank 0's table, fails within seconds naming rank 0 and its error.
echo '{not json' > "$work/bad.json"
start=$(date +%s)
launch bad "$work/bad.json" "$work/qint2_cheap.json"
for i in 0 1; do if wait "${pids[$i]}"; then echo "rank $i succeeded with a bad latency cache on rank 0"; exit 1; fi; done
grep -q "rank 0 stopped: stage 'search' failed: latency cache $work/bad.json is not valid JSON" "$work/bad.rank1.log" ||
  { echo "rank 1 did not name rank 0's error:"; cat "$work/bad.rank1.log"; exit 1; }
[ $(( $(date +%s) - start )) -lt 60 ] || { echo "rank 1 took too long to stop"; exit 1; }
echo "search over 2 ranks: rank 0's widths on both ranks; rank 0's failure named on rank 1"
