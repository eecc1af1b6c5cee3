#!/usr/bin/env bash
# NCCL_* logging variables reach weft's logging through libnccl.so.2, and a
# WEFT_* variable that is set wins over its NCCL_* alias.
#   test_env.sh WEFTRUN NCCL_TEST
set -uo pipefail
weftrun=$1 prog=$2
fail=0

expect() { # expect WHAT PATTERN OUTPUT
  if ! grep -qE "$2" <<<"$3"; then
    echo "FAIL: $1: no line matching '$2' in:"; echo "$3" | sed 's/^/  | /'
    fail=1
  fi
}
reject() { # reject WHAT PATTERN OUTPUT
  if grep -qE "$2" <<<"$3"; then
    echo "FAIL: $1: a line matches '$2':"; grep -E "$2" <<<"$3" | sed 's/^/  | /'
    fail=1
  fi
}

unset WEFT_DEBUG WEFT_DEBUG_SUBSYS WEFT_DEBUG_FILE

out=$(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
expect "NCCL_DEBUG=INFO prints the version" '^\[0\] NCCL version 2\.27\.7 \(weft ' "$out"
expect "NCCL_DEBUG=INFO gives weft INFO lines" 'weft INFO INIT' "$out"
reject "NCCL_DEBUG_SUBSYS=INIT keeps other subsystems quiet" 'weft INFO (BOOTSTRAP|SHM|COLL)' "$out"

out=$(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=^INIT "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "NCCL_DEBUG_SUBSYS=^INIT excludes INIT" 'weft INFO INIT' "$out"

out=$(NCCL_DEBUG=INFO WEFT_DEBUG=WARN "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "WEFT_DEBUG=WARN wins over NCCL_DEBUG=INFO" 'weft INFO' "$out"

out=$(NCCL_DEBUG=WARN "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "NCCL_DEBUG=WARN prints no version and no INFO" 'NCCL version|weft INFO' "$out"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$dir/log.%p" "$weftrun" -n 2 "$prog" --quick >/dev/null 2>&1 || fail=1
logs=$(cat "$dir"/log.* 2>/dev/null)
expect "NCCL_DEBUG_FILE names the log file" 'weft INFO' "$logs"

[ $fail -eq 0 ] && echo "NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE honoured"
exit $fail
