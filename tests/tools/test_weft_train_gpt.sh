#!/bin/bash
# weft-train's transformer under weftrun: README's run (tiny, 4 ranks, stage
# 3) trains, validates, prints the memory table and a sample; a checkpoint
# saved on 4 ranks at stage 3 mid-run resumes on 2 ranks at stage 1 with the
# losses of an uninterrupted run (fp32, 1e-5 relative); bf16 trains; the
# GPU path's kernels, simulated on the host, give the host's losses; a
# token file given and a sequence of 3 train; a save the run would repeat is
# refused before it trains; a run with no step says no loss; the cosine ends
# at its floor; --weight-decay decays the matrices and embeddings only;
# --dump-batches and --data that cannot be used are refused;
# the token file is named for the text's bytes; an epoch draws every window
# once; validation is alike for any --accum and rank count; a diverging
# run fails, naming the step; a token file of another text is written
# again; --gather-bound, --batch and --reduce-every-micro-step the job
# cannot take, and bad options, are refused.
# usage: test_weft_train_gpt.sh WEFTRUN TOOLS_DIR
set -u
weftrun=$1
tools=$2
fail=0
work=$(mktemp -d /tmp/weft_train_gpt_XXXXXX)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work # the token file too

check() { # name, condition result (take $? before the name: a $(...) in it resets $?)
  if [ "$2" -ne 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}

# README's showcase, shortened
out=$(timeout 300 "$weftrun" -n 4 "$tools/weft-train" --zero-stage 3 --steps 20 --val-every 10 --sample 32 2>&1)
check "weft-train exits 0" $?
echo "$out"
# the default text: each file of /usr/share/common-licenses once, where links
# name one twice (GPL is GPL-3)
want=$(for f in /usr/share/common-licenses/*; do [ -f "$f" ] && realpath "$f"; done | sort -u |
  xargs cat | wc -c)
echo "$out" | grep -q "data $want tokens"
check "the default text counts each file once ($want bytes): $(echo "$out" | grep -o 'data [0-9]* tokens')" $?
losses=$(echo "$out" | awk '/ step +[0-9]+ loss /{print $5}')
first=$(echo "$losses" | head -1)
last=$(echo "$losses" | tail -1)
[ "$(echo "$losses" | wc -l)" -eq 20 ]; check "twenty steps printed" $?
awk -v a="$first" -v b="$last" 'BEGIN{exit !(a > 5.3 && a < 5.8 && b < a - 1.5)}'
check "loss starts near ln 256 and falls ($first -> $last)" $?
[ "$(echo "$out" | grep -cE '^\[0\] val +(10|20) loss [0-9.]+$')" -eq 2 ]; check "validation at steps 10 and 20" $?
echo "$out" | grep -qE ' step +20 loss .* tok/s '; check "tokens/s per step" $?
# the schedule: warm-up over steps / 10 = 2 (step 1 at half the peak 1.5e-3),
# the peak after it, and the cosine's floor (0.1 of the peak) at the last step
lrs=$(echo "$out" | awk '/ step +[0-9]+ loss /{for (i = 1; i < NF; i++) if ($i == "lr") print $(i + 1)}')
[ "$(echo "$lrs" | sed -n '1p;3p;20p' | tr '\n' ' ')" = "7.500e-04 1.500e-03 1.500e-04 " ]
st=$?; check "learning rates of steps 1, 3 and 20: $(echo "$lrs" | sed -n '1p;3p;20p' | tr '\n' ' ')" $st
for r in 0 1 2 3; do
  echo "$out" | grep -qE "^\[0\] +$r +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+$"
  check "memory row for rank $r" $?
done
echo "$out" | grep -qE '^\[0\] # peak RSS per rank \(MiB\):( [0-9]+){4}$'; check "peak RSS per rank" $?
echo "$out" | grep -q '# sample (temperature'; check "a sample" $?
echo "$out" | tail -1 | grep -qE '^\[0\] final loss [0-9.e+-]+ params-l2 [0-9.e+-]+ params-sum [0-9.e+-]+$'
check "final line last" $?

# stage 3 on 4 ranks stopped at step 6 and saved; resumed on 2 ranks at
# stage 1 up to 12: the losses of a run without the stop
args=(--steps 12 --seq 32 --batch 8 --sample 0 --val-every 0)
full=$(timeout 300 "$weftrun" -n 4 "$tools/weft-train" "${args[@]}" --zero-stage 3 2>&1)
check "uninterrupted run" $?
timeout 300 "$weftrun" -n 4 "$tools/weft-train" "${args[@]}" --zero-stage 3 --stop-at 6 \
  --save "$work/ckpt" --quiet >/dev/null 2>&1
check "save at step 6" $?
resumed=$(timeout 300 "$weftrun" -n 2 "$tools/weft-train" "${args[@]}" --zero-stage 1 \
  --resume "$work/ckpt" 2>&1)
check "resume on 2 ranks at stage 1" $?
echo "$resumed" | grep -q "from step 6"; check "resumed from step 6" $?
paste <(echo "$full" | awk '/ step +[0-9]+ loss /{if ($3 > 6) print $3, $5}') \
      <(echo "$resumed" | awk '/ step +[0-9]+ loss /{print $3, $5}') |
  awk '{n++; d=$2-$4; if (d<0) d=-d; printf "  step %s: %s %s\n", $1, $2, $4;
        if ($1 != $3 || d > 1e-5 * $2) bad=1} END{exit !(n == 6 && !bad)}'
check "steps 7-12 resumed equal the uninterrupted run within 1e-5" $?

# bf16 parameters and gradients, fp32 master weights
out=$(timeout 300 "$weftrun" -n 2 "$tools/weft-train" --zero-stage 2 --dtype bf16 --steps 8 \
      --seq 32 --batch 8 --sample 0 --val-every 0 2>&1)
check "bf16 run" $?
echo "$out" | awk '/ step +[0-9]+ loss /{l[++n]=$5} END{exit !(n == 8 && l[8] < l[1] - 0.5)}'
check "bf16 loss falls" $?

# The GPU path's kernels and calls (--device sim: train_gpt_kern.h's bodies
# looped on the host, products by the same body) against the host's
# operations: the loss of every step within 1e-5 relative (they differ in
# expf and in the order of sums only), stage 3 on 4 ranks with the
# validation and the greedy sample alike; bf16 with accumulation within 1e-3.
sim_vs_host() { # name, tolerance, weftrun -n N, weft-train arguments...
  local name=$1 tol=$2 n=$3 h d
  shift 3
  h=$(timeout 300 "$weftrun" -n "$n" "$tools/weft-train" --device host "$@" 2>&1)
  d=$(timeout 300 "$weftrun" -n "$n" "$tools/weft-train" --device sim "$@" 2>&1)
  check "$name: both exit 0" $?
  echo "$d" | grep -q 'sim executor, sgemm: host loop'; check "$name: the sim executor ran" $?
  paste <(echo "$h" | awk '/ (step|val) +[0-9]+ loss /{print $2, $3, $5}') \
        <(echo "$d" | awk '/ (step|val) +[0-9]+ loss /{print $2, $3, $5}') |
    awk -v tol="$tol" '{n++; d=$3-$6; if (d<0) d=-d; printf "  %s %s: host %s sim %s\n", $1, $2, $3, $6;
          if ($1 != $4 || $2 != $5 || d > tol * $3) bad=1} END{exit !(n >= 6 && !bad)}'
  check "$name: every loss within $tol relative" $?
  [ "$(echo "$h" | sed -n '/# sample/,/final loss/p' | grep -v 'final loss')" = \
    "$(echo "$d" | sed -n '/# sample/,/final loss/p' | grep -v 'final loss')" ]
  check "$name: the same sample" $?
}
sim_vs_host "sim, fp32, stage 3, 4 ranks" 1e-5 4 --zero-stage 3 --steps 8 --seq 16 --batch 8 \
  --val-every 4 --val-batches 1 --sample 12 --temperature 0
sim_vs_host "sim, bf16, stage 2, accum 2, 2 ranks" 1e-3 2 --zero-stage 2 --dtype bf16 --accum 2 \
  --steps 6 --seq 12 --batch 8 --val-every 0 --sample 0

# the token file of the first run given, and a sequence shorter than 4,
# which samples from a prompt of one byte
tok=$(ls "$work"/weft-train-*.tok 2>/dev/null | head -1)
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" --tokens "$tok" \
  --steps 2 --seq 3 --batch 4 --val-every 0 --sample 6 --temperature 0 2>&1)
check "--tokens FILE, --seq 3 with a sample" $?
echo "$out" | grep -qE 'step +2 loss'; check "  and it trained" $?

# a save the run would repeat is refused before it trains; a resumed run
# with no step left saves nothing, and exits 0
small=(--tokens "$tok" --seq 16 --batch 4 --val-every 0 --sample 0)
timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${small[@]}" --steps 2 --save "$work/again" \
  >/dev/null 2>&1
check "a save of 2 steps" $?
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${small[@]}" --steps 2 --save "$work/again" 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -q 'holds the checkpoint of step 2 already' &&
  ! echo "$out" | grep -qE 'step +1 loss'
check "the same save again refused before any step (exit $st)" $?
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${small[@]}" --steps 2 --resume "$work/again" \
  --save "$work/again" 2>&1)
check "resumed at its last step, exit 0" $?
echo "$out" | grep -q 'nothing saved'; check "  and nothing saved" $?

# a resumed run with no step left has no loss: its final line says none
echo "$out" | tail -1 | grep -qE '^\[0\] final loss none params-l2 [0-9.e+-]+ params-sum [0-9.e+-]+$'
st=$?; check "  and its final line has no loss ($(echo "$out" | tail -1))" $st
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${small[@]}" --steps 0 2>&1)
check "--steps 0: the model as it starts, exit 0" $?
! echo "$out" | grep -qE 'step +1 loss' &&
  echo "$out" | tail -1 | grep -qE '^\[0\] final loss none params-l2 [0-9.e+-]+ params-sum [0-9.e+-]+$'
st=$?; check "  no step, and the final line says no loss ($(echo "$out" | tail -1))" $st

# the cosine's last step is at the floor, also where it is the only step
# after the warm-up: 1.5e-3 peak, the floor 0.1 of it
out=$(timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${small[@]}" --steps 3 --warmup 2 2>&1)
lrs=$(echo "$out" | awk '/ step +[0-9]+ loss /{for (i = 1; i < NF; i++) if ($i == "lr") print $(i + 1)}')
[ "$(echo "$lrs" | tr '\n' ' ')" = "7.500e-04 1.500e-03 1.500e-04 " ]
st=$?; check "--steps 3 --warmup 2: learning rates $(echo "$lrs" | tr '\n' ' ')" $st

# --dump-batches that cannot be written: refused before any step, with the
# path and the reason; a failed write fails the run, saying so
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${small[@]}" --steps 2 \
  --dump-batches "$work/none/batches.bin" 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -q "dump-batches $work/none/batches.bin: No such file or directory" &&
  ! echo "$out" | grep -qE 'step +1 loss'
check "--dump-batches in a missing directory refused before any step (exit $st)" $?
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${small[@]}" --steps 2 \
  --dump-batches /dev/full 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -q 'dump-batches /dev/full: No space left on device'
check "--dump-batches /dev/full fails, saying why (exit $st)" $?

# the default token file is named for the text's absolute path and bytes:
# files of one relative name, size and time in two folders, and a rewrite
# of the same size and time, each get their own tokens
mkdir -p "$work/a" "$work/b"
head -c 3000 /usr/share/common-licenses/GPL-3 >"$work/a/text"
tail -c 3000 /usr/share/common-licenses/GPL-3 >"$work/b/text"
touch -d '2020-01-01 00:00:00' "$work/a/text" "$work/b/text"
tiny=(--steps 1 --seq 8 --batch 2 --val-every 0 --sample 0)
tokens_of() { # text file: whether a token file in $work holds its bytes
  local t
  for t in "$work"/weft-train-*.tok; do
    tail -c +33 "$t" | cmp -s - "$1" && return 0
  done
  return 1
}
(cd "$work/a" && timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data text >/dev/null 2>&1) &&
  (cd "$work/b" && timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data text \
    >/dev/null 2>&1) &&
  tokens_of "$work/a/text" && tokens_of "$work/b/text"
check "--data of one relative name, size and time in two folders: tokens of each" $?
tail -c 3000 /usr/share/common-licenses/GPL-2 >"$work/a/text"
touch -d '2020-01-01 00:00:00' "$work/a/text"
(cd "$work/a" && timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data text \
  >/dev/null 2>&1) && tokens_of "$work/a/text"
check "--data rewritten at the same size and time: tokens of the new text" $?
mkdir -p "$work/tmp2"
out=$(TMPDIR=$work/tmp2 timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data "$work/a" 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -q -- "--data $work/a: a directory" &&
  [ -z "$(ls -A "$work/tmp2")" ]
check "--data naming a directory refused, no token file left (exit $st)" $?

# an epoch draws every window once: a text whose windows of 17 bytes all
# differ (the numbers 00000 to 00199, 1,200 bytes, 1,080 of them to train),
# --seq 16: (1080 - 16) / 16 = 66 windows an epoch, seq apart at one
# offset, each once, the next epoch in another order; the same windows on
# 3 ranks with --accum 2
seq -f '%05g' 0 199 | tr '\n' ' ' >"$work/count.txt"
epoch=(--data "$work/count.txt" --tokens "$work/count.tok" --seq 16 --batch 6 --val-every 0
  --sample 0 --steps 22)
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${epoch[@]}" \
  --dump-batches "$work/epochs.bin" 2>&1)
check "two epochs written by --dump-batches" $?
echo "$out" | grep -q '(1080 train: 66 windows an epoch;'; check "  66 windows an epoch" $?
od -An -v -tu1 -w1 "$work/count.txt" >"$work/count.u1"
tail -c +25 "$work/epochs.bin" | od -An -v -tu1 -w17 >"$work/epochs.u1"
awk -v W=66 -v L=17 -v Q=16 '
  FNR == NR { b[n++] = $1; next } # the text, a byte a line
  FNR == 1 { for (p = 0; p + L <= n; p++) { k = ""; for (i = 0; i < L; i++) k = k " " b[p + i]; at[k] = p } }
  { # a window a line, samples [e W, (e + 1) W) the epoch e
    k = ""; for (i = 1; i <= NF; i++) k = k " " $i
    e = int(m / W); m++
    if (!(k in at)) { print "  sample " m - 1 " is no window of the text"; bad = 1; next }
    p = at[k]
    if (seen[e, p]++) { print "  epoch " e ": the window at " p " twice"; bad = 1 }
    if (e in grid && grid[e] != p % Q) { print "  epoch " e ": the window at " p " off its grid"; bad = 1 }
    grid[e] = p % Q; order[e] = order[e] " " p
  }
  END {
    if (m != 2 * W) { print "  " m " samples, not " 2 * W; bad = 1 }
    if (order[0] == order[1]) { print "  both epochs in one order"; bad = 1 }
    exit bad
  }' "$work/count.u1" "$work/epochs.u1"
check "  each epoch: every window once, seq apart; the second in another order" $?
timeout 120 "$weftrun" -n 3 "$tools/weft-train" "${epoch[@]}" --accum 2 \
  --dump-batches "$work/epochs3.bin" >/dev/null 2>&1 &&
  cmp -s <(tail -c +25 "$work/epochs.bin") <(tail -c +25 "$work/epochs3.bin")
check "  the same windows on 3 ranks with --accum 2" $?

# validation reads the same held-out windows for any --accum and rank
# count: at --lr 0 the parameters stay as they start, and the loss agrees
# (2e-6) for --accum 1, 2 and 4; --val-batches all, every window of the
# held-out tenth (23,732 tokens: 741 of 32), on 1 to 4 ranks
val=(--tokens "$tok" --seq 32 --steps 1 --lr 0 --val-every 1 --sample 0)
vals=
for a in 1 2 4; do
  vals="$vals $(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${val[@]}" --batch 8 --accum $a \
    2>&1 | awk '/ val +1 loss /{print $5}')"
done
echo "$vals" | awk '{d = $1 - $2; e = $1 - $3; exit !(NF == 3 && d * d < 4e-12 && e * e < 4e-12)}'
check "validation loss for --accum 1, 2 and 4 alike:$vals" $?
vals=
for n in 1 2 3 4; do
  out=$(timeout 120 "$weftrun" -n $n "$tools/weft-train" "${val[@]}" --batch 12 --val-batches all 2>&1)
  echo "$out" | grep -q 'validation 741 of 741 windows'; check "  --val-batches all on $n ranks: 741 windows" $?
  vals="$vals $(echo "$out" | awk '/ val +1 loss /{print $5}')"
done
echo "$vals" | awk '{for (i = 2; i <= NF; i++) if (($i - $1) ^ 2 > 4e-12) bad = 1; exit !(NF == 4 && !bad)}'
check "  --val-batches all on 1 to 4 ranks alike:$vals" $?

# --weight-decay decays the 2-D tensors as llm.c does: the token and
# position embeddings and each block's qkv, attention projection, fc and fc
# projection weights; not the layer norms or the biases (the checkpoint's
# manifest records each parameter's decay: layer 0 the embeddings, layers
# 1-5 twelve tensors each, layer 6 the final norm)
timeout 120 "$weftrun" -n 2 "$tools/weft-train" --tokens "$tok" --seq 16 --batch 4 --steps 1 \
  --val-every 0 --sample 0 --quiet --weight-decay 0.1 --save "$work/wd" >/dev/null 2>&1
check "--weight-decay 0.1 trains and saves" $?
awk '/^param /{n++; id=$2; l=$3; k=(id-2)%12;
     want = l == 0 || (l >= 1 && l <= 5 && (k == 2 || k == 4 || k == 8 || k == 10)) ? 0.1 : 0;
     if ($5 != want) bad=1} END{exit !(n == 64 && !bad)}' "$work/wd/step-1/manifest"
check "--weight-decay 0.1: embeddings and block matrices decayed, norms and biases not" $?

# a gradient that is no longer finite: fp32 and bf16 skip the step, saying
# so, and fail after --skip-limit (3) steps in a row, naming the step; fp16
# halves its loss scale and fails once a step overflows at the least, 1;
# a run that ends with a loss that is not finite fails
diverge=(--tokens "$tok" --seq 16 --batch 4 --val-every 0 --sample 0 --lr 1e30 --clip 0)
for dt in fp32 bf16; do
  out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${diverge[@]}" --dtype $dt --steps 5 2>&1)
  st=$?
  [ $st -ne 0 ] && echo "$out" | grep -qE 'step +2 loss .*\(non-finite gradient: step skipped\)$' &&
    echo "$out" | grep -q 'weft-train: step 4: the gradient was not finite in 3 steps in a row' &&
    ! echo "$out" | grep -qE 'loss scale|step +5 loss|final loss'
  check "$dt --lr 1e30: steps skipped, saying why; fails at step 4 (exit $st)" $?
done
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${diverge[@]}" --dtype fp16 --steps 30 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -qE 'step +[0-9]+ loss .*\(overflow: skipped, loss scale halved\)$' &&
  echo "$out" | grep -q "weft-train: step [0-9]*: the gradient overflowed at fp16's least loss scale, 1"
check "fp16 --lr 1e30: fails at the least loss scale (exit $st)" $?
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${diverge[@]}" --steps 3 --skip-limit 5 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -q 'weft-train: the final loss is not finite'
check "a final loss that is not finite fails the run (exit $st)" $?

# a token file given with --data holds that text: one of another text, or
# a WEFTTOK1 file (no text recorded), is written again, saying so; a
# token file given alone is used as it is; a file that is no token file is
# refused and left as it was
head -c 3000 /usr/share/common-licenses/GPL-3 >"$work/one.txt"
tail -c 3000 /usr/share/common-licenses/GPL-2 >"$work/two.txt"
timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data "$work/one.txt" \
  --tokens "$work/given.tok" >/dev/null 2>&1 && tail -c +33 "$work/given.tok" | cmp -s - "$work/one.txt"
check "--tokens FILE written from --data" $?
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" "${tiny[@]}" --data "$work/two.txt" \
  --tokens "$work/given.tok" 2>&1)
st=$?
[ $st -eq 0 ] && tail -c +33 "$work/given.tok" | cmp -s - "$work/two.txt" &&
  echo "$out" | grep -q "given.tok holds another text's tokens: writing it again from $work/two.txt"
check "  another --data: written again, saying so (exit $st)" $?
timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --tokens "$work/given.tok" >/dev/null 2>&1 &&
  tail -c +33 "$work/given.tok" | cmp -s - "$work/two.txt"
check "  given alone: used as it is" $?
{ printf 'WEFTTOK1\001\0\0\0\0\001\0\0\270\013\0\0\0\0\0\0'; cat "$work/one.txt"; } >"$work/old.tok"
out=$(timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --tokens "$work/old.tok" 2>&1)
check "  a WEFTTOK1 file (no hash; 3,000 tokens) trains" $?
echo "$out" | grep -q 'data 3000 tokens'; check "  and holds its 3,000 tokens" $?
out=$(timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data "$work/two.txt" \
  --tokens "$work/old.tok" 2>&1)
st=$?
[ $st -eq 0 ] && tail -c +33 "$work/old.tok" | cmp -s - "$work/two.txt" &&
  echo "$out" | grep -q 'old.tok records no text (a WEFTTOK1 file): writing it again'
check "  with --data: written again in this format (exit $st)" $?
head -c 1000 "$work/old.tok" >"$work/cut.tok"
out=$(timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data "$work/two.txt" \
  --tokens "$work/cut.tok" 2>&1)
st=$?
[ $st -eq 0 ] && tail -c +33 "$work/cut.tok" | cmp -s - "$work/two.txt" &&
  echo "$out" | grep -q 'cut.tok holds fewer or more tokens than its header counts: writing it again'
check "  a token file cut short, with --data: written again, saying so (exit $st)" $?
cp "$work/one.txt" "$work/text.tok"
out=$(timeout 120 "$weftrun" -n 1 "$tools/weft-train" "${tiny[@]}" --data "$work/two.txt" \
  --tokens "$work/text.tok" 2>&1)
st=$?
[ $st -ne 0 ] && cmp -s "$work/text.tok" "$work/one.txt" &&
  echo "$out" | grep -q 'text.tok: not a token file, so not overwritten'
check "  --tokens naming a text refused, the file untouched (exit $st)" $?

# options the job refuses before any step, exit 2: --gather-bound below
# what stage 3 holds at once (tiny, fp32, 4 ranks: the embeddings' 163,840
# bytes and a block's 793,088), which it names; a --batch that the ranks
# and micro-steps do not divide; --reduce-every-micro-step below stage 2
out=$(timeout 120 "$weftrun" -n 4 "$tools/weft-train" --zero-stage 3 --gather-bound 956927 \
  --steps 1 2>&1)
st=$?
[ $st -eq 2 ] && echo "$out" | grep -q -- '--gather-bound 956927: at least 956928 bytes' &&
  ! echo "$out" | grep -qE 'step +1 loss'
check "--gather-bound below the least refused, naming it (exit $st)" $?
timeout 120 "$weftrun" -n 4 "$tools/weft-train" --zero-stage 3 --gather-bound 956928 --steps 1 \
  --seq 16 --val-every 1 --val-batches 1 --sample 4 >/dev/null 2>&1
check "  the least trains, validates and samples" $?
out=$(timeout 120 "$weftrun" -n 4 "$tools/weft-train" --batch 12 --accum 2 --steps 1 2>&1)
st=$?
[ $st -eq 2 ] && echo "$out" | grep -q -- '--batch 12 does not divide by --accum 2 x 4 ranks'
check "--batch 12 --accum 2 on 4 ranks refused, saying which (exit $st)" $?
for s in 0 1; do
  timeout 20 "$tools/weft-train" --zero-stage $s --accum 2 --reduce-every-micro-step >/dev/null \
    2>"$work/err"
  st=$?
  [ $st -eq 2 ] && grep -q -- '--reduce-every-micro-step: stages 2-3' "$work/err"
  check "--reduce-every-micro-step at stage $s refused (exit $st)" $?
done

# every numeric flag whole, in its range and finite; refused with the flag
# and the value (exit 2)
for bad in "--zero-stage abc" "--steps abc" "--steps -1" "--steps 5x" "--lr abc" "--lr -1" \
  "--seed abc" "--seed -1" "--seq 0" "--seq -5" "--seq 65" "--layers 0" "--layers 9" \
  "--clip -1" "--min-lr 2" "--min-lr nan" "--temperature nan" "--temperature -1" \
  "--width 100000" "--width 0" "--accum 0" "--batch 0" "--batch 1e3" "--prefetch -1" \
  "--gather-bound -1" "--warmup -2" "--val-every x" "--val-batches -1" "--sample -1" \
  "--stop-at 0" "--lr inf" "--zero-stage ' 1'" "--val-batches some" "--skip-limit 0"; do
  eval "set -- $bad"
  timeout 20 "$tools/weft-train" "$@" >/dev/null 2>"$work/err"
  st=$?
  [ $st -eq 2 ] && grep -qF -- "weft-train: $1 $2:" "$work/err"
  ok=$?; check "$bad refused: exit $st, $(head -1 "$work/err")" $ok
done
# a flag of the other model is refused, not dropped: the MLP's shape flags
# with a transformer (the run trained the transformer), a transformer's flags
# with the MLP (exit 2, naming the flag)
for bad in "--layers 4" "--width 256" "--model mlp --seq 16" "--model mlp --data /etc/passwd" \
  "--model mlp --val-every 3" "--model mlp --sample 5" "--model mid --layers 2"; do
  eval "set -- $bad"
  timeout 20 "$tools/weft-train" "$@" >/dev/null 2>"$work/err"
  st=$?
  flag=$1
  [ "$flag" = --model ] && flag=$3
  [ $st -eq 2 ] && grep -qF -- "weft-train: $flag " "$work/err"
  ok=$?; check "$bad: the other model's flag refused: exit $st, $(head -1 "$work/err")" $ok
done
"$tools/weft-train" --model mlp --width 100000 2>&1 >/dev/null |
  grep -q 'from 1 to 46340 (a layer.s width x width weights are indexed by int)'
check "--width too wide says its limit and why" $?
"$tools/weft-train" --min-lr -0.5 >/dev/null 2>&1
[ $? -eq 2 ]; check "a negative --min-lr refused" $?
"$tools/weft-train" --model gpt3 >/dev/null 2>&1
[ $? -eq 2 ]; check "unknown model refused" $?
"$tools/weft-train" --model mlp --device sim >/dev/null 2>&1
[ $? -eq 2 ]; check "--device sim refused for the MLP" $?
"$tools/weft-train" --device tpu >/dev/null 2>&1
[ $? -eq 2 ]; check "unknown device refused" $?
exit $fail
