#!/usr/bin/env bash
# Makes a token stream of the King James Bible for language models (examples/lstm.loss).
#
#   scripts/data/make_tokens.sh [OUTDIR] [--vocab V] [--steps T]
#
# OUTDIR defaults to build/data/kjv-tokens under the repository (build/ is ignored by git).
# Writes OUTDIR/kjv.{train,valid,test}.tokens, kjv.tokens.vocab (line i = token id i)
# and README, then prints a one-line summary. Takes a few seconds.
#
# Source: Debian's bible-kjv-text, read with bible-kjv's `bible` program (both
# installed when missing), as scripts/data/make_corpus.sh does: `bible -f
# Gen1:1-Rev22:21` dumps the 31,102 verses, one per line with its reference.
#
# Processing (make_tokens.py, Python standard library only, run with /usr/bin/python3):
# lowercase, drop the verse reference, tokens = runs of letters; every verse ends
# with <eos>. The vocabulary: id 0 <eos>, id 1 <unk>, then the V - 2 (default 2000
# in all) most frequent training words, ties alphabetical; other words become <unk>.
# The split is by whole books (canonical order, 0-based index i): validation when
# i % 16 == 7 (Ruth, Jeremiah, Matthew, Titus), test when i % 16 == 15
# (Nehemiah, Jonah, Galatians, 3 John), training otherwise. A .tokens file
# starts "#orpheus-tokens vocabulary=V steps=T" (T, default 35: the time steps per
# segment the engine unrolls a sequence model over) and holds one verse of ids per
# line. The output is byte-for-byte the same on every run; files are replaced atomically.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON=/usr/bin/python3

usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

OUTDIR=""
TOKEN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --vocab|--steps) [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
                     TOKEN_ARGS+=("$1" "$2"); shift 2 ;;
    --vocab=*|--steps=*) TOKEN_ARGS+=("$1"); shift ;;
    -*) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$OUTDIR" ] || { echo "only one OUTDIR, got '$OUTDIR' and '$1'" >&2; exit 2; }
       OUTDIR=$1; shift ;;
  esac
done
OUTDIR=${OUTDIR:-$ROOT/build/data/kjv-tokens}

# shellcheck source=kjv_dump.sh
source "$HERE/kjv_dump.sh"

DUMP="$(mktemp)"
trap 'rm -f "$DUMP"' EXIT
dump_kjv "$DUMP"

LC_ALL=C "$PYTHON" "$HERE/make_tokens.py" --input "$DUMP" --outdir "$OUTDIR" \
  --source "$KJV_SOURCE" "${TOKEN_ARGS[@]+"${TOKEN_ARGS[@]}"}"
