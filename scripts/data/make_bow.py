#!/usr/bin/python3
"""Bag-of-words corpus in LIBSVM format from the KJV verse dump.

Standard library only; run with Debian's /usr/bin/python3 (scripts/data/make_corpus.sh
does). Input: one verse per line, "<Book><chapter>:<verse> <text>", as printed by
`bible -f Gen1:1-Rev22:21` from Debian's bible-kjv / bible-kjv-text packages, e.g.
    Ge1:1 In the beginning God created the heaven and the earth.
    1Chr10:3 And the battle went sore against Saul, ...

Documents: each chapter is cut into ceil(n/BLOCK) blocks of consecutive verses of
near-equal size (BLOCK = 10 by default), so a 31-verse chapter gives blocks of
8, 8, 8 and 7 verses and a 6-verse psalm stays whole; no block crosses a chapter.
Documents are numbered in canonical order (Genesis 1:1 first); document i is
held out for the test set when i % TEST_EVERY == TEST_EVERY - 1 (every 10th).

Processing: lowercase; the leading verse reference is removed; tokens are maximal
runs of letters a-z (digits, punctuation and apostrophes separate tokens, so
"LORD's" gives "lord" and "s"); tokens shorter than 3 letters and stopwords are
dropped. The vocabulary is the VOCAB most frequent remaining words (by count over
the training documents; ties broken alphabetically) among the words appearing in
at least MIN_DF training documents; test documents never influence it. Feature
index i is line i (0-based) of kjv.vocab, so index 0 is the most frequent word.
Each document becomes "0 idx:val ..." with strictly increasing indices and
val = count / (in-vocabulary tokens of the document), i.e. term frequencies that
sum to 1; documents with fewer than MIN_TOKENS in-vocabulary tokens are dropped.

Outputs go to temporary names and are renamed into place, and nothing in them
depends on time or hashing order, so a rerun writes the same bytes.
"""

import argparse
import collections
import os
import re
import sys

# A standard English stopword list (the usual function words: articles, pronouns,
# auxiliaries, prepositions, conjunctions, common adverbs), 150 words.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been
before being below between both but by can could did do does doing down during
each few for from further had has have having he her here hers herself him
himself his how i if in into is it its itself just me more most my myself no nor
not now of off on once only or other ought our ours ourselves out over own same
she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when
where which while who whom why will with would you your yours yourself
yourselves also upon shall may might must let every yet unto either neither
whether among whose many much else ever another thus therefore within
""".split())

# Early-modern English function words that the standard list misses and that
# would otherwise fill the top of a KJV vocabulary ("thou", "thee", "hath", ...).
# On by default; --no-archaic-stopwords keeps them.
ARCHAIC_STOPWORDS = frozenset("""
thee thou thy thine ye hath hast hadst doth dost didst art wast wert shalt wilt
canst couldest wouldest shouldest mayest saith thereof therein thereon thereto
therewith wherefore whereof wherein whereby whereon whither hither thither thence
hence yea nay
""".split())

REF = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+)\s+(.*)$")
WORD = re.compile(r"[a-z]+")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default="-", help="verse dump (default: stdin)")
    p.add_argument("--outdir", required=True)
    p.add_argument("--vocab", type=int, default=2000, help="vocabulary size V (default 2000)")
    p.add_argument("--block", type=int, default=10, help="verses per document, at most (default 10)")
    p.add_argument("--min-df", type=int, default=5, help="min training documents per word (default 5)")
    p.add_argument("--min-tokens", type=int, default=5, help="drop shorter documents (default 5)")
    p.add_argument("--test-every", type=int, default=10, help="every Nth document is test (default 10)")
    p.add_argument("--no-archaic-stopwords", action="store_true")
    p.add_argument("--source", default="bible-kjv-text", help="source description for the README")
    a = p.parse_args(argv)
    for name in ("vocab", "block", "min_df", "min_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.test_every < 2:
        p.error("--test-every must be at least 2")
    return a


def read_chapters(stream):
    """Returns [(book, chapter, [(verse, text), ...]), ...] in input order."""
    chapters = []
    for lineno, line in enumerate(stream, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        m = REF.match(line)
        if not m:
            sys.exit(f"make_bow.py: line {lineno}: not a '<Book><ch>:<verse> text' line: {line[:60]!r}")
        book, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if not chapters or chapters[-1][0] != book or chapters[-1][1] != ch:
            chapters.append((book, ch, []))
        chapters[-1][2].append((vs, text))
    if not chapters:
        sys.exit("make_bow.py: the input holds no verses")
    return chapters


def make_documents(chapters, block):
    """Cuts each chapter into ceil(n/block) near-equal runs of verses: [(ref, text)]."""
    docs = []
    for book, ch, verses in chapters:
        n = len(verses)
        k = -(-n // block)
        base, extra = divmod(n, k)
        start = 0
        for j in range(k):
            size = base + (1 if j < extra else 0)
            part = verses[start:start + size]
            start += size
            ref = f"{book}{ch}:{part[0][0]}-{part[-1][0]}"
            docs.append((ref, " ".join(text for _, text in part)))
    return docs


def tokenize(text, stop):
    return [w for w in WORD.findall(text.lower()) if len(w) >= 3 and w not in stop]


def write_atomic(path, lines):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.writelines(lines)
    os.replace(tmp, path)


def main(argv):
    a = parse_args(argv)
    stop = STOPWORDS if a.no_archaic_stopwords else STOPWORDS | ARCHAIC_STOPWORDS

    if a.input == "-":
        chapters = read_chapters(sys.stdin)
    else:
        with open(a.input, encoding="utf-8") as f:
            chapters = read_chapters(f)
    nverses = sum(len(v) for _, _, v in chapters)
    docs = make_documents(chapters, a.block)
    tokens = [tokenize(text, stop) for _, text in docs]
    is_test = [i % a.test_every == a.test_every - 1 for i in range(len(docs))]

    # Vocabulary from the training documents only.
    tf = collections.Counter()
    df = collections.Counter()
    for toks, test in zip(tokens, is_test):
        if not test:
            tf.update(toks)
            df.update(set(toks))
    eligible = [w for w in tf if df[w] >= a.min_df]
    eligible.sort(key=lambda w: (-tf[w], w))
    vocab = eligible[:a.vocab]
    index = {w: i for i, w in enumerate(vocab)}

    out = {False: [], True: []}
    ids = {False: [], True: []}
    kept_tokens = 0
    dropped = 0
    for (ref, _), toks, test in zip(docs, tokens, is_test):
        counts = collections.Counter(index[w] for w in toks if w in index)
        total = sum(counts.values())
        if total < a.min_tokens:
            dropped += 1
            continue
        kept_tokens += total
        feats = " ".join(f"{i}:{c / total:.6g}" for i, c in sorted(counts.items()))
        out[test].append(f"0 {feats}\n")
        ids[test].append(f"{ref}\n")

    ntrain, ntest = len(out[False]), len(out[True])
    if ntrain == 0:
        sys.exit("make_bow.py: no training document survived the filters")
    avg = kept_tokens / (ntrain + ntest)

    os.makedirs(a.outdir, exist_ok=True)
    p = lambda name: os.path.join(a.outdir, name)
    write_atomic(p("kjv.train.libsvm"), out[False])
    write_atomic(p("kjv.test.libsvm"), out[True])
    write_atomic(p("kjv.train.ids"), ids[False])
    write_atomic(p("kjv.test.ids"), ids[True])
    write_atomic(p("kjv.vocab"), [f"{w}\n" for w in vocab])

    readme = f"""KJV bag-of-words corpus (LIBSVM format) for topic models
