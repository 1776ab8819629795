#!/usr/bin/python3
"""An independent reader of anytune's TensorBoard event files (tests/cli_tensorboard.sh).

Usage: /usr/bin/python3 tests/tb_check.py PROTO_PY_DIR RUN_DIR

PROTO_PY_DIR holds the Python modules protoc generated from TensorBoard's own
tensorboard/compat/proto/*.proto (tests/data/tensorboard/proto); RUN_DIR is a
run folder with logging.jsonl and runs/events.out.tfevents.*. Each file is
read as TFRecords: the masked CRC-32C of the length and of the data are
recomputed here (bit by bit, not with anytune's table) and must match, and
each record must parse as a tensorboard.Event. The first event of a file
carries file_version "brain.Event:2"; then every line of logging.jsonl must
have an event at its step holding each of its numbers (but "step") as a
scalar tagged train/KEY (eval/KEY for eval_KEY), equal to the number rounded
to float32, and nothing else. Exits 1 with a message on the first mismatch.
"""
import glob
import json
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(msg):
    print("tb_check: " + msg)
    sys.exit(1)


def records(path):
    with open(path, "rb") as f:
        blob = f.read()
    pos = 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            fail("%s: a torn record header at byte %d" % (path, pos))
        head = blob[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if hcrc != masked(head):
            fail("%s: the length's CRC at byte %d does not match" % (path, pos))
        data = blob[pos + 12:pos + 12 + n]
        if len(data) != n or pos + 16 + n > len(blob):
            fail("%s: a torn record at byte %d" % (path, pos))
        (dcrc,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
        if dcrc != masked(data):
            fail("%s: the data's CRC at byte %d does not match" % (path, pos))
        yield data
        pos += 16 + n


def main():
    sys.path.insert(0, sys.argv[1])
    from tensorboard.compat.proto import event_pb2  # noqa: E402
    run = sys.argv[2]
    files = sorted(glob.glob(os.path.join(run, "runs", "events.out.tfevents.*")))
    if not files:
        fail("no event file in %s/runs" % run)
    events = {}
    n_events = 0
    for path in files:
        first = True
        for data in records(path):
            ev = event_pb2.Event()
            ev.ParseFromString(data)
            if first:
                if ev.file_version != "brain.Event:2":
                    fail("%s: the first event has no file_version" % path)
                first = False
                continue
            if not ev.HasField("summary"):
                fail("%s: an event without a summary" % path)
            vals = {v.tag: v.simple_value for v in ev.summary.value}
            events.setdefault(ev.step, {}).update(vals)
            n_events += 1
    lines = [json.loads(x) for x in open(os.path.join(run, "logging.jsonl")) if x.strip()]
    want_events = 0
    for line in lines:
        want = {}
        for k, v in line.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            tag = "eval/" + k[5:] if k.startswith("eval_") else "train/" + k
            want[tag] = struct.unpack("<f", struct.pack("<f", v))[0]
        if not want:
            continue
        want_events += 1
        got = events.get(line["step"])
        if got is None:
            fail("no event at step %d" % line["step"])
        for tag, v in want.items():
            if tag not in got:
                fail("step %d: no scalar %s" % (line["step"], tag))
            if got[tag] != v:
                fail("step %d: %s is %r, logging.jsonl says %r" % (line["step"], tag, got[tag], v))
    if n_events != want_events:
        fail("%d events with scalars, logging.jsonl has %d lines with numbers" % (n_events, want_events))
    tags = sorted({t for e in events.values() for t in e})
    print("tb_check: %d files, %d events, tags %s" % (len(files), n_events, " ".join(tags)))


if __name__ == "__main__":
    main()
