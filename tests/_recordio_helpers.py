"""Shared pieces of the RecordIO tests: test records and the script that drives real MXNet 1.9.1
as the format oracle (the spec-literal encoder is benchmarks/oracles.py's)."""

import json

import numpy as np

from src.recordio import MAGIC_BYTES as MAGIC


def random_payloads(seed: int, count: int, max_size: int = 20000) -> list[bytes]:
    """Random payloads, most with magic words planted at aligned and unaligned offsets."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        buf = bytearray(rng.integers(0, 256, int(rng.integers(0, max_size)), dtype=np.uint8).tobytes())
        for _ in range(int(rng.integers(0, 4))):
            if len(buf) >= 4:
                pos = int(rng.integers(0, len(buf) - 3))
                buf[pos : pos + 4] = MAGIC
        out.append(bytes(buf))
    return out


def record_specs(payloads: list[bytes], seed: int = 0) -> list[dict]:
    """One write call per payload: key (non-contiguous), header and label kind varied."""
    rng = np.random.default_rng(seed)
    specs, key = [], 0
    for n, payload in enumerate(payloads):
        key += int(rng.integers(1, 1000))
        kind = n % 3
        if kind == 0:
            label: float | list[float] = float(np.float32(rng.normal() * 100))
        elif kind == 1:  # caption tokens as this project stores them: 3 x 77 float32
            label = rng.integers(0, 49408, 231).astype(np.float32).tolist()
        else:
            label = rng.normal(size=int(rng.integers(1, 5))).astype(np.float32).tolist()
        specs.append(
            {
                "key": key,
                "header": [int(rng.integers(0, 5)), label, int(rng.integers(0, 2**63)), n],
                "payload": payload.hex(),
            }
        )
    return specs


def dump_specs(path, specs: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump(specs, f)


# Runs inside the MXNet venv. argv: specs.json, dir. Writes dir/mx.rec + dir/mx.idx with
# MXNet, reads dir/our.rec + dir/our.idx (written by src.recordio) with MXNet, and
# round-trips PNG images through pack_img/unpack_img; prints one JSON document.
ORACLE_CODE = r"""
import json, sys, os
import numpy as np
import cv2
from mxnet import recordio as R

specs = json.load(open(sys.argv[1]))
d = sys.argv[2]

def header_of(spec):
    flag, label, id_, id2 = spec["header"]
    return R.IRHeader(flag, label, id_, id2)

w = R.MXIndexedRecordIO(os.path.join(d, "mx.idx"), os.path.join(d, "mx.rec"), "w")
for s in specs:
    w.write_idx(s["key"], R.pack(header_of(s), bytes.fromhex(s["payload"])))
w.close()

def describe(rec):
    h, payload = R.unpack(rec)
    label = h.label.tolist() if h.flag > 0 else float(h.label)
    return {"header": [int(h.flag), label, int(h.id), int(h.id2)], "payload": payload.hex()}

r = R.MXIndexedRecordIO(os.path.join(d, "our.idx"), os.path.join(d, "our.rec"), "r")
by_key = {str(k): describe(r.read_idx(k)) for k in reversed(r.keys)}
r.reset()
sequential = []
while True:
    rec = r.read()
    if rec is None:
        break
    sequential.append(describe(rec))
r.close()

img = np.load(os.path.join(d, "img.npy"))
_, ours = R.unpack_img(open(os.path.join(d, "our_img.rec"), "rb").read())
packed = R.pack_img(R.IRHeader(0, 2.0, 11, 0), img, quality=3, img_fmt=".png")
open(os.path.join(d, "mx_img.rec"), "wb").write(packed)

json.dump({"keys": [int(k) for k in r.keys], "by_key": by_key, "sequential": sequential,
           "our_img_ok": bool(np.array_equal(ours, img))}, sys.stdout)
"""
