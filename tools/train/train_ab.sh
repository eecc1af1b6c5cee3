#!/bin/bash
# weft-train's time per step, build A against build B, in alternating rounds
# (A, B, A, B, ...) so that a shared machine's load falls on both alike.
#
#   tools/train/train_ab.sh BUILD_A BUILD_B [weft-train flags...]
#
# Per round, build and stage: one run of STEPS steps, rank 0's "step N" lines
# timestamped as they arrive (line-buffered through stdbuf); the time per
# step is the span from the first line to the last over STEPS - 1, so
# start-up and teardown stay out of it. Prints the median and the range per
# build and stage, B's median over A's, and the median of each round's B/A.
# Environment: ROUNDS (5), NRANKS (2), STAGES ("1 2"), STEPS (12).
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_A BUILD_B [weft-train flags...]" >&2
  exit 2
fi
a=$1 b=$2
shift 2
rounds=${ROUNDS:-5} nranks=${NRANKS:-2} stages=${STAGES:-1 2} steps=${STEPS:-12}

step_ms() { # build, stage, flags...: ms per step of one run
  local build=$1 stage=$2 first= last= n=0 line model=()
  shift 2
  # builds with --model train a transformer by default: the MLP unless the flags say
  "$build/tools/weft-train" --help | grep -q -- --model && model=(--model mlp)
  while IFS= read -r line; do
    case $line in
      *"] step "*) last=$EPOCHREALTIME; [ -z "$first" ] && first=$last; n=$((n + 1)) ;;
    esac
  done < <("$build/tools/weftrun" -n "$nranks" stdbuf -oL "$build/tools/weft-train" \
             "${model[@]}" --zero-stage "$stage" --steps "$steps" "$@" 2>&1)
  if [ "$n" -lt 2 ]; then
    echo "weft-train printed $n step lines (build $build, stage $stage)" >&2
    exit 1
  fi
  awk -v a="$first" -v b="$last" -v n="$n" 'BEGIN{printf "%.2f", (b - a) * 1000 / (n - 1)}'
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1}
  END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo " - " hi}'; }

echo "# $nranks ranks, $steps steps a run, $rounds rounds; flags: $*"
echo "# A = $a"
echo "# B = $b"
for s in $stages; do
  ta=() tb=()
  for r in $(seq "$rounds"); do
    for build in "$a" "$b"; do
      ms=$(step_ms "$build" "$s" "$@")
      if [ "$build" = "$a" ]; then ta+=("$ms"); else tb+=("$ms"); fi
    done
  done
  ma=$(median "${ta[@]}") mb=$(median "${tb[@]}")
  echo "stage $s  A median $ma ms/step [$(range "${ta[@]}")]  B median $mb ms/step" \
       "[$(range "${tb[@]}")]  B/A $(awk -v x="$ma" -v y="$mb" 'BEGIN{printf "%.3f", y / x}')"
  ratios=()
  for i in "${!ta[@]}"; do ratios+=("$(awk -v x="${ta[$i]}" -v y="${tb[$i]}" 'BEGIN{printf "%.3f", y / x}')"); done
  echo "  paired B/A per round: median $(median "${ratios[@]}") [$(range "${ratios[@]}")]"
  echo "  A: ${ta[*]}"
  echo "  B: ${tb[*]}"
done
