"""Carry a model to the lent device machine, whose calls take at most 64 MiB of files.

`shrink IN OUT --keep K` writes the GGUF's header (metadata, tokenizer, tensor table) whole and,
of every matrix (a tensor of over 64 rows), only its first ceil(rows/K) rows; `expand IN OUT` rebuilds a GGUF of
the original's size, shapes and types, each large tensor filled by repeating its kept rows.
Every block stays a real block of the model (valid scales, real value distribution), so
kernel, bandwidth and accelerator timings are those of the model; its text is not (the rows
repeat). For speed measurement only: never for quality figures.

    python3 scripts/device_model.py shrink model.gguf .dev/model.tiled --keep 16
    python3 scripts/device_model.py expand .dev/model.tiled /tmp/model.gguf   # on the device
"""
import json
import struct
import sys

# ggml type id -> (elements per block, bytes per block)
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
          14: (256, 210), 15: (256, 292), 30: (1, 2)}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n].decode("utf-8", "replace")
        self.p += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALAR[t])


def tensor_table(path):
    """(data offset, [(name, dims, type, offset)], file size) of a GGUF."""
    with open(path, "rb") as f:
        head = f.read(64 << 20)
        f.seek(0, 2)
        size = f.tell()
    r = Reader(head)
    if r.d[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.p = 4
    r.take("<I")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    align = 32
    for _ in range(n_kv):
        key, t = r.string(), r.take("<I")
        v = r.value(t)
        if key == "general.alignment":
            align = v
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        tensors.append((name, dims, r.take("<I"), r.take("<Q")))
    data = (r.p + align - 1) // align * align
    return data, tensors, size


def shrink(src, dst, keep):
    data, tensors, size = tensor_table(src)
    index = {"data": data, "size": size, "tensors": []}
    with open(src, "rb") as f, open(dst, "wb") as out:
        chunks = []
        for name, dims, t, off in tensors:
            per, nbytes = BLOCKS[t]
            row = dims[0] // per * nbytes
            rows = 1
            for d in dims[1:]:
                rows *= d
            total = row * rows
            kept = total if rows <= 64 else -(-rows // keep) * row
            f.seek(data + off)
            chunks.append(f.read(kept))
            index["tensors"].append([data + off, total, kept])
        f.seek(0)
        header = f.read(data)
        meta = json.dumps(index).encode()
        out.write(struct.pack("<QQ", len(meta), len(header)) + meta + header)
        for c in chunks:
            out.write(c)


def expand(src, dst):
    with open(src, "rb") as f, open(dst, "wb") as out:
        n_meta, n_header = struct.unpack("<QQ", f.read(16))
        index = json.loads(f.read(n_meta))
        out.write(f.read(n_header))
        out.truncate(index["size"])
        for start, total, kept in index["tensors"]:
            chunk = f.read(kept)
            out.seek(start)
            reps, rest = divmod(total, kept)
            for _ in range(reps):
                out.write(chunk)
            out.write(chunk[:rest])


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "shrink":
        shrink(a[1], a[2], int(a[4]) if len(a) > 4 and a[3] == "--keep" else 16)
    elif len(a) == 3 and a[0] == "expand":
        expand(a[1], a[2])
    else:
        sys.exit(__doc__)
