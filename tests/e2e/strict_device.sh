#!/usr/bin/env bash
# strict_device.sh ORPHEUS COMPARE MPIEXEC NP CASE: the same job on --device cpu and
# on --device strict (ops/strict: the CPU backend behind memory that host code
# cannot touch between backend calls) ends with the same parameters, bit for bit:
# every rebuild and dense gradient reaches its operands through the backend seam,
# as a GPU needs. A stray host access would end the strict run with SIGSEGV.
# CASE: mlr (the built-in model, resident: SV, broadcast, sgd; restore --device strict
# equals the cpu restore), builtin (--model mlr named, resident: adam, a test set, the
# start-up line),
# mlp (selection by jmcss-gram on the device and restore of its log, random multicast, averaging and
# rotation, adam; --sv-rank), lstm (adagrad, resident,
# carried states, a test set, restore; --sync dense),
# dense (--sync dense with and without --overlap; --sync powersgd; one rank, dense and sv), sparse (LIBSVM rows, sparse V; --sync powersgd), tm (the
# topic model resident: its data-dependent variables' inner steps on the device, a test set),
# optimizers (examples/mlr.loss, the replica resident on the device, with each
# first-order optimizer; bfgs and dfp resident, within 1e-4 of the host's double
# steps, and restore of their logs), recovery (failures and the checkpoint log, resident), ssp (an SSP job
# resident, its replica against the host's replay of its log), transfer (an MLP's SVs
# staged to the host on the copy queue against blocking copies, streamed with
# --overlap and whole with --select: the same bits, and the metrics' transfer fields).
# Where the replica is resident (engine/worker/device_replica.h), the strict device
# also fills the host's mirror of the replica with NaN whenever it falls behind, so
# host code that reads the replica without bringing it up to date fails too.
set -euo pipefail
orpheus=$1; compare=$2; mpiexec=$3; np=$4; case=$5
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
fmnist=(--train "$data/train-images-idx3-ubyte.gz")
# With a test set: evaluation reads the replica on the host.
tested=(--test "$data/t10k-images-idx3-ubyte.gz")

# run NAME DEVICE FLAGS...: one training job, its parameters in $out/NAME-DEVICE.h5.
run() {
  local name=$1 device=$2; shift 2
  "$mpiexec" -n "$np" --oversubscribe "$orpheus" train --device "$device" --seed 7 --progress off \
    --log-level "${log_level:-warn}" \
    --save "$out/$name-$device.h5" --metrics "$out/$name-$device.jsonl" "$@"
  # The summary names the device the job ran on.
  grep -q "\"device\": *\"$device" "$out/$name-$device.jsonl" ||
    { echo "strict_device.sh: the $name job's summary does not name device $device" >&2; exit 1; }
}
# resident NAME: the strict run of NAME kept its replica on the device.
resident() {
  grep -q "\"device\": *\"strict[^\"]*(resident)\"" "$out/$1-strict.jsonl" ||
    { echo "strict_device.sh: the $1 job's replica was not resident on the strict device" >&2; exit 1; }
}
# losses FILE: every test loss a metrics file records (the evaluation clocks' and the summary's).
losses() { grep -o '"test_loss": *[^,}]*' "$1" | sed 's/.*: *//' | tr '\n' ' '; }
# scored NAME: the strict run's test losses, which must be numbers (evaluating a
# replica whose host mirror was left behind its device scores NaN).
scored() {
  local l; l=$(losses "$out/$1-strict.jsonl")
  case "$l" in ''|*[Nn]a[Nn]*|*inf*|*null*) echo "strict_device.sh: the $1 job's test losses are '$l'" >&2; exit 1 ;; esac
  echo "$l"
}
# inbound NAME: what crossed to the device in each clock after the first of NAME's
# strict run (device_in_bytes, both ranks), which must be 508240: MLR at batch 40 on
# 2 ranks, a rank's minibatch (784 x 40 floats, 125440 bytes) and one-hot labels
# (10 x 40, 1600), the peer's batch U C and V (1600 + 125440) and its bias update
# (40): 254120 a rank. The local batch's U and V are read where the pass made them,
# and its bias update is formed there (copied in again, they made it 762400). The
# data queue copies each clock's minibatch and labels in the clock before, so the
# last clock has neither: 254160.
inbound() {
  grep -o '"device_in_bytes": *[0-9]*' "$out/$1-strict.jsonl" | sed 's/.*: *//' | tail -n +2 |
    awk -v name="$1" '$1 != (NR < 19 ? 508240 : 254160) { print "strict_device.sh: " $1 " bytes crossed to the device in clock " NR + 1 " of " name; bad = 1 }
      END { if (NR != 19) { print "strict_device.sh: " NR + 1 " clocks of " name " report device_in_bytes"; bad = 1 }; exit bad }' >&2
}
# same NAME FLAGS...: the job on both devices, compared bitwise.
same() {
  local name=$1; shift
  for device in cpu strict; do run "$name" "$device" "$@"; done
  "$compare" "$out/$name-cpu.h5" "$out/$name-strict.h5" 0
}

