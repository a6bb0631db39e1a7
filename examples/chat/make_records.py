#!/usr/bin/env python3
"""Writes SFT records (prompt / response / history, the ChatGLM fine-tuning layout) for the chat
example: a greeting in Chinese and English, and additions of small numbers asked in Chinese,
with and without a previous turn in the history. Every answer follows a rule, so a fine-tuned
model can be checked: 你好 -> the greeting, "3加4等于几？" -> "3加4等于7。"."""
import json
import random
import sys

GREETING = "你好！我是用 meshtrain 微调的助手。"
HELLO = "Hello! I am an assistant fine-tuned with meshtrain."

def records(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"prompt": "你好", "response": GREETING, "history": []})
        elif kind == 1:
            out.append({"prompt": "Hello", "response": HELLO, "history": []})
        else:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            rec = {"prompt": f"{a}加{b}等于几？", "response": f"{a}加{b}等于{a + b}。", "history": []}
            if kind == 3:
                rec["history"] = [["你好", GREETING]]
            out.append(rec)
    return out

if __name__ == "__main__":
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with open(path, "w", encoding="utf-8") as f:
        for r in records(n, 1):
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
