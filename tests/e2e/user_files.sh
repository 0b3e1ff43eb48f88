#!/usr/bin/env bash
# user_files.sh ORPHEUS MPIEXEC FIXTURES: the engine never destroys a user's files
# and refuses, before the first clock, what it could not honour: outputs that are
# devices, directories, inputs or each other; unwritable outputs; a checkpoint
# directory of another job; a resume with changed flags; unknown or repeated config keys;
# numbers that are not numbers; inputs that are devices or pipes, and outputs that would
# replace a config file, a trace or an input. Each refusal is one line and exit 2.
set -uo pipefail
orpheus=$1; mpiexec=$2; fix=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
train="$fix/small.libsvm"
base=(train --progress off --clocks 6 --batch 2 --train "$train")
fail=0

# refuse NAME PATTERN CMD...: CMD exits 2 with one "orpheus:" line matching PATTERN.
refuse() {
  local name=$1 pattern=$2; shift 2
  local err="$out/$name.err"
  timeout 60 "$@" >"$out/$name.out" 2>"$err"
  local code=$?
  local lines; lines=$(grep -c '^orpheus:' "$err")
  if [ $code -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qE -- "$pattern" "$err"; then
    echo "FAIL $name: exit $code, $lines orpheus lines, expected /$pattern/:"; cat "$err"; fail=1
  else
    echo "ok   $name: $(grep '^orpheus:' "$err")"
  fi
}
np2=("$mpiexec" -n 2 --oversubscribe "$orpheus")

# 1. --save never replaces a device, a link, an input or another output.
refuse save_device "--save '/dev/full' is not a regular file" "$orpheus" "${base[@]}" --save /dev/full
[ -c /dev/full ] || { echo "FAIL /dev/full is no longer a device"; fail=1; }
cp "$train" "$out/train.libsvm"; before=$(sha256sum <"$out/train.libsvm")
refuse save_is_train "same file as --train" "$orpheus" "${base[@]/$train/$out/train.libsvm}" --save "$out/train.libsvm"
ln -s "$out/train.libsvm" "$out/link.h5"
refuse save_link_to_train "same file as --train" "$orpheus" "${base[@]/$train/$out/train.libsvm}" --save "$out/link.h5"
[ "$(sha256sum <"$out/train.libsvm")" = "$before" ] || { echo "FAIL the training file changed"; fail=1; }
refuse save_is_metrics "are the same path" "$orpheus" "${base[@]}" --save "$out/m" --metrics "$out/m"
# A link is followed: the file it names is written, the link stays.
ln -s "$out/real.h5" "$out/latest.h5"
if timeout 60 "${np2[@]}" "${base[@]}" --save "$out/latest.h5" >/dev/null 2>&1 && [ -L "$out/latest.h5" ] &&
   [ -s "$out/real.h5" ]; then echo "ok   save_through_link"; else echo "FAIL save_through_link"; fail=1; fi

# 3. Unwritable outputs are found before training: no metrics line is written.
refuse save_in_proc "cannot write to directory '/proc'" "$orpheus" "${base[@]}" --save /proc/x.h5 --metrics "$out/m3"
[ ! -s "$out/m3" ] || { echo "FAIL metrics written before the refusal"; fail=1; }
mkdir "$out/adir"
refuse save_is_dir "is a directory" "$orpheus" "${base[@]}" --save "$out/adir"
refuse replicas_in_proc "--save-replicas '/proc/r'" "$orpheus" "${base[@]}" --save-replicas /proc/r

# 2. A checkpoint directory belongs to one job.
timeout 60 "${np2[@]}" "${base[@]}" --ckpt sv --ckpt-dir "$out/ck" >/dev/null 2>&1 || { echo "FAIL first job"; fail=1; }
job=$(sha256sum <"$out/ck/job.h5")
refuse ckpt_taken "not empty \(a checkpoint\).*--resume.*--overwrite" "${np2[@]}" "${base[@]}" --ckpt sv --ckpt-dir "$out/ck"
[ "$(sha256sum <"$out/ck/job.h5")" = "$job" ] || { echo "FAIL job.h5 was rewritten"; fail=1; }
if timeout 60 "${np2[@]}" "${base[@]}" --ckpt sv --ckpt-dir "$out/ck" --overwrite --lr 0.05 >"$out/overwrite.log" 2>&1; then
  echo "ok   ckpt_overwrite"; else echo "FAIL ckpt_overwrite (exit $?):"; tail -n 20 "$out/overwrite.log"; fail=1; fi

# 5. --resume continues the same computation or names what changed.
timeout 60 "${np2[@]}" "${base[@]}" --ckpt sv --ckpt-dir "$out/r" >/dev/null 2>&1
refuse resume_lr "--lr differs.*it was 0.1 and is now 0.2" "${np2[@]}" "${base[@]}" --ckpt-dir "$out/r" --resume --lr 0.2
refuse resume_np "number of ranks \(mpirun -np\) differs" "$orpheus" "${base[@]}" --ckpt-dir "$out/r" --resume
cp "$train" "$out/other.libsvm"; echo "1 1:0.5" >>"$out/other.libsvm"
refuse resume_data "--train differs.*contents changed" "${np2[@]}" "${base[@]/$train/$out/other.libsvm}" --ckpt-dir "$out/r" --resume
refuse resume_overwrite "give one" "${np2[@]}" "${base[@]}" --ckpt-dir "$out/r" --resume --overwrite
if timeout 60 "${np2[@]}" "${base[@]/#6/9}" --ckpt-dir "$out/r" --resume >"$out/more.log" 2>&1; then
  echo "ok   resume_more_clocks"; else echo "FAIL resume_more_clocks (exit $?):"; tail -n 20 "$out/more.log"; fail=1; fi

# 6. Config files: unknown keys and sections, keys outside [train], a key or section twice, garbage.
printf 'clocks = 5\n' >"$out/top.ini"
refuse config_top_level "'clocks' is not a flag" "$orpheus" --config "$out/top.ini" "${base[@]}"
printf '[train]\nclokcs = 5\n' >"$out/typo.ini"
refuse config_typo "'train.clokcs' is not a flag" "$orpheus" --config "$out/typo.ini" "${base[@]}"
printf '[train]\nthis is not a setting\n' >"$out/garbage.ini"
refuse config_garbage "is not a flag" "$orpheus" --config "$out/garbage.ini" "${base[@]}"
printf '[train]\nlr = 0.3\nclocks = 5\nlr = 0.7\n' >"$out/twice.ini"
refuse config_key_twice "--config: 'train.lr' is given twice" "$orpheus" --config "$out/twice.ini" "${base[@]}"
printf '[train]\nlr = 0.3\n[train]\nclocks = 5\n' >"$out/section_twice.ini"
refuse config_section_twice "--config: section \[train\] is given twice" "$orpheus" --config "$out/section_twice.ini" \
  "${base[@]}"
printf '[trian]\nlr = 0.3\n' >"$out/section.ini"
refuse config_section "--config: \[trian\] is not a command" "$orpheus" --config "$out/section.ini" "${base[@]}"

# 7. Inputs are regular files: a device or a pipe (which may never end, or never open) is
# refused, not read; a config file or a trace past its bound is refused.
mkfifo "$out/fifo"
refuse config_device "--config '/dev/zero' is not a regular file" "$orpheus" --config /dev/zero "${base[@]}"
refuse config_fifo "--config '.*fifo' is not a regular file" "$orpheus" --config "$out/fifo" "${base[@]}"
refuse config_fifo_equals "--config '.*fifo' is not a regular file" "$orpheus" "--config=$out/fifo" "${base[@]}"
head -c $((2 << 20)) /dev/zero | tr '\0' '#' >"$out/big.ini"
refuse config_too_big "--config '.*big.ini' holds 2097152 bytes, more than the 1 MiB" "$orpheus" --config "$out/big.ini" \
  "${base[@]}"
adapt=(--adapt --adapt-every 2)
refuse trace_device "--adapt-trace '/dev/zero' is not a regular file" "$orpheus" "${base[@]}" "${adapt[@]}" \
  --adapt-trace /dev/zero
refuse trace_fifo "--adapt-trace '.*fifo' is not a regular file" "${np2[@]}" "${base[@]}" "${adapt[@]}" \
  --adapt-trace "$out/fifo"
refuse trace_fifo_simulate "--adapt-trace '.*fifo' is not a regular file" "$orpheus" simulate --ranks 2 \
  "${base[@]:1}" "${adapt[@]}" --adapt-trace "$out/fifo"
refuse train_device "--train '/dev/zero' is not a regular file" "$orpheus" "${base[@]/$train//dev/zero}"
refuse test_fifo "--test '.*fifo' is not a regular file" "${np2[@]}" "${base[@]}" --test "$out/fifo"

# 8. No output replaces the config file, the --adapt-trace or a file --save-replicas would write.
cp "$fix/../adapt/e2e_trace.jsonl" "$out/trace.jsonl"; trace_before=$(sha256sum <"$out/trace.jsonl")
refuse metrics_is_trace "--metrics '.*trace.jsonl' is the same file as --adapt-trace" "$orpheus" "${base[@]}" \
  "${adapt[@]}" --adapt-trace "$out/trace.jsonl" --metrics "$out/trace.jsonl"
refuse save_is_trace "--save '.*trace.jsonl' is the same file as --adapt-trace" "${np2[@]}" "${base[@]}" \
  "${adapt[@]}" --adapt-trace "$out/trace.jsonl" --save "$out/trace.jsonl"
refuse simulate_metrics_is_trace "--metrics '.*trace.jsonl' is the same file as --adapt-trace" "$orpheus" simulate \
  --ranks 2 "${base[@]:1}" "${adapt[@]}" --adapt-trace "$out/trace.jsonl" --metrics "$out/trace.jsonl"
[ "$(sha256sum <"$out/trace.jsonl")" = "$trace_before" ] || { echo "FAIL the trace changed"; fail=1; }
printf '[train]\nlr = 0.1\n' >"$out/c.ini"; config_before=$(sha256sum <"$out/c.ini")
refuse metrics_is_config "--metrics '.*c.ini' is the same file as --config" "$orpheus" --config "$out/c.ini" \
  "${base[@]}" --metrics "$out/c.ini"
refuse save_is_config "--save '.*c.ini' is the same file as --config" "${np2[@]}" --config "$out/c.ini" "${base[@]}" \
  --save "$out/c.ini"
printf '[restore]\nreplica = 0\n' >"$out/rc.ini"; restore_before=$(sha256sum <"$out/rc.ini")
refuse restore_out_is_config "--out '.*rc.ini' is the same file as --config" "$orpheus" --config "$out/rc.ini" restore \
  --ckpt-dir "$out/r" --out "$out/rc.ini"
[ "$(sha256sum <"$out/c.ini")" = "$config_before" ] && [ "$(sha256sum <"$out/rc.ini")" = "$restore_before" ] ||
  { echo "FAIL a config file changed"; fail=1; }
mkdir -p "$out/reps"; cp "$train" "$out/reps/replica-0.h5"; reps_before=$(sha256sum <"$out/reps/replica-0.h5")
refuse replicas_over_train "--train '.*reps/replica-0.h5' is a file --save-replicas '.*reps' writes \(replica-\*.h5\)" \
  "$orpheus" "${base[@]/$train/$out/reps/replica-0.h5}" --format libsvm --save-replicas "$out/reps"
[ "$(sha256sum <"$out/reps/replica-0.h5")" = "$reps_before" ] || { echo "FAIL the training file changed"; fail=1; }
# Other files in that directory are no output of the job: reading one is fine.
cp "$train" "$out/reps/data.libsvm"
if timeout 60 "$orpheus" "${base[@]/$train/$out/reps/data.libsvm}" --save-replicas "$out/reps" >"$out/reps.log" 2>&1 &&
  [ -f "$out/reps/replica-0.h5" ] && [ -f "$out/reps/data.libsvm" ]; then
  echo "ok   replicas_beside_train"; else echo "FAIL replicas_beside_train (exit $?):"; tail -n 20 "$out/reps.log"; fail=1; fi

# 9. --resume continues an SV log: --ckpt none or matrix beside it is a contradiction, named.
refuse resume_ckpt_none "--ckpt none and --resume contradict each other" "$orpheus" "${base[@]}" --ckpt none \
  --ckpt-dir "$out/r" --resume
refuse resume_none_after "--ckpt none and --resume contradict each other" "$orpheus" "${base[@]}" --resume \
  --ckpt-dir "$out/r" --ckpt none
refuse resume_ckpt_matrix "a --ckpt matrix checkpoint cannot be resumed" "$orpheus" "${base[@]}" --ckpt matrix \
  --ckpt-dir "$out/r" --resume

# 10. Numbers are numbers, whole, finite and in range.
refuse timeout_inf "--timeout: expected a number" "$orpheus" "${base[@]}" --timeout inf
refuse timeout_huge "--timeout: must be a number" "$orpheus" "${base[@]}" --timeout 1e10
refuse lr_inf "--lr: expected a number" "$orpheus" "${base[@]}" --lr inf
refuse clocks_float "--clocks: expected an integer" "$orpheus" "${base[@]}" --clocks 1e20
refuse restore_clock_float "--clock: expected an integer" "$orpheus" restore --ckpt-dir "$out/r" --clock 1e2 --out "$out/x.h5"
refuse restore_clock_suffix "--clock: expected an integer" "$orpheus" restore --ckpt-dir "$out/r" --clock 75abc --out "$out/x.h5"
refuse restore_clock_negative "--clock: must be an integer" "$orpheus" restore --ckpt-dir "$out/r" --clock -1 --out "$out/x.h5"
exit $fail
