"""The `outage` benchmark: a dependency that goes down while messages keep arriving (bench.py runs
it as `outage`; docs/outage.md).

A stand-in dependency serves a schedule: up for UP_S, then down for the outage (every connection
reset as soon as it is accepted, like a refused one; or, with BENCH_OUTAGE_KIND=hang, answers
held past the consumers' 2 s timeout), then up with a capacity of K calls a second (a 429 above
it; each call costs 10 ms). A producer (pika) publishes at LAMBDA messages a second, one of them
poison, into a quorum service queue (delays 1 s, 5 s, 30 s; 4 attempts), from the start until
the backlog has drained, and at least TAIL_S after the outage. Each contender consumes with concurrency 32:

- `retryloop`: examples/demo_consumer --dependency, the service's breaker shared by its instances;
- `retryloop-no-breaker`: the same with --no-breaker (a dependency that is down is a retry, as
  before the breaker);
- `pika`: a pika consumer with a fixed retry count: a failed message is republished at once with
  its count, and parked after 4 attempts (the recipe the breaker is measured against).

Recorded per run: messages parked because of the outage, calls to the dependency per second while
it is down, the time to trip and to stop every instance, the time to see the recovery, the drain
time of the backlog against B/(K - LAMBDA), the 429s during the ramp, lost and duplicated.
"""
import http.server
import json
import os
import socket
import socketserver
import struct
import subprocess
import threading
import time

import bench as b

LAMBDA = int(os.environ.get("BENCH_OUTAGE_RATE", "100"))
CAPACITY = int(os.environ.get("BENCH_OUTAGE_CAPACITY", "300"))
UP_S = 10
OUTAGE_S = float(os.environ.get("BENCH_OUTAGE_SECONDS",
                                str(60 * float(os.environ.get("BENCH_OUTAGE_MINUTES", "2")))))
TAIL_S = 10
CONCURRENCY = 32
INSTANCES = [int(x) for x in b.env_list("BENCH_OUTAGE_INSTANCES", ["1", "3"])]
CONTENDERS = b.env_list("BENCH_OUTAGE_CONTENDERS", ["retryloop", "retryloop-no-breaker", "pika"])
KIND = os.environ.get("BENCH_OUTAGE_KIND", "refused")
DEMO = os.path.join(b.BUILD, "examples", "demo_consumer")
PIKA_CONSUMER = os.path.join(b.HERE, "peers", "outage_pika.py")


class Dependency:
    """The stand-in dependency and its schedule; counts every call by phase."""

    def __init__(self):
        self.phase = "up"
        self.lock = threading.Lock()
        self.calls = {"up": 0, "down": 0, "after": 0}
        self.too_many = 0
        self.window = [0, 0]  # second, calls in it
        dependency = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                phase = dependency.count()
                if phase == "down":
                    if KIND == "hang":
                        time.sleep(3)
                    # An RST at once: what a client sees of a refused connection.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                status = 200
                if phase == "after" and dependency.over_capacity():
                    status = 429
                else:
                    time.sleep(0.010)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            request_queue_size = 512

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/charge"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self):
        with self.lock:
            self.calls[self.phase] += 1
            return self.phase

    def over_capacity(self):
        with self.lock:
            second = int(time.time())
            if self.window[0] != second:
                self.window = [second, 0]
            self.window[1] += 1
            if self.window[1] > CAPACITY:
                self.too_many += 1
                return True
            return False

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Lines:
    """A child process's output lines, each with the time it was read; kept across its lives when
    it is killed and started again."""

    def __init__(self, command, name=""):
        self.command, self.name = command, name
        self.out, self.err = [], []
        self.start()

    def start(self):
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, bufsize=1)
        for stream, into in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            threading.Thread(target=self.read, args=(stream, into), daemon=True).start()

    @staticmethod
    def read(stream, into):
        for line in stream:
            into.append((time.time(), line.rstrip("\n")))

    @property
    def pid(self):
        return self.process.pid

    def first(self, text, after=0.0):
        for at, line in list(self.err):
            if at >= after and text in line:
                return at
        return None

    def kill(self):
        self.process.kill()
        self.process.wait()

    def stop(self):
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def topology(bench, name):
    path = os.path.join(bench.work, name + ".json")
    with open(path, "w") as f:
        json.dump({"services": [{
            "name": name, "queue_type": "quorum",
            "input": {"exchange": name + ".in", "type": "direct", "bindings": [name]},
            "retry": {"mode": "republish", "delays": ["1s", "5s", "30s"], "max_attempts": 4},
            "outage": {"probe_interval": "5s", "ramp": {"interval": "2s"}}}]}, f)
    return path


def produce(url, exchange, key, until, published, stop):
    """Publishes LAMBDA messages a second until `until`; the 50th is poison."""
    import pika
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    n, start = 0, time.time()
    while time.time() < until and not stop.is_set():
        due = start + n / LAMBDA
        if due > time.time():
            time.sleep(due - time.time())
        message_id = f"o-{n}"
        body = "not json" if n == 50 else json.dumps({"id": message_id})
        channel.basic_publish(exchange, key, body.encode(),
                              pika.BasicProperties(message_id=message_id, delivery_mode=2))
        published.append(message_id)
        n += 1
    connection.close()


