"""Write problems.jsonl: seeded arithmetic word problems, one JSON object a line ({messages, question, answer, op}).

`messages` is the chat the model sees: a system line, three worked examples in the short form we want
("5 + 3 = 8. The answer is 8."), then the question. SmolLM2-135M answers in that form and stops (about 19 tokens
at greedy), where with a bare instruction it explains at length and hits the token limit.

    python -m examples.word_problems.make_data [--seed 0] [--count 600]

The file shipped in the repo was written with the defaults; the same seed writes the same file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "coins", "stamps", "shells", "cards")


SYSTEM = "Answer each question with one short calculation and the answer."
SHOTS = (
    ("Mia has 5 pens. Leo gives Mia 3 more. How many pens does Mia have now?", "5 + 3 = 8. The answer is 8."),
    ("Sam had 20 cards and gave 6 of them to Ava. How many cards does Sam have left?",
     "20 - 6 = 14. The answer is 14."),
    ("Kim has 3 boxes with 4 toys in each box. How many toys is that in total?", "3 * 4 = 12. The answer is 12."),
)


def messages(question: str) -> list[dict[str, str]]:
    chat = [{"role": "system", "content": SYSTEM}]
    for q, a in SHOTS:
        chat += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return chat + [{"role": "user", "content": question}]


def problem(rng: random.Random) -> dict[str, object]:
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    op = rng.choice(("add", "sub", "mul", "add3"))
    if op == "add":
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        q, ans = f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?", a + b
    elif op == "sub":
        a = rng.randint(10, 60)
        b = rng.randint(1, a - 1)
        q, ans = f"{name} had {a} {item} and gave {b} of them to {other}. How many {item} does {name} have left?", a - b
    elif op == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        q, ans = f"{name} has {a} bags with {b} {item} in each bag. How many {item} is that in total?", a * b
    else:
        a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 20)
        q = (f"{name} found {a} {item} on Monday, {b} on Tuesday and {c} on Wednesday. How many {item} did {name} "
             "find in all?")
        ans = a + b + c
    return {"messages": messages(q), "question": q, "answer": str(ans), "op": op}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--out", default=str(Path(__file__).with_name("problems.jsonl")))
    ns = parser.parse_args()
    rng = random.Random(ns.seed)
    rows = [problem(rng) for _ in range(ns.count)]
    Path(ns.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} problems to {ns.out}")


if __name__ == "__main__":
    main()
