#!/bin/bash
# weft-train's MLP (--model mlp) under weftrun: falling loss, the memory table, the final line;
# --weight-decay decays the weights and not the biases; a checkpoint saved on
# 4 ranks resumes on 2 and consolidates; a --save that cannot be written is
# refused before the first step; no step prints no loss; a --gather-bound
# below the largest layer is refused; a diverging run fails.
# usage: test_weft_train.sh WEFTRUN TOOLS_DIR SOURCE_DIR
set -u
weftrun=$1
tools=$2
src=$3
fail=0
work=$(mktemp -d /tmp/weft_train_XXXXXX)
trap 'rm -rf "$work"' EXIT

check() { # name, condition result (take $? before the name: a $(...) in it resets $?)
  if [ "$2" -ne 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}

# the MLP at stage 3
out=$(timeout 60 "$weftrun" -n 4 "$tools/weft-train" --model mlp --zero-stage 3 2>&1)
rc=$?
echo "$out"
check "weft-train exits 0" $rc
losses=$(echo "$out" | awk '/ step +[0-9]+ loss /{print $5}')
first=$(echo "$losses" | head -1)
last=$(echo "$losses" | tail -1)
[ "$(echo "$losses" | wc -l)" -eq 10 ]; check "ten steps printed" $?
awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a / 2)}'; check "loss falls ($first -> $last)" $?
for r in 0 1 2 3; do
  echo "$out" | grep -qE "^\[0\] +$r +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+$"
  check "memory row for rank $r" $?
done
echo "$out" | grep -q "# memory per rank" ; check "memory table header" $?
echo "$out" | tail -1 | grep -qE '^\[0\] final loss [0-9.e+-]+ params-l2 [0-9.e+-]+ params-sum [0-9.e+-]+$'
check "final line last" $?

# stages agree through the command line too (fp32, 3 ranks)
ref=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 0 --quiet 2>&1 | tail -1)
for s in 1 2 3; do
  got=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage $s --quiet 2>&1 | tail -1)
  awk -v a="$ref" -v b="$got" 'BEGIN{split(a,x," "); split(b,y," "); d=x[6]-y[6]; if (d<0) d=-d;
       exit !(d <= 1e-6 * x[6])}'
  check "stage $s params-l2 matches stage 0 ($got)" $?
done

# --weight-decay: 0 is the default run, bit for bit; 0.5 decays the weight
# matrices only (each parameter's decay in the checkpoint's manifest), ends
# with smaller weights, and agrees across stages; a negative one is refused
wd0=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 0 --quiet \
  --weight-decay 0 2>&1 | tail -1)
[ "$wd0" = "$ref" ]; check "--weight-decay 0 is the default run ($wd0)" $?
wd=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 0 --quiet \
  --weight-decay 0.5 2>&1 | tail -1)
wd3=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 3 --quiet \
  --weight-decay 0.5 --save "$work/wd" 2>&1 | tail -1)
awk -v a="$ref" -v b="$wd" -v c="$wd3" 'BEGIN{split(a,x," "); split(b,y," "); split(c,z," ");
     d=y[6]-z[6]; if (d<0) d=-d; exit !(y[6] > 0 && y[6] < x[6] && d <= 1e-6 * y[6])}'
check "--weight-decay 0.5: smaller params-l2, alike at stage 3 ($wd / $wd3)" $?
# the MLP's layers: weights 12x37, 37x29, 29x3, each followed by its biases
grep '^param ' "$work/wd/step-10/manifest" | tr '\n' ';' | grep -qx \
  'param 0 0 444 0.5;param 1 0 37 0;param 2 1 1073 0.5;param 3 1 29 0;param 4 2 87 0.5;param 5 2 3 0;'
check "--weight-decay 0.5 decays the weights, not the biases (the manifest's param lines)" $?
"$tools/weft-train" --model mlp --weight-decay -0.1 >/dev/null 2>"$work/err"
[ $? -eq 2 ] && grep -q -- "--weight-decay -0.1: a weight decay" "$work/err"
st=$?; check "--weight-decay -0.1 refused ($(cat "$work/err"))" $st

