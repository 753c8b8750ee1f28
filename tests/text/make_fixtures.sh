#!/bin/sh
# Regenerates tests/fixtures/text/: three byte-level BPE tokenizer.json files trained by qforge's
# trainer (GPT-2's layout and regex; Llama-3's Split + ByteLevel layout, regex, ignore_merges, BOS
# template and [a, b] merges; Qwen2's regex, NFC normalizer and chat special tokens) and a SentencePiece model trained by Debian's spm_train with
# Llama-2's options (BPE, byte fallback, split digits) and its tokenizer.json form, all on Debian
# text (fortunes, word lists);
# then the expected ids of hard_strings.json from the independent references (bpe_reference.py,
# python3-sentencepiece). Usage: tests/text/make_fixtures.sh build/tests/text/text_tool
set -eu
tool=$1
cd "$(dirname "$0")/../.."
out=tests/fixtures/text
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fortunes=/usr/share/games/fortunes
# Word lists give the vocabulary accented Latin letters (UTF-8 multi-byte merges).
head -n 4000 /usr/share/dict/french > "$tmp/french"
head -n 4000 /usr/share/dict/ngerman > "$tmp/ngerman"
corpus="$fortunes/fortunes $fortunes/computers $fortunes/science $tmp/french $tmp/ngerman"

"$tool" train $out/gpt2_bpe.json 800 gpt2 --special '<|endoftext|>' $corpus
"$tool" train $out/llama3_bpe.json 800 llama3 --special '<|begin_of_text|>' --special '<|end_of_text|>' \
  --bos '<|begin_of_text|>' --ignore-merges --pair-merges $corpus
"$tool" train $out/qwen2_bpe.json 800 qwen2 --special '<|endoftext|>' --special '<|im_start|>' \
  --special '<|im_end|>' --nfc $corpus

cat "$tmp/french" "$tmp/ngerman" > "$tmp/words"
head -n 4000 /usr/share/dict/american-english >> "$tmp/words"
# Relative paths: the model records its input and prefix, and the file should not change per run.
(cd "$tmp" && spm_train --input=words --model_prefix=sp --vocab_size=600 --model_type=bpe \
  --byte_fallback=true --split_digits=true --character_coverage=0.9995 --normalization_rule_name=identity \
  --remove_extra_whitespaces=false --allow_whitespace_only_pieces=true --unk_id=0 --bos_id=1 --eos_id=2 \
  --num_threads=1 --minloglevel=1)
cp "$tmp/sp.model" $out/sentencepiece_bpe.model
# The same model in Llama-2's tokenizer.json form (transformers' LlamaConverter rules).
/usr/bin/python3 tests/text/llama2_json_from_model.py $out/sentencepiece_bpe.model $out/llama2_bpe.json
/usr/bin/python3 tests/text/llama2_json_from_model.py $out/sentencepiece_bpe.model $out/llama2_metaspace.json --metaspace

for name in gpt2_bpe llama3_bpe qwen2_bpe llama2_bpe llama2_metaspace; do
  /usr/bin/python3 tests/text/bpe_reference.py expected $out/$name.json $out/hard_strings.json $out/${name}_expected.json
done
/usr/bin/python3 tests/text/sentencepiece_reference.py $out/sentencepiece_bpe.model $out/hard_strings.json \
  $out/sentencepiece_bpe_expected.json
ls -l $out
