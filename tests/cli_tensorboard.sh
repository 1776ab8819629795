#!/bin/sh
# --report_to tensorboard (train/tensorboard.h): a short sft run with
# evaluation writes RUN/runs/events.out.tfevents.*, and an independent reader
# (tests/tb_check.py: Debian's python3-protobuf with TensorBoard's own
# event.proto compiled by protoc, CRCs recomputed bit by bit) finds every
# number of logging.jsonl at its step; a byte flipped in the file is caught;
# without the option no runs/ folder is made.
# Usage: sh tests/cli_tensorboard.sh path/to/anytune   (from the repository root)
set -u
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BIN=${1:?usage: cli_tensorboard.sh ANYTUNE}
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, command status
    if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}

mkdir -p "$T/py"
protoc -I tests/data/tensorboard/proto --python_out="$T/py" tests/data/tensorboard/proto/tensorboard/compat/proto/*.proto
check "protoc compiles TensorBoard's event.proto" $?

"$BIN" sft --max_steps 6 --logging_steps 2 --eval_steps 3 --split_dataset_ratio 0.2 --save_steps 100 \
    --report_to tensorboard --add_version false --output_dir "$T/run" > "$T/out.txt" 2>&1
check "anytune sft --report_to tensorboard" $?
ls "$T"/run/runs/events.out.tfevents.* > /dev/null 2>&1
check "an event file in RUN/runs" $?
/usr/bin/python3 tests/tb_check.py "$T/py" "$T/run"
check "every logged number is a scalar of its step, CRCs and protobufs valid" $?
grep -q '"eval_loss"' "$T/run/logging.jsonl"
check "... evaluations among them" $?

# a damaged file must be caught by the reader (the reader is not blind)
cp -r "$T/run" "$T/bad"
f=$(ls "$T"/bad/runs/events.out.tfevents.* | head -1)
size=$(wc -c < "$f")
printf '\377' | dd of="$f" bs=1 seek=$((size - 9)) conv=notrunc 2> /dev/null
/usr/bin/python3 tests/tb_check.py "$T/py" "$T/bad" > "$T/bad.txt" 2>&1
[ $? -ne 0 ] && grep -q "CRC" "$T/bad.txt"
check "a flipped byte fails the CRC check" $?

"$BIN" sft --max_steps 1 --add_version false --output_dir "$T/plain" > /dev/null 2>&1
[ ! -e "$T/plain/runs" ]
check "without --report_to: no runs/ folder" $?
exit $fail
