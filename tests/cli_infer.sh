#!/bin/sh
# anytune infer as a user runs it, on llama2.c's stories260K:
#  - an empty prompt (no template) starts from BOS and prints, greedily, the
#    story llama2.c's run printed at -t 0.0, byte for byte;
#  - --temperature 1 --top_p 0.9 --seed 133742 prints the story run printed
#    with those settings (stories260K.md);
#  - the interactive chat answers like --prompt, keeps history, /reset clears it;
#  - --verbose reports prefill and decode speed; bad input is a clear error.
# Usage: sh tests/cli_infer.sh path/to/anytune   (from the repository root)
set -u
# a 260K-parameter model gains nothing from threads, and on a busy machine their
# barriers cost far more than the work (see the report of the serve issue)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BIN=${1:?usage: cli_infer.sh ANYTUNE}
MODEL="--model tests/data/models/stories260K.bin --tokenizer tests/data/goldens/tok512.bin"
MD=tests/data/goldens/stories260K.md
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command status
    if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
# the code block after the line that ends with $1 in stories260K.md (plus the newline infer prints)
block() {
    awk -v cmd="$1" 'found && /^```/ { exit } found { print } index($0, cmd) && /^\$ \.\/run/ { found = 1 }' "$MD"
}

block "-t 0.0" > "$T/want0"
"$BIN" infer $MODEL --prompt "" --max_new_tokens 256 > "$T/got0" 2> "$T/err0"
cmp -s "$T/want0" "$T/got0"; check "greedy story from BOS equals llama2.c's" $?

block "-t 1.0 -p 0.9 -s 133742" > "$T/want1"
"$BIN" infer $MODEL --prompt "" --max_new_tokens 256 --temperature 1 --top_p 0.9 --seed 133742 --stream false \
    > "$T/got1" 2> "$T/err1"
cmp -s "$T/want1" "$T/got1"; check "sampled story (seed 133742) equals llama2.c's" $?

"$BIN" infer $MODEL --prompt "" --max_new_tokens 40 --verbose > /dev/null 2> "$T/errv"
grep -q "prefill: .* tokens/s; decode: .* tokens/s" "$T/errv"; check "--verbose reports tokens/s" $?

CHAT="$MODEL --template chatml --max_new_tokens 24"
"$BIN" infer $CHAT --prompt "Hello" > "$T/one" 2>/dev/null
printf 'Hello\n/exit\n' | "$BIN" infer $CHAT > "$T/int1" 2>/dev/null
cmp -s "$T/one" "$T/int1"; check "interactive first turn equals --prompt" $?
printf 'Hello\n/reset\nHello\n' | "$BIN" infer $CHAT > "$T/int2" 2>/dev/null
cat "$T/one" "$T/one" | cmp -s - "$T/int2"; check "/reset forgets the history" $?
printf 'Hello\nHello\n' | "$BIN" infer $CHAT > "$T/int3" 2>/dev/null
[ "$(wc -c < "$T/int3")" -gt "$(wc -c < "$T/one")" ]; check "a second turn answers" $?
printf '/system You tell stories.\nHello\n' | "$BIN" infer $CHAT > "$T/int4" 2>/dev/null
"$BIN" infer $CHAT --system "You tell stories." --prompt "Hello" > "$T/one4" 2>/dev/null
cmp -s "$T/one4" "$T/int4"; check "/system TEXT equals --system" $?

"$BIN" infer --model tests/data/models/nothing.bin --prompt x > /dev/null 2> "$T/e1"
[ $? -eq 1 ] && grep -q "nothing.bin" "$T/e1"; check "a missing model is an error naming it" $?
"$BIN" infer $MODEL --temperatur 1 > /dev/null 2> "$T/e2"
[ $? -eq 2 ] && grep -q "temperature" "$T/e2"; check "a misspelled option suggests the right one" $?
"$BIN" infer $MODEL --template nosuch --prompt x > /dev/null 2> "$T/e3"
[ $? -eq 1 ] && grep -q "nosuch" "$T/e3"; check "an unknown template is an error" $?
"$BIN" infer $MODEL --top_p 0 --prompt x > /dev/null 2> "$T/e4"
[ $? -eq 2 ] && grep -q "top_p 0: out of range" "$T/e4"; check "top_p 0 is refused (the option's range)" $?
# quantized weights (QLoRA models): q8_0 keeps the greedy story's opening
"$BIN" infer $MODEL --prompt "" --max_new_tokens 256 --quant_bits 8 --verbose > "$T/gotq" 2> "$T/errq"
[ "$(head -c 60 "$T/gotq")" = "$(head -c 60 "$T/want0")" ] && grep -q "quantized to q8_0" "$T/errq"
check "--quant_bits 8 runs the quantized model and keeps the story's opening" $?
"$BIN" infer $MODEL --prompt x --quant_bits 3 > /dev/null 2> "$T/e5"
[ $? -eq 1 ] && grep -q "quant_bits 3" "$T/e5"; check "--quant_bits 3 is refused" $?
exit $fail
