#!/usr/bin/python3
"""Writes the seed corpora of the model-format fuzz targets:
tests/fuzz/safetensors/, tests/fuzz/gguf/, tests/fuzz/config/.

Each corpus holds valid files (written here by an encoder independent of the
C code, following the safetensors and GGUF specs), truncated copies of them,
and files that lie (sizes, offsets, counts, types, duplicates...). The valid
files double as test inputs: tests/test_gguf.c and tests/test_safetensors.c
read valid_*.{gguf,safetensors} and check the values written below.

Run from the repository root:  /usr/bin/python3 tools/make_fuzz_seeds.py
"""
import json
import os
import struct

ROOT = "tests/fuzz"


def out(corpus, name, data):
    d = os.path.join(ROOT, corpus)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- safetensors

def st_file(header, data, pad=True, hlen=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    n = len(h) if hlen is None else hlen
    return struct.pack("<Q", n) + h + data


def st_valid():
    a = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)        # F32 [2, 2]
    b = struct.pack("<3H", 0x3F80, 0xC000, 0x3F00)     # BF16 [3] = 1, -2, 0.5
    c = struct.pack("<2H", 0x3C00, 0xB800)             # F16 [2] = 1, -0.5
    i = struct.pack("<2i", 7, -9)                      # I32 [2]
    header = {
        "__metadata__": {"format": "pt", "note": "seed"},
        "w.f32": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "w.i32": {"dtype": "I32", "shape": [2], "data_offsets": [16, 24]},
        "w.bf16": {"dtype": "BF16", "shape": [3], "data_offsets": [24, 30]},
        "w.f16": {"dtype": "F16", "shape": [2], "data_offsets": [30, 34]},
        "scalar.u8": {"dtype": "U8", "shape": [], "data_offsets": [34, 35]},
    }
    return header, a + i + b + c + b"\x05"


def make_safetensors():
    header, data = st_valid()
    good = st_file(header, data)
    out("safetensors", "valid_mixed.safetensors", good)
    out("safetensors", "valid_empty.safetensors", st_file({}, b""))
    for n in (0, 4, 7, 8, 20, len(good) // 2, len(good) - 1):
        out("safetensors", "truncated_%d.safetensors" % n, good[:n])
    out("safetensors", "lie_header_len_past_end.safetensors", st_file(header, data, hlen=10**6))
    out("safetensors", "lie_header_len_absurd.safetensors", struct.pack("<Q", 1 << 40) + good[8:])
    out("safetensors", "lie_not_json.safetensors", st_file_raw(b"{\"a\": [1, 2,"))
    out("safetensors", "lie_not_object.safetensors", st_file_raw(b"[1, 2, 3]"))

    def lie(name, mutate, data=data):
        h = json.loads(json.dumps(header))
        mutate(h)
        out("safetensors", "lie_%s.safetensors" % name, st_file(h, data))

    lie("missing_dtype", lambda h: h["w.f32"].pop("dtype"))
    lie("missing_shape", lambda h: h["w.f32"].pop("shape"))
    lie("missing_offsets", lambda h: h["w.f32"].pop("data_offsets"))
    lie("unknown_dtype", lambda h: h["w.f32"].update(dtype="F31"))
    lie("negative_shape", lambda h: h["w.f32"].update(shape=[-2, -2]))
    lie("fraction_shape", lambda h: h["w.f32"].update(shape=[2.5, 2]))
    lie("shape_span_mismatch", lambda h: h["w.f32"].update(shape=[2, 3]))
    lie("offsets_outside", lambda h: h["w.f16"].update(data_offsets=[30, 400]))
    lie("offsets_reversed", lambda h: h["w.i32"].update(data_offsets=[24, 16]))
    lie("overlap", lambda h: h["w.i32"].update(data_offsets=[8, 16]))
    lie("metadata_not_string", lambda h: h["__metadata__"].update(n=3))
    lie("metadata_not_object", lambda h: h.update(__metadata__=[1]))
    lie("huge_shape", lambda h: h["w.f32"].update(shape=[2**31, 2**31, 2**31]))
    lie("empty_overflow", lambda h: h.update({"e": {"dtype": "F32", "shape": [0, 2**40, 2**40, 2**40],
                                                     "data_offsets": [0, 0]}}))
    lie("nine_dims", lambda h: h["w.f32"].update(shape=[1] * 9))
    # cJSON keeps both copies of a duplicated key.
    dup = good.replace(b'"w.i32"', b'"w.f32"', 1)
    out("safetensors", "lie_duplicate_name.safetensors", dup)


def st_file_raw(text):
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


# ----------------------------------------------------------------------- gguf

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}


