"""Redaction precision/recall per kind on the labelled look-alike set, and how often random
order numbers and barcodes are taken for cards; prints a table, then one JSON line.

Side by side with the rule the project used before (any Luhn-valid 13-19-digit number starting
2-6 is a card), measured on the same numbers in the same run.

Usage: ``python bench/redaction_bench.py [--numbers N] [--seed S]``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _luhn_only(digits: str) -> bool:
    from infra.pii import luhn_valid

    return digits[0] in "23456" and len(set(digits)) > 1 and luhn_valid(digits)


def _ean13(body: str, check) -> str:
    return body + check(body)


def main(argv: list[str] | None = None) -> int:
    from infra.pii import redact
    from solutions.rag.redact import evaluate_redaction
    from solutions.rag.redaction_cases import CASES, ean13_digit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numbers", type=int, default=20000, help="random numbers per look-alike family")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    score = evaluate_redaction(CASES)
    positives = sum(1 for c in CASES if c.expected)
    print(f"labelled set: {len(CASES)} cases ({positives} with personal data, {len(CASES) - positives} look-alikes)")
    print(f"{'kind':<10} {'precision':>9} {'recall':>7} {'tp':>4} {'fp':>4} {'fn':>4}")
    for kind, row in score.per_kind.items():
        print(f"{kind:<10} {row['precision']:>9.3f} {row['recall']:>7.3f} {row['tp']:>4} {row['fp']:>4} {row['fn']:>4}")
    for text in score.misses:
        print(f"  mismatch: {text}")

    rng = random.Random(args.seed)
    families = {
        "order_18_digits": lambda: str(rng.randrange(10**17, 10**18)),
        "ean13_cn": lambda: _ean13(f"69{rng.randrange(10**10):010d}", ean13_digit),
        "number_16_digits": lambda: str(rng.randrange(10**15, 10**16)),
    }
    taken: dict[str, dict[str, float]] = {}
    for name, make in families.items():
        numbers = [make() for _ in range(args.numbers)]
        now = sum(1 for n in numbers if redact(f"no. {n} ok")[1].get("bank_card"))
        before = sum(1 for n in numbers if _luhn_only(n))
        taken[name] = {"now": now / len(numbers), "luhn_only": before / len(numbers)}
        print(f"{name:<17} taken for a card: now {now / len(numbers):.4f}, Luhn-only rule {before / len(numbers):.4f}")
    print(json.dumps({"bench": "redaction", "cases": len(CASES), "positives": positives,
                      "per_kind": {k: {m: round(v, 4) for m, v in row.items()} for k, row in score.per_kind.items()},
                      "random_numbers_taken_for_cards": taken, "numbers": args.numbers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
