#!/usr/bin/env bash
# gpu.sh: Orpheus on one GPU against PyTorch on the same GPU, as one time-boxed script.
#
#   source bundle/env.sh && scripts/bench/gpu.sh     # on a GPU host, from a bundle
#   BUILD_DIR=build scripts/bench/gpu.sh             # from a build tree
#   DEVICE=strict scripts/bench/gpu.sh               # dry run here: the strict device
#                                                      stands in, small models, PyTorch on the CPU
# BUDGET (seconds, default 540) bounds the whole run: every step has a timeout, and a
# step that would not fit in what is left is skipped, not overrun. Everything goes to
# $OUT (default ./gpu_bench_out): summary.md (one PASS/FAIL/SKIP line per step with its
# figures) and a log per step; on a GPU the summary is also copied to RESULTS
# (scripts/bench/results/gpu.md). SKIP_STEPS="a b" skips the named steps.
#
# Steps:
#   gpu       nvidia-smi, and whether MPS is on (ranks sharing a GPU time-slice without it)
#   transfer  np 2, MLP 784-2048-2048-10 (dry run: 784-64-32-10), --transfer staged
#             against sync: bitwise the same parameters, seconds per clock of each, the
#             share of the SV copies hidden behind the backward pass, the device's wait
#             for data after the first clocks (goal 0)
#   step      one GPU, the same MLP at batch 100: seconds per training step, Orpheus
#             (--sync dense, resident) against PyTorch's (goal <= 1.2x)
#   netns     whether this host allows scripts/netcluster.sh's emulated network (namespaces,
#             veths, tc; the bundle carries ip and tc): 4 hosts at 1 Gbit/s brought up and down
#   rebuild   the rebuild of an np-4 clock of the MLP (4 batches of 100 columns into W resident
#             on the device): FLOP/s and bytes/s against the SGEMM and device-to-device copy
#             rates measured in the same run (tests/tools/rebuild_rate.cc; goal >= 0.7 of the
#             bound, whichever of the two binds)
#   select    np 2, the same MLP, --select 25 of 100, resident: --select-method jmcss (Gram-Schmidt
#             on the host, from U and V copied out) against jmcss-gram (the Gram products on the
#             device, the draw on the host): seconds a clock spends selecting and seconds a
#             clock, after clock 5, two runs of each interleaved (median of the two)
#   mps       where nvidia-cuda-mps-control is at hand and no MPS daemon runs (MPS=auto, the
#             default; MPS=off skips it): a private MPS daemon for the steps after it, so that
#             the 4 ranks of shared and lstm (and PyTorch's) share the GPU at once instead of
#             time-slicing it; kept only if a 2-rank job runs under it within 60 s
#   shared    4 ranks sharing the GPU train MLP 784-2048-2048-10 to 0.85 (dry run: 784-64-64-10
#             to 0.75): Orpheus (--sv-rank 2, --sync dense, --sync powersgd) against PyTorch DDP over gloo and
#             PowerSGD rank 2 (scripts/bench/ddp_fmnist.py), all with Nesterov 0.9, lr 0.1, batch
#             100 per rank: seconds to target and the ratios, each rank in its own emulated
#             host at 1 Gbit/s where the netns step passed (NET=auto, the default), else over
#             loopback (NET=loopback forces it; NET=1gbit fails where it cannot be had)
#   lstm      the KJV LSTM language model (examples/lstm.loss, embed = hidden = 1024 with weights
#             uniform(0.03) and lr 0.02, where 0.1 and 0.1 diverge; dry run 32, 0.1 and 0.1),
#             4 ranks sharing the GPU: Orpheus dense, SV (broadcast) and best (lstm_vs_torch.sh's
#             flags) against PyTorch nn.LSTM + DDP over gloo (scripts/bench/lstm_torch.py), the
#             same data, shards, init and SGD step: validation perplexity and training seconds
#             after LSTM_CLOCKS clocks (150), and the seconds to the worst final perplexity
# Every run is one repetition (the GPU machine is lent for minutes): each ratio is one sample.
set -uo pipefail

