# Sourced by the scripts that build data sets from the King James Bible
# (make_corpus.sh, make_verses.sh, make_tokens.sh): installs what is missing and dumps the text.
#
#   ensure_packages PKG...   installs the Debian packages that are missing
#   dump_kjv FILE            writes the 31,102 verses to FILE, one per line as
#                            "Ge1:1 In the beginning God created ...", and sets
#                            KJV_SOURCE to a one-line description of where they came from
#
# Source: Debian's bible-kjv-text package, with bible-kjv, which it recommends:
# bible-kjv-text holds the text only in a compressed random-access form
# (/usr/lib/bible.data), and bible-kjv's `bible` program is what reads it.

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

dump_kjv() {
  local out=$1
  ensure_packages bible-kjv-text bible-kjv
  # Where the package put the text, and the reader for it.
  local data reader
  data="$(dpkg -L bible-kjv-text | grep -E '/bible\.data$' | head -n 1 || true)"
  if [ -z "$data" ] || [ ! -f "$data" ]; then
    echo "bible-kjv-text has no bible.data file" >&2; exit 1
  fi
  reader="$(dpkg -L bible-kjv | grep -E '/bin/bible$' | head -n 1 || true)"
  if [ -z "$reader" ] || [ ! -x "$reader" ]; then
    echo "bible-kjv has no bible program" >&2; exit 1
  fi
  KJV_SOURCE="Debian package bible-kjv-text $(dpkg-query -W -f='${Version}' bible-kjv-text) ($data), read with $reader from bible-kjv $(dpkg-query -W -f='${Version}' bible-kjv)"
  # -f: one verse per line with its reference; -p/-d name the data file so that a
  # bible.data in the current directory is never picked up.
  LC_ALL=C "$reader" -f -p "$(dirname "$data")" -d "$(basename "$data")" Gen1:1-Rev22:21 </dev/null >"$out"
  # A complete dump starts at Genesis 1:1 and ends at Revelation 22:21.
  local first last
  first="$(head -n 1 "$out")"
  last="$(tail -n 1 "$out")"
  if [[ "$first" != "Ge1:1 "* || "$last" != "Rev22:21 "* ]]; then
    echo "unexpected output from $reader (first or last verse missing)" >&2; exit 1
  fi
}
