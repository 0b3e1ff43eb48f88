#!/usr/bin/python3
"""Token stream of the KJV verse dump, for language models.

Standard library only; run with Debian's /usr/bin/python3 (scripts/data/make_tokens.sh
does). Input: one verse per line, "<Book><chapter>:<verse> <text>", as printed by
`bible -f Gen1:1-Rev22:21`.

Tokens: lowercase runs of letters a-z (digits, punctuation and apostrophes separate
them); each verse ends with <eos>. Vocabulary: id 0 <eos>, id 1 <unk>, then the
VOCAB - 2 most frequent training words (ties alphabetical); other words map to <unk>.
Books are numbered in canonical order from 0 (a book starts where the reference's
book name changes); book i is validation data when i % 16 == 7, test data when
i % 16 == 15, training data otherwise. Each .tokens file starts with
"#orpheus-tokens vocabulary=V steps=T" and holds one verse of ids per line.

Outputs go to temporary names and are renamed into place, and nothing in them
depends on time or hashing order, so a rerun writes the same bytes.
"""

import argparse
import collections
import os
import re
import sys

EOS = "<eos>"
UNK = "<unk>"
REFERENCE = re.compile(r"^([0-9]?[A-Za-z]+)[0-9]+:[0-9]+ (.*)$")
WORD = re.compile(r"[a-z]+")
SPLITS = ("train", "valid", "test")


def split_of(book):
    if book % 16 == 7:
        return "valid"
    if book % 16 == 15:
        return "test"
    return "train"


def write_atomic(path, lines):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="verse dump, one verse per line")
    p.add_argument("--outdir", required=True)
    p.add_argument("--vocab", type=int, default=2000, help="vocabulary size, <eos> and <unk> included")
    p.add_argument("--steps", type=int, default=35, help="time steps per segment, recorded in the header")
    p.add_argument("--source", default="bible-kjv-text", help="source description for the README")
    args = p.parse_args()
    if args.vocab < 3:
        sys.exit("--vocab must be at least 3")
    if not 1 <= args.steps <= 1000:
        sys.exit("--steps must be between 1 and 1000")

    verses = {s: [] for s in SPLITS}
    books = {s: [] for s in SPLITS}
    book, name = -1, None
    with open(args.input, encoding="ascii") as f:
        for number, line in enumerate(f, 1):
            m = REFERENCE.match(line.rstrip("\n"))
            if not m:
                sys.exit(f"{args.input}:{number}: not a verse line")
            if m.group(1) != name:
                book, name = book + 1, m.group(1)
                books[split_of(book)].append(name)
            verses[split_of(book)].append(WORD.findall(m.group(2).lower()))

    counts = collections.Counter(w for verse in verses["train"] for w in verse)
    words = sorted(counts, key=lambda w: (-counts[w], w))[: args.vocab - 2]
    vocab = [EOS, UNK] + words
    ids = {w: i for i, w in enumerate(vocab)}
    os.makedirs(args.outdir, exist_ok=True)
    header = f"#orpheus-tokens vocabulary={len(vocab)} steps={args.steps}"
    summary = []
    for s in SPLITS:
        lines = [header]
        tokens = unknown = 0
        for verse in verses[s]:
            row = [ids.get(w, 1) for w in verse] + [0]
            tokens += len(row)
            unknown += row.count(1)
            lines.append(" ".join(map(str, row)))
        write_atomic(os.path.join(args.outdir, f"kjv.{s}.tokens"), lines)
        summary.append(f"{s} {tokens} tokens ({len(books[s])} books, {100.0 * unknown / max(tokens, 1):.1f}% <unk>)")
    write_atomic(os.path.join(args.outdir, "kjv.tokens.vocab"), vocab)
    readme = (f"KJV token stream from {args.source}\n"
              f"vocabulary {len(vocab)} (kjv.tokens.vocab, line i = id i), segments of {args.steps} steps\n"
              + "\n".join(summary) + "\n"
              + "\n".join(f"{s} books: {' '.join(books[s])}" for s in SPLITS))
    write_atomic(os.path.join(args.outdir, "README"), [readme])
    print(f"kjv tokens: vocabulary {len(vocab)}; " + "; ".join(summary))


if __name__ == "__main__":
    main()