case "$case" in
  mlr)
    for device in cpu strict; do
      run mlr "$device" "${fmnist[@]}" --clocks 30 --batch 50 --lr 0.1 --ckpt sv --ckpt-dir "$out/ck-$device"
      "$orpheus" restore --ckpt-dir "$out/ck-$device" --clock 20 --device "$device" --out "$out/r20-$device.h5"
    done
    "$compare" "$out/mlr-cpu.h5" "$out/mlr-strict.h5" 0
    "$compare" "$out/r20-cpu.h5" "$out/r20-strict.h5" 0
    # A strict restore of the cpu job's log gives the cpu restore's bits too.
    "$orpheus" restore --ckpt-dir "$out/ck-cpu" --clock 20 --device strict --out "$out/r20-cross.h5"
    "$compare" "$out/r20-cpu.h5" "$out/r20-cross.h5" 0
    resident mlr
    ;;
  builtin)
    # The built-in MLR runs examples/mlr.loss's graph (ops/mlr.h): resident on the
    # device, its test batches scored there, the start-up line saying so.
    for device in cpu strict; do
      log_level=info run builtin "$device" "${fmnist[@]}" "${tested[@]}" --model mlr --clocks 20 --batch 40 \
        --optimizer adam --eval-every 10 2>&1 | tee "$out/builtin-$device.log"
    done
    "$compare" "$out/builtin-cpu.h5" "$out/builtin-strict.h5" 0
    resident builtin
    inbound builtin
    grep -q "device strict.*(rank 0; resident: " "$out/builtin-strict.log" ||
      { echo "strict_device.sh: the built-in mlr's start-up line does not say resident" >&2; exit 1; }
    [ "$(scored builtin)" = "$(losses "$out/builtin-cpu.jsonl")" ] ||
      { echo "strict_device.sh: the builtin job's test loss differs between cpu and strict" >&2; exit 1; }
    ;;
  mlp)
    sed -e 's/^dim hidden1 = .*/dim hidden1 = 64/' -e 's/^dim hidden2 = .*/dim hidden2 = 32/' \
      "$here/../../examples/mlp.loss" >"$out/mlp.loss"
    for device in cpu strict; do
      run mlp "$device" "${fmnist[@]}" --model "$out/mlp.loss" --clocks 30 --batch 40 --select 10 --multicast random \
        --fanout 1 --average-every 10 --rotate-every 7 --optimizer adam --ckpt sv --ckpt-dir "$out/mlp-ck-$device" \
        --save-replicas "$out/mlp-live-$device"
    done
    "$compare" "$out/mlp-cpu.h5" "$out/mlp-strict.h5" 0
    resident mlp
    # --select-method jmcss-gram (the default) forms its Gram matrices on the device from
    # U and V where the pass left them: nothing more crosses in than under jmcss, which
    # selects on the host; only the Gram matrices come out. restore(30) of the job's
    # log, whose receivers' batches are selected again on the device, gives its bits.
    run mlp-host strict "${fmnist[@]}" --model "$out/mlp.loss" --clocks 30 --batch 40 --select 10 --multicast random \
      --fanout 1 --average-every 10 --rotate-every 7 --optimizer adam --select-method jmcss
    cmp <(grep -o '"device_in_bytes": *[0-9]*' "$out/mlp-strict.jsonl") \
      <(grep -o '"device_in_bytes": *[0-9]*' "$out/mlp-host-strict.jsonl") ||
      { echo "strict_device.sh: jmcss-gram copied more to the device than jmcss" >&2; exit 1; }
    "$orpheus" restore --ckpt-dir "$out/mlp-ck-strict" --clock 30 --replica 1 --device strict --out "$out/mlp-r30.h5" \
      >/dev/null
    "$compare" "$out/mlp-r30.h5" "$out/mlp-live-strict/replica-1.h5" 0
    # --sv-rank: the power iteration and its carried error on the device, reading U and
    # V where the pass left them. A clock brings in its minibatch, the rank-2 batches
    # and the basis, about 153 kB a rank (copying U and V in as well would add 158 kB),
    # and takes out M Q, Q', E's column norms and the bias updates, 12 kB a rank (U and
    # V, 158 kB, stay on the device: the host's copies would be NaN on this device).
    same mlp-rank "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 40 --sv-rank 2
    resident mlp-rank
    for way in in out; do
      grep -o "\"device_${way}_bytes\": *[0-9]*" "$out/mlp-rank-strict.jsonl" | sed 's/.*: *//' | tail -n +2 |
        awk -v way=$way -v most=$([ $way = in ] && echo 320000 || echo 50000) \
          '$1 > most { print "strict_device.sh: --sv-rank copied " $1 " bytes " way " at clock " NR + 1; bad = 1 }
          END { exit bad }' >&2
    done
    # Its carried error leaves the device for the checkpoint and comes back on --resume:
    # 10 clocks and a resume to 20 end bitwise as the uninterrupted run.
    log_level=error run mlp-rank-part strict "${fmnist[@]}" --model "$out/mlp.loss" --clocks 10 --batch 40 --sv-rank 2 \
      --ckpt sv --ckpt-dir "$out/rank-ck"
    log_level=error run mlp-rank-resumed strict "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 40 \
      --sv-rank 2 --ckpt sv --ckpt-dir "$out/rank-ck" --resume
    "$compare" "$out/mlp-rank-resumed-strict.h5" "$out/mlp-rank-strict.h5" 0
    ;;
  lstm)
    "$here/synthetic_tokens.sh" "$out/tokens"
    sed -e 's/^dim embed = .*/dim embed = 8/' -e 's/^dim hidden = .*/dim hidden = 8/' \
      "$here/../../examples/lstm.loss" >"$out/lstm.loss"
    "$here/synthetic_tokens.sh" "$out/test-tokens" 720
    # Resident on the strict device: the unrolled LSTM's passes, its carried states
    # between segments and its test batches; restore from the log as on the cpu.
    for device in cpu strict; do
      run lstm "$device" --model "$out/lstm.loss" --train "$out/tokens" --test "$out/test-tokens" --eval-every 10 \
        --clocks 20 --batch 4 --lr 0.05 --optimizer adagrad --ckpt sv --ckpt-dir "$out/ck-$device"
      "$orpheus" restore --ckpt-dir "$out/ck-$device" --clock 15 --device "$device" --out "$out/r15-$device.h5"
    done
    "$compare" "$out/lstm-cpu.h5" "$out/lstm-strict.h5" 0
    "$compare" "$out/r15-cpu.h5" "$out/r15-strict.h5" 0
    resident lstm
    # Without a test set, staged (the data queue on) and with blocking copies and no
    # data queue (--transfer sync): the same bits.
    for mode in staged sync; do
      run "lstm-$mode" strict --model "$out/lstm.loss" --train "$out/tokens" --clocks 20 --batch 4 --lr 0.05 \
        --optimizer adagrad --transfer "$mode"
    done
    "$compare" "$out/lstm-strict.h5" "$out/lstm-staged-strict.h5" 0
    "$compare" "$out/lstm-staged-strict.h5" "$out/lstm-sync-strict.h5" 0
    # --sync dense: each matrix's terms of every step summed as the host's rebuild sums
    # them (one product over the steps side by side, the token one-hots joined).
    same lstm-dense --model "$out/lstm.loss" --train "$out/tokens" --clocks 20 --batch 4 --lr 0.05 --sync dense
    resident lstm-dense
    # What the rebuild copies in each clock (h2d_bytes, both ranks): the peer's
    # batch, 6 steps of U (8 + 32 + 40 rows) and V (16 + 8 rows) at 4 columns,
    # 9984 bytes; its bias updates (6 x (32 + 40) floats, 1728); the E sites' sparse
    # V (48 columns, 580). The rank's own batch is read where the pass left it, and
    # its bias updates are formed there (copied in again, it made 48008).
    for job in lstm lstm-staged lstm-sync; do
      grep -o '"h2d_bytes": *[0-9]*' "$out/$job-strict.jsonl" | sed 's/.*: *//' |
        awk -v job="$job" '$1 != 2 * (9984 + 1728 + 580) { print "strict_device.sh: the " job " job copied " $1 " bytes in for the rebuild in clock " NR; bad = 1 }
          END { if (NR != 20) { print "strict_device.sh: " NR " clocks of " job " report h2d_bytes"; bad = 1 }; exit bad }' >&2
    done
    # SVs per step (--select-unit step): each parameter's steps as one entry, whose
    # local U and V are joined on the device; only the peer's bias updates differ in
    # size (one per entry, (32 + 40) floats a clock).
    same lstm-step --model "$out/lstm.loss" --train "$out/tokens" --clocks 12 --batch 4 --lr 0.05 \
      --optimizer adagrad --select-unit step
    grep -o '"h2d_bytes": *[0-9]*' "$out/lstm-step-strict.jsonl" | sed 's/.*: *//' |
      awk '$1 != 2 * (9984 + 288 + 580) { print "strict_device.sh: the lstm-step job copied " $1 " bytes in for the rebuild in clock " NR; bad = 1 }
        END { if (NR != 12) bad = 1; exit bad }' >&2
    # The data queue copies each clock's token one-hots (6 steps of E's sparse one
    # (52 bytes) and the label's dense one (640), 4152 a rank) in the clock before:
    # the last clock copies none, the sync job's every clock its own.
    for job in lstm-staged lstm-sync; do
      grep -o '"device_in_bytes": *[0-9]*' "$out/$job-strict.jsonl" | sed 's/.*: *//' | tail -n +2 |
        awk -v job="$job" -v last="$([ $job = lstm-staged ] && echo 0 || echo 1)" \
          '$1 != 2 * (9984 + 1728 + 580) + (NR < 19 || last ? 2 * 4152 : 0) { print "strict_device.sh: " $1 " bytes crossed to the device in clock " NR + 1 " of " job; bad = 1 }
          END { exit bad }' >&2
    done
    [ "$(scored lstm)" = "$(losses "$out/lstm-cpu.jsonl")" ] ||
      { echo "strict_device.sh: the lstm job's test loss differs between cpu and strict" >&2; exit 1; }
    ;;
  tm)
    # The topic model resident: each document's theta (a data-dependent variable)
    # comes to the device with its batch, takes its inner steps there and is kept
    # on the host; the test documents' are inferred afresh on the device.
    "$here/../../scripts/data/make_corpus.sh" "$out/kjv" --block 30 --vocab 200 >/dev/null
    for device in cpu strict; do
      run tm "$device" --model "$here/../../examples/tm.loss" --train "$out/kjv/kjv.train.libsvm" \
        --test "$out/kjv/kjv.test.libsvm" --clocks 30 --batch 20 --lr 10 --eval-every 10 --ckpt sv \
        --ckpt-dir "$out/ck-$device"
    done
    "$compare" "$out/tm-cpu.h5" "$out/tm-strict.h5" 0
    resident tm
    # Without a checkpoint folder (no membership watch) the data queue is on: each
    # batch and its documents' theta are copied ahead while the clock before computes
    # (the DDV swap queue's way in). The same bits.
    run tm-queued strict --model "$here/../../examples/tm.loss" --train "$out/kjv/kjv.train.libsvm" \
      --test "$out/kjv/kjv.test.libsvm" --clocks 30 --batch 20 --lr 10 --eval-every 10
    "$compare" "$out/tm-cpu.h5" "$out/tm-queued-strict.h5" 0
    [ "$(scored tm)" = "$(losses "$out/tm-cpu.jsonl")" ] ||
      { echo "strict_device.sh: the topic model's test loss differs between cpu and strict" >&2; exit 1; }
    ;;
  dense)
    same dense "${fmnist[@]}" --clocks 20 --batch 50 --lr 0.1 --sync dense --overlap off
    sed -e 's/^dim hidden1 = .*/dim hidden1 = 48/' -e 's/^dim hidden2 = .*/dim hidden2 = 24/' \
      "$here/../../examples/mlp.loss" >"$out/mlp.loss"
    # Resident too: each parameter's gradient to the host on the copy queue, its
    # all-reduce begun as it lands; folding (sgd) and a step from the buffer (adam).
    same dense-overlap "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 50 --lr 0.1 --sync dense --overlap on
    resident dense-overlap
    same dense-overlap-adam "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 50 --lr 0.01 --sync dense \
      --overlap on --optimizer adam
    resident dense-overlap-adam
    same dense-resident "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 50 --lr 0.1 --sync dense \
      --overlap off --optimizer nesterov --weight-decay 0.001
    resident dense-resident
    # The sums go back to the device on the copy queue: after the first clock (the
    # replica's upload) no copy makes the host wait but the loss row's (one a rank;
    # there were 7, one for each parameter's sum).
    for job in dense-overlap dense-resident; do
      grep -o '"blocking_copies": *[0-9]*' "$out/$job-strict.jsonl" | sed 's/.*: *//' | tail -n +2 |
        awk -v job=$job '$1 != 2 { print "strict_device.sh: " $1 " copies blocked the host in clock " NR + 1 " of " job; bad = 1 }
          END { if (NR != 19) bad = 1; exit bad }' >&2
    done
    # --sync powersgd: the gradient, its residual E and the factors' products stay on
    # the device; after the two clocks summed whole, only the factors P and Q and the
    # biases come to the host for the all-reduces: 8 kB a rank, not the 156 kB gradient.
    same powersgd "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 50 --lr 0.1 --sync powersgd --sv-rank 2
    resident powersgd
    grep -o '"device_out_bytes": *[0-9]*' "$out/powersgd-strict.jsonl" | sed 's/.*: *//' | tail -n +3 |
      awk '$1 > 2 * 20000 { print "strict_device.sh: --sync powersgd copied " $1 " bytes out in clock " NR + 2; bad = 1 }
        END { exit bad }' >&2
    # Its factors cross asynchronously through one staging buffer: after the first
    # clock only the loss row's copy blocks the host (there were 22 a rank).
    grep -o '"blocking_copies": *[0-9]*' "$out/powersgd-strict.jsonl" | sed 's/.*: *//' | tail -n +2 |
      awk '$1 != 2 { print "strict_device.sh: --sync powersgd: " $1 " copies blocked the host in clock " NR + 1; bad = 1 }
        END { if (NR != 19) bad = 1; exit bad }' >&2
    # One rank: no collective, so the gradient stays on the device. Folding (sgd) and
    # a step from the gradient buffer (adam), both bitwise the host's; in no clock
    # does more than the loss come back (a gradient of MLP 784-48-24-10 is 155,944 bytes).
    for opt in sgd adam; do
      np=1 same dense-one-$opt "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 50 --lr 0.01 --sync dense \
        --overlap off --optimizer $opt
      resident dense-one-$opt
      grep -o '"device_out_bytes": *[0-9]*' "$out/dense-one-$opt-strict.jsonl" | sed 's/.*: *//' |
        awk -v o=$opt '$1 > 1024 { print "strict_device.sh: " $1 " bytes came back from the device in clock " NR " (" o ", one rank)"; bad = 1 }
          END { if (NR < 20) { print "strict_device.sh: " NR " clocks report device_out_bytes"; bad = 1 }; exit bad }' >&2
    done
    # --sync sv on one rank with nothing to send, select, round or log: the rebuild
    # reads U and V where the pass left them, and no clock copies more than the
    # loss back (each copied its U and V: 30,800 bytes and the loss).
    np=1 same sv-one "${fmnist[@]}" --model "$out/mlp.loss" --clocks 20 --batch 50 --lr 0.01 --sync sv
    resident sv-one
    grep -o '"device_out_bytes": *[0-9]*' "$out/sv-one-strict.jsonl" | sed 's/.*: *//' |
      awk '$1 > 1024 { print "strict_device.sh: " $1 " bytes came back from the device in clock " NR " (--sync sv, one rank)"; bad = 1 }
        END { if (NR < 20) { print "strict_device.sh: " NR " clocks report device_out_bytes"; bad = 1 }; exit bad }' >&2
    # --sv-rank on one rank reads U and V on the device too.
    np=1 same sv-rank-one "${fmnist[@]}" --model "$out/mlp.loss" --clocks 10 --batch 50 --lr 0.01 --sync sv --sv-rank 2
    ;;
  optimizers)
    mlr="$here/../../examples/mlr.loss"
    same sgd "${fmnist[@]}" --model "$mlr" --clocks 20 --batch 40 --lr 0.1
    same momentum "${fmnist[@]}" --model "$mlr" --clocks 20 --batch 40 --optimizer momentum --lr-schedule cosine
    same nesterov "${fmnist[@]}" --model "$mlr" --clocks 20 --batch 40 --optimizer nesterov --weight-decay 0.01
    same adagrad "${fmnist[@]}" --model "$mlr" --clocks 20 --batch 40 --optimizer adagrad
    same adam "${fmnist[@]}" --model "$mlr" --clocks 20 --batch 40 --optimizer adam --weight-decay 0.001
    for name in sgd momentum nesterov adagrad adam; do resident "$name"; done
    # --resident off: the rebuild alone on the device, W copied in and out; the same bits.
    run adam-off strict "${fmnist[@]}" --model "$mlr" --clocks 20 --batch 40 --optimizer adam --weight-decay 0.001 \
      --resident off
    if grep -q '(resident)' "$out/adam-off-strict.jsonl"; then
      echo "strict_device.sh: --resident off kept the replica on the device" >&2; exit 1
    fi
    "$compare" "$out/adam-cpu.h5" "$out/adam-off-strict.h5" 0
    # What crosses to the host each clock (device_out_bytes, both ranks): resident,
    # the batch's U and loss row, far less than one replica (W and b, 7850 floats
    # = 31400 bytes); with --resident off, W on its way back, on each rank.
    outs() { grep -o '"device_out_bytes": *[0-9]*' "$1" | sed 's/.*: *//'; }
    [ "$(outs "$out/adam-strict.jsonl" | wc -l)" -eq 20 ] ||
      { echo "strict_device.sh: the resident job's clocks do not all report device_out_bytes" >&2; exit 1; }
    outs "$out/adam-strict.jsonl" | awk '$1 >= 31400 { print "strict_device.sh: " $1 " bytes left the device in a resident clock"; bad = 1 } END { exit bad }' >&2
    inbound adam
    outs "$out/adam-off-strict.jsonl" | awk '$1 < 2 * 31360 { print "strict_device.sh: only " $1 " bytes left the device with --resident off"; bad = 1 } END { exit bad }' >&2
    # Quasi-Newton, resident: W and the pair on the device in float, the host's step
    # in double, so equal up to rounding; the strict job's restore is bitwise its replica.
    qn=(--train synthetic:examples=400,features=20,classes=3 --batch 200 --clocks 30 --weight-decay 0.001)
    for method in bfgs dfp; do
      for device in cpu strict; do
        run "$method" "$device" "${qn[@]}" --optimizer "$method" --ckpt sv --ckpt-dir "$out/ck-$method-$device"
      done
      resident "$method"
      "$compare" "$out/$method-cpu.h5" "$out/$method-strict.h5" 1e-4
      "$orpheus" restore --ckpt-dir "$out/ck-$method-strict" --clock 30 --device strict --out "$out/r-$method.h5" \
        >/dev/null
      "$compare" "$out/r-$method.h5" "$out/$method-strict.h5" 0
    done
    ;;
  recovery)
    sed -e 's/^dim hidden1 = .*/dim hidden1 = 32/' -e 's/^dim hidden2 = .*/dim hidden2 = 16/' \
      "$here/../../examples/mlp.loss" >"$out/mlp.loss"
    for device in cpu strict; do
      run recovery "$device" "${fmnist[@]}" "${tested[@]}" --model "$out/mlp.loss" --clocks 30 --batch 30 --optimizer momentum \
        --eval-every 10 --fail-prob 0.08 --ckpt sv --ckpt-dir "$out/ck-$device"
      "$orpheus" restore --ckpt-dir "$out/ck-$device" --clock 25 --device "$device" --out "$out/r25-$device.h5"
    done
    grep -q '"failures": *[1-9]' "$out/recovery-strict.jsonl" ||
      { echo "strict_device.sh: no failure was injected in the recovery job" >&2; exit 1; }
    "$compare" "$out/recovery-cpu.h5" "$out/recovery-strict.h5" 0
    "$compare" "$out/r25-cpu.h5" "$out/r25-strict.h5" 0
    resident recovery
    # Evaluation scored the same replica on both devices.
    [ "$(scored recovery)" = "$(losses "$out/recovery-cpu.jsonl")" ] ||
      { echo "strict_device.sh: the recovery job's test loss differs between cpu and strict" >&2; exit 1; }
    ;;
  ssp)
    # Under SSP arrival order varies from run to run: the resident replica is held to
    # the host's replay of its own log instead (restore --device cpu of the last clock).
    sed -e 's/^dim hidden1 = .*/dim hidden1 = 32/' -e 's/^dim hidden2 = .*/dim hidden2 = 16/' \
      "$here/../../examples/mlp.loss" >"$out/mlp.loss"
    run ssp strict "${fmnist[@]}" "${tested[@]}" --model "$out/mlp.loss" --clocks 30 --batch 30 --consistency ssp --staleness 2 \
      --multicast random --fanout 1 --optimizer adam --eval-every 10 --ckpt sv --ckpt-dir "$out/ck"
    "$orpheus" restore --ckpt-dir "$out/ck" --clock 30 --device cpu --out "$out/r30-cpu.h5"
    "$compare" "$out/ssp-strict.h5" "$out/r30-cpu.h5" 0
    resident ssp
    scored ssp >/dev/null
    ;;
  transfer)
    sed -e 's/^dim hidden1 = .*/dim hidden1 = 64/' -e 's/^dim hidden2 = .*/dim hidden2 = 32/' \
      "$here/../../examples/mlp.loss" >"$out/mlp.loss"
    mlp=("${fmnist[@]}" --model "$out/mlp.loss" --clocks 12 --batch 40 --optimizer momentum)
    for mode in staged sync; do
      run "stream-$mode" strict "${mlp[@]}" --overlap on --transfer "$mode"
      run "select-$mode" strict "${mlp[@]}" --select 10 --transfer "$mode"
    done
    run stream cpu "${mlp[@]}" --overlap on
    "$compare" "$out/stream-cpu.h5" "$out/stream-staged-strict.h5" 0
    "$compare" "$out/stream-staged-strict.h5" "$out/stream-sync-strict.h5" 0
    "$compare" "$out/select-staged-strict.h5" "$out/select-sync-strict.h5" 0
    resident stream-staged
    # Every clock says how its SVs crossed and what moved: to the host each site's U
    # and its V where the pass made it, 4 x 40 x (10 + 32 + 32 + 64 + 64) bytes a rank
    # (the first layer's V is the minibatch, already on the host); to the device the
    # peer's batch for the rebuild. The strict device runs a copy when it is waited
    # for, after the pass, so none of it is hidden there.
    for job in stream-staged stream-sync select-staged select-sync; do
      mode=${job#*-}; file="$out/$job-strict.jsonl"
      n=$(grep -c '"clock"' "$file")
      for field in "\"transfer\": *\"$mode\"" '"d2h_bytes": *64640[,}]' '"h2d_bytes": *[1-9]' \
        '"transfer_hidden_share": *0[,}]'; do
        [ "$(grep -c "$field" "$file")" -eq "$n" ] ||
          { echo "strict_device.sh: not every clock of $job has $field" >&2; exit 1; }
      done
    done
    # The rebuild's bytes are the same, clock by clock, staged or copied at once.
    for job in stream select; do
      [ "$(grep -o '"h2d_bytes": *[0-9]*' "$out/$job-staged-strict.jsonl")" = \
        "$(grep -o '"h2d_bytes": *[0-9]*' "$out/$job-sync-strict.jsonl")" ] ||
        { echo "strict_device.sh: $job copies other h2d_bytes staged than sync" >&2; exit 1; }
    done
    if grep -q '"transfer"' "$out/stream-cpu.jsonl"; then
      echo "strict_device.sh: a cpu job reports a device transfer" >&2; exit 1
    fi
    ;;
  sparse)
    # 900 rows of 300 features, about 12 nonzeros each, 6 classes.
    awk 'BEGIN { s = 99; for (r = 0; r < 900; r++) { s = (s * 1103515245 + 12345) % 2147483648
        line = (s % 6) ""; f = 0
        for (k = 0; k < 12; k++) { s = (s * 1103515245 + 12345) % 2147483648; f += 1 + s % 24
          if (f > 300) break; line = line " " f ":" (s % 1000) / 1000 }
        print line } }' >"$out/rows.libsvm"
    same sparse --train "$out/rows.libsvm" --clocks 30 --batch 30 --lr 1.0
    resident sparse
    # --sync powersgd reduces the dense gradient sparse rows give (W 6 x 300 compressed at rank 2).
    same sparse-powersgd --train "$out/rows.libsvm" --clocks 30 --batch 30 --lr 1.0 --sync powersgd --sv-rank 2
    ;;
  *) echo "strict_device.sh: unknown case '$case'" >&2; exit 2 ;;
esac
