#!/usr/bin/env bash
# scripts/bench/run.sh SUITE [harness options]: installs what is missing, builds the
# Release binary and runs one benchmark suite through the harness (harness.py), which
# writes scripts/bench/results/SUITE.md (also printed), SUITE.png and SUITE_raw.tar.xz
# (the raw runs, which stay in build/bench-raw/SUITE_raw/).
#
# Suites:
#   vs-ddp   PyTorch DDP against Orpheus (dense, SV broadcast, best settings), np 4, on
#            loopback and on emulated 1 and 10 Gbit/s clusters (scripts/netcluster.sh;
#            needs root, else loopback only), MLR and the 784-2048-2048-10 MLP.
#   table4   checkpoint and recovery cost (the Orpheus paper's Table 4), np 4, MLP, then a
#            whole-process A/B of --ckpt sv against none (--ab-clocks 200) and restore(T) times.
#   table3   techniques added one at a time (the paper's Table 3), np 8, MLP
#            (scripts/bench/table3.sh; its own options are environment variables).
#   simulate orpheus simulate: calibration against the emulated 1 Gbit/s cluster at
#            P = 4, 8 and the scaling table P = 8..1000 on a 10 Gbit/s model
#            (scripts/bench/simulate.sh; options as environment variables).
#   simulate-peers  orpheus simulate at P = 100 and 1000 with 1% of workers slowed 2x:
#            Orpheus (random multicast, SSP) against --sync powersgd (tree and ring
#            all-reduce) and --sync dense (scripts/bench/simulate_peers.sh).
#   lstm     the KJV LSTM language model against PyTorch nn.LSTM + DDP over gloo
#            (scripts/bench/lstm_vs_torch.sh; options as environment variables).
#   step     one rank's MLP step (dense and SV) against PyTorch's on the same shapes and
#            BLAS, no network, at 1 and 2 threads (scripts/bench/step_vs_torch.sh;
#            options as environment variables).
#   elastic  elastic restart: a rank killed, the job relaunched on the ranks left;
#            live scale-in: a rank leaves the running job on SIGTERM; --balance with a
#            slowed rank; Litz's scale-out 4 -> 8 at 30% against its ideal (MLR, MLP);
#            half the ranks preempted at clock 100 and back at 200
#            (scripts/bench/elastic.sh; options as environment variables).
#   adapt    --adapt against the best hand-tuned setting and the defaults, np 4, MLP-2048,
#            at 1 and 10 Gbit/s and with the rate dropped 10 -> 1 Gbit/s mid-run
#            (scripts/bench/adapt.sh; options as environment variables).
#   zero-copy one clock's SV batch path (encode, decode, rebuild) and computeSvg in callgrind
#            instruction counts, copy against views (scripts/bench/zero_copy.sh; needs
#            valgrind; options as environment variables).
#   codesign, sv-vs-dense, generated, selection: the older suites in their own scripts
#            (comm_codesign.sh, sv_vs_dense.sh, generated_vs_handwritten.sh,
#            selection_error.sh), options as environment variables; see each header.
#
# Examples:
#   scripts/bench/run.sh vs-ddp
#   scripts/bench/run.sh vs-ddp --networks loopback,1gbit --models mlp-wide --reps 2
#   scripts/bench/run.sh table4 --reps 2
# `scripts/bench/run.sh SUITE --help` lists the harness options.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/common.sh"
suite="${1-}"
case "$suite" in
  vs-ddp | vs-peers | table4 | table3 | codesign | sv-vs-dense | generated | selection | simulate | simulate-peers | lstm | step | elastic | adapt | zero-copy) shift ;;
  -h | --help | "") sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "run.sh: unknown suite '$suite' (vs-ddp, vs-peers, table4, table3, codesign, sv-vs-dense, generated, selection, simulate, simulate-peers, lstm, step, elastic, adapt, zero-copy)" >&2
     exit 2 ;;
esac

"$ROOT/scripts/setup.sh"
extra=()
[ "$suite" = vs-ddp ] && extra=(python3-torch python3-numpy libopenblas0-pthread iproute2)
[ "$suite" = vs-peers ] && extra=(python3-torch python3-numpy libopenblas0-pthread iproute2)
[ "$suite" = lstm ] && extra=(python3-torch iproute2)
[ "$suite" = step ] && extra=(python3-torch libopenblas0-pthread)
[ "$suite" = adapt ] && extra=(iproute2)
[ "$suite" = zero-copy ] && extra=(valgrind)
missing=()
for p in python3-matplotlib "${extra[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "run.sh: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

declare -A SCRIPT=([table3]=table3.sh [codesign]=comm_codesign.sh [sv-vs-dense]=sv_vs_dense.sh
  [generated]=generated_vs_handwritten.sh [selection]=selection_error.sh [simulate]=simulate.sh
  [simulate-peers]=simulate_peers.sh [lstm]=lstm_vs_torch.sh [step]=step_vs_torch.sh [elastic]=elastic.sh
  [adapt]=adapt.sh [zero-copy]=zero_copy.sh)
if [ -n "${SCRIPT[$suite]-}" ]; then
  case "$suite" in table3 | codesign) build "$ROOT/build-dev" Release ;; esac
  case "$suite" in simulate | simulate-peers | step | elastic | zero-copy) build "$ROOT/build-release" Release -DORPHEUS_BUILD_TESTS=OFF ;; esac
  if [ "$suite" = lstm ] || [ "$suite" = adapt ]; then
    build "$ROOT/build-release" Release -DORPHEUS_BUILD_TESTS=OFF
    export BUILD_DIR="${BUILD_DIR:-$ROOT/build-release}"
  fi
  exec "$ROOT/scripts/bench/${SCRIPT[$suite]}" "$@"
fi
build "$ROOT/build-release" Release -DORPHEUS_BUILD_TESTS=OFF
exec /usr/bin/python3 "$ROOT/scripts/bench/harness.py" "$suite" --orpheus "$ROOT/build-release/engine/orpheus" "$@"
