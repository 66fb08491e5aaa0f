"""retryloop on a 3-node cluster against one node: consume+ack and the retry loop on quorum
queues, and the failover time of a consumer whose node is killed.

  python3 bench/cluster.py run single|cluster OUT.json   against the broker of scripts/with-broker
  python3 bench/cluster.py report OUT.json               OUT.md from the rows of both runs

Run through bench/cluster, which builds, starts the brokers and writes
bench/results/cluster-VERSION.{json,md}.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import CLI, ROUNDS, TOOL, beam_pids, log, rotate, run  # noqa: E402

CONSUME_N = int(os.environ.get("BENCH_CLUSTER_CONSUME_N", "20000"))
RETRY_N = int(os.environ.get("BENCH_CLUSTER_RETRY_N", "3000"))
KILLS = int(os.environ.get("BENCH_CLUSTER_KILLS", "20"))
PREFETCH = 300
RETRY_PREFETCH = 200


def node_homes():
    """The home directory of every node under test (the cluster's, or the single node's)."""
    dirs = os.environ.get("RETRYLOOP_TEST_NODE_DIRS") or os.environ["RETRYLOOP_TEST_BROKER_DIR"]
    return [os.path.join(d, "home") for d in dirs.split()]


def brokers_cpu():
    """User + system CPU seconds of every node's VM, summed."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in beam_pids(node_homes()):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class ClusterBench:
    def __init__(self, setup, out):
        self.setup = setup
        self.out = out
        self.url = os.environ["RETRYLOOP_TEST_URL"]
        self.rows = []
        if os.path.exists(out):
            with open(out) as f:
                self.rows = [r for r in json.load(f)["rows"] if r["setup"] != setup]

    def tool(self, *args, **kwargs):
        return run([TOOL, args[0], "--url", self.url, *map(str, args[1:])], **kwargs)

    def timed(self, command):
        cpu0 = brokers_cpu()
        row = run(command, timeout=3600)
        row["broker_cpu_seconds"] = brokers_cpu() - cpu0
        return row

    def record(self, row, **fields):
        row.update(fields, setup=self.setup, nodes=len(node_homes()))
        self.rows.append(row)
        with open(self.out + ".tmp", "w") as f:
            json.dump({"rows": self.rows}, f, indent=1)
        os.replace(self.out + ".tmp", self.out)

    def consume(self):
        for r in range(ROUNDS):
            queue = "bench.cluster.consume"
            self.tool("reset", "--queue", queue, "--type", "quorum")
            self.tool("fill", "--queue", queue, "--count", CONSUME_N, timeout=3600)
            row = self.timed([TOOL, "consume", "--url", self.url, "--queue", queue, "--count",
                              str(CONSUME_N), "--prefetch", str(PREFETCH)])
            self.record(row, bench="consume", round=r + 1)
            log(f"{self.setup} consume round {r + 1}: {row['rate']:8.0f} msg/s")
            self.tool("reset", "--queue", queue, "--delete-only")

    def topology(self, name, mode):
        path = os.path.join(os.environ.get("BENCH_BUILD", "build-bench"), name + ".json")
        service = {"name": name, "queue_type": "quorum",
                   "input": {"exchange": name + ".in", "type": "direct", "bindings": [name]},
                   "retry": {"mode": mode, "delays": ["10ms"], "max_attempts": 5}}
        with open(path, "w") as f:
            json.dump({"services": [service]}, f)
        run([CLI, "topology", "apply", path, "--url", self.url])
        return path

    def retry(self):
        for r in range(ROUNDS):
            for mode in rotate(["reject", "republish"], r):
                name = f"bench.cluster.retry.{mode}.{r + 1}"
                path = self.topology(name, mode)
                self.tool("fill", "--queue", name, "--count", RETRY_N, "--fresh")
                row = self.timed([TOOL, "retry", "--url", self.url, "--topology", path,
                                  "--service", name, "--count", str(RETRY_N), "--fail", "2",
                                  "--prefetch", str(RETRY_PREFETCH)])
                run([CLI, "topology", "delete", path, "--yes", "--force", "--url", self.url])
                self.record(row, bench="retry", mode=mode, round=r + 1)
                log(f"{self.setup} retry {mode} round {r + 1}: {row['rate']:8.0f} completed msg/s")

    def failover(self):
        path = self.topology("bench.cluster.failover", "republish")
        row = run([TOOL, "failover", "--url", self.url, "--topology", path, "--service",
                   "bench.cluster.failover", "--count", str(KILLS)], timeout=3600)
        run([CLI, "topology", "delete", path, "--yes", "--force", "--url", self.url])
        self.record(row, bench="failover")
        log(f"{self.setup} failover over {KILLS} kills: {row['consuming_again_ms']}")

    def run_all(self):
        started = time.time()
        self.consume()
        self.retry()
        if self.setup == "cluster":
            self.failover()
        log(f"{self.setup}: {time.time() - started:.0f} s")


def median(rows, key):
    values = [r[key] for r in rows]
    return statistics.median(values) if values else float("nan")


def report(out):
    with open(out) as f:
        rows = json.load(f)["rows"]
    lines = ["# retryloop on a 3-node cluster against one node", ""]
    meta = os.environ.get("BENCH_CLUSTER_META", "")
    if meta:
        lines += [meta, ""]
    lines += ["Medians of the rounds. Broker CPU is the sum over every node's VM; client CPU is "
              "the benchmark process's.", "",
              "| benchmark | one node msg/s | 3 nodes msg/s | 3 nodes / one | broker CPU µs/msg "
              "(one / 3 nodes) | client CPU µs/msg (one / 3 nodes) |",
              "|---|---:|---:|---:|---:|---:|"]
    for bench, mode, label in (("consume", None, "consume + ack, quorum, prefetch 300"),
                               ("retry", "reject", "retry loop, reject mode, 2 failures"),
                               ("retry", "republish", "retry loop, republish mode, 2 failures")):
        cells = {}
        for setup in ("single", "cluster"):
            sel = [r for r in rows if r["bench"] == bench and r["setup"] == setup and
                   (mode is None or r.get("mode") == mode)]
            if not sel:
                continue
            n = sel[0]["messages"]
            cells[setup] = (median(sel, "rate"), median(sel, "broker_cpu_seconds") / n * 1e6,
                            median(sel, "cpu_seconds") / n * 1e6)
        if len(cells) < 2:
            continue
        one, three = cells["single"], cells["cluster"]
        lines.append(f"| {label} | {one[0]:.0f} | {three[0]:.0f} | {three[0] / one[0]:.2f} | "
                     f"{one[1]:.0f} / {three[1]:.0f} | {one[2]:.1f} / {three[2]:.1f} |")
    failover = [r for r in rows if r["bench"] == "failover"]
    if failover:
        ms = failover[-1]["consuming_again_ms"]
        lines += ["", f"**Failover**, over {failover[-1]['kills']} SIGKILLs of the node the "
                  "consumer was on (restarted after each): from the kill to consuming on another "
                  f"node, p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} ms, max {ms['max']:.0f} ms."]
    with open(out[:-len(".json")] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run" and sys.argv[2] in ("single", "cluster"):
        ClusterBench(sys.argv[2], sys.argv[3]).run_all()
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)
