"""Network partitions and an hour of faults on a 3-node cluster in network namespaces
(scripts/netns-cluster), checked the way Jepsen checks a set.

  python3 bench/partitions.py partitions OUT.json   BENCH_PARTITIONS cuts (default 20), in turn:
                                                    the leader of the service's queue isolated,
                                                    the leader split from the other two, a
                                                    consumer process black-holed
  python3 bench/partitions.py soak OUT.json         BENCH_SOAK_MINUTES (default 60) of steady load
                                                    with a fault every 1-3 minutes
  python3 bench/partitions.py report OUT.json       OUT.md, and OUT.png for a soak

Run through `bench/run partitions` or `bench/run soak`, which build, start the cluster and write
bench/results/. The load, the same in both:
  - a service part.app with three demo_consumer processes, each connected first to another node;
    messages published with confirms by examples/publish in batches of 10 (a batch whose exit is
    not 0 was not confirmed: it is sent again, same ids, and never counted as done); one in ten
    fails once, one in fifty fails for good (permanent, parked at once), one in fifty fails more
    often than its attempts allow (exhausted, parked);
  - scheduled messages, `retryloop send --delay 60s` into part.app, each due a minute later;
  - the outbox: examples/outbox_orders commits orders and their events in a SQLite database, two
    `retryloop outbox relay` processes publish them, and `outbox_orders bill` bills each through
    the inbox (a duplicate is skipped, and counted);
  - parking replays of part.app's parked messages, every two minutes, while the faults go on.
At the end every fault is healed, the loops drain, and the checker reads every id: each confirmed
app message acked or parked as its script says, each scheduled message handled and none before
it was due, each committed order billed exactly once; duplicates counted.
"""

import json
import os
import random
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402
from outage import Lines  # noqa: E402

NETNS = os.environ.get("BENCH_NETNS_DIR", "")
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "20"))
SOAK_MINUTES = float(os.environ.get("BENCH_SOAK_MINUTES", "60"))
CUT_S = float(os.environ.get("BENCH_CUT_SECONDS", "20"))
RATE = int(os.environ.get("BENCH_PARTITION_RATE", "40"))  # app messages a second
SCHEDULE_DELAY_S = 60
HEARTBEAT_S = 5
BLACKHOLE_HEARTBEAT_S = 2
# A publish or a send not confirmed within this is given up and sent again through the next
# node, as a producer with a confirm timeout does (a quorum queue's leader cut off from the
# others takes a publish but never confirms it).
CONFIRM_TIMEOUT_S = 5
# The short-lived clients (publish, send, parking replay): a connect to a cut node gives up
# after 3 s (30 s by default) and the next host is tried.
CLIENT_QUERY = "heartbeat=5&connection_timeout=3000"
APP = "part.app"
BILL = "part.bill"
NETNS_CLUSTER = os.path.join(b.ROOT, "scripts", "netns-cluster")
DEMO = os.path.join(b.BUILD, "examples", "demo_consumer")
PUBLISH = os.path.join(b.BUILD, "examples", "publish")
ORDERS = os.path.join(b.BUILD, "examples", "outbox_orders")


def log(text):
    b.log(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_urls():
    return os.environ["RETRYLOOP_TEST_NODE_URLS"].split()


def url_from(first, query=""):
    """A multi-host URL whose hosts start at node `first` (0-based)."""
    hosts = [u.split("@", 1)[1].rstrip("/") for u in node_urls()]
    hosts = hosts[first:] + hosts[:first]
    return "amqp://guest:guest@" + ",".join(hosts) + "/" + ("?" + query if query else "")


def management_hosts():
    url = os.environ["RETRYLOOP_TEST_MANAGEMENT_URL"]
    return url.split("@", 1)[1].rstrip("/").split(",")


def api(path):
    """GET path from the first node whose management API answers; None when none does."""
    for host in management_hosts():
        request = urllib.request.Request(f"http://{host}{path}")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        try:
            with urllib.request.urlopen(request, timeout=3) as response:
                return json.load(response)
        except Exception:  # noqa: BLE001 - a cut node: try the next
            continue
    return None


def nemesis(verb, arg=None):
    command = [NETNS_CLUSTER, verb, NETNS] + ([str(arg)] if arg is not None else [])
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"netns-cluster {verb} {arg}: {result.stderr.strip()}")
    return result.stdout


