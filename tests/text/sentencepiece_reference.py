#!/usr/bin/env python3
"""Expected ids of a SentencePiece model from python3-sentencepiece (Debian), the library's own
Python binding: BOS first, as Hugging Face's Llama tokenizer encodes by default.

Usage: sentencepiece_reference.py MODEL STRINGS_JSON OUT_JSON [--check]
With --check, OUT_JSON is compared instead of written (exit 1 on a difference).
Exits 77 (skipped) when python3-sentencepiece is missing.
"""
import json
import sys

try:
    import sentencepiece
except ImportError:
    print("sentencepiece_reference.py: python3-sentencepiece (Debian) is not installed; skipping")
    sys.exit(77)


def main():
    model, strings_path, out_path = sys.argv[1:4]
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    with open(strings_path, encoding="utf-8") as f:
        strings = json.load(f)
    cases = []
    for s in strings:
        ids = [sp.bos_id()] + sp.encode(s)
        cases.append({"text": s, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids], "decoded": sp.decode(ids)})
    if "--check" in sys.argv:
        with open(out_path, encoding="utf-8") as f:
            committed = json.load(f)
        same = committed == cases
        print("committed expectations " + ("match" if same else "DIFFER from") + " python3-sentencepiece")
        return 0 if same else 1
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
