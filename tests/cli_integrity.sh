#!/bin/sh
# Runs and the files they hold, as a hostile user finds them (issue 22, and
# 21.1 / 21.6): nothing lost, nothing hijacked.
#  - --resume_from_checkpoint takes the run's own options (args.json); options
#    given again must agree, or the error names each difference; a finished
#    run is said to be finished; an older finished run is never taken over
#    (its args.json and checkpoints stay as they were);
#  - a second writer of a run is refused with the holder's pid;
#  - the last step is checkpointed even when it is skipped; a run where no
#    step trained (NaN weights) fails, says nothing was saved and leaves no
#    run folder; so does a run that fails before its first step;
#  - infer / export check MANIFEST.sha256 (--no_verify reads anyway); export
#    removes the OUT.tmp-PID of an export that was killed;
#  - files that are not regular (a symlink to /dev/zero, a folder) are
#    refused at once; a cut tokenizer.bin is refused at load naming both sizes;
#  - a NUL (\u0000) in a dataset string refuses the record, naming file and line;
#  - infer --template none keeps the first generated token's leading space.
# Usage: sh tests/cli_integrity.sh path/to/anytune   (from the repository root)
set -u
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BIN=${1:?usage: cli_integrity.sh ANYTUNE}
M=demo/stories260K
D=demo/identity.json
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command status
    if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
runs() { ls -d "$1"/v*-* 2>/dev/null | wc -l; }
SFT="$BIN sft --model $M --dataset $D --logging_steps 1"

# ---- 22.1 / 21.1: resume takes the run's own options ----
O=$T/out
$SFT --output_dir "$O" --max_steps 4 --save_steps 2 > /dev/null 2> "$T/a.err"
check "a first run finishes" $?
V0=$(ls -d "$O"/v0-*)
cp "$V0/args.json" "$T/v0-args.json"
ls "$V0" > "$T/v0-files"
# a second run with other options, killed before its first checkpoint
ANYTUNE_DEBUG_KILL_AFTER_STEP=1 $SFT --output_dir "$O" --max_steps 200 --learning_rate 5e-3 --save_steps 2 \
    > /dev/null 2>&1
$SFT --output_dir "$O" --max_steps 200 --learning_rate 5e-3 --save_steps 2 --resume_from_checkpoint last \
    > /dev/null 2> "$T/b.err"
rc=$?
[ $rc -eq 1 ] && grep -q -- "--max_steps 200 (the run: 4)" "$T/b.err" && grep -q -- "--learning_rate" "$T/b.err"
check "resume refuses a run made with other options, naming each difference" $?
cmp -s "$V0/args.json" "$T/v0-args.json" && ls "$V0" | cmp -s - "$T/v0-files"
check "the older finished run is left as it was (args.json, checkpoints)" $?
# no options given: the run's own; the newest run with a checkpoint is v0, finished
$BIN sft --output_dir "$O" --resume_from_checkpoint last > /dev/null 2> "$T/c.err"
[ $? -eq 1 ] && grep -q "is finished" "$T/c.err" && ! grep -q "steps in" "$T/c.err"
check "resuming a finished run says it is finished" $?
# a run stopped after step 3 (checkpoint-2), resumed with no options: it ends its own schedule
O2=$T/out2
ANYTUNE_DEBUG_KILL_AFTER_STEP=3 $SFT --output_dir "$O2" --max_steps 6 --save_steps 2 --learning_rate 2e-3 \
    > /dev/null 2>&1
$BIN sft --output_dir "$O2" --resume_from_checkpoint last > /dev/null 2> "$T/d.err"
rc=$?
R2=$(ls -d "$O2"/v0-*)
[ $rc -eq 0 ] && [ -d "$R2/checkpoint-6" ] && grep -q "\"learning_rate\":[[:space:]]*0.002" "$R2/args.json" &&
    [ "$(grep -c '"step":6' "$R2/logging.jsonl")" -eq 1 ]
check "a bare --resume_from_checkpoint last continues the run with its own options" $?
# ---- 22.2: one writer per run ----
O6=$T/out-lock
ANYTUNE_DEBUG_KILL_AFTER_STEP=2 $SFT --output_dir "$O6" --max_steps 2000 --save_steps 2 > /dev/null 2>&1
$BIN sft --output_dir "$O6" --resume_from_checkpoint last > /dev/null 2> "$T/lock1.err" &
first=$!
R6=$(ls -d "$O6"/v0-*)
i=0
while [ $i -lt 300 ] && ! grep -q '"step":4,' "$R6/logging.jsonl" 2> /dev/null; do sleep 0.1; i=$((i + 1)); done
$BIN sft --output_dir "$O6" --resume_from_checkpoint last > /dev/null 2> "$T/lock2.err"
rc=$?
kill -TERM $first 2> /dev/null
wait $first
[ $rc -eq 1 ] && grep -q "in use by another anytune (pid $first)" "$T/lock2.err"
check "a second writer of a run is refused, naming the holder's pid" $?

