#!/usr/bin/env bash
# Makes a bag-of-words corpus in LIBSVM format from the King James Bible, for
# training a topic model (unsupervised: every label is 0).
#
#   scripts/data/make_corpus.sh [OUTDIR] [--vocab V] [--block N]
#
# OUTDIR defaults to build/data/kjv under the repository (build/ is ignored by git).
# Writes OUTDIR/kjv.train.libsvm, kjv.test.libsvm, kjv.vocab (line i = feature
# index i, 0-based), kjv.{train,test}.ids (verse range of each line) and README,
# then prints a one-line summary. Takes well under a second once the package is in.
#
# Source: Debian's bible-kjv-text package, installed here when missing (with
# bible-kjv, which it recommends: bible-kjv-text holds the text only in a
# compressed random-access form, /usr/lib/bible.data, and bible-kjv's `bible`
# program is what reads it). `bible -f Gen1:1-Rev22:21` dumps the 31,102 verses,
# one per line as "Ge1:1 In the beginning God created ...".
#
# Document unit: verses grouped in blocks of at most 10 within a chapter. A chapter
# of n verses is cut into ceil(n/10) runs of near-equal size (31 verses -> 8+8+8+7),
# so no document crosses a chapter and none is a stub: 3,667 documents of 2-10
# verses (~215 words of text, ~72 vocabulary tokens after stopwords at V = 2000),
# versus only 1,189 documents of very uneven length (2 to 176 verses) for whole
# chapters.
# Every 10th document (index % 10 == 9, canonical order) is held out as test data.
#
# Processing (make_bow.py, Python standard library only, run with /usr/bin/python3):
# lowercase, drop the verse references, tokens = runs of letters (apostrophes and
# punctuation split words), drop words under 3 letters and stopwords (an embedded
# standard English list of 150 words plus 39 archaic ones such as thee/thou/hath),
# keep the V (default 2000) most frequent words among those in >= 5 training
# documents, values = term frequencies (count / in-vocabulary tokens, summing to 1
# per line), drop documents with fewer than 5 in-vocabulary tokens. The output is
# byte-for-byte the same on every run and files are replaced atomically.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON=/usr/bin/python3

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

OUTDIR=""
BOW_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --vocab|--block) [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
                     BOW_ARGS+=("$1" "$2"); shift 2 ;;
    --vocab=*|--block=*) BOW_ARGS+=("$1"); shift ;;
    -*) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$OUTDIR" ] || { echo "only one OUTDIR, got '$OUTDIR' and '$1'" >&2; exit 2; }
       OUTDIR=$1; shift ;;
  esac
done
OUTDIR=${OUTDIR:-$ROOT/build/data/kjv}

# shellcheck source=kjv_dump.sh
source "$HERE/kjv_dump.sh"
DUMP="$(mktemp)"
trap 'rm -f "$DUMP"' EXIT
dump_kjv "$DUMP"
SOURCE=$KJV_SOURCE

LC_ALL=C "$PYTHON" "$HERE/make_bow.py" --input "$DUMP" --outdir "$OUTDIR" \
  --source "$SOURCE" "${BOW_ARGS[@]+"${BOW_ARGS[@]}"}"
