#!/usr/bin/env bash
# NCCL_* variables through libnccl.so.2: the logging ones reach weft's
# logging (a WEFT_* variable that is set wins over its NCCL_* alias), and
# NCCL_COMM_ID gives every rank the same id without passing one around.
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
expect "NCCL_DEBUG=INFO prints the version" '^\[0\] NCCL version 2\.32\.3 \(weft ' "$out"
expect "NCCL_DEBUG=INFO gives weft INFO lines" 'weft INFO INIT' "$out"
reject "NCCL_DEBUG_SUBSYS=INIT keeps other subsystems quiet" 'weft INFO (BOOTSTRAP|SHM|COLL)' "$out"

out=$(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=^INIT "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "NCCL_DEBUG_SUBSYS=^INIT excludes INIT" 'weft INFO INIT' "$out"

out=$(NCCL_DEBUG=INFO WEFT_DEBUG=WARN "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "WEFT_DEBUG=WARN wins over NCCL_DEBUG=INFO" 'weft INFO' "$out"

out=$(NCCL_DEBUG=WARN "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "NCCL_DEBUG=WARN prints no version and no INFO" 'NCCL version|weft INFO' "$out"
expect "NCCL_DEBUG=WARN shows a refused call, as NCCL's" \
  'weft WARN .*invalid argument: ncclGetVersion: version is NULL' "$out"
out=$(env -u NCCL_DEBUG -u WEFT_DEBUG "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "without NCCL_DEBUG a refused call prints nothing, as NCCL's" 'version is NULL' "$out"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$dir/log.%p" "$weftrun" -n 2 "$prog" --quick >/dev/null 2>&1 || fail=1
logs=$(cat "$dir"/log.* 2>/dev/null)
expect "NCCL_DEBUG_FILE names the log file" 'weft INFO' "$logs"

# NCCL's configuration file (NCCL_CONF_FILE; ~/.nccl.conf and /etc/nccl.conf otherwise):
# its settings apply where the environment has none, comments and lines without '=' skipped
printf '# a comment line\nNCCL_DEBUG=INFO\nno equals sign here\nNCCL_DEBUG_SUBSYS=INIT\n' >"$dir/nccl.conf"
out=$(env -u NCCL_DEBUG -u NCCL_DEBUG_SUBSYS NCCL_CONF_FILE="$dir/nccl.conf" \
  "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
expect "NCCL_CONF_FILE's NCCL_DEBUG=INFO prints the version" '^\[0\] NCCL version 2\.32\.3 \(weft ' "$out"
expect "NCCL_CONF_FILE's NCCL_DEBUG=INFO gives weft INFO lines" 'weft INFO INIT' "$out"
reject "NCCL_CONF_FILE's NCCL_DEBUG_SUBSYS=INIT keeps other subsystems quiet" \
  'weft INFO (BOOTSTRAP|SHM|COLL)' "$out"
out=$(env -u NCCL_DEBUG_SUBSYS NCCL_DEBUG=WARN NCCL_CONF_FILE="$dir/nccl.conf" \
  "$weftrun" -n 2 "$prog" --quick 2>&1) || fail=1
reject "the environment's NCCL_DEBUG=WARN wins over the file's INFO" 'NCCL version|weft INFO' "$out"

# A fixed port is the point of NCCL_COMM_ID. Take one below the kernel's ephemeral range, where
# no outgoing connection of a test running beside this one can hold it, and take another if a
# listener has it all the same.
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
for try in 1 2 3 4 5; do
  port=$((10000 + RANDOM % (low - 10000)))
  out=$(NCCL_COMM_ID=127.0.0.1:$port "$weftrun" -n 3 "$prog" --comm-id 2>&1) && break
  case "$out" in *"Address already in use"*) continue ;; esac
  fail=1
  break
done
expect "NCCL_COMM_ID: ranks join without an exchanged id" 'NCCL_COMM_ID: 3 ranks joined' "$out"
out=$(NCCL_COMM_ID=nonsense "$weftrun" -n 2 "$prog" --comm-id 2>&1) && fail=1
expect "a bad NCCL_COMM_ID is refused with a reason" 'NCCL_COMM_ID=nonsense: expected host:port' "$out"

[ $fail -eq 0 ] && echo "NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE, NCCL_CONF_FILE and NCCL_COMM_ID honoured"
exit $fail