$BIN sft --resume_from_checkpoint "$T/nonexistent" > /dev/null 2> "$T/e.err"
[ $? -eq 1 ] && grep -q "no such checkpoint folder" "$T/e.err"
check "--resume_from_checkpoint of a missing folder says so" $?

# ---- 22.3 / 22.4 / 21.6: skipped steps ----
O3=$T/out3
ANYTUNE_DEBUG_NONFINITE_FROM=3 $SFT --output_dir "$O3" --max_steps 3 --save_steps 1000 > /dev/null 2>&1
check "a run whose last step is skipped ends well" $?
[ -d "$(ls -d "$O3"/v0-*)/checkpoint-3" ]
check "the last step is checkpointed even when it is skipped" $?
O4=$T/out4
ANYTUNE_DEBUG_NONFINITE_FROM=1 $SFT --output_dir "$O4" --max_steps 3 > /dev/null 2> "$T/f.err"
[ $? -eq 1 ] && grep -q "nothing was saved" "$T/f.err" && ! grep -q "saved in" "$T/f.err" && [ "$(runs "$O4")" -eq 0 ]
check "no step trained: an error, nothing claimed saved, no run folder" $?
ANYTUNE_DEBUG_NONFINITE_FROM=1 $SFT --output_dir "$O4" --max_steps 9 > /dev/null 2> "$T/g.err"
[ $? -eq 1 ] && grep -q "no checkpoint was saved" "$T/g.err" && ! grep -q "last good checkpoint" "$T/g.err"
check "the non-finite stop does not name a checkpoint that does not exist" $?
# a run failing mid-way (train_loop's error path): it releases its lock, keeps
# its last good checkpoint, names it, claims nothing else; resume goes on from it
OM=$T/out-midway
ANYTUNE_DEBUG_NONFINITE_FROM=6 $SFT --output_dir "$OM" --max_steps 30 --save_steps 2 > /dev/null 2> "$T/h.err"
rc=$?
RM=$(ls -d "$OM"/v0-* 2>/dev/null)
[ $rc -eq 1 ] && grep -q "5 steps in a row had a non-finite loss" "$T/h.err" &&
    grep -q "the last good checkpoint is $RM/checkpoint-8" "$T/h.err" && [ -f "$RM/checkpoint-8/MANIFEST.sha256" ] &&
    ! grep -q "saved in" "$T/h.err" && [ ! -e "$RM/.anytune.lock" ] && [ ! -d "$RM/checkpoint-10" ]
check "a run failing mid-way releases its lock and names its last checkpoint" $?
[ $rc -eq 1 ] || cat "$T/h.err"
$BIN sft --output_dir "$OM" --resume_from_checkpoint last > /dev/null 2> "$T/h2.err"
[ $? -eq 0 ] && grep -q "resuming from $RM/checkpoint-8" "$T/h2.err" && [ -d "$RM/checkpoint-30" ]
check "... and the run resumes from that checkpoint" $?
# a real model with NaN weights (llama2.c file: 28 header bytes, then the embeddings)
cp tests/data/models/stories260K.bin "$T/nan.bin"
python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<f', float('nan')) * 16384)" > "$T/nans"
dd if="$T/nans" of="$T/nan.bin" bs=1 seek=28 conv=notrunc 2> /dev/null
$BIN sft --model "$T/nan.bin" --tokenizer tests/data/goldens/tok512.bin --dataset $D --max_steps 3 \
    --output_dir "$O4" > /dev/null 2> "$T/h.err"
[ $? -eq 1 ] && ! grep -q "saved in" "$T/h.err" && [ "$(runs "$O4")" -eq 0 ]
check "a model with NaN weights fails without claiming a save" $?

