#!/bin/sh
# A run as a user lives it (issue 21): evaluation visible while training and
# the best checkpoint named at the end; the summary counts the steps this
# process ran (a resumed run says where it started); an adapter knows its
# base and a run folder means its newest checkpoint; export's ms-swift
# defaults (ADAPTER-merged) and a single-file GGUF that infer finds in a
# folder; eval counts what it dropped and keeps each run's results; the
# chat's /help and /reset.
# Usage: sh tests/cli_runs.sh path/to/anytune   (from the repository root)
set -u
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BIN=${1:?usage: cli_runs.sh ANYTUNE}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command status
    if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
DEMO="--max_steps 4 --save_steps 2 --eval_steps 2 --logging_steps 2 --split_dataset_ratio 0.25 --preview_max_tokens 4"

# issue 21.12: eval_loss on the console, in the plot, the best checkpoint at the end; 21.4: the summary
"$BIN" sft $DEMO --load_best_model_at_end --output_dir "$T/o" > /dev/null 2> "$T/sft"
check "the demo trains with validation" $?
RUN=$(ls -d "$T"/o/v0-*)
grep -q "step 2/4  eval_loss [0-9]" "$T/sft" && grep -q "step 4/4  eval_loss [0-9]" "$T/sft"
check "eval_loss on the console" $?
grep -q "best checkpoint: $RUN/checkpoint-[24] (eval_loss [0-9.]*)" "$T/sft"; check "the best checkpoint named" $?
grep -q "anytune: 4 steps in .*logged loss [0-9.]* -> [0-9.]*; saved in $RUN" "$T/sft"
check "the summary: steps and logged losses" $?
grep -q "eval_loss" "$RUN/images/train_loss.svg"; check "eval_loss in the plot" $?
"$BIN" sft $DEMO --load_best_model_at_end --save_steps 3 --output_dir "$T/bad" > /dev/null 2> "$T/e"
[ $? -ne 0 ] && grep -q "not a multiple of --eval_steps" "$T/e"; check "--load_best_model_at_end wants saves on evals" $?

# --load_best_model_at_end with --save_total_limit 1 (transformers' rule): the best checkpoint stays beside
# the newest, the run ends with it, the summary names it, --adapters RUN takes it. Here the eval_loss of
# step 50 is the lowest, below the last step's (the premise is checked from logging.jsonl).
"$BIN" sft --max_steps 80 --save_steps 5 --eval_steps 5 --logging_steps 5 --split_dataset_ratio 0.25 \
    --learning_rate 5e-3 --load_best_model_at_end --save_total_limit 1 --output_dir "$T/lb" > /dev/null 2> "$T/lb.err"
