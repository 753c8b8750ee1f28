#!/usr/bin/env bash
# qtrain under torchrun (2 ranks, c10d Gloo) on recipes/llama_mixed.yaml at 2 layers of hidden 64,
# from the float checkpoint of a one-process run (issue 33: the whole pipeline on a Llama):
#   - both ranks exit 0: the replica check after every stage (search, calibration, QAT, the numeric
#     suite, freeze) found the same model on both, quantization state included,
#   - the search's choice is the one-process run's (rank 0's measured table; a size budget only),
#   - the PTQ perplexity equals the one-process run's (weights quantized alike, the evaluation
#     summed over the ranks), within 1e-6 relative (the order of a floating-point sum),
#   - report.json records world_size 2, rank 1 writes nothing to its stderr (torchrun --redirects 2
#     captures each rank's stderr; qtrain sends a non-zero rank's stdout to /dev/null; --redirects 3
#     fails in torch 1.13's own parser under Python 3.11+), model.h5 loads in qgen.
# Exit 77 (skipped) without torchrun or python3 on PATH.
set -euo pipefail
QTRAIN=$1
QGEN=$2
ROOT=$3
command -v torchrun > /dev/null || { echo "torchrun not found (python3-torch): skipped"; exit 77; }
command -v python3 > /dev/null || { echo "python3 not found on PATH: skipped"; exit 77; }
cd "$ROOT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
tiny=(--set model.checkpoint="$work/fp32.h5" --set model.config.num_hidden_layers=2 --set model.config.hidden_size=64
      --set model.config.intermediate_size=128 --set model.config.num_attention_heads=4
      --set model.config.num_key_value_heads=2 --set data.seq_len=32 --set data.tokenizer.train.vocab_size=320
      --set data.max_train_examples=256 --set data.max_eval_examples=32 --set train.epochs=8
      --set train.warmup_steps=0 --set train.lr=0.01
      --set calibrate.batches=2 --set quantize.weights.group_size=32 --set search.group_size=32
      --set search.batches=1 --set search.probes=16 --set search.evaluate_front=1 --set search.latency_cache=off
      --set qat.max_steps=4)
recipe=recipes/llama_mixed.yaml
"$QTRAIN" --recipe $recipe --out "$work/one" "${tiny[@]}" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
       echo $((20000 + RANDOM % 20000)))
QFORGE_DIST_TIMEOUT_S=120 torchrun --no_python --redirects 2 --tee 2 --log_dir "$work/logs" --nproc_per_node 2 \
  --master_addr 127.0.0.1 --master_port "$port" "$QTRAIN" --recipe $recipe --out "$work/two" "${tiny[@]}" \
  > "$work/two.log" 2>&1 || { echo "torchrun failed:"; cat "$work/two.log"; exit 1; }
grep -q '"world_size": 2' "$work/two/report.json" || { echo "report.json lacks world_size 2"; exit 1; }
rank1=$(find "$work/logs" -path '*/1/stderr.log')
[ -n "$rank1" ] || { echo "no rank 1 stderr log under $work/logs"; find "$work/logs"; exit 1; }
[ ! -s "$rank1" ] || { echo "rank 1 printed to stderr:"; head "$rank1"; exit 1; }
searched() { grep -v '^#' "$work/$1/recipe.searched.yaml"; }
[ "$(searched one)" = "$(searched two)" ] ||
  { echo "the 2-rank search chose other widths:"; diff <(searched one) <(searched two) | head; exit 1; }
metric() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['metrics'][sys.argv[2]]['perplexity'])" "$@"; }
one_ptq=$(metric "$work/one/report.json" ptq)
two_ptq=$(metric "$work/two/report.json" ptq)
python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * b)" "$one_ptq" "$two_ptq" ||
  { echo "PTQ perplexity over 2 ranks $two_ptq, one process $one_ptq"; exit 1; }
for stage in qat frozen; do metric "$work/two/report.json" $stage > /dev/null ||
  { echo "no $stage perplexity over 2 ranks"; exit 1; }; done
printf 'the fortunes of a small llama\n' > "$work/text.txt"
"$QGEN" "$work/two" --perplexity "$work/text.txt" --window 16 > "$work/qgen.log" 2> "$work/qgen.err" ||
  { echo "qgen could not load the 2-rank run:"; cat "$work/qgen.err"; exit 1; }
grep -q '^qgen: perplexity ' "$work/qgen.log" || { echo "qgen printed no perplexity:"; cat "$work/qgen.log"; exit 1; }
echo "Llama over 2 ranks under torchrun: replicas agree after every stage, one process's search and PTQ perplexity ($two_ptq), model.h5 loads"
