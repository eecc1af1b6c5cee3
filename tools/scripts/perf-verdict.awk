# A perf tool's table under weftrun (rank 0's "[0] " lines): prints its rows,
# the rows with wrong values (out of place or in place), the first row's
# time and the last row's busbw (out of place); exits 1 when a value is
# wrong or there is no row. Used by gpu-check (coll_key) and
# device-emulated.sh: awk -f tools/scripts/perf-verdict.awk LOG
function size(b) {
  return b >= 1048576 ? sprintf("%.3g MiB", b / 1048576) : b >= 1024 ? sprintf("%.3g KiB", b / 1024) : b " B"
}
# hypercube_perf prints no redop (nccl-tests' shape): its columns from the
# type on come one place earlier
{ sub(/^\[0\] */, "") }
/^ *[0-9]+ +[0-9]+ / {
  k = NF == 12 ? -1 : 0
  if (!n) { first = $1; lat = $(6 + k) }
  n++; last = $1; bw = $(8 + k)
  if ($(9 + k) != 0 || ($(13 + k) != 0 && $(13 + k) != "N/A")) bad++
}
END {
  printf "%d rows, %d wrong, %s %s us, %s %s GB/s", n, bad, size(first), lat, size(last), bw
  exit bad > 0 || n == 0
}