def ctl(k, *args, timeout=30):
    try:
        return subprocess.run([os.path.join(NETNS, f"node-{k}", "ctl"), *args],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def node_of(name):
    match = re.search(r"-n(\d)$", name or "")
    return int(match.group(1)) if match else None


def leader(queue):
    info = api(f"/api/queues/%2F/{queue}")
    if not info:
        return None
    return node_of(info.get("leader") or info.get("node"))


def running_nodes(k):
    result = ctl(k, "cluster_status", "--formatter", "json", timeout=20)
    if result is None or result.returncode != 0:
        return 0
    try:
        return len(json.loads(result.stdout)["running_nodes"])
    except (ValueError, KeyError):
        return 0


def paused(k):
    result = ctl(k, "eval", "-q", "rabbit:is_running().", timeout=20)
    return result is not None and result.returncode == 0 and "false" in result.stdout


def wait_whole(timeout=120):
    """Waits until every node runs and sees all three; returns the seconds it took, or None."""
    start = time.time()
    while time.time() - start < timeout:
        if all(running_nodes(k) == 3 for k in (1, 2, 3)):
            return time.time() - start
        time.sleep(0.5)
    return None


def timed_run(command, timeout):
    """Runs a command for at most `timeout` seconds; a command killed then exits -9."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, -9, "", "")


class Load:
    """The services, their processes, and the publishers, with what each confirmed."""

    def __init__(self, work):
        self.work = work
        os.makedirs(work, exist_ok=True)
        self.db = "sqlite:" + os.path.join(work, "orders.db")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.db[7:] + suffix):
                os.remove(self.db[7:] + suffix)
        self.topology = os.path.join(work, "topology.json")
        with open(self.topology, "w") as f:
            json.dump({
                "delay_levels": {"base": "1s", "max": "5m", "queue_type": "quorum",
                                 "queues": [APP]},
                "services": [
                    {"name": APP, "queue_type": "quorum",
                     "input": {"exchange": APP + ".in", "type": "direct", "bindings": [APP]},
                     "retry": {"mode": "reject", "delays": ["5s"], "max_attempts": 3}},
                    {"name": BILL, "queue_type": "quorum",
                     "input": {"exchange": "orders", "type": "direct",
                               "bindings": ["order.created"]},
                     "retry": {"mode": "reject", "delays": ["2s"], "max_attempts": 3}}]}, f)
        self.cli("topology", "delete", self.topology, "--yes", "--force", check=False)
        self.cli("topology", "apply", self.topology)
        b.run([b.CLI, "outbox", "init", "--db", self.db])
        self.expected = {}  # app id -> "ack" | "park"
        self.confirmed, self.resent = set(), 0
        self.slow_publishes = []  # when each batch that took over 2.5 s began
        self.scheduled = {}  # id -> {"not_before": epoch seconds, "sends": how many it took}
        self.orders = set()
        self.replays = []
        self.stop = threading.Event()
        self.consumers = [self.consumer(k) for k in range(3)]
        self.parsed_lines, self.parsed_calls = [0] * len(self.consumers), []
        self.parse_lock = threading.Lock()
        self.billing = Lines([ORDERS, "bill", "--db", self.db, "--url",
                              url_from(1, f"heartbeat={HEARTBEAT_S}"), "--topology",
                              self.topology, "--service", BILL], name="billing")
        self.relays = [Lines([b.CLI, "outbox", "relay", "--db", self.db, "--url",
                              url_from(k, f"heartbeat={HEARTBEAT_S}")], name=f"relay-{k + 1}")
                       for k in range(2)]
        self.threads = [threading.Thread(target=t, daemon=True)
                        for t in (self.publish_app, self.schedule, self.place_orders,
                                  self.replay_parked)]

    def cli(self, *args, check=True):
        return b.run([b.CLI, *args, "--url", url_from(0)], timeout=300) if check else \
            subprocess.run([b.CLI, *args, "--url", url_from(0)], capture_output=True)

    def consumer(self, k):
        heartbeat = BLACKHOLE_HEARTBEAT_S if k == 2 else HEARTBEAT_S
        port = free_port()
        proc = Lines([DEMO, "--url", url_from(k, f"heartbeat={heartbeat}"), "--topology",
                      self.topology, "--service", APP, "--concurrency", "8", "--prefetch",
                      str(PREFETCH), "--http", f"127.0.0.1:{port}"], name=f"consumer-{k + 1}")
        proc.metrics_port = port
        return proc

    def start(self):
        for t in self.threads:
            t.start()

    # ---- the publishers

    def publish_app(self):
        # The node it publishes through stays the same until a batch fails, as a producer's
        # connection would.
        n, batch, started, first = 0, 10, time.time(), 0
        while not self.stop.is_set():
            due = started + n / RATE
            if due > time.time():
                time.sleep(due - time.time())
            bodies, ids = [], []
            for i in range(n, n + batch):
                message_id = f"a-{i}"
                if i % 50 == 7:
                    body, expect = {"id": message_id, "permanent": "no such account"}, "park"
                elif i % 50 == 13:
                    body, expect = {"id": message_id, "fail_times": 5}, "park"
                elif i % 10 == 3:
                    body, expect = {"id": message_id, "fail_times": 1}, "ack"
                else:
                    body, expect = {"id": message_id}, "ack"
                self.expected[message_id] = expect
                bodies.append(json.dumps(body))
                ids.append(message_id)
            while not self.stop.is_set():
                sent = time.time()
                exit_code = timed_run([PUBLISH, "--url", url_from(first, CLIENT_QUERY),
                                       "--exchange", APP + ".in", "--routing-key", APP, *bodies],
                                      CONFIRM_TIMEOUT_S).returncode
                if time.time() - sent > 2.5:
                    first = (first + 1) % 3  # a host timed out, or a confirm: start at the next
                    self.slow_publishes.append(sent)
                if exit_code == 0:
                    self.confirmed.update(ids)
                    break
                self.resent += 1
                first = (first + 1) % 3
                time.sleep(0.5)
            n += batch

    def schedule(self):
        """A message every 5 s, due a minute later. One whose send failed is sent again, same id;
        the copy of a failed send may have reached the broker all the same, so the earliest a
        message may arrive is a minute after its first send began."""
        n = 0
        while not self.stop.wait(5):
            message_id = f"s-{n}"
            first_sent = time.time()
            for attempt in range(20):
                if self.stop.is_set():
                    return
                result = timed_run(
                    [b.CLI, "send", "-t", self.topology, "--queue", APP, "--delay",
                     f"{SCHEDULE_DELAY_S}s", "--message-id", message_id, "--json",
                     "--url", url_from((n + attempt) % 3, CLIENT_QUERY),
                     json.dumps({"id": message_id})], CONFIRM_TIMEOUT_S)
                if result.returncode == 0:
                    self.scheduled[message_id] = {"not_before": first_sent + SCHEDULE_DELAY_S,
                                                  "sends": attempt + 1}
                    break
                time.sleep(1)
            n += 1

    def place_orders(self):
        n = 0
        while not self.stop.wait(1):
            orders = [f"o-{i}" for i in range(n, n + 5)]
            result = subprocess.run([ORDERS, "place", "--db", self.db, *orders],
                                    capture_output=True, timeout=60)
            if result.returncode == 0:
                self.orders.update(orders)
                n += 5

    def replay_parked(self):
        while not self.stop.wait(120):
            result = subprocess.run([b.CLI, "parking", "replay", "-t", self.topology, APP,
                                     "--url", url_from(random.randrange(3), CLIENT_QUERY)],
                                    capture_output=True, text=True, timeout=300)
            moved = re.search(r"moved (\d+)", result.stderr)
            self.replays.append({"at": time.time(), "exit": result.returncode,
                                 "moved": int(moved.group(1)) if moved else None})

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)

    # ---- what happened

    def calls(self, since=0.0):
        """Every handler call of the app consumers: (time, id, outcome). Each output line is parsed
        once: the bench shares the CPUs with the nodes it measures."""
        with self.parse_lock:
            self.parse_new_lines()
            return [c for c in self.parsed_calls if c[0] >= since]

    def parse_new_lines(self):
        for k, proc in enumerate(self.consumers):
            lines = proc.out[self.parsed_lines[k]:]
            self.parsed_lines[k] += len(lines)
            for read_at, line in lines:
                try:
                    call = json.loads(line)
                except ValueError:
                    continue
                self.parsed_calls.append((handled_at(call.get("time"), read_at), call.get("id"),
                                          call.get("outcome")))

    def acks_between(self, start, end):
        return sum(1 for at, _, outcome in self.calls(start - 5)
                   if outcome == "ack" and start <= at < end)

    def latency_p99(self, previous):
        """The p99 of the handler latency since `previous` (bucket counts from every consumer's
        /metrics); returns (p99 seconds or None, the buckets now)."""
        buckets = {}
        for proc in self.consumers:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except Exception:  # noqa: BLE001 - a consumer being restarted
                continue
            bucket = r'^messaging_process_duration_seconds_bucket\{.*le="([^"]+)"\} (\d+)'
            for m in re.finditer(bucket, text, re.M):
                le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
                buckets[le] = buckets.get(le, 0) + int(m.group(2))
        delta = {le: max(0, count - previous.get(le, 0)) for le, count in buckets.items()}
        total = delta.get(float("inf"), 0)
        if total == 0:
            return None, buckets
        for le in sorted(delta):
            if delta[le] >= 0.99 * total:
                return le, buckets
        return None, buckets


def handled_at(clock, read_at):
    """The epoch time of demo_consumer's HH:MM:SS.mmm `clock`, the one nearest `read_at`."""
    if not clock:
        return read_at
    read = datetime.fromtimestamp(read_at)
    try:
        t = datetime.strptime(clock, "%H:%M:%S.%f").time()
    except ValueError:
        return read_at
    best = None
    for day in (-1, 0, 1):
        candidate = datetime.combine(read.date() + timedelta(days=day), t).timestamp()
        if best is None or abs(candidate - read_at) < abs(best - read_at):
            best = candidate
    return best


def queue_depths():
    queues = api("/api/queues/%2F?columns=name,messages") or []
    return {q["name"]: q.get("messages", 0) for q in queues if q["name"].startswith("part.")}


def quiet(load, timeout=600):
    """Waits until the app's queues hold nothing but parked messages and every confirmed message
    has been handled as expected; returns whether they did."""
    deadline = time.time() + timeout
    stable = 0
    while time.time() < deadline:
        depths = queue_depths()
        busy = sum(v for name, v in depths.items()
                   if not name.endswith(".parking") and not name.startswith("retryloop."))
        acked = {i for _, i, o in load.calls() if o == "ack"}
        waiting = [i for i in load.confirmed if load.expected[i] == "ack" and i not in acked]
        scheduled = [i for i in load.scheduled if i not in acked]
        try:
            with sqlite3.connect(load.db[7:]) as db:
                unbilled = db.execute("SELECT count(*) FROM orders WHERE id NOT IN "
                                      "(SELECT order_id FROM invoices)").fetchone()[0]
        except sqlite3.Error:
            unbilled = 1
        if busy == 0 and not waiting and not scheduled and not unbilled and depths:
            stable += 1
            if stable >= 3:
                return True
        else:
            stable = 0
        time.sleep(2)
    return False


def parked_ids(load):
    """The message id of every message in part.app's parking queue, once per copy."""
    result = subprocess.run([b.CLI, "parking", "list", "-t", load.topology, APP, "--json",
                             "--url", url_from(0)], capture_output=True, text=True, timeout=300)
    ids = []
    for line in result.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        ids.append(message.get("message_id") or message.get("properties", {}).get("message_id"))
    return ids


def check(load):
    """The set checker's verdict."""
    calls = load.calls()
    acks = {}
    for _, message_id, outcome in calls:
        if outcome == "ack":
            acks[message_id] = acks.get(message_id, 0) + 1
    parked = {}
    for message_id in parked_ids(load):
        parked[message_id] = parked.get(message_id, 0) + 1
    lost = sorted(i for i in load.confirmed
                  if (load.expected[i] == "ack" and i not in acks)
                  or (load.expected[i] == "park" and i not in parked))
    wrong = sorted(i for i in load.confirmed if load.expected[i] == "park" and i in acks)
    duplicated = sum(c - 1 for i, c in acks.items() if i in load.expected and c > 1)
    first_ack = {}
    for at, message_id, outcome in calls:
        if outcome == "ack" and message_id in load.scheduled:
            first_ack[message_id] = min(at, first_ack.get(message_id, at))
    early = {i: round(load.scheduled[i]["not_before"] - at, 3) for i, at in first_ack.items()
             if at < load.scheduled[i]["not_before"] - 0.001}
    scheduled_lost = sorted(i for i in load.scheduled if i not in acks)
    with sqlite3.connect(load.db[7:]) as db:
        billed = dict(db.execute("SELECT order_id, count(*) FROM invoices GROUP BY order_id"))
    skipped = sum(1 for _, line in load.billing.out if line.startswith("skipped: "))
    return {
        "app_confirmed": len(load.confirmed),
        "app_resent_batches": load.resent,
        "app_acked": sum(1 for i in load.confirmed if i in acks),
        "app_parked": sum(1 for i in load.confirmed if i in parked),
        "app_lost": len(lost), "app_lost_ids": lost[:20],
        "app_acked_but_expected_parked": len(wrong),
        "app_duplicate_acks": duplicated,
        "scheduled": len(load.scheduled), "scheduled_lost": len(scheduled_lost),
        "scheduled_early": len(early), "scheduled_early_by_s": dict(list(early.items())[:20]),
        "scheduled_sent_again": sum(1 for v in load.scheduled.values() if v["sends"] > 1),
        "scheduled_duplicate_acks": sum(acks.get(i, 1) - 1 for i in load.scheduled),
        "orders_committed": len(load.orders),
        "orders_billed": sum(1 for o in load.orders if billed.get(o, 0) >= 1),
        "orders_lost": sum(1 for o in load.orders if billed.get(o, 0) == 0),
        "orders_billed_twice": sum(1 for o in load.orders if billed.get(o, 0) > 1),
        "duplicates_caught_by_inbox": skipped,
        "replays": load.replays,
    }


PREFETCH = 50


def duplicates_by_fault(load, faults):
    """Each ack of an app message after its first, put with the fault it followed (from the
    fault's start to a minute after its end); the bound of each fault: the prefetch once, and
    once more per consumer session that ended in it. Returns the duplicates no fault explains."""
    seen, extra = set(), []
    for at, message_id, outcome in sorted(load.calls(), key=lambda c: c[0]):
        if outcome != "ack" or message_id not in load.expected:
            continue
        if message_id in seen:
            extra.append(at)
        seen.add(message_id)
    unexplained = 0
    for at in extra:
        owner = None
        for row in faults:
            end = row.get("healed") or row.get("end") or row["start"]
            if row["start"] <= at <= end + 60:
                owner = row
        if owner is None:
            unexplained += 1
        else:
            owner["duplicates"] = owner.get("duplicates", 0) + 1
    for row in faults:
        end = row.get("healed") or row.get("end") or row["start"]
        sessions = sum(1 for proc in load.consumers for at, line in list(proc.err)
                       if row["start"] <= at <= end + 60 and "connected to " in line)
        row["duplicate_bound"] = PREFETCH * (1 + sessions)
        row.setdefault("duplicates", 0)
    return unexplained


class Recorder:
    def __init__(self, out, mode):
        self.out, self.mode = out, mode
        self.data = {"mode": mode, "rabbitmq": os.environ.get("RETRYLOOP_TEST_RABBITMQ"),
                     "cut_seconds": CUT_S, "rate": RATE, "faults": [], "samples": []}

    def save(self, final=False):
        """While the run goes on, to OUT.partial (the faults so far, should it end early: the
        results of the last whole run stay as they are); at its end, to OUT."""
        path = self.out if final else self.out + ".partial"
        with open(path + ".tmp", "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(path + ".tmp", path)
        if final and os.path.exists(self.out + ".partial"):
            os.remove(self.out + ".partial")


# ---- faults

def hold_cut(k, start):
    """Holds a cut of node k for CUT_S, and then until pause_minority has paused it (up to 60 s
    more; RabbitMQ 4.3 has no pause): a cut healed after the others saw it but before the node
    paused leaves the cluster partitioned for good. Returns the seconds until it paused."""
    time.sleep(max(0.0, start + CUT_S - time.time()))
    if os.environ.get("RETRYLOOP_TEST_RABBITMQ", "").startswith("4.3"):
        return None
    deadline = time.time() + 60
    while time.time() < deadline:
        if paused(k):
            return time.time() - start
        time.sleep(1)
    return None


def recovery(load, baseline, healed, timeout=120):
    """Seconds from the heal until the acks of the 2 s before reach 90 % of `baseline`: 0 when
    the service kept its pace through the cut; None when it did not recover within `timeout`."""
    deadline = healed + timeout
    while time.time() < deadline:
        now = time.time()
        for t in frange(healed, now, 0.25):
            if load.acks_between(t - 2, t) / 2 >= 0.9 * baseline:
                return t - healed
        time.sleep(1)
    return None


def frange(start, end, step):
    t = start
    while t <= end:
        yield t
        t += step


def connected_node(proc, since, until, first=False):
    """The node that `proc` connected to between `since` and `until` (its first connection
    then, or its last), as "node K"."""
    found = None
    for at, line in list(proc.err):
        match = re.search(r"connected to amqp://[^@]*@([0-9.]+)", line)
        if match and since <= at <= until:
            found = "node %d" % (int(match.group(1).rsplit(".", 1)[1]) - 10)
            if first:
                break
    return found


def partition_fault(load, kind):
    """One cut of the partitions run: isolate or split the leader of part.app's queue, or
    black-hole a consumer; held, healed, and measured."""
    before = time.time()
    # The steady pace: the share of the app's messages that end in an ack, at RATE a second (a
    # window before the cut could hold the catch-up of the one before).
    baseline = RATE * 48 / 50
    row = {"kind": kind, "start": before, "acks_per_s_before": load.acks_between(before - 20,
                                                                                 before) / 20}
    if kind == "blackhole":
        proc = load.consumers[2]
        row["target"] = proc.name
        row["was_on"] = connected_node(proc, 0, time.time())
        start = time.time()
        nemesis("blackhole", proc.pid)
        noticed = resumed = None
        while time.time() - start < 60 and resumed is None:
            noticed = noticed or proc.first("no heartbeat from the broker", start)
            resumed = proc.first("consuming (prefetch", start) if noticed else None
            time.sleep(0.05)
        row["noticed_s"] = noticed - start if noticed else None
        row["resumed_s"] = resumed - start if resumed else None
        row["resumed_on"] = connected_node(proc, start, time.time(), first=True)
        time.sleep(max(0.0, start + CUT_S - time.time()))
    else:
        k = leader(APP) or 1
        row["target"] = f"node {k}"
        start = time.time()
        nemesis("isolate" if kind == "isolate" else "split", k)
        row["paused_s"] = hold_cut(k, start)
    healed = time.time()
    nemesis("heal")
    row["held_s"] = healed - start
    row["whole_s"] = wait_whole()
    row["full_throughput_s"] = recovery(load, baseline, healed)
    row["acks_per_s_during_cut"] = load.acks_between(start, healed) / (healed - start)
    # What held the publisher back meanwhile: batches whose host or confirm timed out.
    row["slow_publishes"] = sum(1 for at in list(load.slow_publishes) if start <= at < healed)
    row["healed"] = healed
    return row


def soak_fault(load, kind):
    start = time.time()
    row = {"kind": kind, "start": start}
    if kind in ("isolate", "split"):
        k = leader(APP) or 1
        row["target"] = f"node {k}"
        nemesis(kind, k)
        row["paused_s"] = hold_cut(k, start)
        nemesis("heal")
    elif kind == "node-kill":
        k = random.randint(1, 3)
        row["target"] = f"node {k}"
        nemesis("kill", k)
        time.sleep(10)
        for attempt in range(3):
            try:
                nemesis("revive", k)
                break
            except RuntimeError as error:  # recorded; the next attempt may start it
                row.setdefault("errors", []).append(str(error))
                time.sleep(5)
    elif kind == "blackhole":
        proc = random.choice(load.consumers + load.relays + [load.billing])
        row["target"] = proc.name
        try:
            nemesis("blackhole", proc.pid)
        except RuntimeError as error:  # between two connections: nothing to cut
            row["skipped"] = str(error)
        time.sleep(CUT_S)
        nemesis("heal")
    elif kind == "memory-alarm":
        k = random.randint(1, 3)
        row["target"] = f"node {k}"
        ctl(k, "set_vm_memory_high_watermark", "0.0000001")
        time.sleep(CUT_S)
        ctl(k, "set_vm_memory_high_watermark", "0.4")
    elif kind in ("consumer-kill", "relay-kill"):
        # The first consumer and the first relay are never killed: their RSS is the hour's.
        proc = random.choice(load.consumers[1:] if kind == "consumer-kill" else load.relays[1:])
        row["target"] = proc.name
        proc.kill()
        time.sleep(2)
        proc.start()
    row["end"] = time.time()
    row["whole_s"] = wait_whole()
    return row


def sample(load, recorder, stop):
    previous = {}
    last = time.time()
    while not stop.wait(5):
        now = time.time()
        p99, previous = load.latency_p99(previous)
        recorder.data["samples"].append({
            "t": now, "acks_per_s": load.acks_between(last, now) / (now - last),
            "handler_p99_s": p99,
            "rss_kb": {p.name: b.rss_kb(p.pid) for p in [load.consumers[0], load.relays[0]]},
            "depths": queue_depths()})
        last = now


def run(mode, out):
    recorder = Recorder(out, mode)
    work = os.path.join(b.BUILD, f"partitions-{mode}")
    load = Load(work)
    try:
        measure(mode, load, recorder)
    finally:
        load.stop.set()
        for proc in load.consumers + load.relays + [load.billing]:
            proc.stop()
    recorder.save(final=True)
    log("verdict: " + json.dumps({k: v for k, v in recorder.data["verdict"].items()
                                   if k != "replays"}))


def measure(mode, load, recorder):
    start = time.time()
    recorder.data["started"] = start
    load.start()
    stop_sampling = threading.Event()
    sampler = threading.Thread(target=sample, args=(load, recorder, stop_sampling), daemon=True)
    sampler.start()
    time.sleep(30)  # a baseline
    try:
        if mode == "partitions":
            kinds = ["isolate", "split", "blackhole"]
            for i in range(PARTITIONS):
                row = partition_fault(load, kinds[i % len(kinds)])
                recorder.data["faults"].append(row)
                recorder.save()
                log(f"partition {i + 1}/{PARTITIONS}: {summary(row)}")
                time.sleep(10)
        else:
            kinds = ["node-kill", "isolate", "split", "blackhole", "memory-alarm",
                     "consumer-kill", "relay-kill"]
            end = start + SOAK_MINUTES * 60
            bag = []  # drawn without replacement, so that each kind comes once in seven
            while True:
                time.sleep(random.uniform(60, 180))
                if time.time() > end - 60:
                    break
                if not bag:
                    bag = random.sample(kinds, len(kinds))
                kind = bag.pop()
                row = soak_fault(load, kind)
                recorder.data["faults"].append(row)
                recorder.save()
                log(f"fault at {(row['start'] - start) / 60:.1f} min: {summary(row)}")
            time.sleep(max(0.0, end - time.time()))
    finally:
        try:
            nemesis("heal")
        except RuntimeError:
            pass
    load.finish()
    recorder.data["quiet"] = quiet(load)
    stop_sampling.set()
    sampler.join()
    recorder.data["verdict"] = check(load)
    recorder.data["verdict"]["duplicates_after_no_fault"] = duplicates_by_fault(
        load, recorder.data["faults"])
    recorder.data["verdict"]["faults_over_duplicate_bound"] = sum(
        1 for r in recorder.data["faults"] if r["duplicates"] > r["duplicate_bound"])
    recorder.data["seconds"] = time.time() - start


def summary(row):
    keys = ["kind", "target", "was_on", "paused_s", "noticed_s", "resumed_s", "resumed_on",
            "whole_s",
            "full_throughput_s", "skipped"]
    return ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in ((k, row.get(k)) for k in keys) if v is not None)


# ---- the report

def percentile(values, p):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def seconds(v):
    return "–" if v is None else f"{v:.1f} s"


def report(out):
    with open(out) as f:
        data = json.load(f)
    md = out[:-5] + ".md" if out.endswith(".json") else out + ".md"
    v = data.get("verdict", {})
    lines = [f"# {data['mode']} on RabbitMQ {data.get('rabbitmq')}", "",
             os.environ.get("BENCH_PARTITIONS_META", ""), "",
             f"Load: {data['rate']} app messages a second (of which {data['rate'] * 48 / 50:.1f} "
             "a second end in an ack: full throughput), a scheduled message every 5 s, 5 outbox "
             "orders a second; each cut held at least " f"{data['cut_seconds']:.0f} s.", ""]
    faults = data["faults"]
    if data["mode"] == "partitions":
        lines += ["| cut | count | held (p50) | paused after (p50) | acks/s during the cut (p50; "
                  "publishers included) "
                  "| cluster whole after heal (p50 / p99) | full throughput after heal "
                  "(p50 / p99) |",
                  "|---|---|---|---|---|---|---|"]
        for kind in ("isolate", "split", "blackhole"):
            rows = [r for r in faults if r["kind"] == kind]
            if not rows:
                continue
            lines.append(
                f"| {kind} | {len(rows)} | {seconds(percentile([r['held_s'] for r in rows], 50))} "
                f"| {seconds(percentile([r.get('paused_s') for r in rows], 50))} "
                f"| {percentile([r.get('acks_per_s_during_cut') for r in rows], 50) or 0:.1f} "
                f"| {seconds(percentile([r['whole_s'] for r in rows], 50))} / "
                f"{seconds(percentile([r['whole_s'] for r in rows], 99))} "
                f"| {seconds(percentile([r['full_throughput_s'] for r in rows], 50))} / "
                f"{seconds(percentile([r['full_throughput_s'] for r in rows], 99))} |")
        holes = [r for r in faults if r["kind"] == "blackhole"]
        if holes:
            lines += ["", f"A black-holed consumer (heartbeat {BLACKHOLE_HEARTBEAT_S} s, bound "
                      f"{2 * BLACKHOLE_HEARTBEAT_S + 2} s): noticed after "
                      f"{seconds(percentile([r['noticed_s'] for r in holes], 50))} (p50), "
                      f"consuming again on another node after "
                      f"{seconds(percentile([r['resumed_s'] for r in holes], 50))} (p50), "
                      f"{seconds(percentile([r['resumed_s'] for r in holes], 99))} (p99), "
                      f"{seconds(max((r['resumed_s'] or 1e9) for r in holes))} at most."]
    else:
        counts = {}
        for r in faults:
            counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        lines += [f"{len(faults)} faults in {data.get('seconds', 0) / 60:.0f} minutes: "
                  + ", ".join(f"{k} {c}" for k, c in sorted(counts.items())) + ".", ""]
        samples = data["samples"]
        for name in ("consumer-1", "relay-1"):
            series = [(s["t"], s["rss_kb"].get(name)) for s in samples if s["rss_kb"].get(name)]
            t0 = data["started"]
            at5 = [r for t, r in series if t - t0 >= 300]
            if at5:
                first, last = at5[0], series[-1][1]
                lines.append(f"- RSS of {name}: {first / 1024:.1f} MiB after 5 minutes, "
                             f"{last / 1024:.1f} MiB at the end ({(last - first) / first:+.1%}).")
        lines += ["", f"![the hour](./{os.path.basename(out[:-5])}.png)"]
    lines += ["", "The checker:", "",
              f"- app messages: {v.get('app_confirmed')} confirmed ({v.get('app_resent_batches')}"
              f" batches sent again after an unconfirmed publish), {v.get('app_acked')} acked, "
              f"{v.get('app_parked')} parked, **{v.get('app_lost')} lost**, "
              f"{v.get('app_acked_but_expected_parked')} acked that should have parked, "
              f"{v.get('app_duplicate_acks')} duplicate acks ({v.get('duplicates_after_no_fault')}"
              f" after no fault; {v.get('faults_over_duplicate_bound')} faults with more than "
              f"their bound, the prefetch ({PREFETCH}) once and once more per consumer session "
              f"that ended: at most {max([r.get('duplicates', 0) for r in faults] or [0])} at "
              f"one fault);",
              f"- scheduled messages: {v.get('scheduled')} confirmed "
              f"({v.get('scheduled_sent_again')} sent again after an unconfirmed send), "
              f"**{v.get('scheduled_lost')} lost, {v.get('scheduled_early')} early** (handled "
              f"before a minute had passed since their first send), "
              f"{v.get('scheduled_duplicate_acks')} duplicate acks;",
              f"- outbox orders: {v.get('orders_committed')} committed, {v.get('orders_billed')}"
              f" billed, **{v.get('orders_lost')} lost, {v.get('orders_billed_twice')} billed "
              f"twice**; {v.get('duplicates_caught_by_inbox')} duplicate deliveries caught by the"
              f" inbox;",
              f"- parking replays during the run: {len(v.get('replays', []))} "
              f"({sum(1 for r in v.get('replays', []) if r['exit'] == 0)} exited 0), moving "
              f"{sum(r['moved'] or 0 for r in v.get('replays', []))} messages;",
              f"- the loops drained after the last heal: {data.get('quiet')}."]
    with open(md, "w") as f:
        f.write("\n".join(lines) + "\n")
    if data["mode"] == "soak":
        plot(data, out[:-5] + ".png")
    print(f"wrote {md}")


def plot(data, png):
    t0 = data["started"]
    samples = data["samples"]
    path = png[:-4] + ".dat"
    with open(path, "w") as f:
        for s in samples:
            depth = sum(v for k, v in s["depths"].items() if not k.endswith(".parking"))
            rss = s["rss_kb"]
            f.write(f"{(s['t'] - t0) / 60:.3f} {s['acks_per_s']:.2f} "
                    f"{(s['handler_p99_s'] or 0) * 1000:.2f} "
                    f"{(rss.get('consumer-1') or 0) / 1024:.2f} "
                    f"{(rss.get('relay-1') or 0) / 1024:.2f} {depth}\n")
    marks = "\n".join(
        f"set arrow from {(r['start'] - t0) / 60:.2f}, graph 0 to {(r['start'] - t0) / 60:.2f}, "
        f"graph 1 nohead lc rgb '#cc3333' dt 2\n"
        f"set label '{r['kind']}' at {(r['start'] - t0) / 60:.2f}, graph 0.95 rotate by 90 "
        f"right font ',7' tc rgb '#cc3333'" for r in data["faults"])
    script = f"""
set terminal pngcairo size 1200,1100 font ',9'
set output '{png}'
set multiplot layout 4,1 title 'retryloop: an hour of faults on a 3-node RabbitMQ \
{data.get('rabbitmq')} cluster'
set xlabel 'minutes'
set lmargin 10
set grid
{marks}
set ylabel 'acks/s'
plot '{path}' using 1:2 with lines lw 1 title 'throughput (acks a second)'
set ylabel 'ms'
plot '{path}' using 1:3 with lines lw 1 title 'handler latency p99'
set ylabel 'MiB'
plot '{path}' using 1:4 with lines lw 1 title 'consumer RSS', \
     '{path}' using 1:5 with lines lw 1 title 'relay RSS'
set ylabel 'messages'
plot '{path}' using 1:6 with lines lw 1 title 'queue depths (all but parking)'
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    os.remove(path)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("partitions", "soak", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        run(sys.argv[1], sys.argv[2])
