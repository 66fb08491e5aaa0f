"""Runs every benchmark against the throwaway broker that bench/run started, and writes the report.

    bench.py run OUT.json        run the benchmarks (environment: see bench/run), write raw results
    bench.py report OUT.json     write OUT.md and OUT.png from raw results

Every benchmark runs BENCH_ROUNDS times (default 3); within a round the contenders run one after
the other, in an order that rotates from round to round. Rates are measured by the contenders
themselves, from the first delivery (or publish) to the last ack (or confirm); queues are reset
and filled before that window by bench_retryloop, the same way for everyone.
"""
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("BENCH_BUILD", os.path.join(ROOT, "build-bench")))
PYTHON = "/usr/bin/python3"
QUICK = os.environ.get("BENCH_QUICK") == "1"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1" if QUICK else "3"))
ALL_BENCHMARKS = ["consume", "callgrind", "consumer", "publish", "retry", "lateness", "delays",
                  "schedule", "memory", "churn", "replay", "migrate", "transfer", "bluegreen",
                  "outbox", "scale", "outage", "dispatch"]
ALL_CLIENTS = ["retryloop", "rabbitmq-c", "amqp091-go", "amqplib", "amqp-client.js", "pika"]


def env_list(name, default):
    value = os.environ.get(name)
    return [x.strip() for x in value.split(",") if x.strip()] if value else default


FULL = os.environ.get("BENCH_FULL") == "1"
PROFILE = "quick" if QUICK else ("full" if FULL else "default")


def size(name, default, quick, full):
    """A size: BENCH_<NAME> if set, else the profile's. `full` is the issue's size; `default`
    keeps a whole run under 30 minutes on a 2-core machine that other work keeps busy."""
    value = {"quick": quick, "default": default, "full": full}[PROFILE]
    return int(os.environ.get("BENCH_" + name.upper(), value))


SIZES = {
    "consume": size("consume_n", 10000, 5000, 100000),
    "consume_low_prefetch": size("consume_low_n", 1000, 1000, 100000),
    # The retry consumer against the clients under it, each parsing a 1 KB JSON body.
    "consumer": size("consumer_n", 30000, 5000, 100000),
    "publish": size("publish_n", 10000, 5000, 100000),
    "publish_one": size("publish_one_n", 300, 100, 100000),
    "retry": size("retry_n", 3000, 1000, 10000),
    "lateness": size("lateness_n", 1000, 300, 1000),
    "lateness_rate": size("lateness_rate", 500, 500, 500),
    # Retries through the delay levels, each with a delay of its own, published at this rate.
    "delays": size("delays_n", 300, 100, 1000),
    "delays_rate": size("delays_rate", 20, 20, 20),
    # Scheduled delivery: messages scheduled at delays spread on a log scale over the range (the
    # issue's 100,000 over 1 s to 1 h in the full profile; the default run keeps to a minute).
    "schedule": size("schedule_n", 20000, 2000, 100000),
    "schedule_min_ms": size("schedule_min_ms", 1000, 1000, 1000),
    "schedule_max_ms": size("schedule_max_ms", 60000, 10000, 3600000),
    "memory": size("memory_n", 10000, 10000, 10000),
    # Parked messages replayed into a consumer that parks them again, round after round.
    "churn": size("churn_n", 2000, 1000, 4000),
    "churn_rounds": size("churn_rounds", 16, 12, 30),
    "replay": size("replay_n", 20000, 5000, 100000),
    "replay_pika": size("replay_pika_n", 1000, 500, 10000),
    "callgrind": size("callgrind_n", 20000, 2000, 20000),
    # The outbox: rows drained by the relays, and by the naive loop (one transaction per row, a
    # few hundred a second: its rate is steady); the latency run's steady rate and length; the
    # messages each inbox run handles.
    "outbox": size("outbox_n", 50000, 10000, 100000),
    "outbox_naive": size("outbox_naive_n", 2000, 500, 5000),
    "outbox_body": size("outbox_body", 1024, 1024, 1024),
    "outbox_keys": size("outbox_keys", 1000, 1000, 1000),
    "outbox_latency_rate": size("outbox_latency_rate", 200, 200, 200),
    "outbox_latency_seconds": size("outbox_latency_seconds", 20, 5, 60),
    "inbox": size("inbox_n", 5000, 2000, 20000),
    # topology transfer to a second broker: the service queue's messages, the retries waiting in
    # its 20 s wait queue, and the parked ones.
    "transfer": size("transfer_n", 20000, 5000, 100000),
    "transfer_retries": size("transfer_retries_n", 2000, 500, 10000),
    "transfer_parked": size("transfer_parked_n", 2000, 500, 10000),
    # The blue-green walk-through: the backlog on blue when it starts, and the publish rate.
    "bluegreen": size("bluegreen_n", 20000, 5000, 100000),
    "bluegreen_rate": size("bluegreen_rate", 500, 500, 500),
    # `retryloop dispatch` against a pika consumer that POSTs, each message to a 204 application.
    "dispatch": size("dispatch_n", 20000, 5000, 100000),
}
# The scale benchmark's curves (bench/scale.py): the parked counts, the depths of the wait queue,
# the services in one file and the handler concurrencies.
SCALE_SIZES = {
    "parking": [int(x) for x in env_list(
        "BENCH_SCALE_PARKING", {"quick": ["10000"], "default": ["10000", "100000"],
                                "full": ["10000", "100000", "1000000"]}[PROFILE])],
    "wait": [int(x) for x in env_list(
        "BENCH_SCALE_WAIT", {"quick": ["10000"], "default": ["10000", "100000"],
                             "full": ["10000", "100000", "500000"]}[PROFILE])],
    "services": [int(x) for x in env_list("BENCH_SCALE_SERVICES", ["1", "30", "300"])],
    "concurrency": [int(x) for x in env_list("BENCH_SCALE_CONCURRENCY", ["1", "8", "64", "256"])],
}
# topology migrate's curve: the messages waiting in the service queue it makes again. The
# one-at-a-time mover it is compared with runs the sizes up to BENCH_MIGRATE_PIKA_N only (it moves
# a few hundred a second: 1,000,000 would take it hours).
MIGRATE_SIZES = [int(x) for x in env_list(
    "BENCH_MIGRATE_N", {"quick": ["10000"], "default": ["10000", "100000"],
                        "full": ["10000", "100000", "1000000"]}[PROFILE])]
MIGRATE_PIKA_N = int(os.environ.get("BENCH_MIGRATE_PIKA_N", {"quick": "2000", "default": "10000",
                                                              "full": "10000"}[PROFILE]))
PREFETCHES = [int(x) for x in env_list("BENCH_PREFETCH", ["1", "10", "100", "300"])]
QUEUE_TYPES = env_list("BENCH_QUEUE_TYPES", ["classic", "quorum"])
# RabbitMQ 4.3's delayed retry for quorum queues (x-delayed-retry-*) is measured beside the wait
# queues where the broker has it.
RABBITMQ = os.environ.get("RETRYLOOP_TEST_RABBITMQ", "3.10")
DELAYED_RETRY = tuple(int(p) for p in RABBITMQ.split(".")[:2]) >= (4, 3)
BENCHMARKS = env_list("BENCH_ONLY", ALL_BENCHMARKS)
CLIENTS = env_list("BENCH_CLIENTS", ALL_CLIENTS)
RETRY_PREFETCH = 200
PUBLISH_WINDOW = 1000
OUTBOX_RELAYS = [int(x) for x in env_list("BENCH_OUTBOX_RELAYS", ["1", "2", "4"])]
INBOX_CONCURRENCY = [int(x) for x in env_list("BENCH_INBOX_CONCURRENCY", ["1"])]

TOOL = os.path.join(BUILD, "bench", "bench_retryloop")
CLI = os.path.join(BUILD, "retryloop")


