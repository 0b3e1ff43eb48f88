#!/usr/bin/env bash
# gpu.sh: Orpheus on one GPU against PyTorch on the same GPU, as one time-boxed script.
#
#   source bundle/env.sh && scripts/bench/gpu.sh     # on a GPU host, from a bundle
#   BUILD_DIR=build scripts/bench/gpu.sh             # from a build tree
#   DEVICE=strict scripts/bench/gpu.sh               # dry run here: the strict device
#                                                      stands in, small models, no PyTorch
# BUDGET (seconds, default 300) bounds the whole run: every step has a timeout, and a
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
#   netns     whether this host allows network namespaces and tc (scripts/netcluster.sh)
#   rebuild, shared, lstm   not prepared yet: SKIP with the reason
set -uo pipefail

BUDGET=${BUDGET:-300}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$PWD/gpu_bench_out}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS=${RESULTS:-$here/scripts/bench/results/gpu.md}
source "$here/scripts/gpu_steps.sh"
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3 || echo python3)
if [ "$DEVICE" = cuda ]; then hidden=2048; else hidden=64; fi
STEP_VARS=(orpheus compare examples mpirun data python work here DEVICE hidden)
mlp() {
  sed -e "s/^dim hidden1 = .*/dim hidden1 = $hidden/" -e "s/^dim hidden2 = .*/dim hidden2 = $hidden/" \
    "$examples/mlp.loss" >"$work/mlp.loss"
}
# train NP NAME FLAGS...: a job on $DEVICE, parameters in $work/NAME.h5, metrics in $work/NAME.jsonl.
train() {
  local np=$1 name=$2; shift 2
  "$mpirun" -n "$np" --oversubscribe "$orpheus" train --device "$DEVICE" --seed 7 --progress off --log-level warn \
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
check_step() {
  [ "$DEVICE" = cuda ] || skip "DEVICE=$DEVICE: PyTorch's side needs the GPU"
  "$python" -c 'import torch; assert torch.cuda.is_available()' || skip "no PyTorch with CUDA"
  mlp
  train 1 step --model "$work/mlp.loss" --clocks 60 --batch 100 --eval-every 0 --sync dense --overlap off || exit 1
  local ours; ours=$(mean "$work/step.jsonl" clock_seconds 11)
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
  figure "seconds per step: Orpheus $ours, PyTorch $theirs, ratio $ratio (goal <= 1.2)"
  "$python" -c "import sys; sys.exit(0 if float('$ratio') <= 1.2 else 1)"
}
check_netns() {
  command -v ip >/dev/null || skip "no ip(8)"
  local ns=orpheus_probe_$$
  if ip netns add "$ns" 2>/dev/null; then
    local tc=no; ip netns exec "$ns" tc qdisc add dev lo root tbf rate 1gbit burst 32kb latency 50ms 2>/dev/null && tc=yes
    ip netns del "$ns"
    figure "network namespaces: yes; tc rate limit: $tc"
  else
    figure "network namespaces: no (loopback only)"
  fi
}
not_prepared() { skip "not prepared yet"; }

: >"$summary"
record "# gpu bench $(date -u +%FT%TZ), device $DEVICE, budget ${BUDGET}s, $(git -C "$here" rev-parse --short HEAD 2>/dev/null)"
step gpu 60 check_gpu
step transfer 150 check_transfer
step step 120 check_step
step netns 20 check_netns
for s in rebuild shared lstm; do step "$s" 10 not_prepared; done
record "total $(($(date +%s) - start))s of ${BUDGET}s"
if [ "$DEVICE" = cuda ]; then cp "$summary" "$RESULTS"; fi
exit $failed
