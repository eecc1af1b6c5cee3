#!/usr/bin/env bash
# weft-train on the GPU (--device cuda) against the same run on the host:
# the same options, the same ranks, the same data. A transformer's every
# step and validation loss must agree within 1e-3 relative (its products
# sum in another order on the GPU); the MLP's final parameter norm within
# 1e-6 relative (tanhf may differ in its last bit). Prints one line: what
# was compared and the largest difference. Used by tools/scripts/gpu-check.sh
# (weft_train_device) and, on cuda_emu's threads, by device-emulated.sh.
# Usage: tools/scripts/train-device-match.sh BUILD_DIR TAG NRANKS [weft-train options]
# Logs: $TRAIN_MATCH_LOGS (default BUILD_DIR)/train-match.TAG.{host,cuda}.
# Environment: TRAIN_MATCH_TIMEOUT, seconds for each run (default 300);
# TRAIN_MATCH_GEMM, what the GPU run's products must go through ("cuBLAS"
# or "weft's kernel", as its header line says; default: either);
# TRAIN_MATCH_CUDA_OPTS, options of the GPU run alone (--offload-optimizer,
# whose run must then say in its memory table that it offloaded, unless
# --quiet keeps the table out).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 BUILD_DIR TAG NRANKS [weft-train options]" >&2
  exit 2
fi
B=$1 tag=$2 n=$3
shift 3
logs=${TRAIN_MATCH_LOGS:-$B}
number='^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$' # what a finite loss prints as
limit=${TRAIN_MATCH_TIMEOUT:-300}
host_log="$logs/train-match.$tag.host" cuda_log="$logs/train-match.$tag.cuda"
mlp=0 prev=
for a in "$@"; do
  { [ "$prev" = --model ] && [ "$a" = mlp ]; } || [ "$a" = --model=mlp ] && mlp=1
  prev=$a
done

run() { # log, extra options
  local log=$1
  shift
  timeout "$limit" "$B/tools/weftrun" -n "$n" "$B/tools/weft-train" "$@" >"$log" 2>&1
}
run "$host_log" "$@"
rc=$?
if [ $rc != 0 ]; then
  echo "$tag: the host run failed (exit $rc): $(tail -2 "$host_log" | tr '\n' ' ')"
  exit 1
fi
# shellcheck disable=SC2086 # its words
run "$cuda_log" --device cuda ${TRAIN_MATCH_CUDA_OPTS:-} "$@"
rc=$?
if [ $rc != 0 ]; then
  echo "$tag: --device cuda failed (exit $rc):" \
    "$(grep -m2 -iE 'error|fail|refus' "$cuda_log" | tr '\n' ' ')"
  exit 1
fi

case " ${TRAIN_MATCH_CUDA_OPTS:-} $* " in
  *" --offload-optimizer "*" --quiet "* | *" --quiet "*" --offload-optimizer "*) ;;
  *" --offload-optimizer "*)
    if ! grep -q "the optimizer state is offloaded" "$cuda_log"; then
      echo "$tag: --offload-optimizer's memory table does not say it offloaded"
      exit 1
    fi ;;
esac

gemm=$(grep -m1 -o 'sgemm: .*' "$cuda_log" | sed 's/^sgemm: //')
if [ $mlp = 0 ] && [ -n "${TRAIN_MATCH_GEMM:-}" ] && [ "$gemm" != "$TRAIN_MATCH_GEMM" ]; then
  echo "$tag: the GPU's products went through ${gemm:-?}, not $TRAIN_MATCH_GEMM"
  exit 1
fi

if [ $mlp = 1 ]; then
  awk -v tag="$tag" -v num="$number" '
    FNR == 1 { f++ }
    / final / { for (i = 1; i < NF; i++) if ($i == "params-l2") l2[f] = $(i + 1) }
    END {
      d = l2[1] - l2[2]; if (d < 0) d = -d
      ok = l2[1] ~ num && l2[2] ~ num && d <= 1e-6 * l2[1]
      printf "%s: MLP params-l2 %s host, %s GPU: %s\n", tag, l2[1], l2[2], ok ? "match" : "DIFFER"
      exit !ok
    }' "$host_log" "$cuda_log"
  exit
fi
# the transformer: rank 0's "[0] step N loss X ..." and "[0] val N loss X"
losses() { awk '{ sub(/^\[ *0\] /, "") } /^(step|val) +[0-9]+ loss /{ print $1, $2, $4 }' "$1"; }
paste <(losses "$host_log") <(losses "$cuda_log") |
  awk -v tag="$tag" -v gemm="$gemm" -v num="$number" -v want="$(losses "$host_log" | wc -l)" '
    { n++; d = $3 - $6; if (d < 0) d = -d; h = $3 < 0 ? -$3 : $3; r = h > 0 ? d / h : d
      if (r > max) max = r
      # not a number (nan, inf) on either side is a difference
      if ($1 != $4 || $2 != $5 || $3 !~ num || $6 !~ num || !(r <= 1e-3)) bad++ }
    END {
      printf "%s: %d losses, %d off by more than 1e-3, largest relative difference %.2g (sgemm: %s)\n",
             tag, n, bad, max, gemm
      exit !(n > 0 && n == want && bad == 0)
    }'
