#!/usr/bin/env bash
# expect_error.sh PATTERN FORBIDDEN_FILE -- command...
# Runs the command and passes when it exits with code 2 (or $EXPECT_CODE: 3 for a
# failed file operation), its stderr's first line
# starting "orpheus:" matches PATTERN (grep -E), it wrote exactly one such line,
# did not dump core, and FORBIDDEN_FILE (a model it must not write; "-" for none)
# does not exist afterwards.
set -u
pattern="$1"; forbidden="$2"; shift 3
err=$(mktemp); trap 'rm -f "$err"' EXIT
[ "$forbidden" != "-" ] && rm -f "$forbidden"
"$@" >/dev/null 2>"$err"
rc=$?
ours=$(grep -c '^orpheus:' "$err")
first=$(grep -m1 '^orpheus:' "$err")
echo "exit code: $rc"
echo "message: $first"
fail=0
want=${EXPECT_CODE:-2}
[ "$rc" -eq "$want" ] || { echo "FAIL: expected exit code $want"; fail=1; }
[ "$ours" -eq 1 ] || { echo "FAIL: expected exactly one 'orpheus:' line, got $ours"; cat "$err"; fail=1; }
echo "$first" | grep -Eq -- "$pattern" || { echo "FAIL: message does not match /$pattern/"; fail=1; }
grep -qi 'core dumped\|segmentation fault\|terminate called' "$err" && { echo "FAIL: crashed"; fail=1; }
if [ "$forbidden" != "-" ] && ls "$(dirname "$forbidden")" 2>/dev/null | grep -q "$(basename "$forbidden")"; then
  echo "FAIL: partial output file left: $(ls "$(dirname "$forbidden")")"; fail=1
fi
exit $fail