# accumulation reduced every micro-step trains as summed locally, at stages 2 and 3
final='^\[0\] final loss [0-9.e+-]+ params-l2 [0-9.e+-]+ params-sum [0-9.e+-]+$'
for s in 2 3; do
  args=(--model mlp --zero-stage $s --accum 3 --batch 18 --quiet)
  a=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" "${args[@]}" 2>&1 | tail -1)
  b=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" "${args[@]}" --reduce-every-micro-step 2>&1 | tail -1)
  [[ $a =~ $final && $b =~ $final ]] && awk -v a="$a" -v b="$b" 'BEGIN{split(a,x," ");
       split(b,y," "); d=x[6]-y[6]; if (d<0) d=-d; exit !(x[6] > 0 && d <= 1e-6 * x[6])}'
  check "stage $s --accum 3: --reduce-every-micro-step matches ($a / $b)" $?
done

# the cosine schedule applies to the MLP too: other parameters than the
# constant rate's, the same at every stage
cos0=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 0 --quiet \
  --lr-schedule cosine --warmup 2 --min-lr 0.01 2>&1 | tail -1)
cos3=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 3 --quiet \
  --lr-schedule cosine --warmup 2 --min-lr 0.01 2>&1 | tail -1)
awk -v a="$ref" -v b="$cos0" -v c="$cos3" 'BEGIN{split(a,x," "); split(b,y," "); split(c,z," ");
     d=y[6]-z[6]; if (d<0) d=-d; exit !(y[6] > 0 && x[6] != y[6] && d <= 1e-6 * y[6])}'
check "cosine: params-l2 differs from the constant rate's and agrees at stage 3 ($cos0)" $?

# save on 4 ranks at stage 3, resume on 2 at stage 1, consolidate
timeout 60 "$weftrun" -n 4 "$tools/weft-train" --model mlp --zero-stage 3 --steps 4 --save "$work/ckpt" --quiet >/dev/null 2>&1
check "save" $?
[ -f "$work/ckpt/LATEST" ] && grep -qx "step-4" "$work/ckpt/LATEST"; check "LATEST names step-4" $?
out=$(timeout 60 "$weftrun" -n 2 "$tools/weft-train" --model mlp --zero-stage 1 --steps 8 --resume "$work/ckpt" 2>&1)
check "resume" $?
echo "$out" | grep -q "from step 4"; check "resumed from step 4" $?
# --save where no checkpoint can be written is refused before the first
# step; missing parents are made, as mkdir -p does
touch "$work/plain"
for dir in "$work/plain" "$work/plain/ckpt"; do
  out=$(timeout 60 "$weftrun" -n 2 "$tools/weft-train" --model mlp --steps 2 --save "$dir" 2>&1)
  st=$?
  [ $st -ne 0 ] && echo "$out" | grep -q -- "--save $dir: Not a directory" &&
    ! echo "$out" | grep -qE 'step +1 loss'
  check "--save $dir (under a regular file) refused before any step (exit $st)" $?
done
timeout 60 "$weftrun" -n 2 "$tools/weft-train" --model mlp --steps 2 --quiet \
  --save "$work/new/parents/ckpt" >/dev/null 2>&1 && grep -qx step-2 "$work/new/parents/ckpt/LATEST"
check "--save into missing parents makes them" $?
# no step, no loss: the final line says none
out=$(timeout 60 "$weftrun" -n 2 "$tools/weft-train" --model mlp --steps 0 2>&1)
check "--steps 0 exits 0" $?
echo "$out" | tail -1 | grep -qE '^\[0\] final loss none params-l2 [0-9.e+-]+ params-sum [0-9.e+-]+$'
st=$?; check "--steps 0: final loss none ($(echo "$out" | tail -1))" $st
"$tools/weft-zero-consolidate" "$work/ckpt" "$work/full.bin"; check "consolidate" $?
[ "$(stat -c %s "$work/full.bin")" -eq $((8 + 8 + 8 * 3 + 4 * 1673)) ]; check "consolidated size" $?
"$tools/weft-zero-consolidate" --allow-non-finite "$work/ckpt" "$work/full2.bin" &&
  cmp -s "$work/full.bin" "$work/full2.bin"
check "consolidate --allow-non-finite" $?
"$tools/weft-zero-consolidate" --allow-nan "$work/ckpt" "$work/full2.bin" 2>/dev/null
[ $? -eq 2 ]; check "consolidate refuses an unknown flag" $?
# a random shard is refused with a message, and the earlier output stays
shard="$work/ckpt/step-4/rank-00001.bin"
head -c "$(stat -c %s "$shard")" /dev/urandom >"$work/random.bin" && mv "$work/random.bin" "$shard"
cp "$work/full.bin" "$work/full.before"
"$tools/weft-zero-consolidate" "$work/ckpt" "$work/full.bin" 2>"$work/err"
[ $? -eq 1 ] && grep -q "rank-00001.bin is not a weft ZeRO shard" "$work/err" &&
  cmp -s "$work/full.bin" "$work/full.before"
