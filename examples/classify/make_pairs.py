#!/usr/bin/env python3
"""Sentence pairs from real text for the classification example, in AFQMC's layout
({"id", "sentence1", "sentence2", "label"}): sentence1 asks "Is this about <file>?" of sentence2,
a quote from Debian's `fortunes` files on that topic (computers: computers, linux, perl;
politics: politics, law; science: science, medicine); the label is "1" when the quote comes
from the topic asked about, "0" when not, half and half: a rule anyone can check,
which a model meets only by reading the quote (the question first: a causal model reads the
quote knowing what it is asked). Every fifth quote of each file is held
out: the validation pairs use only those, so validation measures quotes the model never saw.

  make_pairs.py OUTDIR [TRAIN_PAIRS] [DEV_PAIRS]   -> OUTDIR/train.jsonl, OUTDIR/dev.jsonl, OUTDIR/corpus.txt
"""
import json
import os
import random
import sys

# The topic a question names, and the fortunes files its quotes come from.
FILES = {"computers": ("computers", "linux", "perl"), "politics": ("politics", "law"),
         "science": ("science", "medicine")}
TOPICS = tuple(FILES)
ROOT = "/usr/share/games/fortunes"


def quotes(name):
    with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
        parts = f.read().split("\n%\n")
    out = []
    for p in parts:
        q = " ".join(p.replace("%", " ").split())
        if 20 <= len(q) <= 400:
            out.append(q)
    return out


def pairs(pool, n, rng, start):
    """Half the pairs ask about the quote's own file ("1"), half about one of the other two ("0")."""
    recs = []
    for i in range(n):
        t = rng.choice(TOPICS)
        q = rng.choice(pool[t])
        asked = t if i % 2 == 0 else rng.choice([x for x in TOPICS if x != t])
        recs.append({"id": start + i, "sentence1": f"Is this about {asked}?", "sentence2": q,
                     "label": "1" if asked == t else "0"})
    rng.shuffle(recs)
    return recs


def main():
    out = sys.argv[1]
    n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 12000
    n_dev = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    os.makedirs(out, exist_ok=True)
    train, dev = {}, {}
    for t in TOPICS:
        q = [x for name in FILES[t] for x in quotes(name)]
        dev[t] = q[::5]
        train[t] = [x for i, x in enumerate(q) if i % 5]
    rng = random.Random(7)
    for name, pool, n, start in (("train", train, n_train, 0), ("dev", dev, n_dev, n_train)):
        with open(os.path.join(out, name + ".jsonl"), "w", encoding="utf-8") as f:
            for r in pairs(pool, n, rng, start):
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    # The pretraining corpus: every fortunes file's quotes but the held-out ones.
    held = {q for t in TOPICS for q in dev[t]}
    names = sorted(n for n in os.listdir(ROOT) if not n.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(ROOT, n)))
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
        for name in names:
            for q in quotes(name):
                if q not in held:
                    f.write(q + "\n\n")
    print(f"{n_train} training and {n_dev} validation pairs from "
          + ", ".join(f"{t} ({len(train[t])} + {len(dev[t])} held out)" for t in TOPICS))


if __name__ == "__main__":
    main()
