#!/usr/bin/python3
"""Sparse text classification set in LIBSVM format from the KJV verse dump.

Standard library only for the LIBSVM files; --hdf5 also writes the same matrices as
HDF5 CSR files and needs numpy and h5py (scripts/data/make_verses.sh installs them).
Input: one verse per line, "<Book><chapter>:<verse> <text>", as printed by
`bible -f Gen1:1-Rev22:21` from Debian's bible-kjv / bible-kjv-text packages.

Examples: each chapter is cut into ceil(n/BLOCK) runs of consecutive verses of
near-equal size (make_bow.py's blocks: no example crosses a chapter); BLOCK = 1
makes every verse an example. Example i (canonical order) is held out for the
test set when i % TEST_EVERY == TEST_EVERY - 1.

Labels: --labels sections (default) gives 6 sections of the canon: law (5
books), history (12), wisdom and poetry (5), prophets (17: the major and minor
prophets, which a linear model confuses when apart), gospels and Acts (5), letters
and Revelation (22); --labels books gives the 66 books. Class names are listed in
verses.classes.

Features: lowercase; tokens are runs of letters a-z; no stopwords are removed
(function words such as "thee" and "unto" mark style). Features are the words and,
with --ngrams 2, the pairs of adjacent words within a verse, that appear in at
least MIN_DF training examples (test examples never influence the vocabulary).
Values are sublinear tf-idf, (1 + ln count) * (ln((1 + n) / (1 + df)) + 1) with n
and df counted over the training examples, and each row is scaled to unit L2 norm
(printed with 6 significant digits). Indices are 0-based, in order of decreasing
training document frequency (ties alphabetical), strictly increasing on a line.

Outputs go to temporary names and are renamed into place, and nothing in them
depends on time or hashing order, so a rerun writes the same bytes.
"""

import argparse
import collections
import math
import os
import re
import sys

from make_bow import make_documents, read_chapters, write_atomic

# The canon in order, by the `bible` program's abbreviations, grouped into the
# traditional sections.
SECTIONS = [
    ("law", "Ge Exo Lev Num Deu"),
    ("history", "Josh Jdgs Ruth 1Sm 2Sm 1Ki 2Ki 1Chr 2Chr Ezra Neh Est"),
    ("wisdom", "Job Psa Prv Eccl SSol"),
    ("prophets", "Isa Jer Lam Eze Dan Hos Joel Amos Obad Jonah Mic Nahum Hab Zep Hag Zec Mal"),
    ("gospels-acts", "Mat Mark Luke John Acts"),
    ("letters-revelation",
     "Rom 1Cor 2Cor Gal Eph Phi Col 1Th 2Th 1Tim 2Tim Titus Phmn Heb Jas 1Pet 2Pet 1Jn 2Jn 3Jn Jude Rev"),
]
BOOKS = [b for _, books in SECTIONS for b in books.split()]
SECTION_OF = {b: i for i, (_, books) in enumerate(SECTIONS) for b in books.split()}
WORD = re.compile(r"[a-z]+")
VERSE_REF = re.compile(r"^([1-3]?[A-Za-z]+)\d+:")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default="-", help="verse dump (default: stdin)")
    p.add_argument("--outdir", required=True)
    p.add_argument("--block", type=int, default=3, help="verses per example, at most (default 3)")
    p.add_argument("--labels", choices=("sections", "books"), default="sections")
    p.add_argument("--ngrams", type=int, choices=(1, 2), default=2, help="words (1) or words and pairs (2, default)")
    p.add_argument("--min-df", type=int, default=2, help="min training examples per feature (default 2)")
    p.add_argument("--test-every", type=int, default=10, help="every Nth example is test (default 10)")
    p.add_argument("--hdf5", action="store_true", help="also write verses.{train,test}.h5 (CSR; numpy, h5py)")
    p.add_argument("--source", default="bible-kjv-text", help="source description for the README")
    a = p.parse_args(argv)
    if a.block < 1 or a.min_df < 1:
        p.error("--block and --min-df must be at least 1")
    if a.test_every < 2:
        p.error("--test-every must be at least 2")
    return a


def features_of(text, ngrams):
    """Counts of the example's words and (ngrams == 2) adjacent word pairs; verses
    are joined by make_documents with a space, so pairs may span two verses."""
    words = WORD.findall(text.lower())
    counts = collections.Counter(words)
    if ngrams == 2:
        counts.update(f"{a} {b}" for a, b in zip(words, words[1:]))
    return counts


def write_hdf5(path, rows, labels, width):
    """The rows (lists of (index, value-as-printed)) as a CSR group X plus y, as h5py
    writes a scipy.sparse.csr_matrix; the values are the printed ones, so the file
    holds exactly what the LIBSVM file does."""
    import h5py
    import numpy as np
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    indices = np.fromiter((i for r in rows for i, _ in r), dtype=np.int32, count=int(indptr[-1]))
    data = np.array([float(v) for r in rows for _, v in r], dtype=np.float32)
    tmp = f"{path}.tmp.{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        g = f.create_group("X")
        g["data"], g["indices"], g["indptr"] = data, indices, indptr
        g.attrs["shape"] = (len(rows), width)
        f["y"] = np.asarray(labels, dtype=np.int32)
    os.replace(tmp, path)


