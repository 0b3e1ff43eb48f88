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

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# Installs the packages that are missing; refreshes the package lists only when
# apt could not find or fetch a package with the lists it has.
ensure_packages() {
  local missing=() p
  for p in "$@"; do installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
  echo "installing ${missing[*]}" >&2
  local log
  log="$(mktemp)"
  if ! "${apt[@]}" install -y -q "${missing[@]}" >"$log" 2>&1; then
    if grep -Eq 'Unable to locate package|has no installation candidate|Unable to fetch|Failed to fetch' "$log"; then
      echo "the package lists are missing or stale: running apt-get update" >&2
      "${apt[@]}" update -q >&2
      "${apt[@]}" install -y -q "${missing[@]}" >&2
    else
      cat "$log" >&2; rm -f "$log"; exit 1
    fi
  fi
  rm -f "$log"
}

ensure_packages bible-kjv-text bible-kjv

# Where the package put the text, and the reader for it.
DATA="$(dpkg -L bible-kjv-text | grep -E '/bible\.data$' | head -n 1 || true)"
if [ -z "$DATA" ] || [ ! -f "$DATA" ]; then
  echo "bible-kjv-text has no bible.data file" >&2; exit 1
fi
READER="$(dpkg -L bible-kjv | grep -E '/bin/bible$' | head -n 1 || true)"
if [ -z "$READER" ] || [ ! -x "$READER" ]; then
  echo "bible-kjv has no bible program" >&2; exit 1
fi
version() { dpkg-query -W -f='${Version}' "$1"; }
SOURCE="Debian package bible-kjv-text $(version bible-kjv-text) ($DATA), read with $READER from bible-kjv $(version bible-kjv)"

DUMP="$(mktemp)"
trap 'rm -f "$DUMP"' EXIT
# -f: one verse per line with its reference; -p/-d name the data file so that a
# bible.data in the current directory is never picked up.
LC_ALL=C "$READER" -f -p "$(dirname "$DATA")" -d "$(basename "$DATA")" Gen1:1-Rev22:21 \
  </dev/null >"$DUMP"
# A complete dump starts at Genesis 1:1 and ends at Revelation 22:21.
FIRST="$(head -n 1 "$DUMP")"
LAST="$(tail -n 1 "$DUMP")"
if [[ "$FIRST" != "Ge1:1 "* || "$LAST" != "Rev22:21 "* ]]; then
  echo "unexpected output from $READER (first or last verse missing)" >&2; exit 1
fi

LC_ALL=C "$PYTHON" "$HERE/make_tokens.py" --input "$DUMP" --outdir "$OUTDIR" \
  --source "$SOURCE" "${TOKEN_ARGS[@]+"${TOKEN_ARGS[@]}"}"
