"""One safetensors writer for the numpy-only tools (make_image_goldens.py,
make_mrope_goldens.py, make_tiny_vlm.py): no torch, no PIL."""
import json
import struct

import numpy as np


def bf16_bits(a):
    """f32 -> bf16 (round to nearest even) as uint16 bit patterns."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, metadata, bf16=False):
    """tensors: (name, numpy array of uint8, float32 or int32) pairs, in file
    order. bf16: float32 arrays are stored as BF16."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, arr in tensors:
        if bf16 and arr.dtype == np.float32:
            dt, b = "BF16", bf16_bits(arr).tobytes()
        else:
            dt = {np.uint8: "U8", np.float32: "F32", np.int32: "I32"}[arr.dtype.type]
            b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
