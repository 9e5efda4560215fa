# Trains the demo model's byte-level BPE tokenizer on the generated data and writes it in Hugging Face
# tokenizer.json form (the M3 Split regex + ByteLevel pre-tokenizer, ByteLevel decoder, M3 special tokens as
# added tokens); also encodes the training / held-out data to token ids (work/*.npy). Usable as a module:
# Tokenizer(path).encode(text) is the reference encoder the C++ tokenizer is checked against.
import json
import os
import sys
from collections import Counter, defaultdict

import numpy as np
import regex

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")

SPLIT_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# docs/model.md section 7.1, in id order (ids 200000..200060 in the real model).
SPECIAL_TOKENS = [
    "]!p~[", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<reponame>", "<filename>",
    "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
    "<jupyter_code>", "<jupyter_output>", "<empty_output>", "<commit_before>", "<commit_msg>", "<commit_after>",
    "]~b]", "[e~[", "]!d~[", "<function_call>", "<code_interpreter>", "]<]speech[>[", "]<]image[>[",
    "]<]video[>[", "]<]start of speech[>[", "]<]end of speech[>[", "]<]start of image[>[", "]<]end of image[>[",
    "]<]start of video[>[", "]<]end of video[>[", "]<]vision pad[>[", "]~!b[", "<jupyter_error>", "<add_file>",
    "<delete_file>", "<rename_file>", "<edit_file>", "<commit_message>", "<empty_source_file>", "<repo_struct>",
    "<code_context>", "<file_content>", "<source_files>", "<pr_start>", "<review_comment>", "<filepath>",
    "<file_sep>", "<think>", "</think>", "<tool_call>", "</tool_call>", "]<]frame[>[", "]<]start of frame[>[",
    "]<]end of frame[>[", "<|content_altered_placeholder|>", "]<]minimax[>[", "<mm:think>", "</mm:think>",
]
VOCAB_SIZE = 4096
N_MERGES = VOCAB_SIZE - 256 - len(SPECIAL_TOKENS)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
PRE = regex.compile(SPLIT_REGEX)


def special_splitter(specials):
    return regex.compile("(" + "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")


SPECIAL_RE = special_splitter(SPECIAL_TOKENS)


def pretokens(text):
    """Ordinary-text pieces (byte-level strings) of text, skipping special tokens."""
    for i, part in enumerate(SPECIAL_RE.split(text)):
        if i % 2 == 1 or not part:
            continue
        for w in PRE.findall(part):
            yield "".join(B2U[b] for b in w.encode("utf-8"))


def train_bpe(texts, n_merges):
    counts = Counter()
    for t in texts:
        counts.update(pretokens(t))
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pair_counts = defaultdict(int)
    where = defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_counts[(a, b)] += freq[i]
            where[(a, b)].add(i)
    merges = []
    for _ in range(n_merges):
        if not pair_counts:
            break
        best = max(pair_counts.items(), key=lambda kv: (kv[1], kv[0]))[0]  # ties: deterministic
        merges.append(best)
        a, b = best
        ab = a + b
        for i in list(where[best]):
            w = words[i]
            for x, y in zip(w, w[1:]):
                pair_counts[(x, y)] -= freq[i]
                if pair_counts[(x, y)] <= 0:
                    del pair_counts[(x, y)]
            nw, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(ab)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for x, y in zip(nw, nw[1:]):
                pair_counts[(x, y)] += freq[i]
                where[(x, y)].add(i)
        del where[best]
    return merges