LB=$(ls -d "$T"/lb/v0-*)
BEST=$(python3 -c "
import json, sys
ev = [(json.loads(l)['eval_loss'], json.loads(l)['step']) for l in open(sys.argv[1]) if 'eval_loss' in l]
print(min(ev)[1])" "$LB/logging.jsonl")
[ "$BEST" != 80 ] && [ "$(ls -d "$LB"/checkpoint-* | wc -l)" -eq 2 ] && [ -d "$LB/checkpoint-$BEST" ] && [ -d "$LB/checkpoint-80" ]
check "the best checkpoint (step $BEST) is kept beside the newest by --save_total_limit 1" $?
grep -q "best checkpoint: $LB/checkpoint-$BEST (eval_loss [0-9.]*); the final model (--load_best_model_at_end: its weights were loaded" "$T/lb.err"
check "the summary names the best checkpoint as the final model" $?
"$BIN" infer --adapters "$LB" --prompt "Who are you?" --max_new_tokens 12 > "$T/lb.got" 2> "$T/lb.e"
"$BIN" infer --adapters "$LB/checkpoint-$BEST" --prompt "Who are you?" --max_new_tokens 12 > "$T/lb.want" 2> /dev/null
cmp -s "$T/lb.got" "$T/lb.want" && grep -q "using its best (--load_best_model_at_end) checkpoint, $LB/checkpoint-$BEST" "$T/lb.e"
check "--adapters RUN of such a run takes its best checkpoint" $?

ANYTUNE_DEBUG_TERM_AFTER_STEP=2 "$BIN" sft $DEMO --output_dir "$T/r" > /dev/null 2>&1
"$BIN" sft $DEMO --output_dir "$T/r" --resume_from_checkpoint last > /dev/null 2> "$T/res"
grep -q "anytune: 2 steps (resumed at 2, 4 in all)" "$T/res"; check "a resumed run says where it started" $?

# issue 21.2 / 21.14: --adapters without --model; a run folder as --adapters
RUNR=$(ls -d "$T"/r/v0-*)
"$BIN" infer --model demo/stories260K --adapters "$RUNR/checkpoint-4" --prompt "Who are you?" --max_new_tokens 12 \
    > "$T/want" 2>/dev/null
"$BIN" infer --adapters "$RUNR" --prompt "Who are you?" --max_new_tokens 12 > "$T/got" 2> "$T/err"
cmp -s "$T/want" "$T/got" && grep -q "is a run folder: using its newest checkpoint, $RUNR/checkpoint-4" "$T/err" &&
    grep -q "no --model given: using demo/stories260K, the base model of" "$T/err"
check "infer --adapters RUN: the base from args.json, the newest checkpoint" $?
mkdir "$T/empty"
"$BIN" infer --adapters "$T/empty" --prompt x > /dev/null 2> "$T/e"
[ $? -eq 1 ] && grep -q "neither an adapter" "$T/e"; check "--adapters of a folder with nothing says so" $?

# issue 21.2 / 21.13: export's defaults and a single GGUF file
"$BIN" export --adapters "$RUN/checkpoint-4" --merge_lora --quiet > /dev/null 2> "$T/ex"
[ $? -eq 0 ] && [ -f "$RUN/checkpoint-4-merged/config.json" ] && grep -q "writing $RUN/checkpoint-4-merged" "$T/ex"
check "export --merge_lora: the base from the run, ADAPTER-merged" $?
"$BIN" export --adapters "$RUN" --merge_lora --to gguf --output_dir "$T/x.gguf" --quiet > /dev/null 2>&1
[ -f "$T/x.gguf" ] && [ "$(head -c 4 "$T/x.gguf")" = "GGUF" ] && ! ls -d "$T"/x.gguf.tmp* > /dev/null 2>&1
check "export --to gguf --output_dir x.gguf writes that file" $?
mkdir "$T/g" && cp "$T/x.gguf" "$T/g/"
"$BIN" infer --model "$T/g" --prompt "Who are you?" --max_new_tokens 12 > "$T/gg" 2> "$T/ge"
[ $? -eq 0 ] && [ -s "$T/gg" ] && grep -q "holds one GGUF file" "$T/ge"; check "infer --model a folder with one GGUF" $?

# issue 21.11: batch inference over a dataset, continuous batching, the reference beside each answer
"$BIN" infer --adapters "$RUN/checkpoint-4" --val_dataset demo/identity.json --model_name anytune \
    --model_author "the anytune team" --max_new_tokens 12 --max_batch_size 3 --result_path "$T/res.jsonl" \
    > /dev/null 2> "$T/bi"
[ $? -eq 0 ] && [ "$(wc -l < "$T/res.jsonl")" -eq 16 ] && grep -q "16 prompts answered" "$T/bi"
check "infer --val_dataset answers every record" $?
# each answer equals the one-prompt answer (greedy): batching changes nothing
ok=0
for k in 1 2 3 4 5; do
    q=$(sed -n "${k}p" "$T/res.jsonl" | sed 's/.*"messages":\[{"role":"user","content":"\([^"]*\)"}\].*/\1/')
    want=$(sed -n "${k}p" "$T/res.jsonl" | sed 's/^{"response":"\([^"]*\)".*/\1/')
    got=$("$BIN" infer --adapters "$RUN/checkpoint-4" --prompt "$q" --max_new_tokens 12 2>/dev/null)
    [ "$got" = "$want" ] || { ok=1; echo "  record $k ($q): batch '$want', alone '$got'"; }
done
check "batched answers equal one-prompt answers" $ok
grep -q '"labels":"Hello! I am anytune, an AI assistant developed by the anytune team.' "$T/res.jsonl"
check "the reference answer beside each result" $?
"$BIN" infer --adapters "$RUN/checkpoint-4" --load_data_args true --max_new_tokens 4 --result_path "$T/val.jsonl" \
    > /dev/null 2>&1
[ $? -eq 0 ] && [ "$(wc -l < "$T/val.jsonl")" -eq 4 ] && grep -q '"labels":".*anytune' "$T/val.jsonl"
check "--load_data_args answers the run's validation split (4 of 16)" $?

# issue 21.5 / 21.14: eval counts what it drops and keeps every run's results
EV="--adapters $RUN --dataset demo/identity.json --max_length 80 --eval_output_dir $T/ev"
"$BIN" eval $EV > "$T/ev1" 2>/dev/null && sleep 1 && "$BIN" eval $EV > /dev/null 2>&1
grep -q "^samples: [0-9]* of 16 (7 longer than --max_length 80 dropped" "$T/ev1"
check "eval: samples N of M, the dropped counted" $?
[ "$(ls "$T"/ev/loss_results-*.json | wc -l)" -eq 2 ] && [ -f "$T/ev/loss_results.json" ]
check "eval writes a new file per run" $?

# issue 21.9: ms-swift's --save_strategy / --eval_strategy, --save_only_model, --add_version, --columns
"$BIN" sft --num_train_epochs 2 --save_strategy epoch --eval_strategy no --split_dataset_ratio 0.25 \
    --save_only_model --preview_max_tokens 4 --output_dir "$T/ep" > /dev/null 2>&1
EP=$(ls -d "$T"/ep/v0-*)
[ "$(ls -d "$EP"/checkpoint-* | xargs -n1 basename | tr '\n' ' ')" = "checkpoint-3 checkpoint-6 " ] &&
    ! grep -q eval_loss "$EP/logging.jsonl" && [ ! -e "$EP/checkpoint-6/trainer_state.safetensors" ]
check "--save_strategy epoch, --eval_strategy no, --save_only_model" $?
"$BIN" sft --max_steps 2 --add_version false --preview_max_tokens 4 --output_dir "$T/flat" > /dev/null 2>&1
[ -f "$T/flat/args.json" ] && [ -d "$T/flat/checkpoint-2" ]; check "--add_version false writes into --output_dir" $?
printf '{"q": "Who are you?", "a": "I am anytune."}\n{"q": "Hi", "a": "Hello!"}\n' \
    > "$T/qa.jsonl"
"$BIN" sft --model demo/stories260K --dataset "$T/qa.jsonl" --max_steps 1 --preview_max_tokens 4 \
    --output_dir "$T/qa0" > /dev/null 2> "$T/qa0.err"
[ $? -ne 0 ] && grep -q "fit no dataset format" "$T/qa0.err"; check "unknown columns are refused" $?
"$BIN" sft --model demo/stories260K --dataset "$T/qa.jsonl" --columns '{"q": "query", "a": "response"}' \
    --max_steps 1 --preview_max_tokens 4 --output_dir "$T/qa1" > /dev/null 2>&1
check "--columns renames them (ms-swift's JSON form)" $?
"$BIN" sft --model demo/stories260K --dataset "$T/qa.jsonl" --columns '{"q": "query"} {"a": "response"}' \
    --max_steps 1 --preview_max_tokens 4 --output_dir "$T/qa2" > /dev/null 2> "$T/qa2.err"
[ $? -ne 0 ] && grep -q "expected a JSON object" "$T/qa2.err"; check "--columns: data after the object is refused" $?

# issue 21.7: self-cognition placeholders without --model_name warn; ms-swift's two-value form
SC="--model demo/stories260K --dataset demo/identity.json --max_steps 1 --save_steps 0 --preview_max_tokens 4"
"$BIN" sft $SC --output_dir "$T/sc1" > /dev/null 2> "$T/sc1.err"
grep -q "hold {{name}} / {{author}} placeholders and no --model_name" "$T/sc1.err"
check "{{name}} without --model_name is a warning" $?
"$BIN" sft $SC --model_name 小黄 "Xiao Huang" --model_author 魔搭 ModelScope --output_dir "$T/sc2" > /dev/null 2> "$T/sc2.err"
[ $? -eq 0 ] && ! grep -q "placeholders" "$T/sc2.err" && grep -q '"Xiao Huang"' "$T"/sc2/v0-*/args.json
check "--model_name 小黄 'Xiao Huang' is accepted (and kept in args.json)" $?
"$BIN" sft $SC --model_name a b c --output_dir "$T/sc3" > /dev/null 2> "$T/sc3.err"
[ $? -eq 2 ] && grep -q "two (Chinese, English)" "$T/sc3.err"; check "--model_name with three values is refused" $?

# issue 21.14: DPO's console line shows what TRL users watch
"$BIN" rlhf --rlhf_type dpo --model demo/stories260K --dataset tests/data/dpo/dpo_en_demo_8.json --template chatml \
    --max_steps 2 --logging_steps 1 --output_dir "$T/dpo" > /dev/null 2> "$T/dpo.err"
grep -a -q "step 1/2 .* rewards/accuracies [0-9.]*  rewards/margins -*[0-9.]*" "$T/dpo.err"
check "dpo: rewards/accuracies and rewards/margins on the console" $?

# issue 21.14: the chat's commands
printf '/help\nHello\n/reset\n/exit\n' | "$BIN" infer --max_new_tokens 4 > /dev/null 2> "$T/chat"
grep -q "commands: /reset" "$T/chat" && grep -q "history cleared" "$T/chat"; check "chat: /help and /reset answer" $?
exit $fail