def peer_command(client, mode, url, queue, count, setting):
    """The command line of a peer's consume or publish run."""
    args = [mode, url, queue, str(count), str(setting)]
    return {
        "retryloop": [TOOL, mode, "--url", url, "--queue", queue, "--count", str(count),
                      "--prefetch" if mode == "consume" else "--window", str(setting)],
        "rabbitmq-c": [os.path.join(BUILD, "bench", "bench_rabbitmq_c")] + args,
        "amqp091-go": [os.path.join(BUILD, "peers", "amqp091")] + args,
        "amqplib": ["node", os.path.join(HERE, "peers", "amqplib.js")] + args,
        "amqp-client.js": ["node", os.path.join(HERE, "peers", "amqp_client.mjs")] + args,
        "pika": [PYTHON, os.path.join(HERE, "peers", "pika_bench.py")] + args,
    }[client]


def log(text):
    print(text, flush=True)


def log_rate(prefix, row, count):
    """The progress line of a consume run: its rate, and the client's and broker's CPU."""
    if "failed" not in row:
        log(f"{prefix} {row['rate']:9.0f} msg/s  client {row['cpu_seconds'] / count * 1e6:6.1f} "
            f"us/msg  broker {row['broker_cpu_seconds'] / count * 1e6:6.1f} us/msg")


def run(command, timeout=1200):
    """Runs a command; returns its last JSON line (or None); fails loudly on a non-zero exit."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def rss_kb(pid):
    """A process's resident set in kB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rotate(items, k):
    k %= len(items)
    return items[k:] + items[:k]


def beam_pids(homes):
    """The pids of the beam.smp processes of the nodes whose home directory is in `homes`."""
    wanted = {h.encode() for h in homes}
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"beam.smp") and b"-home" in args and \
                wanted.intersection(args):
            pids.append(pid)
    return pids


class Broker:
    """CPU time and peak RSS of the throwaway node's beam.smp, sampled while a contender runs."""

    def __init__(self):
        pids = beam_pids([os.path.join(os.environ["RETRYLOOP_TEST_BROKER_DIR"], "home")])
        if not pids:
            raise RuntimeError("cannot find the broker's beam.smp")
        self.pid = pids[0]
        self.tick = os.sysconf("SC_CLK_TCK")
        self.samples = []
        self.peak_rss_kb = 0
        self.running = False

    def cpu(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick

    def rss_kb(self):
        return rss_kb(self.pid) or 0

    def __enter__(self):
        self.samples, self.running = [(time.time(), self.cpu())], True
        self.peak_rss_kb = self.rss_kb()

        def sample():
            while self.running:
                time.sleep(0.02)
                self.samples.append((time.time(), self.cpu()))
                self.peak_rss_kb = max(self.peak_rss_kb, self.rss_kb())
        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.samples.append((time.time(), self.cpu()))

    def cpu_at(self, t):
        """CPU seconds at wall time t, interpolated between samples (ticks are 10 ms)."""
        before = max((s for s in self.samples if s[0] <= t), default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= t), default=self.samples[-1])
        if after[0] == before[0]:
            return before[1]
        return before[1] + (after[1] - before[1]) * (t - before[0]) / (after[0] - before[0])

    def cpu_between(self, t0, t1):
        return self.cpu_at(t1) - self.cpu_at(t0)

    def wait_quiet(self, busy=0.05, window=0.5, windows=4, limit=60.0):
        """Waits until the broker has used less than `busy` of a core in each of `windows`
        windows of `window` seconds in a row: filling a queue, or the contender before, leaves
        the broker work that would otherwise land in the next contender's window (a classic
        queue that has been idle for a second writes its index out, for a second or two after a
        fill). Returns the seconds waited; gives up after `limit`."""
        start = time.time()
        quiet = 0
        while quiet < windows and time.time() - start < limit:
            before = self.cpu()
            time.sleep(window)
            quiet = quiet + 1 if self.cpu() - before < busy * window else 0
        return round(time.time() - start, 2)