st=$?; check "consolidate refuses a random shard ($(cat "$work/err"))" $st
"$tools/weft-zero-consolidate" "$work/none" "$work/x.bin" 2>/dev/null
[ $? -eq 1 ]; check "consolidate of a missing checkpoint fails" $?
"$tools/weft-train" --model mlp --zero-stage 7 >/dev/null 2>&1
[ $? -eq 2 ]; check "bad stage refused" $?
# stage 3 gathers a layer at a time: a --gather-bound below the largest
# (1,102 parameters padded to 1,104 on 3 ranks, 4,416 bytes) is refused
# before any step, naming it (exit 2), and that bound trains
out=$(timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 3 --gather-bound 4415 2>&1)
st=$?
[ $st -eq 2 ] && echo "$out" | grep -q -- '--gather-bound 4415: at least 4416 bytes, the largest layer' &&
  ! echo "$out" | grep -qE 'step +1 loss'
check "--gather-bound 4415 refused, naming the least (exit $st)" $?
timeout 60 "$weftrun" -n 3 "$tools/weft-train" --model mlp --zero-stage 3 --gather-bound 4416 --quiet \
  >/dev/null 2>&1
check "  --gather-bound 4416 trains" $?
# a gradient no longer finite: the step is skipped, saying so, and the run
# fails after --skip-limit (3) in a row, naming the step
out=$(timeout 60 "$weftrun" -n 2 "$tools/weft-train" --model mlp --lr 1e30 --steps 6 2>&1)
st=$?
[ $st -ne 0 ] && echo "$out" | grep -qE 'step +2 loss .*\(non-finite gradient: step skipped\)$' &&
  echo "$out" | grep -q 'weft-train: step 4: the gradient was not finite in 3 steps in a row'
check "--lr 1e30: steps skipped, saying why; fails at step 4 (exit $st)" $?
# --device cuda: without a GPU (or CUDA) the ranks refuse with a message;
# with one, the final line is the host run's within float tolerance
"$tools/weft-train" --model mlp --device gpu >/dev/null 2>&1
[ $? -eq 2 ]; check "--device gpu refused" $?
"$tools/weft-train" --model mlp --offload-optimizer 2>"$work/err" >/dev/null
[ $? -eq 2 ] && grep -q "needs --device cuda" "$work/err"
st=$?; check "--offload-optimizer on the host refused ($(cat "$work/err"))" $st
host=$(timeout 60 "$weftrun" -n 2 "$tools/weft-train" --model mlp --zero-stage 3 --quiet 2>&1 | tail -1)
out=$(timeout 120 "$weftrun" -n 2 "$tools/weft-train" --model mlp --device cuda --zero-stage 3 --quiet 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$out"
  # the first rank to refuse ends the job: the other may not get to say it
  echo "$out" | grep -qE 'weft-train: --device cuda: (no CUDA device is visible|weft-train was built without CUDA)' &&
    ! echo "$out" | grep -q 'final loss'
  check "--device cuda without a GPU: refused, saying why" $?
else
  got=$(echo "$out" | tail -1)
  awk -v a="$host" -v b="$got" 'BEGIN{split(a,x," "); split(b,y," "); d=x[6]-y[6]; if (d<0) d=-d;
       exit !(y[2] == "final" && d <= 1e-6 * x[6])}'
  check "--device cuda matches the host run ($got; host $host)" $?
fi
# docs/zero.md's complete example is tools/train/zero_example.c, and it runs
awk '/^```c$/{n++; if (n==2) {on=1; next}} on && /^```$/{exit} on' "$src/docs/zero.md" \
  | diff -q - "$src/tools/train/zero_example.c" >/dev/null
check "docs/zero.md shows tools/train/zero_example.c verbatim" $?
out=$(cd "$work" && timeout 60 "$weftrun" -n 3 "$tools/zero-example" 2 example-ckpt 2>&1)
check "zero-example runs" $?
[ -f "$work/example-ckpt/LATEST" ]
check "zero-example saved a checkpoint into the directory it was given" $?
echo "$out" | awk '/ w0 /{w=$3; b=$7; found=1} END{d1=w-0.1; d2=b-0.5; if(d1<0)d1=-d1; if(d2<0)d2=-d2;
  exit !(found && d1 < 0.01 && d2 < 0.01)}'
st=$?; check "zero-example fits the model ($(echo "$out" | tail -1))" $st
exit $fail
