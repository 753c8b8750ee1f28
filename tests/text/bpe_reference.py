#!/usr/bin/env python3
"""Independent reference of Hugging Face tokenizer.json byte-level BPE encoding and decoding.

Written from the tokenizers library's documented behaviour, sharing no code with qforge: added
tokens are split off first (leftmost-longest; non-normalized ones, then after the normalizer,
Python's unicodedata, the normalized ones), the
pre-tokenizer steps (ByteLevel, Split "Isolated", Sequence) cut the rest with Python's `regex`
module, and each piece is merged the way OpenAI's GPT-2 encoder.py does it (repeatedly merge
every occurrence of the lowest-ranked pair). Used to generate tests/fixtures/text/*_expected.json
and to re-check qforge's ids on a whole corpus (tests/text/CMakeLists.txt).

Usage:
  bpe_reference.py expected TOKENIZER_JSON STRINGS_JSON OUT_JSON   # ids of each string
  bpe_reference.py check TOKENIZER_JSON TEXT_FILE IDS_FILE          # qforge's ids, one line each
Exits 77 (skipped) when python3-regex is missing.
"""
import json
import sys
import unicodedata

try:
    import regex
except ImportError:
    print("bpe_reference.py: python3-regex (Debian) is not installed; skipping")
    sys.exit(77)

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the rest for 256, 257, ..."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def isolated(pattern, text):
    """Matches and the gaps between them, none empty."""
    out, last = [], 0
    for m in pattern.finditer(text):
        if m.start() == m.end():
            continue
        if m.start() > last:
            out.append(text[last:m.start()])
        out.append(m.group(0))
        last = m.end()
    if last < len(text):
        out.append(text[last:])
    return out


def flatten_steps(pre):
    if pre is None:
        return []
    if pre["type"] == "Sequence":
        return [s for p in pre["pretokenizers"] for s in flatten_steps(p)]
    if pre["type"] == "ByteLevel":
        use = pre.get("use_regex", True)
        return [("bytelevel", regex.compile(GPT2_PATTERN) if use else None, pre.get("add_prefix_space", True))]
    if pre["type"] == "Split":
        assert pre["behavior"] == "Isolated" and not pre.get("invert", False)
        pat = pre["pattern"]
        compiled = regex.compile(pat["Regex"]) if "Regex" in pat else regex.compile(regex.escape(pat["String"]))
        return [("split", compiled, False)]
    raise ValueError("unsupported pre-tokenizer " + pre["type"])


class Reference:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        self.vocab = model["vocab"]
        self.inverse = {i: t for t, i in self.vocab.items()}
        self.ranks = {}
        for rank, m in enumerate(model["merges"]):
            pair = tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
            self.ranks[pair] = rank
        self.ignore_merges = model.get("ignore_merges", False)
        self.added = tj.get("added_tokens") or []
        norm = tj.get("normalizer")
        assert norm is None or norm["type"] in ("NFC", "NFD", "NFKC", "NFKD")
        self.form = norm["type"] if norm else None
        self.steps = flatten_steps(tj.get("pre_tokenizer"))
        self.byte_level = any(kind == "bytelevel" for kind, _, _ in self.steps)
        self.prefix, self.suffix = [], []
        self._template(tj.get("post_processor"))

    def _template(self, post):
        if post is None:
            return
        if post["type"] == "Sequence":
            for p in post["processors"]:
                self._template(p)
        elif post["type"] == "TemplateProcessing":
            target = self.prefix
            for item in post["single"]:
                if "Sequence" in item:
                    target = self.suffix
                else:
                    target.extend(post["special_tokens"][item["SpecialToken"]["id"]]["ids"])

    def split_added(self, segments, normalized):
        tokens = sorted((t for t in self.added if t.get("normalized", not t["special"]) == normalized),
                        key=lambda t: -len(t["content"]))
        out = []
        for seg in segments:
            if seg[0] is not None:
                out.append(seg)
                continue
            text, i, start = seg[1], 0, 0
            while i < len(text):
                hit = next((t for t in tokens if text.startswith(t["content"], i)), None)
                if hit is None:
                    i += 1
                    continue
                if i > start:
                    out.append((None, text[start:i]))
                out.append((hit["id"], hit["content"]))
                i += len(hit["content"])
                start = i
            if start < len(text):
                out.append((None, text[start:]))
        return out

    def pre_tokenize(self, text):
        pieces = [text]
        for kind, pattern, prefix in self.steps:
            nxt = []
            for p in pieces:
                if prefix and not p.startswith(" "):
                    p = " " + p
                nxt.extend(isolated(pattern, p) if pattern is not None else [p])
            if kind == "bytelevel":
                nxt = ["".join(BYTE_CHAR[b] for b in p.encode("utf-8")) for p in nxt]
            pieces = nxt
        return pieces

    def bpe(self, piece):
        if self.ignore_merges and piece in self.vocab:
            return [self.vocab[piece]]
        word = list(piece)
        while len(word) > 1:
            pairs = [(word[i], word[i + 1]) for i in range(len(word) - 1)]
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return [self.vocab[s] for s in word if s in self.vocab]

    def encode(self, text, add_special=True):
        segments = self.split_added([(None, text)], False)
        if self.form:
            segments = [(t, s if t is not None else unicodedata.normalize(self.form, s)) for t, s in segments]
        segments = self.split_added(segments, True)
        ids = list(self.prefix) if add_special else []
        for tid, seg in segments:
            if tid is not None:
                ids.append(tid)
            else:
                for piece in self.pre_tokenize(seg):
                    ids.extend(self.bpe(piece))
        return ids + (self.suffix if add_special else [])

    def decode(self, ids, skip_special):
        added = {t["id"]: t for t in self.added}
        data = b""
        for i in ids:
            if i in added:
                if skip_special and added[i]["special"]:
                    continue
                tok = added[i]["content"]
            else:
                tok = self.inverse[i]
            if self.byte_level and all(c in CHAR_BYTE for c in tok):
                data += bytes(CHAR_BYTE[c] for c in tok)
            else:
                data += tok.encode("utf-8")
        return data.decode("utf-8", "replace")


def main():
    mode, tokenizer = sys.argv[1], Reference(sys.argv[2])
    if mode == "expected":
        with open(sys.argv[3], encoding="utf-8") as f:
            strings = json.load(f)
        cases = []
        for s in strings:
            ids = tokenizer.encode(s)
            cases.append({"text": s, "ids": ids, "decoded": tokenizer.decode(ids, False),
                          "decoded_skip_special": tokenizer.decode(ids, True)})
        with open(sys.argv[4], "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return 0
    with open(sys.argv[3], encoding="utf-8") as f:
        lines = f.read().split("\n")
    with open(sys.argv[4], encoding="utf-8") as f:
        got = [[int(x) for x in line.split()] for line in f.read().split("\n")[: len(lines)]]
    bad = [(n, line) for n, line in enumerate(lines) if tokenizer.encode(line, False) != got[n]]
    for n, line in bad[:5]:
        print(f"line {n + 1}: {line!r}\n  reference {tokenizer.encode(line, False)}\n  qforge    {got[n]}")
    print(f"{len(lines) - len(bad)} of {len(lines)} lines tokenized as the reference does")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
