#!/usr/bin/env python3
"""Packs a golden data file or log into text: FILE -> FILE.b64, and removes FILE.

The tree tracks no data file dedupd could open (a committed write-ahead log
was once replayed into every fresh clone's new database), so the golden
files live as text: the file's size, then each run of non-zero bytes as
"offset base64". tests/store/golden.rs unpacks them into a temporary
directory. Usage: tests/golden/pack.py FILE...
"""
import base64
import os
import sys

CHUNK = 32        # zero runs are found in chunks of this many bytes
LINE = 768        # bytes per line at most (1024 base64 characters)


def pack(path):
    data = open(path, "rb").read()
    name = os.path.basename(path)
    case = os.path.basename(os.path.dirname(os.path.abspath(path)))
    out = [
        f"# dedupd golden file: {name} of tests/golden/{case}, {len(data)} bytes.",
        "# Each line below the size: a run of non-zero bytes, as offset and base64;",
        "# the rest is zeros. Written by tests/golden/pack.py, unpacked by",
        "# tests/store/golden.rs.",
        f"size {len(data)}",
    ]
    at = 0
    while at < len(data):
        if not any(data[at:at + CHUNK]):
            at += CHUNK
            continue
        start = at
        while at < len(data) and any(data[at:at + CHUNK]) and at - start < LINE:
            at += CHUNK
        run = data[start:min(at, len(data))]
        out.append(f"{start} {base64.b64encode(run).decode()}")
    with open(path + ".b64", "w") as f:
        f.write("\n".join(out) + "\n")
    os.remove(path)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        pack(p)