BUDGET=${BUDGET:-540}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$PWD/gpu_bench_out}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS=${RESULTS:-$here/scripts/bench/results/gpu.md}
source "$here/scripts/gpu_steps.sh"
# The first Python that has PyTorch (a GPU host's python3; Debian's /usr/bin/python3 here), else python3.
python=$(command -v python3 || echo python3)
for p in $(command -v python3) /usr/bin/python3; do
  if "$p" -c 'import torch' 2>/dev/null; then python=$p; break; fi
done
# From a bundle, PyTorch runs with the host's library path (env.sh keeps it): the
# bundle's names a system cuDNN, which would stand in for the one PyTorch was built with.
if [ -n "${ORPHEUS_HOST_LD_LIBRARY_PATH+set}" ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH="$ORPHEUS_HOST_LD_LIBRARY_PATH" exec %s "$@"\n' "$python" >"$work/python"
  chmod +x "$work/python"
  python=$work/python
fi
if [ "$DEVICE" = cuda ]; then hidden=2048; else hidden=64; fi
kjv=${ORPHEUS_KJV:-}
NET=${NET:-auto}
MPS=${MPS:-auto}
netcluster=$here/scripts/netcluster.sh
launch=()  # extra mpirun arguments: the emulated network's, where a step brought it up
STEP_VARS=(orpheus compare tests examples mpirun data kjv python work here DEVICE hidden NET MPS netcluster launch)
mlp() {
  sed -e "s/^dim hidden1 = .*/dim hidden1 = $hidden/" -e "s/^dim hidden2 = .*/dim hidden2 = $hidden/" \
    "$examples/mlp.loss" >"$work/mlp.loss"
}
# train NP NAME FLAGS...: a job on $DEVICE, parameters in $work/NAME.h5, metrics in $work/NAME.jsonl.
train() {
  local np=$1 name=$2; shift 2
  "$mpirun" -n "$np" --oversubscribe "${launch[@]}" "$orpheus" train --device "$DEVICE" --seed 7 --progress off --log-level warn \
    --train "$data/train-images-idx3-ubyte.gz" --save "$work/$name.h5" --metrics "$work/$name.jsonl" "$@"
}
# mean FILE FIELD [FROM]: a field's mean over the clock lines from clock FROM (default 1) on.
mean() {
  "$python" - "$@" <<'EOF'
import json, sys
path, field, first = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1
values = [l[field] for l in map(json.loads, open(path)) if "clock" in l and l["clock"] >= first and field in l]
print(f"{sum(values) / len(values):.6g}" if values else "nan")
EOF
}

check_gpu() {
  [ "$DEVICE" = cuda ] || skip "DEVICE=$DEVICE: a dry run"
  command -v nvidia-smi >/dev/null || skip "no nvidia-smi: no NVIDIA driver on this host"
  nvidia-smi || exit 1
  local mps=off
  if pgrep -x nvidia-cuda-mps-control >/dev/null || [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then mps=on; fi
  figure "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1); MPS $mps"
}
check_transfer() {
  mlp
  local clocks=30
  for mode in staged sync; do
    train 2 "$mode" --model "$work/mlp.loss" --clocks $clocks --batch 100 --eval-every 0 --overlap on --transfer "$mode" ||
      exit 1
  done
  local d; d=$("$compare" "$work/staged.h5" "$work/sync.h5" 1e300 | awk '{print $4}')
  figure "staged vs sync parameters differ by $d (goal 0)"
  figure "seconds per clock after clock 5: staged $(mean "$work/staged.jsonl" clock_seconds 6), sync $(mean "$work/sync.jsonl" clock_seconds 6)"
  figure "SV copies hidden: $(mean "$work/staged.jsonl" transfer_hidden_share 6) (staged); device data wait after clock 5: $(mean "$work/staged.jsonl" device_data_wait_seconds 6) s (goal 0)"
  figure "d2h $(mean "$work/staged.jsonl" d2h_bytes) B, h2d $(mean "$work/staged.jsonl" h2d_bytes) B per clock"
  [ "$d" = "0.000e+00" ]
}
check_select() {
  mlp
  local rep method
  for rep in 1 2; do
    for method in jmcss jmcss-gram; do
      train 2 "select-$method-$rep" --model "$work/mlp.loss" --clocks 30 --batch 100 --eval-every 0 --select 25 \
        --select-method "$method" || exit 1
    done
  done
  "$python" - "$work" >"$work/select.txt" <<'EOF' || exit 1
import json, statistics, sys
work = sys.argv[1]
def per_clock(method, rep, field):
    rows = [json.loads(l) for l in open(f"{work}/select-{method}-{rep}.jsonl")]
    return statistics.mean(r[field] for r in rows if "clock" in r and r["clock"] >= 6 and field in r)
got = {}
for m in ("jmcss", "jmcss-gram"):
    sel = [per_clock(m, r, "select_seconds") for r in (1, 2)]
    clk = [per_clock(m, r, "clock_seconds") for r in (1, 2)]
    got[m] = (statistics.median(sel), statistics.median(clk))
    print(f"{m}: selection {1e3 * got[m][0]:.3g} ms a clock (runs {1e3 * min(sel):.3g}-{1e3 * max(sel):.3g}), "
          f"clock {1e3 * got[m][1]:.3g} ms (runs {1e3 * min(clk):.3g}-{1e3 * max(clk):.3g})")
print(f"jmcss / jmcss-gram: selection {got['jmcss'][0] / got['jmcss-gram'][0]:.2f}x, "
      f"clock {got['jmcss'][1] / got['jmcss-gram'][1]:.2f}x")
EOF
  local line
  while IFS= read -r line; do figure "$line"; done <"$work/select.txt"
}
check_step() {
  [ "$DEVICE" = cuda ] || skip "DEVICE=$DEVICE: PyTorch's side needs the GPU"
  "$python" -c 'import torch; assert torch.cuda.is_available()' || skip "no PyTorch with CUDA"
  mlp
  # One rank: the dense gradient never leaves the device (no collective); SV for comparison.
  train 1 step --model "$work/mlp.loss" --clocks 60 --batch 100 --eval-every 0 --sync dense --overlap off || exit 1
  train 1 step-sv --model "$work/mlp.loss" --clocks 60 --batch 100 --eval-every 0 --sync sv || exit 1
  local ours; ours=$(mean "$work/step.jsonl" clock_seconds 11)
  local sv; sv=$(mean "$work/step-sv.jsonl" clock_seconds 11)
  local theirs; theirs=$("$python" - "$hidden" <<'EOF'
import sys, time, torch
from torch import nn
h = int(sys.argv[1]); dev = torch.device("cuda")
torch.manual_seed(7)
model = nn.Sequential(nn.Linear(784, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(100, 784, device=dev); y = torch.randint(0, 10, (100,), device=dev)
def one():
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
for _ in range(10): one()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(50): one()
torch.cuda.synchronize(); print(f"{(time.perf_counter() - t) / 50:.6g}")
EOF
)
  local ratio; ratio=$("$python" -c "print(f'{float(\"$ours\") / float(\"$theirs\"):.3g}')")
  figure "seconds per step: Orpheus $ours (dense, one rank; SV: $sv), PyTorch $theirs, ratio $ratio (goal <= 1.2)"
  figure "bytes per clock, one rank dense: to the host $(mean "$work/step.jsonl" device_out_bytes 11), to the device $(mean "$work/step.jsonl" device_in_bytes 11)"
  "$python" -c "import sys; sys.exit(0 if float('$ratio') <= 1.2 else 1)"
}
# The emulated network of 4 hosts at 1 Gbit/s, up and down again; "1gbit" in $work/net
# where it worked, for the shared step.
check_netns() {
  [ "$NET" != loopback ] || skip "NET=loopback"
  command -v ip >/dev/null && command -v tc >/dev/null || skip "no ip(8) or tc(8) on this host or in the bundle"
  [ "$(id -u)" -eq 0 ] || skip "not root: network namespaces need CAP_NET_ADMIN"
  if "$netcluster" up 4 --rate 1gbit; then
    "$netcluster" status
    "$netcluster" down
    echo 1gbit >"$work/net"
    figure "network namespaces, veths and tc: yes; the shared step runs at an emulated 1 Gbit/s"
  else
    "$netcluster" down >/dev/null 2>&1
    figure "scripts/netcluster.sh up: refused here (its log says why); the shared step runs over loopback"
  fi
}
# ddp NAME FLAGS...: scripts/bench/ddp_fmnist.py with FLAGS on 4 ranks, metrics in $work/NAME.jsonl:
# over loopback, or one process in each emulated host (gloo over eth0; rank 0 writes metrics).
ddp() {
  local name=$1 i pids=(); shift
  if [ ${#launch[@]} -eq 0 ]; then
    "$python" "$here/scripts/bench/ddp_fmnist.py" --np 4 "$@" --metrics "$work/$name.jsonl"
    return
  fi
  for i in 0 1 2 3; do
    local out=(); [ $i -eq 0 ] && out=(--metrics "$work/$name.jsonl")
    "$netcluster" exec $i env GLOO_SOCKET_IFNAME=eth0 "$python" "$here/scripts/bench/ddp_fmnist.py" --rank $i \
      --world-size 4 --master 198.18.0.1:29500 --ifname eth0 "$@" "${out[@]}" &
    pids+=($!)
  done
  local rc=0; for i in "${pids[@]}"; do wait "$i" || rc=1; done
  return $rc
}
# seconds METRICS TARGET [perplexity]: training seconds at the first evaluation that reached
# TARGET (accuracy >= TARGET, or perplexity <= TARGET), else "none"; Orpheus's and the
# peers' metrics files alike.
seconds() {
  "$python" - "$@" <<'EOF'
import json, sys
path, target = sys.argv[1], float(sys.argv[2])
perplexity = len(sys.argv) > 3
for line in open(path):
    r = json.loads(line)
    if r.get("summary") or "clock" not in r:
        continue
    v = r.get("test_perplexity", r.get("valid_perplexity")) if perplexity else r.get("test_accuracy")
    if v is not None and (v <= target if perplexity else v >= target):
        print(f"{r['seconds']:.4g}")
        break
else:
    print("none")
EOF
}
# lastPerplexity METRICS: "PERPLEXITY SECONDS" of the last evaluation in the file.
lastPerplexity() {
  "$python" - "$1" <<'EOF'
import json, sys
last = None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "clock" in r and not r.get("summary") and ("test_perplexity" in r or "valid_perplexity" in r):
        last = r
print(f"{last.get('test_perplexity', last.get('valid_perplexity'))!r} {last['seconds']:.4g}" if last else "nan nan")
EOF
}
# ratio A B: A / B to three digits, or "n/a" when either is not a number.
ratio() {
  "$python" -c 'import sys
try: print(f"{float(sys.argv[1]) / float(sys.argv[2]):.3g}")
except (ValueError, ZeroDivisionError): print("n/a")' "$1" "$2"
}

check_rebuild() {
  local shapes=2048x784,2048x2048,10x2048
  [ "$DEVICE" = cuda ] || shapes=256x196,256x256,10x256
  "$tests/rebuild_rate" --device "$DEVICE" --shape "$shapes" --ranks 4 --columns 100 --reps 20 >"$work/rebuild.json" ||
    exit 1
  cat "$work/rebuild.json"
  figure "$("$python" - "$work/rebuild.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"W {r['shapes']} from 4 x 100 columns: {r['device_seconds'] * 1e3:.3g} ms a clock on the device, "
      f"{r['device_flops'] / 1e12:.3g} TFLOP/s ({r['device_flops'] / r['sgemm_flops']:.2f} of SGEMM's "
      f"{r['sgemm_flops'] / 1e12:.3g}), {r['device_bytes_per_second'] / 1e9:.3g} GB/s "
      f"({r['device_bytes_per_second'] / r['copy_bytes_per_second']:.2f} of the copy's "
      f"{r['copy_bytes_per_second'] / 1e9:.3g}); {r['bound']} binds: efficiency {r['efficiency']:.2f} "
      f"(goal >= 0.7); plain SGEMMs of the rebuild's shapes {r['gemm_seconds'] * 1e3:.3g} ms "
      f"({r['gemm_flops'] / 1e12:.3g} TFLOP/s): the rebuild reaches {r['of_gemm']:.2f} of them, in "
      f"{r['device_launches']} device operations a clock; "
      f"from host batches (their U C and V copied in, {r['transfer']}) {r['received_seconds'] * 1e3:.3g} ms")
EOF
)"
  [ "$DEVICE" != cuda ] ||
    "$python" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["efficiency"] < 0.7)' "$work/rebuild.json"
}
# mpsOn: the private MPS daemon's folders in the environment, where the mps step started one.
mpsOn() {
  [ -f "$work/mps" ] || return 0
  export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
}
check_mps() {
  [ "$DEVICE" = cuda ] || skip "DEVICE=$DEVICE: a dry run"
  [ "$MPS" != off ] || skip "MPS=off: ranks sharing the GPU time-slice it"
  if pgrep -x nvidia-cuda-mps-control >/dev/null || [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    touch "$work/mps-external"
    figure "an MPS daemon runs already: the steps after this one share the GPU through it"
    return 0
  fi
  command -v nvidia-cuda-mps-control >/dev/null ||
    skip "no nvidia-cuda-mps-control on this host: ranks sharing the GPU time-slice it"
  mkdir -p "$work/mps-pipe" "$work/mps-log"
  export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
  nvidia-cuda-mps-control -d || skip "nvidia-cuda-mps-control -d refused to start: ranks sharing the GPU time-slice it"
  # A client that cannot reach the server may hang rather than fail: probed under a timeout.
  if timeout --kill-after=5 60 "$mpirun" -n 2 --oversubscribe "$orpheus" train --device cuda --progress off \
    --log-level warn --train "$data/train-images-idx3-ubyte.gz" --clocks 3 --batch 10 --eval-every 0; then
    touch "$work/mps"
    figure "a private MPS daemon serves the steps after this one (shared, lstm): their ranks share the GPU at once"
    return 0
  fi
  echo quit | nvidia-cuda-mps-control
  tail -n 5 "$work/mps-log/control.log" "$work/mps-log/server.log" 2>/dev/null
  skip "MPS started, but a 2-rank job under it failed or ran past 60 s (log: mps.log): ranks sharing the GPU time-slice it"
}
mpsState() { if [ -f "$work/mps" ] || [ -f "$work/mps-external" ]; then echo on; else echo off; fi; }
mpsOff() {
  [ -f "$work/mps" ] || return 0
  mpsOn
  echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  rm -f "$work/mps"
}
check_shared() {
  mpsOn
  "$python" -c 'import torch' || skip "no PyTorch"
  local target=0.85 clocks=400 every=25 torch_device=cuda
  if [ "$DEVICE" = cuda ]; then
    "$python" -c 'import torch; assert torch.cuda.is_available()' || skip "no PyTorch with CUDA"
  else
    target=0.75 clocks=200 torch_device=cpu
  fi
  local net=loopback
  if [ "$NET" = 1gbit ] || { [ "$NET" = auto ] && [ -f "$work/net" ]; }; then
    net=1gbit
    "$netcluster" up 4 --rate 1gbit || exit 1
    trap '"$netcluster" down >/dev/null 2>&1' EXIT
    # shellcheck disable=SC2207
    launch=($("$netcluster" mpirun-args))
    # The hosts are started through netcluster's agent, an ssh stand-in: the bundle's
    # env.sh turns Open MPI's rsh launcher off (a bare container has no ssh).
    export OMPI_MCA_plm=rsh
  fi
  mlp
  local common=(--test "$data/t10k-images-idx3-ubyte.gz" --model "$work/mlp.loss" --batch 100 --lr 0.1
    --optimizer nesterov --momentum 0.9 --clocks $clocks --eval-every $every --target-accuracy $target)
  train 4 best "${common[@]}" --sync sv --sv-rank 2 || exit 1
  train 4 dense "${common[@]}" --sync dense || exit 1
  # Orpheus's own PowerSGD (the factors' products resident): the engine's overhead against torch's hook.
  train 4 opsgd "${common[@]}" --sync powersgd --sv-rank 2 || exit 1
  local peer=(--device $torch_device --model mlp --hidden "$hidden" --data "$data" --batch 100 --lr 0.1 --nesterov 0.9
    --clocks $clocks --eval-every $every --target-accuracy $target)
  ddp ddp "${peer[@]}" || exit 1
  ddp powersgd "${peer[@]}" --peer powersgd --rank-r 2 || exit 1
  local best dense ddp psgd opsgd
  best=$(seconds "$work/best.jsonl" $target); dense=$(seconds "$work/dense.jsonl" $target)
  opsgd=$(seconds "$work/opsgd.jsonl" $target)
  ddp=$(seconds "$work/ddp.jsonl" $target); psgd=$(seconds "$work/powersgd.jsonl" $target)
  figure "seconds to $target, 4 ranks on one $DEVICE, $net, MPS $(mpsState): Orpheus --sv-rank 2 $best, Orpheus dense $dense," \
    "Orpheus --sync powersgd r2 $opsgd, DDP $ddp, PowerSGD r2 $psgd"
  figure "DDP / Orpheus best $(ratio "$ddp" "$best"), PowerSGD / Orpheus best $(ratio "$psgd" "$best"), DDP / Orpheus dense $(ratio "$ddp" "$dense")," \
    "PowerSGD / Orpheus powersgd $(ratio "$psgd" "$opsgd")"
  # Where an Orpheus clock goes (means from clock 2): the pass and the rank-2 power
  # iteration (compute, which includes select), the rebuild and step (update), the waits.
  local phase f; phase=""
  for f in clock_seconds compute_seconds select_seconds update_seconds wait_seconds data_wait_seconds; do
    phase+=" ${f%_seconds} $(mean "$work/best.jsonl" $f 2)"
  done
  figure "per clock, Orpheus --sv-rank 2 (s):$phase; dense: clock $(mean "$work/dense.jsonl" clock_seconds 2)"
  figure "bytes per clock: Orpheus best $(mean "$work/best.jsonl" bytes_sent), dense $(mean "$work/dense.jsonl" bytes_sent), DDP $(mean "$work/ddp.jsonl" bytes_sent), PowerSGD $(mean "$work/powersgd.jsonl" bytes_sent)"
  figure "per clock, all ranks: operations queued: best $(mean "$work/best.jsonl" launches 2), dense $(mean "$work/dense.jsonl" launches 2), powersgd $(mean "$work/opsgd.jsonl" launches 2); copies that blocked the host: best $(mean "$work/best.jsonl" blocking_copies 2), dense $(mean "$work/dense.jsonl" blocking_copies 2), powersgd $(mean "$work/opsgd.jsonl" blocking_copies 2)"
  [ "$best" != none ] && [ "$ddp" != none ]
}
check_lstm() {
  mpsOn
  "$python" -c 'import torch' || skip "no PyTorch"
  # At 1024 the example's uniform(0.1) and lr 0.1 diverge (dense as well as SV, on the CPU
  # too: the loss passes 40 within 25 clocks); uniform(0.03), about 1/sqrt(hidden) as
  # nn.LSTM's default, and lr 0.02 train steadily on both.
  local size=1024 clocks=${LSTM_CLOCKS:-150} every=25 torch_device=cuda init=0.03 lr=0.02
  [ "$DEVICE" = cuda ] || { size=32; clocks=${LSTM_CLOCKS:-10}; every=$clocks; torch_device=cpu; init=0.1 lr=0.1; }
  local corpus; corpus=$(kjvData "$kjv" kjv.train.tokens make_tokens.sh --vocab 2000 --steps 35) || exit $?
  sed -e "s/^dim embed = .*/dim embed = $size/" -e "s/^dim hidden = .*/dim hidden = $size/" \
    -e "s/uniform(0.1)/uniform($init)/" "$examples/lstm.loss" >"$work/lstm.loss"
  local common=(--model "$work/lstm.loss" --train "$corpus/kjv.train.tokens" --test "$corpus/kjv.valid.tokens"
    --batch 20 --clocks $clocks --lr $lr --eval-every $every)
  local -A flags=([dense]="--sync dense" [sv]="--sync sv"
    [best]="--sync sv --select 5 --multicast random --fanout 2 --consistency ssp --staleness 4 --average-every 50")
  local c
  for c in dense sv best; do
    "$mpirun" -n 4 --oversubscribe "$orpheus" train --device "$DEVICE" --seed 1 --progress off --log-level warn \
      "${common[@]}" ${flags[$c]} --metrics "$work/lstm-$c.jsonl" || exit 1
  done
  "$python" "$here/scripts/bench/lstm_torch.py" --ddp --ranks 4 --device $torch_device --train "$corpus/kjv.train.tokens" \
    --valid "$corpus/kjv.valid.tokens" --batch 20 --clocks $clocks --lr $lr --eval-every $every --embed $size \
    --hidden $size --init $init >"$work/lstm-torch.jsonl" || exit 1
  local finals="" worst=0 ppl secs
  for c in dense sv best torch; do
    read -r ppl secs < <(lastPerplexity "$work/lstm-$c.jsonl")
    finals+="${finals:+, }$c $(printf %.4g "$ppl") in $secs s"
    worst=$("$python" -c 'import sys; print(max(map(float, sys.argv[1:])))' "$worst" "$ppl")
  done
  figure "embed = hidden = $size, uniform($init), lr $lr, 4 ranks on one $DEVICE (MPS $(mpsState)), $clocks clocks: perplexity and training seconds: $finals"
  local theirs line="seconds to perplexity $(printf %.4g "$worst"):"
  theirs=$(seconds "$work/lstm-torch.jsonl" "$worst" perplexity)
  for c in dense sv best; do
    local ours; ours=$(seconds "$work/lstm-$c.jsonl" "$worst" perplexity)
    line+=" Orpheus $c $ours (torch / it $(ratio "$theirs" "$ours")),"
  done
  figure "$line torch $theirs"
  # Where an LSTM clock goes (means from clock 2; evaluations excluded), and what it queues:
  # the next device run says whether the pass, the exchange or the wait is what cuDNN's lead is made of.
  local phases f
  for c in dense sv best; do
    phases=""
    for f in clock_seconds compute_seconds select_seconds update_seconds wait_seconds data_wait_seconds; do
      phases+=" ${f%_seconds} $(mean "$work/lstm-$c.jsonl" $f 2)"
    done
    figure "per clock, Orpheus $c (s):$phases; operations queued $(mean "$work/lstm-$c.jsonl" launches 2), bytes sent $(mean "$work/lstm-$c.jsonl" bytes_sent 2)"
  done
  local step; step=$("$python" - "$work/lstm-torch.jsonl" <<'EOF'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
print(f"{r['seconds'] / r['clocks']:.4g}")
EOF
)
  figure "PyTorch: $step s a step (training seconds over steps)"
  cp "$work"/lstm-*.jsonl "$OUT/" 2>/dev/null || true
}

: >"$summary"
record "# gpu bench $(date -u +%FT%TZ), device $DEVICE, budget ${BUDGET}s, $(cat "${ORPHEUS_BUNDLE:-$here}/VERSION" 2>/dev/null || git -C "$here" rev-parse --short HEAD 2>/dev/null)"
step gpu 60 check_gpu
step transfer 150 check_transfer
step step 120 check_step
step netns 20 check_netns
step rebuild 60 check_rebuild
step select 90 check_select
step mps 75 check_mps
step shared 300 check_shared
[ -f "$work/net" ] && "$netcluster" down >/dev/null 2>&1  # where a timeout cut the step short
step lstm 240 check_lstm
mpsOff
record "total $(($(date +%s) - start))s of ${BUDGET}s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" --exclude=logs.tar.gz . 2>/dev/null
if [ "$DEVICE" = cuda ]; then cp "$summary" "$RESULTS"; fi
exit $failed
