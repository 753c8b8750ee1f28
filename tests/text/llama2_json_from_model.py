#!/usr/bin/env python3
"""Writes the Hugging Face tokenizer.json form of a SentencePiece BPE model, as transformers'
LlamaConverter builds Llama-2's: the pieces as the BPE vocabulary, merges for every split of a
piece into two pieces ordered by the merged piece's score, byte fallback, fused <unk>, the
Prepend / Replace normalizer and the Replace / ByteFallback / Fuse / Strip decoder, <s> added by
the template. Reads the model with python3-sentencepiece.

With --metaspace, the form transformers writes for legacy=False tokenizers: no normalizer and a
Metaspace pre-tokenizer that prefixes "▁" only at the start of the text.

Usage: llama2_json_from_model.py MODEL OUT_JSON [--metaspace]
"""
import json
import sys

import sentencepiece


def main():
    sp = sentencepiece.SentencePieceProcessor(model_file=sys.argv[1])
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scored = []
    for piece, pid in vocab.items():
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        splits.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        scored.extend((a, b, sp.get_score(pid)) for a, b in splits)
    scored.sort(key=lambda m: m[2], reverse=True)  # stable: ties keep the order above
    special = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for t in ("<unk>", "<s>", "</s>")]
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos,
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b, _ in scored]},
    }
    if "--metaspace" in sys.argv:
        tokenizer["normalizer"] = None
        tokenizer["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                      "split": False}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
