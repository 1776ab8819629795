#!/bin/sh
# A --reward_command for test_grpo: reads one JSON object per line, answers
# per line by mode ($1): ok (1 when the completion says "yes", else
# {"reward": 0.5}), bad (a malformed line), two (two numbers on a line:
# only one is a reward), short (one line too few),
# sleep (never answers in time), fail (exit status 3).
mode=$1
n=0
while IFS= read -r line; do
    n=$((n + 1))
    case $mode in
    bad) if [ $n -eq 2 ]; then echo "not a number"; else echo 0; fi ;;
    two) if [ $n -eq 2 ]; then echo "0.5 0.7"; else echo 0; fi ;;
    short) if [ $n -gt 1 ]; then echo 1; fi ;;
    sleep) sleep 3 ;;
    *) case $line in
        *'"completion":"yes'*) echo 1 ;;
        *) echo '{"reward": 0.5}' ;;
        esac ;;
    esac
done
[ "$mode" = fail ] && exit 3
exit 0
