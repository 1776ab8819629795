#!/bin/sh
# The README's quick start, run as written on the bundled demo model (issue
# 21.15): the block between the "walkthrough" markers of README.md, with
# MODEL set to demo/stories260K and `serve` stopped once it listens (on a
# free port). Each command must succeed and write what the README says.
# Usage: sh tests/cli_walkthrough.sh path/to/anytune   (from the repository root)
set -u
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BIN=${1:?usage: cli_walkthrough.sh ANYTUNE}
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
ROOT=$PWD
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command status
    if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}

awk '/<!-- walkthrough: end -->/ { on = 0 } on && !/^```/ { print } /<!-- walkthrough: begin -->/ { on = 1 }' \
    README.md > "$T/quickstart.sh"
[ "$(grep -c '^anytune ' "$T/quickstart.sh")" -ge 7 ]; check "the README's quick start has its commands" $?
grep -q '^MODEL=' "$T/quickstart.sh"; check "... and a MODEL= line to point at the demo" $?
sed -i "s|^MODEL=.*|MODEL=$ROOT/demo/stories260K|" "$T/quickstart.sh"

# `anytune` as the quick start calls it: each command's output kept by its number
cat > "$T/run.sh" <<'RUN'
n=0
anytune() {
    n=$((n + 1))
    if [ "$1" = serve ]; then
        "$BIN" "$@" --port 0 > "log.$n.out" 2> "log.$n.err" &
        pid=$!
        i=0
        while [ $i -lt 300 ] && ! grep -q "on http://" "log.$n.err" 2>/dev/null && kill -0 $pid 2>/dev/null; do
            sleep 0.1
            i=$((i + 1))
        done
        grep -q "on http://" "log.$n.err" || { echo "FAILED: anytune $*"; cat "log.$n.err"; status=1; }
        kill $pid 2>/dev/null
        wait $pid 2>/dev/null
        return 0
    fi
    "$BIN" "$@" > "log.$n.out" 2> "log.$n.err" || { echo "FAILED: anytune $* (status $?)"; tail -3 "log.$n.err"; status=1; }
}
status=0
RUN
cat "$T/quickstart.sh" >> "$T/run.sh"
echo 'exit $status' >> "$T/run.sh"
(cd "$T" && BIN=$BIN sh run.sh)
check "every quick-start command runs" $?

cd "$T"
RUN=$(ls -d output/v*-* | tail -n 1)
[ "$(wc -l < my_data.jsonl)" -eq 2 ]; check "1. the data file" $?
[ -f "$RUN/args.json" ] && [ -f "$RUN/logging.jsonl" ] && [ -f "$RUN/images/train_loss.svg" ] &&
    ls "$RUN"/checkpoint-*/adapter_model.safetensors > /dev/null 2>&1
check "2. sft: args.json, logging.jsonl, the plot, a PEFT checkpoint" $?
awk '/logged loss/ { split($0, a, "logged loss "); split(a[2], b, " -> "); exit !(b[2] + 0 < b[1] + 0) }' log.1.err
check "2. sft: the logged loss went down" $?
grep -q '"model":[[:space:]]*".*demo/stories260K"' "$RUN/args.json"; check "2. args.json names the base model" $?
[ -s log.2.out ]; check "3. infer answers" $?
[ "$(wc -l < answers.jsonl)" -eq 2 ] && grep -q '"labels":"I am Lumi' answers.jsonl
check "4. infer --val_dataset: one answer per record, the reference beside it" $?
[ -f eval_output/loss_results.json ] && grep -q "^eval_loss: " log.4.out; check "5. eval: loss and its file" $?
[ -f merged/config.json ] && [ -f merged/model.safetensors ]; check "6. export: the merged folder" $?
[ -f model.gguf ] && [ "$(head -c 4 model.gguf)" = "GGUF" ]; check "6. export: model.gguf is one file" $?
grep -q "1 adapter" log.7.err; check "7. serve listens with the adapter" $?
exit $fail