=========================================================

Made by scripts/data/make_corpus.sh (helper scripts/data/make_bow.py).

Source: {a.source}.

  The text is the King James Version as packaged by Debian: bible-kjv-text ships
  it compressed (/usr/lib/bible.data); the `bible` reader from bible-kjv dumps it
  one verse per line ("Ge1:1 In the beginning ...").
  {nverses} verses in {len(chapters)} chapters.

Documents: runs of consecutive verses within one chapter. A chapter of n verses is
  cut into ceil(n/{a.block}) runs of near-equal size (at most {a.block} verses each),
  giving {len(docs)} documents. Document i (0-based, canonical order) is a test
  document when i % {a.test_every} == {a.test_every - 1} (every {a.test_every}th); the rest are
  training documents. Documents with fewer than {a.min_tokens} in-vocabulary tokens are
  dropped ({dropped} dropped).

Processing: lowercase; verse references removed; tokens are runs of letters a-z
  (digits, punctuation and apostrophes split tokens); words shorter than 3 letters
  and stopwords removed (a standard English list of {len(STOPWORDS)} words{
  "" if a.no_archaic_stopwords else f" plus {len(ARCHAIC_STOPWORDS)} archaic function words such as thee, thou, hath"}).
  Vocabulary: the {len(vocab)} most frequent remaining words (by count in the training
  documents, ties alphabetical) among those found in at least {a.min_df} training
  documents. Test documents do not influence the vocabulary.

Files:
  kjv.train.libsvm  {ntrain} training documents, one per line
  kjv.test.libsvm   {ntest} held-out documents
  kjv.vocab         {len(vocab)} words; line i (0-based) is feature index i, most
                    frequent first (so index 0 occurs in most documents)
  kjv.train.ids, kjv.test.ids
                    the verse range of each line of the matching .libsvm file

Format: "0 idx:val idx:val ...". The label is 0 for every document (topic models
  are unsupervised). Indices are 0-based, in [0, {len(vocab)}), strictly increasing.
  Values are term frequencies: the word's count in the document divided by the
  document's number of in-vocabulary tokens, so each line's values sum to 1
  (printed with 6 significant digits).

Counts: {ntrain} train + {ntest} test documents, vocabulary {len(vocab)},
  {avg:.1f} in-vocabulary tokens per document on average ({kept_tokens} in all).
"""
    write_atomic(p("README"), [readme])
    print(f"kjv corpus: {ntrain} train / {ntest} test documents, vocabulary {len(vocab)}, "
          f"{avg:.1f} tokens per document on average -> {a.outdir}")


if __name__ == "__main__":
    main(sys.argv[1:])
