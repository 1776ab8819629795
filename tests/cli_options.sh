#!/bin/sh
# What an ms-swift user types (issues 21 and 22): the option table's ranges
# with the value as typed, ms-swift's words mapped, accepted with a note or
# refused with what to use instead, a config file's unknown keys at once,
# ms-swift's command names, --version; an adapter that knows its base, a run
# folder as --adapters, export's ms-swift defaults and single-file GGUF.
# Usage: sh tests/cli_options.sh path/to/anytune   (from the repository root)
set -u
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BIN=${1:?usage: cli_options.sh ANYTUNE}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command status
    if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
# refused with exit status 2 and a message holding $3
refused() { # name, expected text, options...
    name=$1 want=$2
    shift 2
    "$BIN" "$@" > /dev/null 2> "$T/err"
    rc=$?
    [ $rc -eq 2 ] && grep -qF -- "$want" "$T/err"
    check "$name" $?
    [ $rc -eq 2 ] || { echo "  status $rc:"; cat "$T/err"; }
}

"$BIN" --version > "$T/v"
grep -q "^anytune [0-9][0-9.]*" "$T/v"; check "--version" $?
"$BIN" deploy --help | grep -q "usage: anytune serve"; check "deploy is serve" $?
"$BIN" app --help | grep -q "usage: anytune web-ui"; check "app is web-ui" $?
"$BIN" sft --help > "$T/help"
grep -q -- "--adam_beta1 NUM .*(range \[0, 1))" "$T/help" && grep -q -- "--lora_rank INT .*(range \[1, 65536\])" "$T/help"
check "--help shows each number's range" $?
grep -q -- "--weight_decay NUM .*(default: 0.1)" "$T/help"; check "--help shows the defaults the library uses" $?

# issue 22.9 / 22.10: every value against its meaning, reported as typed
refused "negative learning rate" "--learning_rate -1e-3: out of range (0, 1]" sft --learning_rate -1e-3
refused "learning rate 1e30" "--learning_rate 1e30: out of range" sft --learning_rate 1e30
refused "adam_beta1 1" "--adam_beta1 1: out of range [0, 1)" sft --adam_beta1 1
refused "adam_beta2 2" "--adam_beta2 2: out of range [0, 1)" sft --adam_beta2 2
refused "warmup_ratio 2" "--warmup_ratio 2: out of range [0, 1]" sft --warmup_ratio 2
refused "warmup_steps -3" "--warmup_steps -3: out of range" sft --warmup_steps -3
refused "num_train_epochs 0" "--num_train_epochs 0: out of range (0, 1e6]" sft --num_train_epochs 0
refused "num_train_epochs -1" "--num_train_epochs -1: out of range" sft --num_train_epochs -1
refused "lora_rank 2^31 as typed" "--lora_rank 2147483648: out of range [1, 65536]" sft --lora_rank 2147483648
refused "top_p 0 (infer)" "--top_p 0: out of range (0, 1]" infer --top_p 0 --prompt x
refused "port 70000 (serve)" "--port 70000: out of range [0, 65535]" serve --port 70000
refused "max_body_bytes 100 (serve)" "--max_body_bytes must be 0 (the default for the model) or >= 1024" serve --max_body_bytes 100
refused "a choice misspelled" "did you mean 'cosine'" sft --lr_scheduler_type cosin

# issue 21.9: ms-swift's vocabulary
refused "--deepspeed says what instead" "mpirun -np N" sft --deepspeed zero2
refused "--max_pixels under one merged patch" "--max_pixels 100: out of range [784, 2147483647]" sft --max_pixels 100
"$BIN" sft --attn_impl flash_attn --dataloader_num_workers 4 --dry_run > /dev/null 2> "$T/note"
[ $? -eq 0 ] && grep -q "note: --attn_impl changes nothing here: attention is always the fused" "$T/note" &&
    grep -q "note: --dataloader_num_workers" "$T/note"
check "--attn_impl and --dataloader_num_workers accepted with why" $?
refused "--bf16 with another --torch_dtype" "disagree" sft --bf16 true --torch_dtype float32 --dry_run
"$BIN" sft --fp16 true --dry_run --json > "$T/plan.json" 2>/dev/null
grep -q '"weight_dtype":[[:space:]]*"f16"' "$T/plan.json"; check "--fp16 true is --torch_dtype float16" $?
"$BIN" sft --dry_run --json > "$T/plan0.json" 2>/dev/null
grep -q '"max_length":[[:space:]]*512,' "$T/plan0.json"
check "--max_length defaults to the model's context (512 for the demo model)" $?
printf 'lora_rnak: 8\nlearning_rate: 1e-4\nflash_attn_x: true\nnum_epochs: 3\n' > "$T/c.yaml"
refused "a config's unknown keys all at once" "3 unknown options" sft --config "$T/c.yaml"
grep -q "lora_rnak" "$T/err" && grep -q "flash_attn_x" "$T/err" && grep -q "num_epochs" "$T/err"
check "... each named" $?
"$BIN" infer --template qwen2_5 --prompt "Hi" --max_new_tokens 4 > /dev/null 2> "$T/tq"
check "--template qwen2_5 (ms-swift's name) is chatml" $?
"$BIN" infer --template qwen25 --prompt x > /dev/null 2> "$T/err"
[ $? -eq 1 ] && grep -q "qwen2_5" "$T/err"; check "a template misspelled lists ms-swift's names too" $?

# --model_type (ms-swift's meaning): the family to read a model folder as
mkdir "$T/mt" && cp demo/stories260K/* "$T/mt/" && sed -i 's/"model_type": "llama"/"model_type": "my_llama"/' "$T/mt/config.json"
"$BIN" infer --model demo/stories260K --template none --prompt "Once upon a time" --max_new_tokens 12 > "$T/mt_ref" 2>/dev/null
"$BIN" infer --model "$T/mt" --template none --prompt "Once upon a time" --max_new_tokens 12 > /dev/null 2> "$T/err"
[ $? -ne 0 ] && grep -q 'model_type "my_llama" is not supported' "$T/err"
check "a config.json naming an unknown family fails without --model_type" $?
"$BIN" infer --model "$T/mt" --model_type llama3 --template none --prompt "Once upon a time" --max_new_tokens 12 \
    > "$T/mt_out" 2> "$T/err"
[ $? -eq 0 ] && [ -s "$T/mt_ref" ] && cmp -s "$T/mt_ref" "$T/mt_out"
check "--model_type llama3 reads it as a Llama: the same answer as the original folder" $?
"$BIN" sft --model "$T/mt" --model_type llama --dry_run > /dev/null 2>&1
check "sft --model_type: the planner reads the folder as that family too" $?
"$BIN" export --model "$T/mt" --model_type llama --output_dir "$T/mt_fixed" --quiet > /dev/null 2> "$T/err" &&
    grep -q '"model_type":[[:space:]]*"llama"' "$T/mt_fixed/config.json" && grep -q "read as llama (--model_type llama" "$T/err"
check "export --model_type writes the family into the exported config.json" $?
refused "--model_type of an unknown family lists the known ones" "qwen2_5" infer --model "$T/mt" --model_type gpt9 --prompt x
"$BIN" infer --model demo/stories260K --model_type qwen2_5 --prompt x --max_new_tokens 2 > /dev/null 2> "$T/err"
[ $? -ne 0 ] && grep -q "bias" "$T/err"
check "--model_type qwen2_5 on a Llama folder wants Qwen2's q/k/v biases (the family really changes)" $?

exit $fail
