#!/usr/bin/env python3
# Independent Python reference for Hugging Face byte-level BPE (used because the `tokenizers` package
# is not installed here): added tokens leftmost-longest, Split regex (Isolated) via the `regex`
# module, GPT-2 byte mapping, rank-ordered merges. It is checked against o200k tests.jsonl (ids from
# Hugging Face `tokenizers`) before writing expected ids for the tiny m3 tokenizer:
#   python3 reference_bpe.py check o200k/tokenizer.json o200k/tests.jsonl
#   python3 reference_bpe.py make m3-tiny/tokenizer.json corpus.jsonl > m3-tiny/expected.jsonl
import json
import sys

import regex


def byte_map():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Ref:
    def __init__(self, path):
        t = json.load(open(path, encoding="utf-8"))
        m = t["model"]
        self.vocab = m["vocab"]
        self.ranks = {}
        for i, mg in enumerate(m["merges"]):
            a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
            self.ranks.setdefault((a, b), i)
        self.added = {a["content"]: a["id"] for a in t["added_tokens"]}
        steps = t["pre_tokenizer"]["pretokenizers"]
        self.re = regex.compile(steps[0]["pattern"]["Regex"])
        self.bm = byte_map()

    def bpe(self, piece):
        syms = [self.bm[b] for b in piece.encode("utf-8")]
        while len(syms) > 1:
            best = None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        return [self.vocab[s] for s in syms]

    def plain(self, text):
        out = []
        pos = 0
        for m in self.re.finditer(text):
            if m.start() > pos:
                out += self.bpe(text[pos:m.start()])
            out += self.bpe(m.group(0))
            pos = m.end()
        if pos < len(text):
            out += self.bpe(text[pos:])
        return out

    def encode(self, text):
        out = []
        seg = 0
        i = 0
        while i < len(text):
            best = None
            for c in self.added:
                if text.startswith(c, i) and (best is None or len(c) > len(best)):
                    best = c
            if best is None:
                i += 1
                continue
            out += self.plain(text[seg:i])
            out.append(self.added[best])
            i += len(best)
            seg = i
        out += self.plain(text[seg:])
        return out


def main():
    mode, tok_path, data = sys.argv[1:4]
    ref = Ref(tok_path)
    if mode == "check":
        bad = 0
        for line in open(data, encoding="utf-8"):
            case = json.loads(line)
            if ref.encode(case["text"]) != case["ids"]:
                bad += 1
                print("mismatch:", repr(case["text"]), file=sys.stderr)
        print(f"{bad} mismatches", file=sys.stderr)
        sys.exit(1 if bad else 0)
    for line in open(data, encoding="utf-8"):
        text = json.loads(line)
        print(json.dumps({"text": text, "ids": ref.encode(text)}, ensure_ascii=False))


if __name__ == "__main__":
    main()