def main(argv):
    a = parse_args(argv)
    if a.input == "-":
        chapters = read_chapters(sys.stdin)
    else:
        with open(a.input, encoding="utf-8") as f:
            chapters = read_chapters(f)
    unknown = sorted({book for book, _, _ in chapters} - set(BOOKS))
    if unknown:
        sys.exit(f"make_verses.py: unknown book abbreviations {unknown}")
    nverses = sum(len(v) for _, _, v in chapters)
    docs = make_documents(chapters, a.block)
    books = [VERSE_REF.match(ref).group(1) for ref, _ in docs]
    if a.labels == "sections":
        classes = [name for name, _ in SECTIONS]
        labels = [SECTION_OF[b] for b in books]
    else:
        classes = BOOKS
        labels = [BOOKS.index(b) for b in books]
    counts = [features_of(text, a.ngrams) for _, text in docs]
    is_test = [i % a.test_every == a.test_every - 1 for i in range(len(docs))]

    # Vocabulary and idf from the training examples only.
    df = collections.Counter()
    for c, test in zip(counts, is_test):
        if not test:
            df.update(c.keys())
    ntrain_docs = sum(1 for t in is_test if not t)
    vocab = [f for f in df if df[f] >= a.min_df]
    vocab.sort(key=lambda f: (-df[f], f))
    index = {f: i for i, f in enumerate(vocab)}
    idf = [math.log((1 + ntrain_docs) / (1 + df[f])) + 1 for f in vocab]

    rows = {False: [], True: []}
    ys = {False: [], True: []}
    ids = {False: [], True: []}
    nnz = 0
    empty = 0
    for (ref, _), c, y, test in zip(docs, counts, labels, is_test):
        weights = {index[f]: (1 + math.log(n)) * idf[index[f]] for f, n in c.items() if f in index}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        if norm == 0:
            empty += 1
            continue
        rows[test].append([(i, f"{weights[i] / norm:.6g}") for i in sorted(weights)])
        ys[test].append(y)
        ids[test].append(f"{ref}\n")
        nnz += len(weights)

    os.makedirs(a.outdir, exist_ok=True)
    p = lambda name: os.path.join(a.outdir, name)
    for test, split in ((False, "train"), (True, "test")):
        write_atomic(p(f"verses.{split}.libsvm"),
                     [f"{y} " + " ".join(f"{i}:{v}" for i, v in r) + "\n" for y, r in zip(ys[test], rows[test])])
        write_atomic(p(f"verses.{split}.ids"), ids[test])
        if a.hdf5:
            write_hdf5(p(f"verses.{split}.h5"), rows[test], ys[test], len(vocab))
    write_atomic(p("verses.vocab"), [f"{f}\n" for f in vocab])
    write_atomic(p("verses.classes"), [f"{c}\n" for c in classes])

    ntrain, ntest = len(rows[False]), len(rows[True])
    share = collections.Counter(ys[False])
    majority = max(share.values()) / ntrain
    unit = "verse" if a.block == 1 else f"run of at most {a.block} verses within a chapter"
    readme = f"""KJV verses -> {a.labels}: sparse text classification (LIBSVM{", HDF5" if a.hdf5 else ""})
===========================================================================

Made by scripts/data/make_verses.sh (helper scripts/data/make_verses.py).

Source: {a.source}.
  {nverses} verses in {len(chapters)} chapters.

Examples: one per {unit} ({len(docs)} in all); a chapter of n verses
  is cut into ceil(n/{a.block}) runs of near-equal size. Example i (0-based, canonical
  order) is a test example when i % {a.test_every} == {a.test_every - 1}; the rest train.
  {empty} examples without a vocabulary feature were dropped.

Labels: {"the 6 sections of the canon" if a.labels == "sections" else "the 66 books"} (verses.classes, line i = class i).
  The largest class holds {majority:.3f} of the training examples.

Features: lowercase runs of letters, no stopwords removed; {"words and adjacent word pairs" if a.ngrams == 2 else "words"}
  found in at least {a.min_df} training examples: {len(vocab)} features (verses.vocab,
  line i = feature index i, 0-based). Values: sublinear tf-idf, (1 + ln count) *
  (ln((1 + n) / (1 + df)) + 1) over the n = {ntrain_docs} training examples, each row
  scaled to unit L2 norm, 6 significant digits.

Files:
  verses.train.libsvm  {ntrain} training examples ("label idx:val ...")
  verses.test.libsvm   {ntest} test examples
  verses.{{train,test}}.ids   the verse range of each line
{"  verses.{train,test}.h5    the same as HDF5: a CSR group X (data, indices, indptr,"
 + chr(10) + "                       shape attribute) and y" + chr(10) if a.hdf5 else ""}
Counts: {ntrain} train + {ntest} test, {len(vocab)} features, {nnz / (ntrain + ntest):.1f} nonzeros per row.
"""
    write_atomic(p("README"), [readme])
    print(f"kjv verses: {ntrain} train / {ntest} test examples, {len(classes)} classes ({a.labels}), "
          f"{len(vocab)} features, {nnz / (ntrain + ntest):.1f} nonzeros per row -> {a.outdir}")


if __name__ == "__main__":
    main(sys.argv[1:])
