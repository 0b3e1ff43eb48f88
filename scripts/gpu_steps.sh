# Sourced by scripts/gpu_check.sh and scripts/bench/gpu.sh: where the binaries are,
# and the time-boxed steps both scripts are made of. The sourcing script sets BUDGET,
# OUT and `here` (the repository root) first, and lists in STEP_VARS the variables its
# step functions read. Sets summary ($OUT/summary.md), work (a scratch folder removed
# on exit), start and failed.

mkdir -p "$OUT"
summary=$OUT/summary.md
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
start=$(date +%s)
failed=0

# Binaries: the bundle's (env.sh sourced), else a build tree's.
if [ -n "${ORPHEUS_BUNDLE:-}" ]; then
  bin=$ORPHEUS_BUNDLE/bin; tests=$bin; examples=$ORPHEUS_BUNDLE/examples; mpirun=$bin/mpirun
else
  build=${BUILD_DIR:-$here/build}
  bin=$build/engine; tests=$build/tests; examples=$here/examples; mpirun=$(command -v mpirun || echo mpirun)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
orpheus=$bin/orpheus
compare=$tests/compare_params
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}

left() { echo $((BUDGET - ($(date +%s) - start))); }
record() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT FUNCTION: runs FUNCTION under a timeout of LIMIT seconds (cut to
# what the budget has left), its output in $OUT/NAME.log. FUNCTION returns 0 (PASS),
# 77 (SKIP, its reason in $work/why) or anything else (FAIL); its figures, if any, in
# $work/figure (one a line, joined with "; ").
step() {
  local name=$1 limit=$2 fn=$3 rc
  rm -f "$work/why" "$work/figure"
  case " ${SKIP_STEPS:-} " in *" $name "*) record "- SKIP $name: SKIP_STEPS"; return ;; esac
  if [ "$(left)" -lt 15 ]; then
    record "- SKIP $name: the budget of ${BUDGET}s is spent"
    return
  fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  local t0=$(date +%s)
  timeout --kill-after=5 "$limit" bash -c "$(declare -f); $(declare -p "${STEP_VARS[@]}" 2>/dev/null); $fn" \
    >"$OUT/$name.log" 2>&1
  rc=$?
  local took=$(($(date +%s) - t0)) figure=""
  [ -f "$work/figure" ] && figure=": $(paste -sd'|' "$work/figure" | sed 's/|/; /g')"
  case $rc in
    0) record "- PASS $name (${took}s)$figure" ;;
    77) record "- SKIP $name: $(cat "$work/why" 2>/dev/null || echo skipped)" ;;
    124|137) record "- FAIL $name: timed out after ${limit}s (log: $name.log)"; failed=1 ;;
    *) record "- FAIL $name (exit $rc, ${took}s)$figure (log: $name.log)"; failed=1 ;;
  esac
  # A failure's last lines on the console too: a GPU host may hand back only the console.
  case $rc in
    0|77) ;;
    *) grep -v -e 'pmix' -e 'Perhaps a missing symbol' -e 'dlopen error' "$OUT/$name.log" | tail -n 6 |
         cut -c1-300 | sed 's/^/    | /' ;;
  esac
}

skip() { echo "$*" >"$work/why"; exit 77; }
figure() { echo "$*" >>"$work/figure"; }
# kjvData GIVEN FILE SCRIPT ARGS...: a folder holding the KJV data file FILE: GIVEN (the
# bundle's data/), else one made in $work by scripts/data/SCRIPT ARGS from Debian's
# bible-kjv, else the step skips. Call as corpus=$(kjvData ...) || exit $?.
kjvData() {
  local given=$1 file=$2 script=$3; shift 3
  if [ -n "$given" ] && [ -f "$given/$file" ]; then echo "$given"; return; fi
  { [ -f /usr/lib/bible.data ] && command -v bible >/dev/null; } ||
    skip "no KJV $file (the bundle's data/, or Debian's bible-kjv for scripts/data/$script)"
  "$here/scripts/data/$script" "$work/kjv-$script" "$@" >&2 || exit 1
  echo "$work/kjv-$script"
}