def one_run(bench, contender, instances):
    name = f"bench.outage.{contender}.{instances}.{int(time.time())}"
    path = topology(bench, name)
    b.run([b.CLI, "topology", "apply", path, "--url", bench.url])
    dependency = Dependency()
    if contender == "pika":
        commands = [["/usr/bin/python3", PIKA_CONSUMER, bench.url, name, dependency.url,
                     str(CONCURRENCY)] for _ in range(instances)]
    else:
        commands = [[DEMO, "--url", bench.url, "--topology", path, "--service", name,
                     "--concurrency", str(CONCURRENCY), "--prefetch", str(2 * CONCURRENCY),
                     "--dependency", dependency.url]
                    + (["--no-breaker"] if contender == "retryloop-no-breaker" else [])
                    for _ in range(instances)]
    consumers = [Lines(command) for command in commands]
    time.sleep(2)
    published, stop = [], threading.Event()
    start = time.time()
    down_at, up_at = start + UP_S, start + UP_S + OUTAGE_S
    # The producer goes on until the backlog has drained (and TAIL_S more), so that the drain
    # races arrivals at LAMBDA, as the bound B / (K - LAMBDA) assumes.
    producer = threading.Thread(target=produce, args=(bench.url, name + ".in", name,
                                                      float("inf"), published, stop))
    producer.start()
    time.sleep(max(0.0, down_at - time.time()))
    dependency.phase = "down"
    time.sleep(max(0.0, up_at - time.time()))
    acked_at_up = acked_ids(consumers)
    backlog = len(published) - len(acked_at_up)
    dependency.phase = "after"
    # Drained: what is not yet done is no more than half a second of arrivals. (The producer goes
    # on for TAIL_S, so the time the last message is acked says nothing of the backlog.)
    drained_at = None
    deadline = time.time() + max(120.0, 3 * OUTAGE_S)
    while time.time() < deadline:
        if len(published) - len(acked_ids(consumers)) - parked_count(bench, name) <= LAMBDA // 2:
            drained_at = time.time()
            break
        time.sleep(0.1)
    time.sleep(max(0.0, up_at + TAIL_S - time.time()))
    stop.set()
    producer.join()
    expected = len(published) - 1  # the poison message parks
    while time.time() < deadline:
        if len(acked_ids(consumers)) + parked_count(bench, name) >= len(published):
            break
        time.sleep(0.2)
    time.sleep(1)
    for consumer in consumers:
        consumer.stop()
    acked = acked_ids(consumers)
    outcomes = {}
    for consumer in consumers:
        for _, line in consumer.out:
            try:
                kind = json.loads(line)["outcome"]
            except (ValueError, KeyError):
                continue
            outcomes[kind] = outcomes.get(kind, 0) + 1
    ack_lines = sum(1 for c in consumers for _, line in c.out if '"outcome":"ack"' in line)
    parked = parked_count(bench, name)
    row = {
        "contender": contender, "instances": instances, "kind": KIND,
        "outage_s": OUTAGE_S, "rate": LAMBDA, "capacity": CAPACITY,
        "published": len(published), "acked": len(acked),
        "parked": parked, "parked_by_outage": max(0, parked - 1),
        "lost": len(set(published) - acked - {"o-50"}) - max(0, parked - 1),
        "duplicates": ack_lines - len(acked),
        "calls_per_s_down": round(dependency.calls["down"] / OUTAGE_S, 2),
        "calls_after": dependency.calls["after"], "too_many_after": dependency.too_many,
        "backlog": backlog, "outcomes": outcomes,
        "drain_s": round(drained_at - up_at, 1) if drained_at else None,
        "drain_bound_s": round(backlog / (CAPACITY - LAMBDA), 1) if CAPACITY > LAMBDA else None,
    }
    if contender == "retryloop":
        trips = [c.first("-> open", down_at) for c in consumers]
        if all(trips):
            row["trip_s"] = round(min(trips) - down_at, 2)
            row["all_stopped_s"] = round(max(trips) - min(trips), 2)
        recovered = [c.first("-> ramping", up_at) for c in consumers]
        if any(recovered):
            row["recovery_seen_s"] = round(min(r for r in recovered if r) - up_at, 2)
        closed = [c.first("-> closed", up_at) for c in consumers]
        if all(closed):
            row["full_concurrency_s"] = round(max(closed) - up_at, 2)
        row["probers"] = sum(1 for c in consumers if c.first("open -> probing", down_at))
    dependency.close()
    if os.environ.get("BENCH_OUTAGE_LOG"):
        for i, consumer in enumerate(consumers):
            for at, line in consumer.err:
                if "breaker" in line:
                    b.log(f"  [{i}] {at - up_at:+7.2f}s {line[line.find('breaker'):][:150]}")
    b.run([b.CLI, "topology", "delete", path, "--url", bench.url, "--yes", "--force"])
    expected_note = f"{expected} expected"
    b.log(f"outage {contender} x{instances}: {row} ({expected_note})")
    return row


def acked_ids(consumers):
    ids = set()
    for consumer in consumers:
        for _, line in list(consumer.out):
            if '"outcome":"ack"' not in line:
                continue
            try:
                ids.add(json.loads(line)["id"])
            except (ValueError, KeyError):
                pass
    return ids


def parked_count(bench, name):
    """The parking queue's depth (a passive declare)."""
    import pika
    try:
        connection = pika.BlockingConnection(pika.URLParameters(bench.url))
        try:
            return connection.channel().queue_declare(name + ".parking",
                                                      passive=True).method.message_count
        finally:
            connection.close()
    except pika.exceptions.AMQPError:
        return 0


def run(bench):
    for instances in INSTANCES:
        for contender in CONTENDERS:
            row = one_run(bench, contender, instances)
            bench.record(row, bench="outage")
