#!/usr/bin/env python3
"""Writes tests/models/fixtures/qgen_tiny_llama: an HF folder qgen loads (config.json, BF16
model.safetensors with random weights, tokenizer.json: the committed GPT-2-style test tokenizer,
vocabulary 800 with <|endoftext|> 799) and expected_greedy.json: the prompt, its ids (from the
tokenizer fixture's expected encodings) and the 8 ids greedy decoding gives after it, computed by
llama_reference.py's float forward (no KV cache, full sequence each step), and the perplexity of the
prompt's ids over the windows of Hugging Face's "Perplexity of fixed-length models" guide
(llama_reference.guide_perplexity, docs/llm.md "Perplexity") for the windows qgen_test passes to
`qgen --perplexity` (a file holding the prompt's text).

    /usr/bin/python3 tests/models/make_qgen_fixture.py [--check]
"""
import argparse
import json
import os
import shutil
import sys

try:
    import torch
except ImportError:
    print("python3-torch is not installed: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_reference as ref  # noqa: E402

FOLDER = os.path.join(HERE, "fixtures", "qgen_tiny_llama")
TOKENIZER = os.path.join(HERE, "..", "fixtures", "text", "gpt2_bpe.json")
EXPECTED = os.path.join(HERE, "..", "fixtures", "text", "gpt2_bpe_expected.json")
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 800, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "bos_token_id": 799, "eos_token_id": 799, "hidden_act": "silu"}
NEW_TOKENS = 8
WINDOWS = [(8, 4), (16, 16)]  # (max_length, stride) runs of qgen --perplexity in qgen_test


def greedy(c, w, ids):
    out = list(ids)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = ref.forward(c, w, torch.tensor([out]))
            out.append(int(logits[0, -1].argmax()))
    return out[len(ids):]


def perplexity(c, w, ids, max_length, stride):
    # llama_reference.py's oracle: the guide's -100 labels and CrossEntropyLoss, not qforge's loop.
    with torch.no_grad():
        ppl, scored = ref.guide_perplexity(c, w, torch.tensor([ids]), max_length, stride)
    return {"max_length": max_length, "stride": stride, "tokens_scored": scored, "perplexity": ppl}


def expected(c, w):
    with open(EXPECTED) as f:
        case = json.load(f)[1]  # "Hello, World! HELLO world."
    return {"prompt": case["text"], "prompt_ids": case["ids"], "greedy_ids": greedy(c, w, case["ids"]),
            "perplexity": [perplexity(c, w, case["ids"], m, s) for m, s in WINDOWS]}


def same(stored, want):
    # Ids exactly; perplexities within 1e-4 relative, as qgen_test holds qgen's: a float32 forward of
    # a random model (about 19 nats a token) differs in its last bits between machines.
    close = len(stored.get("perplexity", [])) == len(want["perplexity"]) and all(
        {k: a[k] for k in a if k != "perplexity"} == {k: b[k] for k in b if k != "perplexity"}
        and abs(a["perplexity"] - b["perplexity"]) <= 1e-4 * b["perplexity"]
        for a, b in zip(stored["perplexity"], want["perplexity"]))
    return close and {k: v for k, v in stored.items() if k != "perplexity"} == {
        k: v for k, v in want.items() if k != "perplexity"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="recompute expected_greedy.json from the committed weights")
    args = ap.parse_args()
    torch.set_num_threads(1)
    c = ref.resolve_config(CONFIG)
    if args.check:
        w = {k: v.float() for k, v in ref.read_folder_weights(FOLDER).items()}
        with open(os.path.join(FOLDER, "expected_greedy.json")) as f:
            reproduced = same(json.load(f), expected(c, w))
        print("expected_greedy.json:", "reproduced" if reproduced else "DIFFERS")
        return 0 if reproduced else 1
    os.makedirs(FOLDER, exist_ok=True)
    with open(os.path.join(FOLDER, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    shutil.copyfile(TOKENIZER, os.path.join(FOLDER, "tokenizer.json"))
    gen = torch.Generator().manual_seed(2033)
    stored = {k: v.to(torch.bfloat16) for k, v in ref.random_weights(c, gen).items()}
    ref.write_weights(FOLDER, stored, 1)
    w = {k: v.float() for k, v in stored.items()}
    with open(os.path.join(FOLDER, "expected_greedy.json"), "w") as f:
        json.dump(expected(c, w), f, indent=2)
    print("wrote", FOLDER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
