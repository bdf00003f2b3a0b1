"""The decorator's overhead over raw claim/done calls, against a real dedupd.

    python clients/python/bench/overhead.py [--bin PATH] [--calls 1000] [--rounds 4] [--pin]

Starts dedupd (embedded redb store, an API token) on a free port, then runs
the same work, a function that returns a small JSON result, on fresh keys in
two ways, in blocks of ``--calls`` (ABBA order over the rounds): ``raw``
(``claim``, then ``done`` with the result) and ``once`` (the function
decorated with ``client.once``: the same two requests, plus the key
function, the result check, registering the claim with the heartbeat and
``current_claim``). Prints the median time of one call of each and its 90th
percentile, the client's CPU time per call (this process, all threads) and
the server's (from /proc, Linux only), the context switches of each per
call (the client's from getrusage, the server's threads' from /proc), and
the differences. One client, one thread: per-call latency, not throughput.
``--pin``: the server on CPU 0, this client on CPU 1.
"""

from __future__ import annotations

import argparse
import os
import resource
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


def switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of a
    process (0 where /proc is not there)."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def own_switches() -> int:
    """This process's context switches, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def start(binary: str, workdir: Path, token: str, pin: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = workdir / "dedupd.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\ndata_path = "{workdir / "dedupd.redb"}"\n'
        f'[api]\ntokens = ["{token}"]\n'
    )
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDUPD_")}
    proc = subprocess.Popen(
        (["taskset", "-c", "0"] if pin else []) + [binary, "serve", "--config", str(config)],
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
    ap.add_argument("--pin", action="store_true", help="the server on CPU 0, the client on 1")
    args = ap.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {1})

    workdir = Path(tempfile.mkdtemp(prefix="dedupd-py-bench-"))
    token = secrets.token_hex(32)
    proc, url = start(args.bin, workdir, token, args.pin)
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
            client_sw: dict[str, int] = dict.fromkeys(kinds, 0)
            server_sw: dict[str, int] = dict.fromkeys(kinds, 0)
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
                    ssw0, csw0 = switches(proc.pid), own_switches()
                    for i in range(args.calls):
                        t0 = time.perf_counter()
                        fn(r * args.calls + i)
                        times[name].append(time.perf_counter() - t0)
                    client_cpu[name] += time.process_time() - client0
                    server_cpu[name] += cpu_seconds(proc.pid) - server0
                    client_sw[name] += own_switches() - csw0
                    server_sw[name] += switches(proc.pid) - ssw0
                n += args.calls
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)

    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    pinned = ", pinned (server CPU 0, client CPU 1)" if args.pin else ""
    print(
        f"{n} calls of each, {args.rounds} rounds, one client thread, dedupd (redb) at {url}"
        f"{pinned}"
    )
    print(
        f"{'':6} {'median per call':>16} {'p90':>9} {'client CPU':>11} {'server CPU':>11}"
        f" {'client sw':>10} {'server sw':>10}"
    )
    for k, v in times.items():
        p90 = statistics.quantiles(v, n=10)[-1] * 1e6
        print(
            f"{k:6} {med[k]:13.0f} µs {p90:6.0f} µs {client_cpu[k] / n * 1e6:8.0f} µs"
            f" {server_cpu[k] / n * 1e6:8.0f} µs {client_sw[k] / n:10.2f} {server_sw[k] / n:10.2f}"
        )
    extra = med["once"] - med["raw"]
    cpu = (client_cpu["once"] - client_cpu["raw"]) / n * 1e6
    print(
        f"once - raw: {extra:+.0f} µs per call ({med['once'] / med['raw']:.2f}x), "
        f"client CPU {cpu:+.0f} µs per call"
    )


if __name__ == "__main__":
    main()
