"""The decorator's overhead over raw claim/done calls, against a real dedupd.

    python clients/python/bench/overhead.py [--bin PATH] [--calls 1000] [--rounds 4]

Starts dedupd (embedded redb store, an API token) on a free port, then runs
the same work, a function that returns a small JSON result, on fresh keys in
two ways, in blocks of ``--calls`` (ABBA order over the rounds): ``raw``
(``claim``, then ``done`` with the result) and ``once`` (the function
decorated with ``client.once``: the same two requests, plus the key
function, the result check, registering the claim with the heartbeat and
``current_claim``). Prints the median time of one call of each and its 90th
percentile, the client's CPU time per call (this process, all threads) and
the server's (from /proc, Linux only), and the differences. One client, one
thread: per-call latency, not throughput.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx

import dedupd

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (0 where /proc is not there)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(binary: str, workdir: Path, token: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = workdir / "dedupd.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\ndata_path = "{workdir / "dedupd.redb"}"\n'
        f'[api]\ntokens = ["{token}"]\n'
    )
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDUPD_")}
    proc = subprocess.Popen(
        [binary, "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.02)
    proc.kill()
    sys.exit(f"dedupd at {binary} was not ready within 20 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_bin = os.environ.get("DEDUPD_BIN", str(REPO / "target/release/dedupd"))
    ap.add_argument("--bin", default=default_bin, help="the dedupd binary")
    ap.add_argument("--calls", type=int, default=1000, help="calls of each kind per round")
    ap.add_argument("--rounds", type=int, default=4, help="an even number keeps ABBA balanced")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dedupd-py-bench-"))
    token = secrets.token_hex(32)
    proc, url = start(args.bin, workdir, token)
    try:
        with dedupd.Client(url, token=token) as client:
            run = secrets.token_hex(4)

            def work(i: int) -> dict[str, Any]:
                return {"i": i, "status": "ok"}

            once = client.once(key=lambda i: f"bench/{run}/once/{i}", ttl=30)(work)

            def raw(i: int) -> None:
                claim = client.claim(f"bench/{run}/raw/{i}", ttl=30)
                client.done(claim.key, claim.token, result=work(i))

            kinds: dict[str, Callable[[int], object]] = {"raw": raw, "once": once}
            times: dict[str, list[float]] = {k: [] for k in kinds}
            client_cpu: dict[str, float] = dict.fromkeys(kinds, 0.0)
            server_cpu: dict[str, float] = dict.fromkeys(kinds, 0.0)
            for warm in range(200):  # connections, caches
                raw(-1 - warm)
                once(-1 - warm)
            # ABBA blocks, so that a drift of the machine weighs on both alike.
            order = [("raw", "once"), ("once", "raw")]
            n = 0
            for r in range(args.rounds):
                for name in order[r % 2]:
                    fn = kinds[name]
                    server0, client0 = cpu_seconds(proc.pid), time.process_time()
                    for i in range(args.calls):
                        t0 = time.perf_counter()
                        fn(r * args.calls + i)
                        times[name].append(time.perf_counter() - t0)
                    client_cpu[name] += time.process_time() - client0
                    server_cpu[name] += cpu_seconds(proc.pid) - server0
                n += args.calls
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)

    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(f"{n} calls of each, {args.rounds} rounds, one client thread, dedupd (redb) at {url}")
    print(f"{'':6} {'median per call':>16} {'p90':>9} {'client CPU':>11} {'server CPU':>11}")
    for k, v in times.items():
        p90 = statistics.quantiles(v, n=10)[-1] * 1e6
        print(
            f"{k:6} {med[k]:13.0f} µs {p90:6.0f} µs {client_cpu[k] / n * 1e6:8.0f} µs"
            f" {server_cpu[k] / n * 1e6:8.0f} µs"
        )
    extra = med["once"] - med["raw"]
    cpu = (client_cpu["once"] - client_cpu["raw"]) / n * 1e6
    print(
        f"once - raw: {extra:+.0f} µs per call ({med['once'] / med['raw']:.2f}x), "
        f"client CPU {cpu:+.0f} µs per call"
    )


if __name__ == "__main__":
    main()