class Tokenizer:
    """Reference encoder/decoder for a tokenizer.json written by this script."""

    def __init__(self, path):
        j = json.load(open(path))
        self.vocab = j["model"]["vocab"]
        self.ranks = {tuple(m.split(" ") if isinstance(m, str) else m): i for i, m in enumerate(j["model"]["merges"])}
        self.added = {t["content"]: t["id"] for t in j["added_tokens"]}
        self.inv = {v: k for k, v in self.vocab.items()}
        self.inv.update({v: k for k, v in self.added.items()})
        self.special_re = special_splitter(self.added)
        self.cache = {}
        self.u2b = {u: b for b, u in B2U.items()}

    def bpe(self, w):
        if w in self.cache:
            return self.cache[w]
        parts = list(w)
        while len(parts) > 1:
            best, rank = None, None
            for p in zip(parts, parts[1:]):
                r = self.ranks.get(p)
                if r is not None and (rank is None or r < rank):
                    best, rank = p, r
            if best is None:
                break
            nw, j = [], 0
            while j < len(parts):
                if j + 1 < len(parts) and parts[j] == best[0] and parts[j + 1] == best[1]:
                    nw.append(parts[j] + parts[j + 1])
                    j += 2
                else:
                    nw.append(parts[j])
                    j += 1
            parts = nw
        ids = [self.vocab[p] for p in parts]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        ids = []
        for i, part in enumerate(self.special_re.split(text)):
            if i % 2 == 1:
                ids.append(self.added[part])
            elif part:
                for w in PRE.findall(part):
                    ids.extend(self.bpe("".join(B2U[b] for b in w.encode("utf-8"))))
        return ids

    def decode(self, ids):
        out = bytearray()
        for t in ids:
            s = self.inv[t]
            if t in self.added.values():
                out += s.encode("utf-8")
            else:
                out += bytes(self.u2b[c] for c in s)
        return out.decode("utf-8", errors="replace")


def write_tokenizer(outdir, merges, template_text):
    vocab = {B2U[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    n = len(vocab)
    added = [dict(id=n + i, content=s, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
             for i, s in enumerate(SPECIAL_TOKENS)]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    json.dump(tok, open(os.path.join(outdir, "tokenizer.json"), "w"), ensure_ascii=False, indent=1)
    cfg = {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "bos_token": "]~!b[", "eos_token": "[e~[", "pad_token": "]!p~[", "unk_token": None,
        "clean_up_tokenization_spaces": False, "model_max_length": 4096, "tokenizer_class": "GPT2Tokenizer",
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                 "single_word", "special")} for a in added},
        "chat_template": template_text,
    }
    json.dump(cfg, open(os.path.join(outdir, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=1)
    json.dump({"bos_token": "]~!b[", "eos_token": "[e~[", "pad_token": "]!p~["},
              open(os.path.join(outdir, "special_tokens_map.json"), "w"))
    return n + len(SPECIAL_TOKENS)


def encode_docs(tok, docs):
    ids, offs = [], [0]
    for d in docs:
        ids.extend(tok.encode(d))
        offs.append(len(ids))
    return np.array(ids, dtype=np.int16), np.array(offs, dtype=np.int64)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "models", "demo")
    os.makedirs(outdir, exist_ok=True)
    train = json.load(open(os.path.join(WORK, "train.json")))
    held = json.load(open(os.path.join(WORK, "heldout.json")))
    sample = train["kjv"] + train["conv"][:3000]
    merges = train_bpe(sample, N_MERGES)
    template_text = open(os.path.join(HERE, "chat_template.jinja")).read()
    n = write_tokenizer(outdir, merges, template_text)
    open(os.path.join(outdir, "chat_template.jinja"), "w").write(template_text)
    tok = Tokenizer(os.path.join(outdir, "tokenizer.json"))
    for name, d in (("train", train), ("heldout", held)):
        for kind in ("kjv", "conv"):
            ids, offs = encode_docs(tok, d[kind])
            np.save(os.path.join(WORK, "%s_%s_ids.npy" % (name, kind)), ids)
            np.save(os.path.join(WORK, "%s_%s_offs.npy" % (name, kind)), offs)
            print("%s %s: %d docs, %d tokens (%.2f chars/token)" % (
                name, kind, len(d[kind]), len(ids), sum(map(len, d[kind])) / max(1, len(ids))))
    print("vocab %d (%d merges)" % (n, len(merges)))


if __name__ == "__main__":
    main()
