#!/usr/bin/env bash
# Makes a sparse text classification set from the King James Bible: runs of
# verses labelled with the section of the canon they come from, as LIBSVM files.
#
#   scripts/data/make_verses.sh [OUTDIR] [--block N] [--labels sections|books]
#                               [--ngrams 1|2] [--min-df N] [--hdf5]
#
# OUTDIR defaults to build/data/verses under the repository (build/ is ignored by
# git). Writes OUTDIR/verses.{train,test}.libsvm, verses.vocab, verses.classes,
# verses.{train,test}.ids and README, and with --hdf5 verses.{train,test}.h5 (the
# same rows as HDF5 CSR: a group X with data, indices, indptr and a shape
# attribute, and y), then prints a one-line summary. A few seconds.
#
# Source: Debian's bible-kjv-text package (scripts/data/kjv_dump.sh installs it).
#
# Defaults, chosen by measurement (scikit-learn 1.2 on the same files; test accuracy):
#   example = run of <= 3 verses within a chapter, label = one of 6 sections (law,
#   history, wisdom, prophets, gospels and Acts, letters and Revelation), words and
#   adjacent word pairs in >= 2 training examples: 9,693 train / 1,077 test rows,
#   62,861 features, ~102 nonzeros per row, largest class 0.22.
#   LinearSVC 0.914, LogisticRegression(C=10) 0.905, SGDClassifier() 0.914,
#   SGDClassifier(loss="log_loss") 0.877.
# Alternatives measured (LinearSVC): single verses 0.836 (6 sections); 8 sections
# (major and minor prophets, Paul and the other letters apart) 0.877 at 3 verses,
# 0.897 at 5; the 66 books 0.727 at 5 verses. make_verses.py's docstring details the
# features (sublinear tf-idf, rows of unit L2 norm) and the split (every 10th
# example is test). Output is byte-for-byte the same on every run; files are
# replaced atomically.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON=/usr/bin/python3

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

OUTDIR=""
ARGS=()
HDF5=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --block|--labels|--ngrams|--min-df) [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
                                        ARGS+=("$1" "$2"); shift 2 ;;
    --block=*|--labels=*|--ngrams=*|--min-df=*) ARGS+=("$1"); shift ;;
    --hdf5) HDF5=1; ARGS+=("$1"); shift ;;
    -*) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$OUTDIR" ] || { echo "only one OUTDIR, got '$OUTDIR' and '$1'" >&2; exit 2; }
       OUTDIR=$1; shift ;;
  esac
done
OUTDIR=${OUTDIR:-$ROOT/build/data/verses}

# shellcheck source=kjv_dump.sh
source "$HERE/kjv_dump.sh"
[ "$HDF5" -eq 0 ] || ensure_packages python3-numpy python3-h5py
DUMP="$(mktemp)"
trap 'rm -f "$DUMP"' EXIT
dump_kjv "$DUMP"

LC_ALL=C "$PYTHON" "$HERE/make_verses.py" --input "$DUMP" --outdir "$OUTDIR" \
  --source "$KJV_SOURCE" "${ARGS[@]+"${ARGS[@]}"}"
