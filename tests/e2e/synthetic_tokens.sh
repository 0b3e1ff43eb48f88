#!/usr/bin/env bash
# synthetic_tokens.sh OUT [TOKENS VOCABULARY STEPS PER_LINE]: a token stream with some
# structure to learn (a token often repeats its predecessor + 1), from a fixed linear
# congruential sequence: by default 6,000 tokens over a vocabulary of 40, segments of
# 6 steps, 12 to a line. Shared by the LSTM tests and scripts/gpu_check.sh.
set -euo pipefail
out=$1; tokens=${2:-6000}; vocabulary=${3:-40}; steps=${4:-6}; perLine=${5:-12}
awk -v n="$tokens" -v v="$vocabulary" -v steps="$steps" -v per="$perLine" 'BEGIN {
  print "#orpheus-tokens vocabulary=" v " steps=" steps; s = 12345; prev = 0
  for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648
    t = (s % 4 == 0) ? int(s / 7) % v : (prev + 1) % v; prev = t
    printf "%d%s", t, (i % per == per - 1) ? "\n" : " " } }' >"$out"