# ---- 22.5 / 22.6: checkpoints are verified; stale staging folders go ----
CK=$(ls -d "$V0"/checkpoint-4)
cp -r "$CK" "$T/ck"
python3 - "$T/ck/adapter_model.safetensors" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[-4:] = b'\x00\x00\xc0\x7f'  # a NaN in the last value
open(p, 'wb').write(b)
EOF
$BIN infer --model $M --adapters "$T/ck" --prompt hi --max_new_tokens 2 > /dev/null 2> "$T/i.err"
[ $? -eq 1 ] && grep -q "adapter_model.safetensors does not match" "$T/i.err"
check "infer refuses an adapter that does not match its manifest, naming the file" $?
$BIN infer --model $M --adapters "$T/ck" --prompt hi --max_new_tokens 2 --no_verify > /dev/null 2>&1
check "--no_verify reads it anyway" $?
$BIN export --model $M --adapters "$T/ck" --merge_lora --to hf --output_dir "$T/merged" > /dev/null 2> "$T/j.err"
[ $? -ne 0 ] && grep -q "adapter_model.safetensors does not match" "$T/j.err" && [ ! -e "$T/merged" ]
check "export refuses it too" $?
# a full fine-tuning checkpoint loaded as --model is checked too
$SFT --train_type full --output_dir "$T/outf" --max_steps 1 > /dev/null 2>&1
CKF=$(ls -d "$T"/outf/v0-*/checkpoint-1)
printf 'x' | dd of="$CKF/model.safetensors" bs=1 seek=200 conv=notrunc 2> /dev/null
$BIN infer --model "$CKF" --tokenizer $M --prompt hi --max_new_tokens 2 > /dev/null 2> "$T/i2.err"
[ $? -eq 1 ] && grep -q "model.safetensors does not match" "$T/i2.err"
check "infer refuses a full checkpoint that does not match its manifest" $?
sh -c 'exit 0' & dead=$!
wait $dead
mkdir -p "$T/exp.tmp-$dead" "$T/exp.tmp-$$"
$BIN export --model $M --adapters "$CK" --merge_lora --to hf --output_dir "$T/exp" > /dev/null 2>&1
[ $? -eq 0 ] && [ ! -e "$T/exp.tmp-$dead" ] && [ -d "$T/exp.tmp-$$" ]
check "export removes the staging folder of a dead export, not of a live one" $?

