#!/usr/bin/env python3
"""Unpacks a golden case into a directory: CASE_DIR/*.b64 -> OUT/* (the
inverse of pack.py; tests/store/golden.rs does the same in Rust). For the
systemd drill (.ci/systemd-drill.sh), which serves a golden data file with
the installed package. Usage: tests/golden/unpack.py CASE_DIR OUT
"""
import base64
import os
import sys


def unpack(packed, out):
    data = None
    for line in open(packed):
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        first, rest = line.split(" ", 1)
        if first == "size":
            data = bytearray(int(rest))
        else:
            chunk = base64.b64decode(rest)
            at = int(first)
            data[at:at + len(chunk)] = chunk
    with open(out, "wb") as f:
        f.write(bytes(data))


def main():
    case, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(case)):
        if name.endswith(".b64"):
            unpack(os.path.join(case, name), os.path.join(out, name[: -len(".b64")]))


if __name__ == "__main__":
    main()
