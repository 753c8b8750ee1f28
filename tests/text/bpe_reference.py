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


def flatten(section, key):
    if section is None:
        return []
    if section["type"] == "Sequence":
        return [s for part in section[key] for s in flatten(part, key)]
    return [section]


def byte_of(token):
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def decode_step(d, tokens):
    kind = d["type"]
    if kind == "ByteLevel":
        data = b"".join(bytes(CHAR_BYTE[c] for c in t) if all(c in CHAR_BYTE for c in t) else t.encode("utf-8")
                        for t in tokens)
        return [data.decode("utf-8", "replace")]
    if kind == "Replace":
        return [t.replace(d["pattern"]["String"], d["content"]) for t in tokens]
    if kind == "Metaspace":
        prefixed = d.get("prepend_scheme", "always" if d.get("add_prefix_space", True) else "never") != "never"
        return [t.replace(d["replacement"], "" if i == 0 and prefixed else " ") for i, t in enumerate(tokens)]
    if kind == "Fuse":
        return ["".join(tokens)]
    if kind == "Strip":
        out = []
        for t in tokens:
            start = 0
            while start < min(d["start"], len(t)) and t[start] == d["content"]:
                start += 1
            stop = len(t)
            while len(t) - stop < d["stop"] and stop > start and t[stop - 1] == d["content"]:
                stop -= 1
            out.append(t[start:stop])
        return out
    if kind == "ByteFallback":
        out, run = [], []
        def flush():
            if run:
                try:
                    out.append(bytes(run).decode("utf-8"))
                except UnicodeDecodeError:
                    out.append("\ufffd" * len(run))
                run.clear()
        for t in tokens:
            b = byte_of(t)
            if b is None:
                flush()
                out.append(t)
            else:
                run.append(b)
        flush()
        return out
    raise ValueError("unsupported decoder " + kind)


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
    if pre["type"] == "Metaspace":
        scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
        return [("metaspace", (pre["replacement"], pre.get("split", True)), scheme)]
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
        self.normalizers = flatten(tj.get("normalizer"), "normalizers")
        self.decoders = flatten(tj.get("decoder"), "decoders")
        self.byte_fallback = model.get("byte_fallback", False)
        self.unk = model.get("unk_token")
        self.fuse_unk = model.get("fuse_unk", False)
        self.steps = flatten_steps(tj.get("pre_tokenizer"))
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

    def normalize(self, text):
        for n in self.normalizers:
            if n["type"] in ("NFC", "NFD", "NFKC", "NFKD"):
                text = unicodedata.normalize(n["type"], text)
            elif n["type"] == "Prepend":
                text = n["prepend"] + text if text else text
            elif n["type"] == "Replace":
                text = text.replace(n["pattern"]["String"], n["content"])
            else:
                raise ValueError("unsupported normalizer " + n["type"])
        return text

    def symbols(self, piece):
        """Characters of the piece as vocabulary entries: byte fallback, then <unk>, else dropped.
        A pending <unk> is written when the next known character (or the end) comes, so byte
        tokens met meanwhile precede it, as in HF's BPE."""
        out, pending = [], None
        for ch in piece:
            if ch in self.vocab:
                if pending:
                    out.append(pending)
                    pending = None
                out.append(ch)
            elif self.byte_fallback and all(f"<0x{b:02X}>" in self.vocab for b in ch.encode("utf-8")):
                out.extend(f"<0x{b:02X}>" for b in ch.encode("utf-8"))
            elif self.unk is not None:
                if pending and not self.fuse_unk:
                    out.append(pending)
                pending = self.unk
        if pending:
            out.append(pending)
        return out

    def pre_tokenize(self, text, at_start):
        pieces = [text]
        for kind, pattern, prefix in self.steps:
            nxt = []
            for index, p in enumerate(pieces):
                if kind == "metaspace":
                    rep, split = pattern
                    p = p.replace(" ", rep)
                    if (prefix == "always" or (prefix == "first" and at_start and index == 0)) and not p.startswith(rep):
                        p = rep + p
                    if not split:
                        nxt.extend([p] if p else [])
                        continue
                    cuts = [i for i in range(1, len(p)) if p[i] == rep]  # a new piece before each replacement
                    nxt.extend(p[a:b] for a, b in zip([0] + cuts, cuts + [len(p)]) if b > a)
                    continue
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
        word = self.symbols(piece)
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
        return [self.vocab[s] for s in word]

    def encode(self, text, add_special=True):
        segments = self.split_added([(None, text)], False)
        segments = [(t, s if t is not None else self.normalize(s)) for t, s in segments]
        segments = self.split_added(segments, True)
        ids = list(self.prefix) if add_special else []
        for index, (tid, seg) in enumerate(segments):
            if tid is not None:
                ids.append(tid)
            elif seg:
                for piece in self.pre_tokenize(seg, index == 0):
                    ids.extend(self.bpe(piece))
        return ids + (self.suffix if add_special else [])

    def decode(self, ids, skip_special):
        added = {t["id"]: t for t in self.added}
        tokens = []
        for i in ids:
            if i in added:
                if not (skip_special and added[i]["special"]):
                    tokens.append(added[i]["content"])
            else:
                tokens.append(self.inverse[i])
        if not self.decoders:
            return " ".join(tokens)
        for d in self.decoders:
            tokens = decode_step(d, tokens)
        return "".join(tokens)


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
