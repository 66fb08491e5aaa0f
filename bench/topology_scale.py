#!/usr/bin/env python3
"""How long `retryloop topology plan`, `export`, `apply` and `verify` take on a file with many
input bindings: each should grow in proportion to the bindings (validation once grew with their
square). No broker is needed for plan and export; apply and verify run when --url is given.

    bench/topology_scale.py [--cli build/retryloop] [--counts 40000,80000,350000]
                            [--url amqp://guest:guest@localhost:5672/%2F --broker-counts 2000,4000]
"""
import argparse
import json
import os
import resource
import subprocess
import tempfile
import time


def topology(count, kind):
    if kind == "headers":
        exchange_type = "headers"
        bindings = [{"headers": {"n": k}} for k in range(count)]
    else:
        exchange_type = "direct"
        bindings = [f"order.{k}" for k in range(count)]
    return {"services": [{"name": f"bench.bindings.{kind}.{count}",
                          "input": {"exchange": f"bench.bindings.{kind}.{count}.in",
                                    "type": exchange_type, "bindings": bindings},
                          "retry": {"delays": ["30s"], "max_attempts": 5}}]}


def timed(command):
    """Runs a command; returns its wall time and its CPU time (user and system), in seconds. The
    CPU time is the fairer figure on a machine that other work shares."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... exited {result.returncode}: "
                         f"{result.stderr[-500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return f"{seconds:6.2f} s ({cpu:5.2f} s CPU)"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", default=os.path.join(here, "..", "build", "retryloop"))
    parser.add_argument("--counts", default="40000,80000,350000")
    parser.add_argument("--url")
    parser.add_argument("--broker-counts", default="2000,4000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for kind in ("direct", "headers"):
            for count in [int(c) for c in args.counts.split(",")]:
                path = os.path.join(work, f"{kind}-{count}.json")
                with open(path, "w") as f:
                    json.dump(topology(count, kind), f)
                size = os.path.getsize(path) / 1e6
                plan = timed([args.cli, "topology", "plan", path])
                export = timed([args.cli, "topology", "export", path])
                print(f"{kind:7s} {count:>8,} bindings ({size:5.1f} MB): plan {plan}, "
                      f"export {export}", flush=True)
            if not args.url:
                continue
            for count in [int(c) for c in args.broker_counts.split(",")]:
                path = os.path.join(work, f"{kind}-{count}.json")
                with open(path, "w") as f:
                    json.dump(topology(count, kind), f)
                apply = timed([args.cli, "topology", "apply", path, "--url", args.url])
                verify = timed([args.cli, "topology", "verify", path, "--url", args.url])
                timed([args.cli, "topology", "delete", path, "--yes", "--force", "--url", args.url])
                print(f"{kind:7s} {count:>8,} bindings on the broker: apply {apply}, "
                      f"verify {verify}", flush=True)


if __name__ == "__main__":
    main()