def resource_children_cpu():
    """CPU seconds (user and system) of this process's children that have been waited for."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_cpu():
    """CPU seconds the whole machine has spent busy (every process, other users' too)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ArrivalWatch(threading.Thread):
    """Consumes a queue (acking everything) until every message of `due` has arrived or 90 s
    after the last due time; lateness() is how late each arrived against its due time."""

    def __init__(self, url, queue, due):
        super().__init__(daemon=True)
        self.url, self.queue, self.due = url, queue, due
        self.late = {}

    def run(self):
        import pika
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)

        def on_message(ch, method, properties, body):
            message_id = properties.message_id or ""
            if message_id in self.due and message_id not in self.late:
                self.late[message_id] = int(time.time() * 1000) - self.due[message_id]
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(self.queue, on_message)
        deadline = max(self.due.values()) / 1000 + 90
        while len(self.late) < len(self.due) and time.time() < deadline:
            connection.process_data_events(time_limit=0.2)
        connection.close()

    def lateness(self):
        """The lateness in ms (p50, p99, max), how many arrived early and how many arrived."""
        values = sorted(self.late.values())
        if not values:
            return {"late_p50_ms": None, "late_p99_ms": None, "late_max_ms": None, "early": 0,
                    "retries_back": 0}
        return {"late_p50_ms": values[len(values) // 2],
                "late_p99_ms": values[min(len(values) - 1, len(values) * 99 // 100)],
                "late_max_ms": values[-1], "early": sum(1 for v in values if v < 0),
                "retries_back": len(values)}


class PostgresServer:
    """CPU time of the throwaway PostgreSQL (scripts/with-postgres): the postmaster and every
    process of its cluster, plus what the postmaster reaped (backends that ended: a relay's
    connection closes with the relay)."""

    def __init__(self):
        self.url = os.environ["RETRYLOOP_TEST_PG_URL"]
        with open(os.path.join(os.environ["RETRYLOOP_TEST_PG_DIR"], "data",
                               "postmaster.pid")) as f:
            self.pid = f.readline().strip()
        self.tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _stat(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    def cpu(self):
        """A backend reaped while /proc is read (the one a client that just exited had) would
        be counted twice or not at all: the reading is taken again until the postmaster's
        reaped time stays the same across it."""
        for _ in range(10):
            before = self._stat(self.pid)[11:15]  # utime stime cutime cstime
            total = 0
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    fields = self._stat(pid)
                except OSError:
                    continue
                if fields[1] == self.pid:
                    total += int(fields[11]) + int(fields[12])
            after = self._stat(self.pid)[11:15]
            if after[2:] == before[2:]:
                break
            time.sleep(0.05)
        return (total + sum(int(x) for x in after)) / self.tick

    def version(self):
        done = subprocess.run(["psql", "-XAtq", "-d", self.url, "-c", "show server_version"],
                              capture_output=True, text=True)
        return done.stdout.strip().split(" ")[0] or None


class Bench:
    def __init__(self, out):
        self.url = os.environ["RETRYLOOP_TEST_URL"]
        self.out = out
        self.broker = Broker()
        self.rows = []
        self.work = tempfile.mkdtemp(prefix="retryloop-bench-")
        self.meta = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "quick": QUICK, "profile": PROFILE, "rounds": ROUNDS, "sizes": SIZES, "prefetches": PREFETCHES,
            "queue_types": QUEUE_TYPES, "benchmarks": BENCHMARKS, "clients": CLIENTS,
            "machine": machine(), "load_before": os.getloadavg(), "versions": versions(),
            "outbox_relays": OUTBOX_RELAYS, "inbox_concurrency": INBOX_CONCURRENCY,
        }
        self.postgres = None
        if "outbox" in BENCHMARKS:
            self.postgres = PostgresServer()
            self.meta["versions"]["postgresql"] = self.postgres.version()

    def tool(self, *args, **kwargs):
        return run([TOOL, args[0], "--url", self.url, *map(str, args[1:])], **kwargs)

    def save(self):
        data = {"meta": self.meta, "rows": self.rows}
        with open(self.out + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.replace(self.out + ".tmp", self.out)

    def record(self, row, **extra):
        row.update(extra)
        row["load"] = os.getloadavg()[0]
        self.rows.append(row)
        self.save()
        return row

    def timed(self, command, count, postgres=False, machine=False):
        """Runs a contender; adds the broker's CPU over its measured window. A contender that
        fails or hangs (at least 20 msg/s is expected) is recorded as failed; the run goes on.
        With `postgres`, adds the PostgreSQL server's CPU over the contender's whole run, and
        with it or `machine`, the cores the whole machine kept busy meanwhile."""
        quiet_wait = self.broker.wait_quiet()
        try:
            pg0 = self.postgres.cpu() if postgres else None
            busy0, wall0 = machine_cpu(), time.time()
            with self.broker:
                row = run(command, timeout=max(300, count / 20))
            if row and postgres:
                row["pg_cpu_seconds"] = round(self.postgres.cpu() - pg0, 4)
            if row and (postgres or machine):
                row["machine_busy_cores"] = round((machine_cpu() - busy0) /
                                                  (time.time() - wall0), 3)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            text = str(e).replace(self.url, "URL").replace(BUILD, "BUILD").replace(ROOT, ".")[:500]
            log(f"FAILED: {text}")
            return {"failed": text, "messages": count}
        if row and "t0" in row:
            row["broker_cpu_seconds"] = round(self.broker.cpu_between(row["t0"], row["t1"]), 4)
        if row:
            row["broker_quiet_wait_seconds"] = quiet_wait
        return row

    # ---- 1 and 2. Consume and ack; client and broker CPU per message ----

    def consume(self):
        for queue_type in QUEUE_TYPES:
            for prefetch in PREFETCHES:
                count = SIZES["consume"] if prefetch >= 100 else SIZES["consume_low_prefetch"]
                for r in range(ROUNDS):
                    fanout = f"bench.fill.{queue_type}"
                    for client in CLIENTS:
                        self.tool("reset", "--queue", f"bench.consume.{client}", "--type",
                                  queue_type, "--exchange", fanout)
                    self.tool("fill", "--exchange", fanout, "--count", count, timeout=3600)
                    for client in rotate(CLIENTS, r):
                        queue = f"bench.consume.{client}"
                        row = self.timed(peer_command(client, "consume", self.url, queue, count,
                                                      prefetch), count)
                        self.record(row, bench="consume", client=client, queue_type=queue_type,
                                    prefetch=prefetch, round=r + 1)
                        log_rate(f"consume {queue_type} prefetch {prefetch} round {r + 1}: "
                                 f"{client:15s}", row, count)
        for client in CLIENTS:
            self.tool("reset", "--queue", f"bench.consume.{client}", "--delete-only")

    # ---- 1b. The retry consumer against the clients under it, the same handler work ----

    # retryloop's contenders: the retry consumer at concurrency 1 and 8 with its handler on the
    # worker threads, and on the loop; the raw client under it with the same handler.
    CONSUMER_VARIANTS = {
        "retryloop-c1": ["--concurrency", "1"],
        "retryloop-c8": ["--concurrency", "8"],
        "retryloop-loop": ["--concurrency", "1", "--on-loop"],
    }

    def consumer(self):
        count = SIZES["consumer"]
        contenders = []
        if "retryloop" in CLIENTS:
            contenders += list(self.CONSUMER_VARIANTS) + ["retryloop-raw"]
        contenders += [c for c in ("pika", "amqplib", "rabbitmq-c") if c in CLIENTS]
        for queue_type in [q for q in QUEUE_TYPES if q in ("classic", "quorum")]:
            paths = {}
            for contender in contenders:
                queue = f"bench.handle.{contender}"
                if contender in self.CONSUMER_VARIANTS:
                    paths[contender] = self.topology(queue, queue_type, "reject", "30s")
                else:
                    self.tool("reset", "--queue", queue, "--type", queue_type)
            for r in range(ROUNDS):
                for contender in rotate(contenders, r):
                    queue = f"bench.handle.{contender}"
                    self.tool("fill", "--queue", queue, "--count", count, "--fresh", "--json",
                              timeout=3600)
                    if contender in self.CONSUMER_VARIANTS:
                        command = [TOOL, "handle", "--url", self.url, "--topology",
                                   paths[contender], "--service", queue, "--count", str(count),
                                   "--prefetch", str(RETRY_PREFETCH),
                                   *self.CONSUMER_VARIANTS[contender]]
                    elif contender == "retryloop-raw":
                        command = peer_command("retryloop", "consume", self.url, queue, count,
                                               RETRY_PREFETCH) + ["--json"]
                    else:
                        command = peer_command(contender, "handle", self.url, queue, count,
                                               RETRY_PREFETCH)
                    row = self.timed(command, count)
                    self.record(row, bench="consumer", client=contender, queue_type=queue_type,
                                prefetch=RETRY_PREFETCH, round=r + 1)
                    log_rate(f"consumer {queue_type} round {r + 1}: {contender:15s}", row, count)
            for contender in contenders:
                if contender in paths:
                    self.drop_topology(paths[contender])
                else:
                    self.tool("reset", "--queue", f"bench.handle.{contender}", "--delete-only")

    def callgrind(self):
        clients = [c for c in ("retryloop", "rabbitmq-c") if c in CLIENTS]
        count, prefetch = SIZES["callgrind"], 100
        for r in range(ROUNDS):
            for client in clients:
                self.tool("reset", "--queue", f"bench.callgrind.{client}", "--exchange",
                          "bench.fill.callgrind")
            self.tool("fill", "--exchange", "bench.fill.callgrind", "--count", count)
            for client in rotate(clients, r):
                out = os.path.join(self.work, f"callgrind.{client}.{r}")
                command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + \
                    peer_command(client, "consume", self.url, f"bench.callgrind.{client}", count,
                                 prefetch)
                run(command)
                # CALLGRIND_DUMP_STATS wrote the window (first delivery to last ack) as out.1.
                instructions = callgrind_total(out + ".1")
                self.record({"client": client, "messages": count, "prefetch": prefetch,
                             "instructions": instructions}, bench="callgrind", round=r + 1)
                log(f"callgrind round {r + 1}: {client:12s} {instructions / count:8.0f} "
                    f"instructions/msg")
        for client in clients:
            self.tool("reset", "--queue", f"bench.callgrind.{client}", "--delete-only")

    # ---- 3. Publish with confirms ----

    def publish(self):
        for window, count in ((PUBLISH_WINDOW, SIZES["publish"]), (1, SIZES["publish_one"])):
            for r in range(ROUNDS):
                for client in rotate(CLIENTS, r):
                    queue = f"bench.publish.{client}"
                    self.tool("reset", "--queue", queue)
                    row = self.timed(peer_command(client, "publish", self.url, queue, count,
                                                  window), count)
                    self.record(row, bench="publish", client=client, window=window, round=r + 1)
                    if "failed" not in row:
                        log(f"publish window {window} round {r + 1}: {client:15s} "
                            f"{row['rate']:9.0f} msg/s")
                    self.tool("reset", "--queue", queue, "--delete-only")

    # ---- 4. The retry loop: the seed recipe against retryloop ----

    def topology(self, name, queue_type, mode, delay, max_attempts=5):
        path = os.path.join(self.work, name + ".json")
        service = {"name": name, "queue_type": queue_type,
                   "input": {"exchange": name + ".in", "type": "direct", "bindings": [name]},
                   "retry": {"mode": mode, "delays": [delay], "max_attempts": max_attempts}}
        with open(path, "w") as f:
            json.dump({"services": [service]}, f)
        run([CLI, "topology", "apply", path, "--url", self.url])
        return path

    def drop_topology(self, path):
        run([CLI, "topology", "delete", path, "--yes", "--force", "--url", self.url])

    def seed_command(self, name, count, fail, *extra):
        return [PYTHON, os.path.join(HERE, "peers", "pika_bench.py"), "seed", self.url, name,
                str(count), str(fail), str(RETRY_PREFETCH), *extra]

    def seed_setup(self, name, ttl_ms, queue_type):
        run([PYTHON, os.path.join(HERE, "peers", "pika_bench.py"), "seed-setup", self.url, name,
             str(ttl_ms), queue_type])

    def seed_drop(self, name):
        for queue in (name, name + ".dead"):
            self.tool("reset", "--queue", queue, "--delete-only")

    def delayed_command(self, name, count, fail, *extra):
        return [PYTHON, os.path.join(HERE, "peers", "pika_bench.py"), "delayed", self.url, name,
                str(count), str(fail), str(RETRY_PREFETCH), *extra]

    def delayed_setup(self, name, min_ms):
        run([PYTHON, os.path.join(HERE, "peers", "pika_bench.py"), "delayed-setup", self.url,
             name, str(min_ms)])

    def retry(self):
        count, fail = SIZES["retry"], 2
        for queue_type in QUEUE_TYPES:
            contenders = ["seed-pika", "retryloop-reject", "retryloop-republish"]
            if DELAYED_RETRY and queue_type == "quorum":
                contenders += ["delayed-pika", "retryloop-in_queue"]
            for r in range(ROUNDS):
                for contender in rotate(contenders, r):
                    name = f"bench.retry.{contender}.{queue_type}.{r + 1}"
                    if contender == "delayed-pika":
                        self.delayed_setup(name, 10)
                        self.tool("fill", "--queue", name, "--count", count, "--fresh")
                        row = self.timed(self.delayed_command(name, count, fail), count)
                        self.tool("reset", "--queue", name, "--delete-only")
                    elif contender == "seed-pika":
                        self.seed_setup(name, 10, queue_type)
                        self.tool("fill", "--queue", name, "--count", count, "--fresh")
                        row = self.timed(self.seed_command(name, count, fail), count)
                        self.seed_drop(name)
                    else:
                        path = self.topology(name, queue_type, contender.split("-")[1], "10ms")
                        self.tool("fill", "--queue", name, "--count", count, "--fresh")
                        row = self.timed([TOOL, "retry", "--url", self.url, "--topology", path,
                                          "--service", name, "--count", str(count), "--fail",
                                          str(fail), "--prefetch", str(RETRY_PREFETCH)], count)
                        self.drop_topology(path)
                    self.record(row, bench="retry", client=contender, queue_type=queue_type,
                                round=r + 1, delay_ms=10)
                    if "failed" not in row:
                        log(f"retry {queue_type} round {r + 1}: {contender:20s} "
                            f"{row['rate']:8.0f} completed msg/s")

    def lateness(self):
        count, rate = SIZES["lateness"], SIZES["lateness_rate"]
        publish = lambda queue: [TOOL, "publish", "--url", self.url, "--queue", queue, "--count",
                                 str(count), "--window", "100", "--rate", str(rate), "--fresh"]
        for queue_type in QUEUE_TYPES:
            contenders = ["broker-ttl", "seed-pika", "retryloop-reject", "retryloop-republish"]
            if DELAYED_RETRY and queue_type == "quorum":
                contenders += ["delayed-pika", "retryloop-in_queue"]
            for r in range(ROUNDS):
                for contender in rotate(contenders, r):
                    name = f"bench.late.{contender}.{queue_type}.{r + 1}"
                    cleanup = None
                    if contender == "delayed-pika":
                        self.delayed_setup(name, 1000)
                        consumer = self.delayed_command(name, count, 1, "lateness", "1000")
                        cleanup = lambda: self.tool("reset", "--queue", name, "--delete-only")
                    elif contender == "broker-ttl":
                        self.tool("reset", "--queue", name + ".out", "--type", queue_type)
                        self.tool("reset", "--queue", name, "--type", queue_type, "--ttl", 1000,
                                  "--dead-letter-to", name + ".out")
                        consumer = [TOOL, "ttl", "--url", self.url, "--queue", name + ".out",
                                    "--count", str(count), "--delay-ms", "1000"]
                        cleanup = lambda: [self.tool("reset", "--queue", q, "--delete-only")
                                           for q in (name, name + ".out")]
                    elif contender == "seed-pika":
                        self.seed_setup(name, 1000, queue_type)
                        consumer = self.seed_command(name, count, 1, "lateness", "1000")
                        cleanup = lambda: self.seed_drop(name)
                    else:
                        path = self.topology(name, queue_type, contender.split("-")[1], "1s")
                        consumer = [TOOL, "retry", "--url", self.url, "--topology", path,
                                    "--service", name, "--count", str(count), "--fail", "1",
                                    "--prefetch", str(RETRY_PREFETCH), "--lateness"]
                        cleanup = lambda: self.drop_topology(path)
                    process = subprocess.Popen(consumer, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True)
                    time.sleep(1.5)  # consuming before the first message arrives
                    run(publish(name))
                    stdout, stderr = process.communicate(timeout=600)
                    if process.returncode != 0:
                        raise RuntimeError(f"{' '.join(consumer)}: {stderr[-2000:]}")
                    row = json.loads([l for l in stdout.splitlines() if l.startswith("{")][-1])
                    cleanup()
                    self.record(row, bench="lateness", client=contender, queue_type=queue_type,
                                round=r + 1, delay_ms=1000)
                    late = row["late_ms"]
                    log(f"lateness {queue_type} round {r + 1}: {contender:20s} p50 "
                        f"{late['p50']:6.1f} ms  p99 {late['p99']:6.1f} ms  max {late['max']:6.1f} ms")

    # The delay levels' accuracy: real delays on a 100 ms base, and 100 ms to 1 h compressed a
    # hundredfold (1 ms to 36 s on a 1 ms base: the same bits, so the same hops). One round: the
    # runs are long, and each message is its own sample.
    DELAY_CONFIGS = [
        {"name": "100 ms base, 100 ms to 60 s", "base": "100ms", "max": "1h",
         "min_ms": 100, "max_ms": 60000},
        {"name": "1 ms base, 1 ms to 36 s (100 ms to 1 h compressed 100x)", "base": "1ms",
         "max": "1m", "min_ms": 1, "max_ms": 36000},
    ]

    def delays(self):
        count, rate = SIZES["delays"], SIZES["delays_rate"]
        # The 1 ms base passes the most levels; it runs in the full profile, which keeps the
        # default run near 20 minutes.
        configs = self.DELAY_CONFIGS if FULL else self.DELAY_CONFIGS[:1]
        for queue_type in QUEUE_TYPES:
            for k, config in enumerate(configs):
                name = f"bench.delays.{queue_type}.{k}"
                path = os.path.join(self.work, name + ".json")
                service = {"name": name, "queue_type": queue_type,
                           "input": {"exchange": name + ".in", "type": "direct",
                                     "bindings": [name]},
                           "retry": {"mode": "republish", "delays": ["1s"], "max_attempts": 3,
                                     "delay_levels": {"base": config["base"],
                                                      "max": config["max"]}}}
                with open(path, "w") as f:
                    json.dump({"services": [service]}, f)
                run([CLI, "topology", "apply", path, "--url", self.url])
                consumer = [TOOL, "delays", "--url", self.url, "--topology", path, "--service",
                            name, "--count", str(count), "--min-ms", str(config["min_ms"]),
                            "--max-ms", str(config["max_ms"]), "--prefetch",
                            str(RETRY_PREFETCH)]
                process = subprocess.Popen(consumer, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
                time.sleep(1.5)  # consuming before the first message arrives
                run([TOOL, "publish", "--url", self.url, "--queue", name, "--count", str(count),
                     "--window", "100", "--rate", str(rate), "--fresh"])
                stdout, stderr = process.communicate(timeout=1200)
                if process.returncode != 0:
                    raise RuntimeError(f"{' '.join(consumer)}: {stderr[-2000:]}")
                row = json.loads([l for l in stdout.splitlines() if l.startswith("{")][-1])
                self.drop_topology(path)
                self.record(row, bench="delays", client="retryloop", queue_type=queue_type,
                            config=config["name"], round=1)
                log(f"delays {queue_type} {config['name']}: error p50 "
                    f"{row['error_ms']['p50']:.1f} ms p99 {row['error_ms']['p99']:.1f} ms, "
                    f"lateness p99 {row['late_ms']['p99']:.1f} ms, within bound "
                    f"{row['within_bound']}/{row['messages']}")

    # ---- 4c. Scheduled delivery through the delay levels ----

    def schedule(self):
        count = SIZES["schedule"]
        low, high = SIZES["schedule_min_ms"], SIZES["schedule_max_ms"]
        for queue_type in QUEUE_TYPES:
            queue = f"bench.schedule.{queue_type}"
            path = os.path.join(self.work, queue + ".json")
            with open(path, "w") as f:
                json.dump({"delay_levels": {"base": "1s", "max": "1h", "queue_type": queue_type,
                                            "queues": [queue]}}, f)
            self.tool("reset", "--queue", queue, "--type", queue_type)
            run([CLI, "topology", "apply", path, "--url", self.url])
            rss_before = self.broker.rss_kb()
            row = self.timed([TOOL, "schedule", "--url", self.url, "--topology", path, "--queue",
                              queue, "--count", str(count), "--min-ms", str(low), "--max-ms",
                              str(high)], count)
            if "failed" not in row:
                row["broker_rss_before_kb"] = rss_before
                row["broker_peak_rss_kb"] = self.broker.peak_rss_kb
            self.tool("reset", "--queue", queue, "--delete-only")
            self.record(row, bench="schedule", client="retryloop", queue_type=queue_type, round=1)
            if "failed" not in row:
                log(f"schedule {queue_type}: {row['rate']:.0f} scheduled msg/s (plain publish "
                    f"{row['plain_rate']:.0f}), {row['arrived']}/{count} arrived, "
                    f"{row['early']} early, lateness p99 {row['late_ms']['p99']:.0f} ms, "
                    f"broker RSS {rss_before // 1024} -> {self.broker.peak_rss_kb // 1024} MB")

    def scale(self):
        import scale
        scale.run(self)

    def outage(self):
        import outage
        outage.run(self)

    def dispatch(self):
        import dispatch
        dispatch.run(self)

    # ---- 5. Memory ----

    def memory(self):
        count = SIZES["memory"]
        path = self.topology("bench.memory", "classic", "reject", "30s")
        # The slow handler acks a message every 500 ms: a few more than held, for every round.
        self.tool("fill", "--queue", "bench.memory", "--count", count + 20 * ROUNDS)
        for r in range(ROUNDS):
            row = run([TOOL, "hold", "--url", self.url, "--topology", path, "--service",
                       "bench.memory", "--count", str(count), "--prefetch", str(count)])
            self.record(row, bench="memory", client="retryloop", round=r + 1)
            log(f"memory round {r + 1}: peak RSS {row['peak_rss_kb'] / 1024:.1f} MB holding "
                f"{row['held']} unacked messages")
        self.drop_topology(path)

    def churn(self):
        """The consumer's RSS while the same parked messages come back again and again: each
        round replays every parked message into a demo_consumer (quorum queues, prefetch 50, 8
        workers, as in the hour of faults) that parks it once more. Each round adds two entries
        to every message's retryloop-history (parked, replayed) until it keeps its last 20: from
        then on no message grows, and the RSS should not either."""
        import pika
        count, rounds = SIZES["churn"], SIZES["churn_rounds"]
        name = "bench.churn"
        path = self.topology(name, "quorum", "reject", "5s", max_attempts=3)
        consumer = subprocess.Popen(
            [os.path.join(BUILD, "examples", "demo_consumer"), "--url", self.url, "--topology",
             path, "--service", name, "--concurrency", "8", "--prefetch", "50", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()

            def parked():
                return channel.queue_declare(name + ".parking", passive=True).method.message_count

            def all_parked():
                deadline = time.time() + 300
                while parked() < count:
                    if time.time() > deadline or consumer.poll() is not None:
                        raise RuntimeError(f"churn: {parked()} of {count} parked")
                    time.sleep(0.2)
                time.sleep(1)  # the last confirms and acks

            for i in range(count):
                channel.basic_publish(name + ".in", name, json.dumps(
                    {"id": f"churn-{i}", "permanent": "no such account"}))
            all_parked()
            row = {"messages": count, "rss_kb": [rss_kb(consumer.pid)], "header_bytes": [],
                   "seconds": []}
            for _ in range(rounds):
                t0 = time.time()
                run([CLI, "parking", "replay", "-t", path, name, "--url", self.url], timeout=600)
                all_parked()
                row["seconds"].append(round(time.time() - t0, 2))
                row["rss_kb"].append(rss_kb(consumer.pid))
                method, properties, _ = channel.basic_get(name + ".parking", auto_ack=False)
                row["header_bytes"].append(len(json.dumps(properties.headers, default=str)))
                channel.basic_nack(method.delivery_tag, requeue=True)
        finally:
            consumer.terminate()
            consumer.wait(timeout=60)
            connection.close()
        self.drop_topology(path)
        self.record(row, bench="churn", client="retryloop", round=1)
        log(f"churn: RSS {row['rss_kb'][0]} kB parked once, {row['rss_kb'][1]} kB after the "
            f"first replay, {row['rss_kb'][-1]} kB after {rounds}; headers of a parked message "
            f"{row['header_bytes'][0]} -> {row['header_bytes'][-1]} bytes as JSON")

    # ---- 6. Replay ----

    def replay(self):
        contenders = ["retryloop", "pika-loop"]
        for r in range(ROUNDS):
            for contender in rotate(contenders, r):
                name = "bench.replay"
                path = self.topology(name, "classic", "reject", "30s")
                count = SIZES["replay"] if contender == "retryloop" else SIZES["replay_pika"]
                self.tool("fill", "--queue", name + ".parking", "--count", count, "--parked",
                          timeout=3600)
                if contender == "retryloop":
                    with self.broker:
                        t0 = time.time()
                        run([CLI, "parking", "replay", "-t", path, name, "--url", self.url])
                        t1 = time.time()
                    row = {"client": "retryloop", "messages": count, "seconds": round(t1 - t0, 4),
                           "rate": round(count / (t1 - t0), 1), "t0": t0, "t1": t1,
                           "broker_cpu_seconds": round(self.broker.cpu_between(t0, t1), 4),
                           "note": "wall time of `retryloop parking replay`, start to exit"}
                else:
                    row = self.timed([PYTHON, os.path.join(HERE, "peers", "pika_bench.py"),
                                      "replay", self.url, name + ".parking", name, str(count)],
                                     count)
                self.drop_topology(path)
                self.record(row, bench="replay", client=contender, round=r + 1)
                if "failed" not in row:
                    log(f"replay round {r + 1}: {contender:10s} {row['rate']:8.0f} msg/s")

    # ---- 6b. topology migrate ----

    def migrate(self):
        """A service queue made again with another type while N messages wait in it: the wall
        time of `retryloop topology migrate`, start to exit (it moves each message twice: into
        the holding queue and back), its peak RSS and CPU, the broker's CPU; beside pika doing
        what NServiceBus's migrate-to-quorum does, one message and one confirm at a time."""
        for count in MIGRATE_SIZES:
            for source, target in (("classic", "quorum"), ("quorum", "classic")):
                for r in range(ROUNDS):
                    contenders = ["retryloop"] + (["pika-loop"] if count <= MIGRATE_PIKA_N
                                                  else [])
                    for contender in rotate(contenders, r):
                        name = "bench.migrate"
                        path = self.topology(name, source, "reject", "30s")
                        self.tool("fill", "--queue", name, "--count", count, timeout=7200)
                        if contender == "retryloop":
                            row = self.migrate_retryloop(name, path, target, count)
                        else:
                            row = self.timed([PYTHON, os.path.join(HERE, "peers", "pika_bench.py"),
                                              "migrate", self.url, name, target, str(count)],
                                             2 * count)
                        self.drop_topology(path)
                        for leftover in (".pika-holding", ".migrating"):  # after a failed run
                            self.tool("reset", "--queue", name + leftover, "--delete-only")
                        self.record(row, bench="migrate", client=contender, messages=count,
                                    source=source, target=target, round=r + 1)
                        if "failed" not in row:
                            log(f"migrate {count} {source}->{target} round {r + 1}: "
                                f"{contender:10s} {row['rate']:8.0f} msg/s")

    def migrate_retryloop(self, name, path, target, count):
        with open(path) as f:
            topology = json.load(f)
        topology["services"][0]["queue_type"] = target
        new_path = path + ".new.json"
        with open(new_path, "w") as f:
            json.dump(topology, f)
        quiet_wait = self.broker.wait_quiet()
        with self.broker:
            t0 = time.time()
            p = subprocess.Popen([CLI, "topology", "migrate", new_path, "--url", self.url],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            peak = 0
            while p.poll() is None:
                peak = max(peak, rss_kb(p.pid) or 0)
                time.sleep(0.05)
            t1 = time.time()
        err = p.stderr.read()
        if p.returncode != 0:
            log(f"FAILED: topology migrate exited {p.returncode}: {err[:300]}")
            return {"failed": err[:300], "messages": count}
        return {"client": "retryloop", "messages": count, "moved": 2 * count,
                "seconds": round(t1 - t0, 4), "rate": round(count / (t1 - t0), 1),
                "moved_rate": round(2 * count / (t1 - t0), 1), "rss_kb": peak,
                "t0": t0, "t1": t1, "broker_cpu_seconds": round(self.broker.cpu_between(t0, t1), 4),
                "broker_quiet_wait_seconds": quiet_wait,
                "note": "wall time of `retryloop topology migrate`, start to exit; rate is "
                        "messages migrated a second (each moved twice)"}

    # ---- 6c. topology transfer ----

    def transfer(self):
        """A republish-mode service moved to a second broker (RETRYLOOP_TARGET_URL, which bench/run
        starts): SIZES["transfer"] messages in its service queue, SIZES["transfer_retries"]
        retries waiting in its 20 s wait queue, each due 20 s after it was published there (as
        the consumer writes it in retryloop-retry-due), and SIZES["transfer_parked"] parked. The
        wall time of `retryloop topology transfer`, start to exit, its CPU and the old broker's;
        and how late each moved retry reaches a consumer of the new service queue, started before
        the move, against its due time. Beside
        it pika moving the same queues one message and one confirm at a time, as a shovel would,
        the wait queue first (the 20,000 messages take it longer than the retries' delay): a
        retry waits its whole delay again, so it is late by what it had already waited."""
        import pika
        new_url = os.environ["RETRYLOOP_TARGET_URL"]
        count, retries, parked = (SIZES["transfer"], SIZES["transfer_retries"],
                                  SIZES["transfer_parked"])
        name = "bench.transfer"
        wait = name + ".wait.20s"
        for queue_type in QUEUE_TYPES:
            if queue_type not in ("classic", "quorum"):
                continue
            for r in range(ROUNDS):
                for contender in rotate(["retryloop", "pika-loop"], r):
                    path = self.topology(name, queue_type, "republish", "20s")
                    run([CLI, "topology", "apply", path, "--url", new_url])
                    # The retries first: by the move they have waited 10 s or more of their 20.
                    due = self.transfer_retries(pika, wait, retries)
                    self.tool("fill", "--queue", name, "--count", count, "--fresh", timeout=3600)
                    self.tool("fill", "--queue", name + ".parking", "--count", parked, "--parked",
                              timeout=3600)
                    time.sleep(max(0.0, min(due.values()) / 1000 - 10 - time.time()))
                    # Consumers on the new broker from the start, as in a blue-green move: each
                    # retry's arrival is seen when it comes, however long the move takes.
                    watch = ArrivalWatch(new_url, name, due)
                    watch.start()
                    if contender == "retryloop":
                        row = self.transfer_retryloop(path, new_url, count + retries + parked)
                    else:
                        row = self.timed([PYTHON, os.path.join(HERE, "peers", "pika_bench.py"),
                                          "transfer", self.url, new_url, f"{wait}={retries}",
                                          f"{name}={count}", f"{name}.parking={parked}"],
                                         count + retries + parked)
                    watch.join()
                    if "failed" not in row:
                        row.update(watch.lateness())
                    self.drop_topology(path)
                    run([CLI, "topology", "delete", path, "--yes", "--force", "--url", new_url])
                    self.record(row, bench="transfer", client=contender, queue_type=queue_type,
                                round=r + 1, retries=retries, parked=parked)
                    if "failed" not in row:
                        log(f"transfer {queue_type} round {r + 1}: {contender:10s} "
                            f"{row['rate']:8.0f} msg/s; retries late by p50 {row['late_p50_ms']} "
                            f"p99 {row['late_p99_ms']} max {row['late_max_ms']} ms, "
                            f"{row['early']} early")

    def transfer_retries(self, pika, wait, count):
        """Publishes `count` retries into the wait queue as a republish-mode consumer does, each
        due 20 s after it is published; returns their due times by message id."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.confirm_delivery()
        due = {}
        for i in range(count):
            message_id = f"retry-{i}"
            due[message_id] = int(time.time() * 1000) + 20000
            channel.basic_publish("", wait, json.dumps({"id": message_id}), pika.BasicProperties(
                delivery_mode=2, message_id=message_id, content_type="application/json",
                headers={"retryloop-retry-due": due[message_id], "retryloop-retries": 1}),
                mandatory=True)
        connection.close()
        return due

    def transfer_retryloop(self, path, new_url, count):
        quiet_wait = self.broker.wait_quiet()
        with self.broker:
            t0 = time.time()
            cpu0 = resource_children_cpu()
            p = subprocess.Popen([CLI, "topology", "transfer", path, "--url", self.url, "--to",
                                  new_url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
            peak = 0
            while p.poll() is None:
                peak = max(peak, rss_kb(p.pid) or 0)
                time.sleep(0.05)
            t1 = time.time()
            cpu = resource_children_cpu() - cpu0
        err = p.stderr.read()
        if p.returncode != 0:
            log(f"FAILED: topology transfer exited {p.returncode}: {err[:300]}")
            return {"failed": err[:300], "messages": count}
        return {"client": "retryloop", "messages": count, "seconds": round(t1 - t0, 4),
                "rate": round(count / (t1 - t0), 1), "cpu_seconds": round(cpu, 4),
                "rss_kb": peak, "t0": t0, "t1": t1,
                "broker_cpu_seconds": round(self.broker.cpu_between(t0, t1), 4),
                "broker_quiet_wait_seconds": quiet_wait,
                "note": "wall time of `retryloop topology transfer`, start to exit: the service "
                        "queue, the wait queue and the parking queue; the broker's CPU is the "
                        "old broker's"}

    # ---- 6d. a blue-green move, step by step ----

    def bluegreen(self):
        """docs/transfer.md's blue-green upgrade, step by step, with the service running: blue is
        the benchmark's broker, green the second one (RETRYLOOP_TARGET_URL). A republish-mode
        service (20 s wait queue) has SIZES["bluegreen"] messages in its queue, SIZES["transfer_
        retries"] retries waiting (due 20 s after they were put there) and SIZES["transfer_
        parked"] parked; a consumer on blue handles about 1,000 messages a second and a publisher
        sends SIZES["bluegreen_rate"] a second to blue. Then: 1. apply on green; 2. a consumer on
        green; 3. `transfer --follow`; 4. the publisher switches to green once the transfer's
        first pass is over; 5. the blue consumer stops; 6. `--follow` ends by itself (--settle
        10s). Each step's wall time, where every message was handled (blue or green, none lost,
        none twice) and how late the moved retries came."""
        import pika
        green = os.environ["RETRYLOOP_TARGET_URL"]
        backlog, retries, parked = (SIZES["bluegreen"], SIZES["transfer_retries"],
                                    SIZES["transfer_parked"])
        name = "bench.bluegreen"
        for queue_type in QUEUE_TYPES:
            if queue_type not in ("classic", "quorum"):
                continue
            for r in range(ROUNDS):
                path = self.topology(name, queue_type, "republish", "20s")
                due = self.transfer_retries(pika, name + ".wait.20s", retries)
                self.tool("fill", "--queue", name, "--count", backlog, "--fresh", "--unique-ids",
                          timeout=3600)
                self.tool("fill", "--queue", name + ".parking", "--count", parked, "--parked",
                          timeout=3600)
                time.sleep(max(0.0, min(due.values()) / 1000 - 10 - time.time()))
                backlog_ids = {f"bench-{i}" for i in range(backlog)}
                row = self.bluegreen_round(pika, path, name, green, due, backlog_ids, parked)
                self.drop_topology(path)
                run([CLI, "topology", "delete", path, "--yes", "--force", "--url", green])
                self.record(row, bench="bluegreen", client="retryloop", queue_type=queue_type,
                            round=r + 1, backlog=backlog, retries=retries, parked=parked)
                log(f"bluegreen {queue_type} round {r + 1}: " + ", ".join(
                    f"{k} {row[k]}" for k in ("apply_s", "first_pass_s", "switch_pause_ms",
                                              "finish_s", "lost", "twice", "late_max_ms")))

    def bluegreen_round(self, pika, path, name, green, due, backlog_ids, parked):
        blue = self.url
        handled = {}  # message id -> (broker, when)
        twice = [0]
        lock = threading.Lock()
        gaps = {"last": time.time(), "longest": 0.0}

        def consumer(url, stop, per_message=0.0002):
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=50)

            def on_message(ch, method, properties, body):
                if per_message:
                    time.sleep(per_message)  # the handler's work
                now = time.time()
                with lock:
                    message_id = properties.message_id or ""
                    if message_id in handled:
                        twice[0] += 1
                    handled[message_id] = (url, now)
                    gaps["longest"] = max(gaps["longest"], now - gaps["last"])
                    gaps["last"] = now
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume(name, on_message)
            while not stop.is_set():
                connection.process_data_events(time_limit=0.1)
            connection.close()  # its unacked messages go back to the queue

        published = []
        switch = {"to_green": threading.Event(), "pause_ms": None}

        def publisher(stop):
            rate = SIZES["bluegreen_rate"]
            url, n = blue, 0
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.confirm_delivery()
            t_next = time.time()
            while not stop.is_set():
                if switch["to_green"].is_set() and url == blue:
                    t = time.time()
                    connection.close()
                    url = green
                    connection = pika.BlockingConnection(pika.URLParameters(url))
                    channel = connection.channel()
                    channel.confirm_delivery()
                    switch["pause_ms"] = round((time.time() - t) * 1000)
                message_id = f"pub-{n}"
                channel.basic_publish(name + ".in", name, b"{}", pika.BasicProperties(
                    delivery_mode=2, message_id=message_id), mandatory=True)
                published.append(message_id)
                n += 1
                t_next += 1.0 / rate
                time.sleep(max(0.0, t_next - time.time()))
            connection.close()

        stop_blue, stop_green, stop_publisher = (threading.Event(), threading.Event(),
                                                 threading.Event())
        threads = [threading.Thread(target=consumer, args=(blue, stop_blue), daemon=True),
                   threading.Thread(target=publisher, args=(stop_publisher,), daemon=True)]
        for t in threads:
            t.start()
        time.sleep(2)  # the service running on blue
        row = {"note": "wall time of each step of docs/transfer.md's blue-green upgrade, with a "
                       "consumer on each broker (pika, 1 ms a message) and a publisher"}
        t = time.time()
        run([CLI, "topology", "apply", path, "--url", green])
        row["apply_s"] = round(time.time() - t, 2)
        t = time.time()
        green_consumer = threading.Thread(target=consumer, args=(green, stop_green), daemon=True)
        green_consumer.start()
        threads.append(green_consumer)
        row["green_consumer_s"] = round(time.time() - t, 2)

        t0 = time.time()
        cpu0 = resource_children_cpu()
        transfer = subprocess.Popen([CLI, "topology", "transfer", path, "--url", blue, "--to",
                                     green, "--follow"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        first_pass = None
        lines = []
        for line in transfer.stdout:
            lines.append(line.rstrip())
            # The first pass ends with the parking queue's read.
            if first_pass is None and line.startswith(name + ".parking:"):
                first_pass = time.time()
                row["first_pass_s"] = round(first_pass - t0, 2)
                switch["to_green"].set()  # step 4: the publishers switch
                while switch["pause_ms"] is None:
                    time.sleep(0.01)
                row["switch_pause_ms"] = switch["pause_ms"]
                t5 = time.time()
                stop_blue.set()  # step 5: the consumers on blue stop
                threads[0].join()
                row["blue_stop_s"] = round(time.time() - t5, 2)
                blue_stopped = time.time()
        transfer.wait()
        if first_pass is None:  # it ended before its first pass was over
            stop_blue.set()
            threads[0].join()
            blue_stopped = time.time()
        row["finish_s"] = round(time.time() - blue_stopped, 2)
        row["transfer_s"] = round(time.time() - t0, 2)
        row["transfer_cpu_s"] = round(resource_children_cpu() - cpu0, 3)
        row["transfer_exit"] = transfer.returncode
        # Each read's line ("QUEUE: N messages moved ...", "pass K: QUEUE: ..."), not the total.
        row["moved"] = sum(int(m.group(1).replace(",", "")) for m in
                           (re.match(r"(?:pass \d+: )?\S+: ([\d,]+) messages? moved", line)
                            for line in lines) if m)
        if transfer.returncode != 0:
            log(f"FAILED: topology transfer --follow exited {transfer.returncode}: "
                f"{transfer.stderr.read()[:300]}")
        stop_publisher.set()
        threads[1].join()
        # Everything published, the backlog and the retries, handled on one broker or the other.
        expected = set(published) | backlog_ids | set(due)
        deadline = max(time.time(), max(due.values()) / 1000) + 60
        while time.time() < deadline:
            with lock:
                if expected <= handled.keys():
                    break
            time.sleep(0.2)
        stop_green.set()
        green_consumer.join()
        with lock:
            on_blue = sum(1 for where, _ in handled.values() if where == blue)
            on_green = len(handled) - on_blue
            late = sorted(int(handled[i][1] * 1000) - due[i] for i in due if i in handled
                          and handled[i][0] == green)
            row.update({"handled_blue": on_blue, "handled_green": on_green,
                        "published": len(published),
                        "lost": len(expected - handled.keys()),
                        "twice": twice[0],
                        "longest_gap_s": round(gaps["longest"], 2),
                        "retries_on_green": len(late),
                        "late_p50_ms": late[len(late) // 2] if late else None,
                        "late_max_ms": late[-1] if late else None,
                        "early": sum(1 for v in late if v < 0)})
        connection = pika.BlockingConnection(pika.URLParameters(green))
        row["parked_on_green"] = connection.channel().queue_declare(
            name + ".parking", passive=True).method.message_count
        connection.close()
        row["parked_lost"] = parked - row["parked_on_green"]
        return row

    # ---- 7. The outbox and the inbox ----

    def outbox_databases(self):
        """The PostgreSQL of scripts/with-postgres and a SQLite file, with retryloop's tables."""
        sqlite_path = os.path.join(self.work, "outbox.db")
        dbs = {"postgresql": self.postgres.url, "sqlite": "sqlite:" + sqlite_path}
        for url in dbs.values():
            run([CLI, "outbox", "init", "--db", url])
        return dbs

    def outbox_fill(self, db, count):
        """Empties the outbox, then fills it with `count` rows, outside any timed window."""
        return run([TOOL, "outbox-fill", "--db", db, "--queue", "bench.outbox", "--count",
                    str(count), "--size", str(SIZES["outbox_body"]), "--keys",
                    str(SIZES["outbox_keys"])], timeout=3600)

    def relays(self, db, n, count):
        """n `retryloop outbox relay --until-idle` processes on a full table, from their start to
        the last one's exit; their CPU time (rusage of each child), the broker's and
        PostgreSQL's over the same window."""
        logs = [tempfile.TemporaryFile(mode="w+") for _ in range(n)]
        pg0 = self.postgres.cpu()
        busy0 = machine_cpu()
        with self.broker:
            t0 = time.time()
            processes = [subprocess.Popen([CLI, "outbox", "relay", "--db", db, "--url", self.url,
                                           "--until-idle"], stdout=subprocess.DEVNULL,
                                          stderr=log) for log in logs]
            cpu, failed = 0.0, []
            for p in processes:
                _, status, usage = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                cpu += usage.ru_utime + usage.ru_stime
                if p.returncode != 0:
                    failed.append(p.returncode)
            t1 = time.time()
        pg1 = self.postgres.cpu()
        busy = machine_cpu() - busy0
        published = 0
        text = ""
        for log in logs:
            log.seek(0)
            text = log.read()
            for line in text.splitlines():
                if "stopped; published" in line:
                    published += int(line.split("published ")[1].split(",")[0])
            log.close()
        if failed or published != count:
            raise RuntimeError(f"relays exited {failed}, published {published} of {count}:\n"
                               f"{text[-1500:]}")
        return {"messages": count, "relays": n, "seconds": round(t1 - t0, 4),
                "rate": round(count / (t1 - t0), 1), "cpu_seconds": round(cpu, 4),
                "t0": t0, "t1": t1,
                "broker_cpu_seconds": round(self.broker.cpu_between(t0, t1), 4),
                "pg_cpu_seconds": round(pg1 - pg0, 4) if "postgresql" in db else 0.0,
                "machine_busy_cores": round(busy / (t1 - t0), 3),
                "note": "wall time of the relay processes, start to the last exit"}

    def outbox(self):
        dbs = self.outbox_databases()
        count, naive = SIZES["outbox"], SIZES["outbox_naive"]
        # The first fill of each database goes through outbox::enqueue, as an application writes
        # (a side figure); later fills copy those rows.
        for name, db in dbs.items():
            row = self.outbox_fill(db, count)
            self.record(row, bench="outbox-fill", client=name)
            log(f"outbox fill {name}: {row['rows']} rows at {row['rate']:.0f} rows/s "
                f"({row['method']})")
        contenders = [("relay", "postgresql", n) for n in OUTBOX_RELAYS] + \
            [("relay", "sqlite", 1), ("naive", "postgresql", 1), ("naive", "sqlite", 1),
             ("publish", "broker", 1)]
        for r in range(ROUNDS):
            for kind, database, n in rotate(contenders, r):
                self.tool("reset", "--queue", "bench.outbox")
                if kind == "publish":
                    # The broker's own ceiling: the same messages (body, headers, mandatory)
                    # to the same queue, pipelined (1,000 unconfirmed), with no database at all.
                    row = self.timed([TOOL, "publish", "--url", self.url, "--queue",
                                      "bench.outbox", "--count", str(count), "--window", "1000",
                                      "--size", str(SIZES["outbox_body"]), "--fresh",
                                      "--mandatory", "--outbox-headers"], count,
                                     machine=True)
                    client = "broker-publish"
                elif kind == "naive":
                    self.outbox_fill(dbs[database], naive)
                    row = self.timed([TOOL, "outbox-naive", "--db", dbs[database], "--url",
                                      self.url, "--count", str(naive)], naive,
                                     postgres=database == "postgresql")
                    client = f"naive-{database}"
                else:
                    self.outbox_fill(dbs[database], count)
                    quiet = self.broker.wait_quiet()
                    try:
                        row = self.relays(dbs[database], n, count)
                        row["broker_quiet_wait_seconds"] = quiet
                    except (RuntimeError, OSError) as e:
                        log(f"FAILED: {e}")
                        row = {"failed": str(e)[:500], "messages": count}
                    client = f"relay-{database}-{n}"
                self.record(row, bench="outbox", client=client, database=database, relays=n,
                            round=r + 1)
                if "failed" not in row:
                    log(f"outbox round {r + 1}: {client:22s} {row['rate']:8.0f} rows/s  "
                        f"client {row['cpu_seconds'] / row['messages'] * 1e6:6.1f} us/row  "
                        f"broker {row['broker_cpu_seconds'] / row['messages'] * 1e6:6.1f} "
                        f"us/row  postgresql "
                        f"{row.get('pg_cpu_seconds', 0) / row['messages'] * 1e6:6.1f} us/row")
        self.tool("reset", "--queue", "bench.outbox", "--delete-only")
        self.outbox_latency(dbs["postgresql"])
        self.inbox(dbs)

    def outbox_latency(self, db):
        rate = SIZES["outbox_latency_rate"]
        count = rate * SIZES["outbox_latency_seconds"]
        modes = ["notify", "poll"]
        for r in range(ROUNDS):
            for mode in rotate(modes, r):
                self.tool("reset", "--queue", "bench.outbox")
                self.outbox_fill(db, 0)
                relay = subprocess.Popen(
                    [CLI, "outbox", "relay", "--db", db, "--url", self.url] +
                    (["--no-notify"] if mode == "poll" else []),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)  # connected to both before the first commit
                try:
                    row = run([TOOL, "outbox-latency", "--db", db, "--url", self.url, "--queue",
                               "bench.outbox", "--count", str(count), "--rate", str(rate),
                               "--size", str(SIZES["outbox_body"]), "--keys",
                               str(SIZES["outbox_keys"])], timeout=count / rate + 120)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    log(f"FAILED: {e}")
                    row = {"failed": str(e)[:500], "messages": count}
                relay.terminate()
                _, _, usage = os.wait4(relay.pid, 0)
                relay.returncode = 0
                row["relay_cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 4)
                self.record(row, bench="outbox-latency", client=mode, round=r + 1,
                            poll_interval_ms=100 if mode == "poll" else 5000)
                if "failed" not in row:
                    late = row["latency_ms"]
                    log(f"outbox latency round {r + 1}: {mode:6s} p50 {late['p50']:6.1f} ms  "
                        f"p99 {late['p99']:6.1f} ms  max {late['max']:6.1f} ms")
        self.tool("reset", "--queue", "bench.outbox", "--delete-only")

    def inbox(self, dbs):
        count = SIZES["inbox"]
        for database, db in dbs.items():
            for concurrency in INBOX_CONCURRENCY:
                for r in range(ROUNDS):
                    for contender in rotate(["plain", "inbox"], r):
                        name = f"bench.inbox.{database}.{contender}.{r + 1}"
                        path = self.topology(name, "classic", "reject", "10s")
                        self.tool("fill", "--queue", name, "--count", count, "--fresh",
                                  "--unique-ids")
                        run([TOOL, "inbox-reset", "--db", db])
                        row = self.timed([TOOL, "inbox", "--db", db, "--url", self.url,
                                          "--topology", path, "--service", name, "--count",
                                          str(count), "--concurrency", str(concurrency)] +
                                         (["--inbox"] if contender == "inbox" else []), count,
                                         postgres=database == "postgresql")
                        self.drop_topology(path)
                        self.record(row, bench="inbox", client=contender, database=database,
                                    concurrency=concurrency, round=r + 1)
                        if "failed" not in row:
                            log(f"inbox {database} concurrency {concurrency} round {r + 1}: "
                                f"{contender:6s} {row['rate']:8.0f} msg/s")

    def run_all(self):
        started = time.time()
        try:
            for name in BENCHMARKS:
                t0 = time.time()
                getattr(self, name)()
                self.meta.setdefault("bench_seconds", {})[name] = round(time.time() - t0, 1)
                log(f"-- {name} done in {time.time() - t0:.0f} s (load {os.getloadavg()[0]:.1f})")
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        self.meta["seconds"] = round(time.time() - started, 1)
        if os.environ.get("BENCH_STARTED"):
            self.meta["total_seconds"] = round(time.time() - float(os.environ["BENCH_STARTED"]), 1)
        self.meta["load_after"] = os.getloadavg()
        self.meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        self.save()


def callgrind_total(path):
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}


def versions():
    def package(name):
        done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True,
                              text=True)
        return done.stdout or None

    def npm(name):
        try:
            with open(os.path.join(HERE, "peers", "node_modules", name, "package.json")) as f:
                return json.load(f)["version"]
        except OSError:
            return None
    def broker(expression):
        done = subprocess.run([os.environ["RETRYLOOP_TEST_CTL"], "eval", "-q", expression],
                              capture_output=True, text=True)
        return done.stdout.strip().strip('"') or None

    # What the running broker says: the 4.0 lane's broker is not this host's package.
    return {"rabbitmq-server": broker("rabbit_misc:version()."),
            "erlang": broker("rabbit_misc:otp_release()."),
            "python3-pika": package("python3-pika"),
            "amqp091-go": package("golang-github-rabbitmq-amqp091-go-dev"),
            "golang": package("golang-go"), "librabbitmq": package("librabbitmq-dev"),
            "amqplib": npm("amqplib"), "@cloudamqp/amqp-client": npm("@cloudamqp/amqp-client"),
            "node": subprocess.run(["node", "--version"], capture_output=True,
                                   text=True).stdout.strip(),
            "sqlite": package("libsqlite3-0"),
            # topology transfer's second broker (scripts/with-broker --as-target), if there is one.
            "rabbitmq_target": ("RabbitMQ " + os.environ["RETRYLOOP_TARGET_RABBITMQ"]
                                if os.environ.get("RETRYLOOP_TARGET_RABBITMQ") else None)}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        Bench(sys.argv[2]).run_all()
    else:
        import report
        report.write(sys.argv[2])