# ---- 22.8: files that are not regular ----
ln -s /dev/zero "$T/zero.yaml"
timeout 20 $BIN sft --config "$T/zero.yaml" --dry_run > /dev/null 2> "$T/k.err"
[ $? -eq 2 ] && grep -q "not a regular file" "$T/k.err"
check "--config that is /dev/zero is refused at once" $?
mkdir "$T/d.yaml"
$BIN sft --config "$T/d.yaml" --dry_run > /dev/null 2> "$T/l.err"
[ $? -eq 2 ] && grep -q "a folder" "$T/l.err"
check "--config that is a folder says so" $?
for f in config.json tokenizer_config.json; do
    mkdir -p "$T/m-$f"
    cp $M/* "$T/m-$f/"
    rm "$T/m-$f/$f"
    ln -s /dev/zero "$T/m-$f/$f"
    timeout 20 $BIN infer --model "$T/m-$f" --prompt hi --max_new_tokens 2 > /dev/null 2> "$T/m.err"
    [ $? -eq 1 ] && grep -q "$f: a device" "$T/m.err"
    check "a model's $f that is /dev/zero is refused at once" $?
done

# ---- 22.12 / 21.6: a tokenizer that does not fit the model ----
head -c 100 $M/tokenizer.bin > "$T/cut.bin"
$BIN infer --model $M --tokenizer "$T/cut.bin" --prompt hi > /dev/null 2> "$T/n.err"
[ $? -eq 1 ] && grep -q "has 7 ids but the model" "$T/n.err" && grep -q "vocabulary of 512" "$T/n.err"
check "a cut tokenizer.bin is refused at load, naming both sizes" $?
O5=$T/out5
$SFT --tokenizer "$T/cut.bin" --output_dir "$O5" --max_steps 2 > /dev/null 2> "$T/o.err"
[ $? -eq 1 ] && grep -q "vocabulary of 512" "$T/o.err" && [ "$(runs "$O5")" -eq 0 ]
check "training with it fails at load and leaves no run folder" $?
for to in hf gguf; do
    $BIN export --model $M --tokenizer "$T/cut.bin" --to $to --output_dir "$T/cut-$to" --quiet > /dev/null 2> "$T/o.err"
    [ $? -eq 1 ] && grep -q "has 7 ids but the model" "$T/o.err" && [ ! -e "$T/cut-$to" ]
    check "export --to $to refuses it too, writing nothing" $?
done

# ---- 22.11: NUL in a dataset string ----
printf '{"query": "hi", "response": "a\\u0000b"}\n{"query": "ho", "response": "c"}\n' > "$T/nul.jsonl"
$SFT --dataset "$T/nul.jsonl" --output_dir "$T/out6" --max_steps 1 --strict > /dev/null 2> "$T/p.err"
[ $? -eq 1 ] && grep -q "nul.jsonl:1:.*NUL" "$T/p.err"
check "a NUL in a dataset string refuses the record, naming file and line" $?

# ---- messages that say what is wrong ----
$SFT --dataset "$D#-1" --output_dir "$T/out8" --max_steps 1 > /dev/null 2> "$T/t1.err"
[ $? -eq 1 ] && grep -q "sample count after '#'" "$T/t1.err"
check "FILE#-1 names the sample count" $?
$SFT --output_dir "" --max_steps 1 > /dev/null 2> "$T/t2.err"
[ $? -eq 1 ] && grep -q -- "--output_dir is empty" "$T/t2.err"
check "--output_dir \"\" says it is empty" $?
# the summary of skipped records is printed once
printf '{"query": "hi", "response": "a\u0000b"}\n{"query": "ho", "response": "c"}\n' > "$T/skip.jsonl"
$SFT --dataset "$T/skip.jsonl" --output_dir "$T/out9" --max_steps 1 > /dev/null 2> "$T/t3.err"
[ $? -eq 0 ] && [ "$(grep -c "skipped 1 bad record" "$T/t3.err")" -eq 1 ]
check "the dataset's skip summary is printed once" $?

# ---- 22.14: a continued text keeps its first space ----
$BIN infer --model $M --template none --prompt "Once upon a" --max_new_tokens 3 --stream false > "$T/q.out" 2>/dev/null
[ "$(head -c 1 "$T/q.out")" = " " ]
check "infer --template none keeps the first token's leading space" $?

# ---- 22.15: the LoRA GGUF that export writes loads as --adapters ----
$SFT --output_dir "$T/out7" --max_steps 30 --learning_rate 5e-3 > /dev/null 2>&1
CK7=$(ls -d "$T"/out7/v0-*/checkpoint-30)
$BIN export --model $M --adapters "$CK7" --to gguf --output_dir "$T/gg" > /dev/null 2>&1
ASK="--prompt Who_are_you? --max_new_tokens 24 --stream false"
$BIN infer --model $M --adapters "$CK7" $ASK > "$T/s1" 2>/dev/null
$BIN infer --model $M --adapters "$T/gg/adapter-f32.gguf" $ASK > "$T/s2" 2> "$T/s.err"
$BIN infer --model $M $ASK > "$T/s0" 2>/dev/null
cmp -s "$T/s1" "$T/s2" && ! cmp -s "$T/s0" "$T/s2"
check "infer --adapters ADAPTER.gguf answers as the checkpoint it was exported from" $?
# merged from the GGUF adapter: the weights merged from the checkpoint, byte for byte (both
# merge the same f32 values; how close merged weights answer to the unmerged adapter is
# test_export's, against PyTorch with a tolerance: W + s·BA rounded once is not x·Wᵀ +
# s·(xAᵀ)Bᵀ, and a greedy answer compared byte for byte flips at a near-tie)
$BIN export --model $M --adapters "$T/gg/adapter-f32.gguf" --merge_lora --to hf --output_dir "$T/gm" > /dev/null 2>&1 &&
    $BIN export --model $M --adapters "$CK7" --merge_lora --to hf --output_dir "$T/gm2" > /dev/null 2>&1 &&
    cmp -s "$T/gm/model.safetensors" "$T/gm2/model.safetensors" &&
    $BIN infer --model "$T/gm" $ASK > "$T/s3" 2>/dev/null && ! cmp -s "$T/s0" "$T/s3"
check "export --merge_lora takes it too" $?
$BIN infer --adapters "$T/gg/adapter-f32.gguf" $ASK > /dev/null 2> "$T/s.err"
[ $? -eq 1 ] && grep -q "a LoRA GGUF file does not say which model it was trained on: give --model" "$T/s.err"
check "--adapters ADAPTER.gguf without --model says the GGUF names no base" $?

# ---- 22.16: special tokens written in the text are parsed, as llama.cpp and Hugging Face do ----
for m in $M tests/data/models/stories260K.gguf; do
    $BIN infer --model $m --template none --prompt "a<unk>" --max_new_tokens 1 --verbose > /dev/null 2> "$T/r.err"
    grep -q "prefill: 3 tokens" "$T/r.err" # BOS, "a", <unk>
    check "<unk> in the prompt is one token ($m)" $?
done

exit $fail