def g_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def g_val(t, v):
    if t in SCALAR:
        return struct.pack(SCALAR[t], v)
    if t == STR:
        return g_str(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(g_val(et, x) for x in items)


def g_kv(key, t, v):
    return g_str(key) + struct.pack("<I", t) + g_val(t, v)


def g_tinfo(name, ne, gtype, offset, n_dims=None):
    nd = len(ne) if n_dims is None else n_dims
    return g_str(name) + struct.pack("<I", nd) + b"".join(struct.pack("<Q", x) for x in ne) + struct.pack("<IQ", gtype, offset)


def gguf(kvs, tinfos, data, align=32, version=3, n_kv=None, n_t=None, magic=b"GGUF"):
    head = magic + struct.pack("<IQQ", version, len(tinfos) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tinfos)
    body += b"\0" * ((align - len(body) % align) % align)
    return body + data


# The values test_gguf.c checks in valid_all_types.gguf.
GGUF_KVS = [
    ("t.u8", U8, 200), ("t.i8", I8, -100), ("t.u16", U16, 60000), ("t.i16", I16, -30000),
    ("t.u32", U32, 4000000000), ("t.i32", I32, -2000000000), ("t.f32", F32, 1.5), ("t.bool", BOOL, True),
    ("t.str", STR, "héllo"), ("t.u64", U64, 2**63 + 5), ("t.i64", I64, -(2**62)), ("t.f64", F64, -0.125),
    ("t.arr_i32", ARR, (I32, [1, -2, 3])), ("t.arr_str", ARR, (STR, ["a", "", "ccc"])),
    ("t.arr_nested", ARR, (ARR, [(STR, ["x", "y"]), (STR, ["z"])])), ("t.arr_empty", ARR, (F32, [])),
    ("general.alignment", U32, 64),
]


def q8_block(d_f16_bits, qs):
    return struct.pack("<H", d_f16_bits) + struct.pack("<32b", *qs)


def q4_block(d_f16_bits, nib):
    qs = bytes((nib[j] & 15) | ((nib[j + 16] & 15) << 4) for j in range(16))
    return struct.pack("<H", d_f16_bits) + qs


def gguf_valid():
    """Tensors: f32 [2,3] (ne 3,2), f16 [2], bf16 [2], q8_0 [1,32], q4_0 [1,32]."""
    align = 64
    blobs = [
        ("a.f32", [3, 2], 0, struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
        ("a.f16", [2], 1, struct.pack("<2H", 0x3C00, 0xC000)),          # 1, -2
        ("a.bf16", [2], 30, struct.pack("<2H", 0x3F80, 0x4040)),        # 1, 3
        ("a.q8_0", [32], 8, q8_block(0x3800, [j - 16 for j in range(32)])),   # d = 0.5
        ("a.q4_0", [32], 2, q4_block(0x4000, [j % 16 for j in range(32)])),   # d = 2
    ]
    tinfos, data = [], b""
    for name, ne, t, blob in blobs:
        data += b"\0" * ((align - len(data) % align) % align)
        tinfos.append(g_tinfo(name, ne, t, len(data)))
        data += blob
    kvs = [g_kv(k, t, v) for k, t, v in GGUF_KVS]
    return kvs, tinfos, data, align


def make_gguf():
    kvs, tinfos, data, align = gguf_valid()
    good = gguf(kvs, tinfos, data, align)
    out("gguf", "valid_all_types.gguf", good)
    out("gguf", "valid_empty.gguf", gguf([], [], b""))
    for n in (0, 3, 4, 8, 16, 24, 40, len(good) // 3, len(good) // 2, len(good) - 1):
        out("gguf", "truncated_%d.gguf" % n, good[:n])
    out("gguf", "lie_magic.gguf", gguf(kvs, tinfos, data, align, magic=b"GGML"))
    out("gguf", "lie_version1.gguf", gguf(kvs, tinfos, data, align, version=1))
    out("gguf", "lie_version9.gguf", gguf(kvs, tinfos, data, align, version=9))
    out("gguf", "lie_n_kv_huge.gguf", gguf(kvs, tinfos, data, align, n_kv=2**62))
    out("gguf", "lie_n_tensors_huge.gguf", gguf(kvs, tinfos, data, align, n_t=2**61 + 3))
    out("gguf", "lie_string_too_long.gguf", gguf([g_str("k") + struct.pack("<IQ", STR, 2**40) + b"abc"], [], b""))
    out("gguf", "lie_array_too_long.gguf", gguf([g_str("k") + struct.pack("<IIQ", ARR, U32, 2**60)], [], b""))
    out("gguf", "lie_value_type.gguf", gguf([g_str("k") + struct.pack("<I", 77) + b"\0" * 16], [], b""))
    deep = struct.pack("<I", ARR)
    for _ in range(20):
        deep += struct.pack("<IQ", ARR, 1)
    deep += struct.pack("<IQ", U8, 0)
    out("gguf", "lie_deep_nesting.gguf", gguf([g_str("k") + deep], [], b""))
    out("gguf", "lie_duplicate_key.gguf", gguf(kvs + [g_kv("t.u8", U8, 1)], tinfos, data, align))
    out("gguf", "lie_alignment_3.gguf", gguf([g_kv("general.alignment", U32, 3)], [], b""))
    out("gguf", "lie_alignment_type.gguf", gguf([g_kv("general.alignment", U64, 32)], [], b""))
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    out("gguf", "lie_misaligned_offset.gguf", gguf([], [g_tinfo("x", [4], 0, 4)], f32 + f32))
    out("gguf", "lie_data_outside.gguf", gguf([], [g_tinfo("x", [4], 0, 32)], f32))
    out("gguf", "lie_huge_ne.gguf", gguf([], [g_tinfo("x", [2**41, 2], 0, 0)], f32))
    out("gguf", "lie_ne_overflow.gguf", gguf([], [g_tinfo("x", [2**31, 2**31, 2**31, 2**31], 0, 0)], f32))
    out("gguf", "lie_empty_overflow.gguf", gguf([], [g_tinfo("x", [0, 2**40, 2**40, 2**40], 0, 0)], f32))
    out("gguf", "lie_n_dims_5.gguf", gguf([], [g_tinfo("x", [1, 1, 1, 1, 4], 0, 0)], f32))
    out("gguf", "lie_unknown_type.gguf", gguf([], [g_tinfo("x", [4], 99, 0)], f32))
    out("gguf", "lie_q8_row.gguf", gguf([], [g_tinfo("x", [17], 8, 0)], f32 * 4))
    out("gguf", "lie_duplicate_tensor.gguf", gguf([], [g_tinfo("x", [4], 0, 0), g_tinfo("x", [4], 0, 32)],
                                                   f32 + b"\0" * 16 + f32))
    out("gguf", "lie_overlap.gguf", gguf([], [g_tinfo("x", [16], 0, 0), g_tinfo("y", [4], 0, 32)], f32 * 4 + f32 * 2))
    # the language model of a Qwen2-VL export (llama.cpp's qwen2vl: M-RoPE sections + a fourth 0)
    vl = [g_kv("general.architecture", STR, "qwen2vl"), g_kv("qwen2vl.embedding_length", U32, 64),
          g_kv("qwen2vl.block_count", U32, 1), g_kv("qwen2vl.feed_forward_length", U32, 128),
          g_kv("qwen2vl.attention.head_count", U32, 4), g_kv("qwen2vl.attention.head_count_kv", U32, 2),
          g_kv("qwen2vl.vocab_size", U32, 8)]
    out("gguf", "model_qwen2vl.gguf", gguf(vl + [g_kv("qwen2vl.rope.dimension_sections", ARR, (I32, [2, 3, 3, 0]))],
                                          [], b""))
    out("gguf", "lie_qwen2vl_sections.gguf",
        gguf(vl + [g_kv("qwen2vl.rope.dimension_sections", ARR, (I32, [2, 3, 3, 5]))], [], b""))


# --------------------------------------------------------------------- config

def make_config():
    base = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 172, "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
        "vocab_size": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32", "bos_token_id": 1,
        "eos_token_id": 2,
    }

    def cfg(name, **upd):
        c = dict(base)
        for k, v in upd.items():
            if v is Ellipsis:
                c.pop(k, None)
            else:
                c[k] = v
        out("config", name + ".json", json.dumps(c, indent=1).encode())

    cfg("valid_llama")
    cfg("valid_llama3_rope", rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        eos_token_id=[128001, 128008, 128009])
    cfg("valid_linear_type_key", rope_scaling={"type": "linear", "factor": 2.0})
    cfg("valid_qwen3", model_type="qwen3", head_dim=128, attention_bias=False, use_sliding_window=False,
        sliding_window=None)
    cfg("valid_qwen2_window", model_type="qwen2", use_sliding_window=True, sliding_window=4096, max_window_layers=2)
    cfg("valid_mistral_window", model_type="mistral", sliding_window=4096)
    cfg("bad_model_type", model_type="gemma")
    cfg("bad_act", hidden_act="gelu")
    cfg("bad_yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    cfg("bad_dynamic", rope_scaling={"type": "dynamic", "factor": 2.0})
    cfg("bad_mlp_bias", mlp_bias=True)
    cfg("bad_kv_heads", num_key_value_heads=3)
    cfg("bad_missing_hidden", hidden_size=Ellipsis)
    cfg("bad_negative", num_hidden_layers=-5)
    cfg("bad_huge", hidden_size=2**40)
    cfg("bad_string_size", hidden_size="64")
    cfg("bad_eos", eos_token_id=["x"])
    cfg("bad_llama3_missing", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    out("config", "bad_not_object.json", b"[1, 2, 3]")
    out("config", "bad_truncated.json", json.dumps(base).encode()[:57])
    out("config", "bad_empty.json", b"")
    for src in ("mistral-7b-instruct-v0.3", "qwen2-1.5b-instruct"):
        with open("tests/data/models/configs/%s.config.json" % src, "rb") as f:
            out("config", "real_%s.json" % src, f.read())


if __name__ == "__main__":
    make_safetensors()
    make_gguf()
    make_config()
    for c in ("safetensors", "gguf", "config"):
        print(c, len(os.listdir(os.path.join(ROOT, c))), "seeds")
