"""Turns bench.py's raw results (JSON) into the report (Markdown) and the chart (PNG, gnuplot)."""
import json
import os
import statistics
import subprocess

PEERS = ["rabbitmq-c", "amqp091-go", "amqplib", "amqp-client.js", "pika"]
# The load average a run makes by itself: the broker and the client under test, both busy.
BENCHMARK_LOAD = 2


def med(values):
    return statistics.median(values) if values else None


def spread(values, fmt="{:.0f}"):
    """'median (min–max)'."""
    if not values:
        return "–"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(med(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def ratio(a, b):
    return a / b if a and b else None


def fmt_ratio(value):
    return "–" if value is None else f"{value:.2f}x"


class Report:
    def __init__(self, data):
        self.meta, self.rows = data["meta"], data["rows"]
        self.lines = []
        self.targets = []

    def select(self, bench, **where):
        """Rows of a benchmark that match `where`; failed runs are left out (and listed)."""
        return [r for r in self.rows if r.get("bench") == bench and "failed" not in r and
                all(r.get(k) == v for k, v in where.items())]

    def values(self, bench, key="rate", **where):
        return [r[key] for r in self.select(bench, **where) if r.get(key) is not None]

    def out(self, text=""):
        self.lines.append(text)

    def table(self, header, rows, left=1):
        """Columns from `left` on are right-aligned (numbers)."""
        self.out("| " + " | ".join(header) + " |")
        self.out("|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|")
        for row in rows:
            self.out("| " + " | ".join(row) + " |")
        self.out()

    def target(self, name, figure, met, why=""):
        self.targets.append((name, figure, "met" if met else ("missed" if met is False else "–"),
                             why))

    # ---- sections ----

    def header(self):
        m = self.meta
        load = [r["load"] for r in self.rows if "load" in r]
        self.out("# Benchmark results")
        self.out()
        self.out(f"Run {m['started']} to {m.get('finished', '(unfinished)')}: "
                 f"{m.get('seconds', 0) / 60:.1f} min of benchmarks"
                 + (f", {m['total_seconds'] / 60:.1f} min for all of `bench/run`"
                    if m.get("total_seconds") else "")
                 + (" (BENCH_QUICK=1: small sizes, for a look only)" if m.get("quick") else "")
                 + (" (BENCH_FULL=1: the issue's sizes)" if m.get("profile") == "full" else "")
                 + ".")
        mach, ver = m["machine"], m["versions"]
        self.out(f"Machine: {mach['cpus']} CPUs ({mach['cpu']}), {mach['memory_gb']} GB, Linux "
                 f"{mach['kernel']}. Broker: RabbitMQ {ver['rabbitmq-server']} (Erlang "
                 f"{ver['erlang']}), one throwaway node on loopback, default configuration.")
        if load:
            self.out(f"Machine load (1-minute load average on {mach['cpus']} CPUs): "
                     f"{m['load_before'][0]:.1f} before, median {med(load):.1f} and max "
                     f"{max(load):.1f} during the runs, {m.get('load_after', [0])[0]:.1f} after."
                     + (" The machine was busy with other work: absolute rates are lower than on "
                        "an idle machine, and the broker, which needs CPU for every message, "
                        "suffers most." if med(load) > BENCHMARK_LOAD + 1 else
                        " The benchmark itself keeps about two processes busy (the broker and "
                        "the client under test): the machine had no other work to speak of."))
        self.out(f"Clients: retryloop, rabbitmq-c {ver['librabbitmq']}, amqp091-go "
                 f"{ver['amqp091-go']} (Go {ver['golang']}), amqplib {ver['amqplib']} and "
                 f"@cloudamqp/amqp-client {ver['@cloudamqp/amqp-client']} (Node {ver['node']}), "
                 f"pika {ver['python3-pika']}.")
        self.out(f"Each figure is the median of {m['rounds']} rounds in rotating order, with the "
                 f"lowest and highest in parentheses.")
        self.out()

    def consume(self):
        rows = self.select("consume")
        if not rows:
            return
        clients = [c for c in self.meta["clients"] if any(r["client"] == c for r in rows)]
        sizes = self.meta["sizes"]
        self.out("## 1. Consume and ack")
        self.out()
        self.out(f"Persistent 1 KB messages with an x-death header table, the queue filled "
                 f"beforehand; ack each, no-op handler; msg/s from the first delivery to the last "
                 f"ack. N = {sizes['consume']:,} at prefetch 100 and above, "
                 f"{sizes['consume_low_prefetch']:,} below.")
        self.out()
        for queue_type in self.meta["queue_types"]:
            body = []
            for prefetch in self.meta["prefetches"]:
                rates = {c: self.values("consume", client=c, queue_type=queue_type,
                                        prefetch=prefetch) for c in clients}
                if not any(rates.values()):
                    continue
                peers = {c: med(v) for c, v in rates.items() if c != "retryloop" and v}
                best = max(peers, key=peers.get) if peers else None
                ours = med(rates.get("retryloop", []))
                body.append([str(prefetch)] + [spread(rates[c]) for c in clients] +
                            [best or "–", fmt_ratio(ratio(ours, peers.get(best))),
                             fmt_ratio(ratio(ours, peers.get("pika")))])
                if prefetch >= 100 and ours and best:
                    self.consume_targets(queue_type, prefetch, rates, peers, best, ours)
            self.out(f"**{queue_type} queue**, msg/s:")
            self.out()
            self.table(["prefetch"] + clients + ["best peer", "retryloop / best peer",
                                                 "retryloop / pika"], body)

    def consumer(self):
        rows = self.select("consumer")
        if not rows:
            return
        sizes = self.meta["sizes"]
        parse = [r["parse_us"] for r in rows if "parse_us" in r]
        self.out("## 1b. The retry consumer against the clients under it")
        self.out()
        self.out(f"N = {sizes.get('consumer', 0):,} persistent 1 KB JSON orders (no x-death: first "
                 f"deliveries), the queue filled beforehand, prefetch 200. Every contender does "
                 f"the same handler work: parse the body (nlohmann::json, json.loads, JSON.parse, "
                 f"json-c), read a field, ack. `retryloop-c1` is the retry consumer as "
                 f"`demo_consumer` runs it (concurrency 1, handler on a worker thread), `-c8` "
                 f"with 8 handlers at once, `-loop` with the handler on the loop thread, `-raw` "
                 f"the client under it with the same handler. CPU is the client process's over "
                 f"the window from the first delivery to the last ack."
                 + (f" One parse of the body alone costs {med(parse):.1f} µs of CPU (measured by "
                    f"`bench_retryloop handle` before it connects)." if parse else ""))
        self.out()
        contenders = []
        for r in rows:
            if r["client"] not in contenders:
                contenders.append(r["client"])
        for q in self.meta["queue_types"]:
            per = {}
            for c in contenders:
                sel = self.select("consumer", client=c, queue_type=q)
                if sel:
                    per[c] = sel
            if not per:
                continue
            cpu = {c: med([r["cpu_seconds"] / r["messages"] * 1e6 for r in sel])
                   for c, sel in per.items()}
            rate = {c: med([r["rate"] for r in sel]) for c, sel in per.items()}
            body = []
            for c, sel in per.items():
                broker = [r["broker_cpu_seconds"] / r["messages"] * 1e6 for r in sel
                          if "broker_cpu_seconds" in r]
                body.append([c, spread([r["rate"] for r in sel]),
                             f"{cpu[c]:.1f}", f"{med(broker):.1f}" if broker else "–",
                             fmt_ratio(ratio(cpu[c], cpu.get("pika"))),
                             fmt_ratio(ratio(rate[c], rate.get("pika")))])
            self.out(f"**{q} queue**:")
            self.out()
            self.table(["contender", "msg/s", "client CPU µs/msg", "broker CPU µs/msg",
                        "CPU / pika's", "rate / pika's"], body)
            ours, loop = "retryloop-c1", "retryloop-loop"
            broker = {c: med([r["broker_cpu_seconds"] / r["messages"] * 1e6 for r in sel
                              if "broker_cpu_seconds" in r] or [0]) for c, sel in per.items()}
            # What a miss of the worker mode is, by measurement: the same consumer with its
            # handler on the loop, and the handler's own work.
            hand_off = (f"the handler's own parse costs {med(parse):.1f} µs; the same consumer "
                        f"with its handler on the loop costs {cpu[loop]:.1f} µs "
                        f"({cpu[loop] / cpu['pika']:.2f}x pika's): what concurrency 1 on a worker "
                        f"adds is the hand-off between two threads, which wakes each of them "
                        f"whenever the worker runs dry between the broker's deliveries "
                        f"(bench/README.md, 'The retry consumer')"
                        if loop in cpu and "pika" in cpu and parse else "")
            if ours in cpu and "pika" in cpu:
                met = cpu[ours] <= 0.25 * cpu["pika"]
                self.target(f"retry consumer CPU ≤ 0.25x pika's, same handler ({q})",
                            f"{cpu[ours]:.1f} vs {cpu['pika']:.1f} µs "
                            f"({cpu[ours] / cpu['pika']:.2f}x)", met, "" if met else hand_off)
            if ours in cpu and "retryloop-raw" in cpu:
                met = cpu[ours] <= cpu["retryloop-raw"] + 3
                self.target(f"retry consumer CPU ≤ the raw client's with the same handler + 3 µs "
                            f"({q})", f"{cpu[ours]:.1f} vs {cpu['retryloop-raw']:.1f} µs", met,
                            "" if met else hand_off)
            if q == "classic" and ours in rate and "pika" in rate:
                met = rate[ours] >= 2 * rate["pika"]
                self.target("retry consumer drain ≥ 2x pika's (classic, prefetch 200)",
                            f"{rate[ours] / rate['pika']:.2f}x", met,
                            "" if met else
                            f"the broker bounds the drain: it spends {broker[ours]:.1f} µs of CPU "
                            f"per message for retryloop-c1 ({broker.get('pika', 0):.1f} for "
                            f"pika), on the 2 CPUs the consumers share with it; the fastest "
                            f"contender, {max(rate, key=rate.get)}, drains "
                            f"{max(rate.values()) / rate['pika']:.2f}x pika's rate")

    def consume_targets(self, queue_type, prefetch, rates, peers, best, ours):
        where = f"{queue_type}, prefetch {prefetch}"
        ranges_overlap = min(rates["retryloop"]) <= max(rates[best]) and \
            min(rates[best]) <= max(rates["retryloop"])
        broker = med([r["broker_cpu_seconds"] / r["messages"] * 1e6
                      for r in self.select("consume", client="retryloop", queue_type=queue_type,
                                           prefetch=prefetch)])
        client = med([r["cpu_seconds"] / r["messages"] * 1e6
                      for r in self.select("consume", client="retryloop", queue_type=queue_type,
                                           prefetch=prefetch)])
        bound = (f"the broker spends {broker:.0f} µs of CPU per message against retryloop's "
                 f"{client:.1f} µs: the broker is the bottleneck, and every client cheap enough "
                 f"runs at the broker's pace")
        met = ours >= peers[best]
        self.target(f"consume ≥ best peer ({where})",
                    f"{ours:,.0f} vs {best} {peers[best]:,.0f} msg/s", met,
                    "" if met else f"{(1 - ours / peers[best]) * 100:.0f}% behind"
                    + (", within the rounds' spread" if ranges_overlap else "") + "; " + bound)
        if "pika" in peers:
            met = ours >= 3 * peers["pika"]
            pika_cpu = med([r["cpu_seconds"] / r["messages"] * 1e6
                            for r in self.select("consume", client="pika",
                                                 queue_type=queue_type, prefetch=prefetch)])
            self.target(f"consume ≥ 3x pika ({where})",
                        f"{ours / peers['pika']:.2f}x", met,
                        "" if met else
                        (f"pika needs {pika_cpu:.0f} µs of CPU per message and runs on the "
                         f"second core, in parallel with the broker ({broker:.0f} µs/msg): pika "
                         f"too is held back by the broker rather than by its own cost, and no "
                         f"client can be 3x faster than the broker allows"
                         if pika_cpu < broker else
                         f"pika needs {pika_cpu:.0f} µs of CPU per message, retryloop "
                         f"{client:.1f} µs, but the broker needs {broker:.0f} µs for each of "
                         f"retryloop's messages: retryloop runs at the broker's pace, which is "
                         f"less than 3x pika's"))

    def cpu(self):
        rows = self.select("consume")
        if not rows:
            return
        clients = [c for c in self.meta["clients"] if any(r["client"] == c for r in rows)]
        high = [p for p in self.meta["prefetches"] if p >= 100] or self.meta["prefetches"]
        self.out("## 2. Client cost per message")
        self.out()
        self.out(f"CPU time (user + sys) per consumed message over the measured window: of the "
                 f"client process (getrusage) and of the broker's beam.smp (/proc, sampled every "
                 f"20 ms), from the consume runs at prefetch {', '.join(map(str, high))}. "
                 f"µs per message.")
        self.out()
        header, body = ["client"], []
        for queue_type in self.meta["queue_types"]:
            header += [f"{queue_type}: client", "broker", "client / broker"]
        for c in clients:
            line = [c]
            for queue_type in self.meta["queue_types"]:
                sel = [r for p in high for r in self.select("consume", client=c,
                                                             queue_type=queue_type, prefetch=p)]
                ours = [r["cpu_seconds"] / r["messages"] * 1e6 for r in sel]
                broker = [r["broker_cpu_seconds"] / r["messages"] * 1e6 for r in sel]
                share = [r["cpu_seconds"] / r["broker_cpu_seconds"] for r in sel
                         if r["broker_cpu_seconds"]]
                line += [spread(ours, "{:.1f}"), spread(broker, "{:.1f}"),
                         spread([s * 100 for s in share], "{:.0f}%")]
                if c == "retryloop" and share:
                    peer_costs = [
                        (med([r["cpu_seconds"] / r["messages"] * 1e6 for p in high
                              for r in self.select("consume", client=peer,
                                                   queue_type=queue_type, prefetch=p)]), peer)
                        for peer in PEERS]
                    peer_costs = [cost for cost in peer_costs if cost[0] is not None]
                    cheapest_peer = (f" (the cheapest peer, {min(peer_costs)[1]}: "
                                     f"{min(peer_costs)[0]:.1f} µs)" if peer_costs else "")
                    self.target(f"client CPU ≤ 15% of broker CPU ({queue_type})",
                                f"{med(share) * 100:.1f}%", med(share) <= 0.15,
                                "" if med(share) <= 0.15 else
                                f"retryloop spends {med(ours):.1f} µs of CPU per message"
                                f"{cheapest_peer}, but a {queue_type} queue costs "
                                f"the broker only {med(broker):.1f} µs per message, so 15% "
                                f"leaves {med(broker) * 0.15:.1f} µs; most of the client's time "
                                f"is the kernel's socket reads and writes (see the profile in "
                                f"bench/README.md)")
            body.append(line)
        self.table(header, body)
        grind = self.select("callgrind")
        if grind:
            per = {c: [r["instructions"] / r["messages"] for r in grind if r["client"] == c]
                   for c in ("retryloop", "rabbitmq-c")}
            self.out(f"Instructions per consumed message under `valgrind --tool=callgrind` "
                     f"({grind[0]['messages']:,} messages, prefetch {grind[0]['prefetch']}, from "
                     f"the first delivery to the last ack; repeatable on a busy machine, for "
                     f"tracking regressions):")
            self.out()
            self.table(["client", "instructions / message"],
                       [[c, spread(v)] for c, v in per.items() if v])
            if per["retryloop"] and per["rabbitmq-c"]:
                ours, theirs = med(per["retryloop"]), med(per["rabbitmq-c"])
                self.target("callgrind instructions / message ≤ rabbitmq-c's",
                            f"{ours:,.0f} vs {theirs:,.0f}", ours <= theirs,
                            "" if ours <= theirs else
                            f"{(ours / theirs - 1) * 100:.0f}% more; most of retryloop's "
                            f"instructions go to decoding the header table into owned values (a "
                            f"string or vector per field, two nested x-death tables) and to "
                            f"malloc and free for them, where rabbitmq-c decodes into one memory "
                            f"pool (see the profile in bench/README.md)")

    def publish(self):
        rows = self.select("publish")
        if not rows:
            return
        clients = [c for c in self.meta["clients"] if any(r["client"] == c for r in rows)]
        sizes = self.meta["sizes"]
        self.out("## 3. Publish with confirms")
        self.out()
        self.out(f"Persistent 1 KB messages with the same headers to a classic queue, msg/s "
                 f"from the first publish to the last confirm. Pipelined: at most 1,000 "
                 f"unconfirmed, N = {sizes['publish']:,}. One at a time: each publish waits for "
                 f"its confirm, which the broker sends after the message reached the disk, so "
                 f"the rate is a disk-sync latency; N = {sizes['publish_one']:,}.")
        self.out()
        body = []
        for c in clients:
            body.append([c, spread(self.values("publish", client=c, window=1000)),
                         spread(self.values("publish", client=c, window=1))])
        self.table(["client", "pipelined (window 1,000)", "one at a time"], body)

    def retry(self):
        rows = self.select("retry")
        if not rows:
            return
        contenders = ["seed-pika", "retryloop-reject", "retryloop-republish"]
        contenders += [c for c in ("retryloop-in_queue", "delayed-pika")
                       if self.select("retry", client=c)]
        self.out("## 4. Retry loop")
        self.out()
        self.out(f"{self.meta['sizes']['retry']:,} messages in the queue, each failing twice "
                 f"and acked on its third attempt, with a 10 ms wait queue; completed messages "
                 f"per second from the first delivery to the last ack. The seed recipe is the "
                 f"seed article's own code pattern with pika (reject with requeue=false, count "
                 f"from x-death[0], wait queue dead-lettering back through the input exchange); "
                 f"retryloop runs its retry consumer (handler on the loop) in reject mode and in "
                 f"republish mode (and, on RabbitMQ 4.3 quorum queues, in in_queue mode, where "
                 f"the queue's own delayed retry holds the message). Prefetch 200 for all.")
        self.out()
        header, body = ["contender"], []
        for queue_type in self.meta["queue_types"]:
            header += [f"{queue_type} msg/s", "vs seed"]
        seed = {q: med(self.values("retry", client="seed-pika", queue_type=q))
                for q in self.meta["queue_types"]}
        for c in contenders:
            line = [c]
            for q in self.meta["queue_types"]:
                v = self.values("retry", client=c, queue_type=q)
                line += [spread(v), fmt_ratio(ratio(med(v), seed[q]))]
                if c.startswith("retryloop") and v and seed[q]:
                    sel = self.select("retry", client=c, queue_type=q)
                    broker = med([r["broker_cpu_seconds"] / r["messages"] * 1e6 for r in sel])
                    client = med([r["cpu_seconds"] / r["messages"] * 1e6 for r in sel])
                    self.target(f"retry loop ≥ 3x the seed recipe ({c}, {q})",
                                f"{med(v) / seed[q]:.2f}x", med(v) >= 3 * seed[q],
                                "" if med(v) >= 3 * seed[q] else
                                f"each completed message takes the broker three deliveries and "
                                f"two trips through the wait queue (in by dead-lettering or a "
                                f"confirmed publish, out by TTL expiry and dead-lettering): "
                                f"{broker:.0f} µs of broker CPU per completed message against "
                                f"{client:.0f} µs in retryloop. The broker's work bounds both "
                                f"contenders; a client cannot make the loop 3x faster" +
                                ("; and for quorum queues retryloop's topology dead-letters "
                                 "at least once (x-dead-letter-strategy at-least-once, which the "
                                 "broker carries out with an internal publisher waiting for "
                                 "confirms) where the seed recipe dead-letters at most once: "
                                 "safety the broker pays for"
                                 if q == "quorum" else ""))
            body.append(line)
        self.table(header, body)
        self.retry_cpu(contenders)
        self.lateness()

    def retry_cpu(self, contenders):
        """Broker and client CPU per completed message (two retries each) of every contender:
        where the broker's work goes for each way of waiting."""
        self.out("CPU per completed message (two retries and an ack), medians of the rounds: "
                 "the broker's (its beam.smp over the contender's window) and the client's. "
                 "`delayed-pika` is RabbitMQ 4.3's delayed retry for quorum queues "
                 "(x-delayed-retry-type failed, 10 ms minimum: the message stays in its queue, "
                 "no wait queue, no dead-lettering), with pika rejecting with requeue=true "
                 "while x-delivery-count is below 2.")
        self.out()
        header, body = ["contender"], []
        for q in self.meta["queue_types"]:
            header += [f"{q} broker µs", "client µs"]
        for c in contenders:
            line = [c]
            for q in self.meta["queue_types"]:
                sel = [r for r in self.select("retry", client=c, queue_type=q)
                       if "broker_cpu_seconds" in r]
                if not sel:
                    line += ["–", "–"]
                    continue
                line += [f"{med([r['broker_cpu_seconds'] / r['messages'] * 1e6 for r in sel]):.0f}",
                         f"{med([r['cpu_seconds'] / r['messages'] * 1e6 for r in sel]):.0f}"]
            body.append(line)
        self.table(header, body)

    def scale(self, chart_name):
        rows = self.select("scale")
        if not rows:
            return
        types = self.meta["queue_types"]
        self.out("## Scale: how each cost grows with the work")
        self.out()
        self.out(f"![scale curves]({chart_name.replace('.png', '-scale.png')})")
        self.out()

        def by(part, **where):
            return [r for r in rows if r["part"] == part and
                    all(r.get(k) == v for k, v in where.items())]

        def grid(part, ops, counts, cell):
            """A row per queue type and op, a cell per count: cell(row), or – when not run."""
            body = []
            for q in types:
                for op in ops:
                    line = [q, op]
                    for n in counts:
                        hit = by(part, queue_type=q, op=op, count=n)
                        line.append(cell(hit[0]) if hit else "–")
                    if any(c != "–" for c in line[2:]):
                        body.append(line)
            return body

        parking = by("parking")
        if parking:
            counts = sorted({r["count"] for r in parking})
            self.out("**Parking at depth.** Wall time and the command's peak RSS (`retryloop "
                     "parking ...` as a user runs it) with N parked messages of 1 KB with the "
                     "parking headers. The filtered replay moves the 1% whose error differs, "
                     "reading all of them (its rate is of reading); the full replay moves the "
                     "rest (its rate is of moving).")
            self.out()
            body = grid("parking", ["stats", "stats again", "list 50", "replay 1%", "replay all"], counts,
                        lambda r: f"{r['seconds']:.2f} s, {r['peak_rss_kb'] / 1024:.0f} MB" +
                        (f", {r['rate']:,.0f}/s" if r["op"].startswith("replay") else ""))
            self.table(["queue", "command"] + [f"{n:,} parked" for n in counts], body, left=2)
            for q in types:
                rss = [r["peak_rss_kb"] for r in by("parking", queue_type=q)]
                if rss:
                    self.target(f"parking: client peak RSS flat and under 64 MB ({q})",
                                f"{min(rss) / 1024:.0f}–{max(rss) / 1024:.0f} MB over "
                                f"{counts[0]:,}–{counts[-1]:,}", max(rss) < 64 * 1024)
                full = {r["count"]: r["rate"] for r in by("parking", queue_type=q, op="replay all")}
                if len(full) >= 2:
                    lo, hi = full[min(full)], full[max(full)]
                    self.target(f"parking: full replay's rate at {max(full):,} within 20% of at "
                                f"{min(full):,} ({q})", f"{hi:,.0f} vs {lo:,.0f} msg/s",
                                hi >= 0.8 * lo, "" if hi >= 0.8 * lo else
                                "the broker's CPU per moved message (bench/README.md, Scale)")
        wait = by("wait")
        if wait:
            depths = sorted({r["count"] for r in wait})
            self.out("**A wait queue at depth.** N messages already wait in a 20 s delay tier "
                     "when 500 new retries (50/s) join them; the new retries' lateness (the time "
                     "from the failure to the next delivery, minus 20 s), the broker's RSS before "
                     "the fill and at its peak.")
            self.out()
            body = []
            for q in types:
                for n in depths:
                    hit = by("wait", queue_type=q, count=n)
                    if not hit:
                        continue
                    r = hit[0]
                    body.append([q, f"{n:,}", f"{r['late_ms']['p50']:.1f}",
                                 f"{r['late_ms']['p99']:.1f}", f"{r['fill_seconds']:.1f}",
                                 f"{r['broker_rss_before_kb'] / 1024:.0f}",
                                 f"{r['broker_peak_rss_kb'] / 1024:.0f}"])
                lates = {r["count"]: r["late_ms"]["p99"] for r in by("wait", queue_type=q)}
                if len(lates) >= 2:
                    lo, hi = lates[min(lates)], lates[max(lates)]
                    met = hi <= 2 * max(lo, 1.0)
                    self.target(f"wait queue: lateness p99 at {max(lates):,} within 2x of at "
                                f"{min(lates):,} ({q})", f"{hi:.1f} vs {lo:.1f} ms", met,
                                "" if met else "a retry waits while the broker dead-letters the "
                                "backlog that expires before it (bench/README.md, Scale)")
            self.table(["queue", "waiting", "lateness p50 ms", "p99", "fill s",
                        "broker RSS before MB", "peak MB"], body, left=2)
        services = by("services")
        if services:
            counts = sorted({r["count"] for r in services})
            self.out("**Many services.** `retryloop topology` with K services in one file "
                     "(republish mode, two delays, a parking limit: 7 objects and 5 bindings "
                     "each), against the local broker: apply creates them, apply again finds "
                     "them all in place; export needs no broker.")
            self.out()
            body = grid("services", ["apply", "apply again", "verify", "export"], counts,
                        lambda r: f"{r['seconds']:.2f} s")
            for q in types:
                apply = {r["count"]: r["seconds"] for r in by("services", queue_type=q,
                                                              op="apply")}
                if 300 in apply:
                    self.target(f"topology apply of 300 services under 10 s ({q})",
                                f"{apply[300]:.1f} s", apply[300] < 10)
            self.table(["queue", "command"] + [f"{k} services" for k in counts], body, left=2)
        handlers = by("handlers")
        if handlers:
            concurrencies = sorted({r["count"] for r in handlers})
            self.out("**Handlers that wait on I/O.** Each handler sleeps 20 ms; the consumer "
                     "runs `concurrency` of them at once on its worker threads, with the default "
                     "prefetch of 200. Ideal: 50 msg/s per handler.")
            self.out()
            body = []
            for q in types:
                for c in concurrencies:
                    hit = by("handlers", queue_type=q, count=c)
                    if not hit:
                        continue
                    r = hit[0]
                    ideal = 1000 / r["sleep_ms"] * min(c, r["prefetch"])
                    body.append([q, str(c), f"{r['rate']:,.0f}", f"{ideal:,.0f}",
                                 f"{r['rate'] / ideal * 100:.0f}%",
                                 f"{r['peak_rss_kb'] / 1024:.1f}"])
            self.table(["queue", "concurrency", "msg/s", "ideal (min(concurrency, prefetch) × "
                        "50)", "of ideal", "peak RSS MB"], body, left=2)
        part_seconds = self.meta.get("scale_part_seconds")
        if part_seconds:
            full_only = {("parking", 1000000), ("wait", 500000)}
            default = sum(s for key, s in part_seconds.items()
                          if (key.split()[0], int(key.split()[-1])) not in full_only)
            self.out(f"**Time.** The curves took {sum(part_seconds.values()):,.0f} s in all; the "
                     f"points of the default sizes (all but 1,000,000 parked and 500,000 waiting) "
                     f"took {default:,.0f} s of it.")
            self.out()

    def delays(self):
        rows = self.select("delays")
        if not rows:
            return
        self.out("## Delays the handler chooses (delay levels)")
        self.out()
        self.out(f"One round. The retry consumer fails each of {self.meta['sizes']['delays']:,} "
                 f"messages "
                 f"(published at {self.meta['sizes']['delays_rate']} msg/s) once with "
                 f"`Outcome::retry_after(d)`, d spread evenly on a log scale over the range; the "
                 f"actual delay is the time from the failure to the next delivery. Error: "
                 f"|actual − d|, which includes rounding d to the base. Lateness: actual minus d "
                 f"rounded, what the broker adds (a TTL expiry and a dead-lettering per level "
                 f"passed). The bound is one base step plus 10 ms per level passed.")
        self.out()
        body = []
        for r in rows:
            err, late = r["error_ms"], r["late_ms"]
            body.append([r["queue_type"], r["config"], str(r["messages"]), str(r["most_hops"]),
                         f"{err['p50']:.1f}", f"{err['p99']:.1f}", f"{err['max']:.1f}",
                         f"{late['p50']:.1f}", f"{late['p99']:.1f}",
                         f"{r['late_per_hop_ms']['p50']:.1f}" if "late_per_hop_ms" in r else "–",
                         f"{r['within_bound']}/{r['messages']}"])
            met = r["within_bound"] >= r["messages"] * 0.99
            self.target(f"delay levels: p99 error within one base step + 10 ms per level "
                        f"({r['queue_type']}, {r['config']})",
                        f"{r['within_bound']}/{r['messages']} within; p99 {err['p99']:.1f} ms",
                        met, "" if met else "the broker's TTL lateness per level is larger here")
        self.table(["queue", "delays", "messages", "most levels passed", "error p50 ms", "p99",
                    "max", "lateness p50 ms", "p99", "per level p50 ms", "within bound"],
                   body, left=2)

    def schedule(self):
        rows = [r for r in self.select("schedule") if "failed" not in r]
        if not rows:
            return
        sizes = self.meta["sizes"]
        self.out("## Scheduled delivery (`retryloop send`, schedule::Scheduler)")
        self.out()
        self.out(f"One round per queue type of the levels (base 1 s, up to 1 h). First "
                 f"{sizes['schedule']:,} messages of 1 KB published straight to the queue with "
                 f"confirms (the undelayed rate, in the same run), then {sizes['schedule']:,} "
                 f"scheduled for it, delays spread on a log scale from "
                 f"{sizes['schedule_min_ms'] / 1000:g} s to {sizes['schedule_max_ms'] / 1000:g} s, "
                 f"at most 1000 unconfirmed; a consumer on the queue notes when each arrives. "
                 f"Lateness: arrival minus `retryloop-due-at` (the due time is the request rounded "
                 f"up to the base). Early: arrived before it was due. Broker RSS: the node's "
                 f"before the run and its peak during it. The archived delayed-message plugin's "
                 f"published figure, for comparison only (not measured here: it cannot run on "
                 f"RabbitMQ 4.3): about 6,300 delayed publishes/s on an 8-core machine with "
                 f"RabbitMQ 3.5.")
        self.out()
        body = []
        for r in rows:
            ranges = r.get("late_ms_by_range", {})
            late = r["late_ms"] or {"p50": 0, "p99": 0, "max": 0}
            body.append([r["queue_type"], f"{r['messages']:,}", f"{r['rate']:,.0f}",
                         f"{r['plain_rate']:,.0f}", f"{r['cpu_us_per_message']:.1f}",
                         f"{r['arrived']:,}", str(r["early"]), str(r["lost"]),
                         f"{late['p50']:.0f} / {late['p99']:.0f} / {late['max']:.0f}",
                         f"{r.get('broker_rss_before_kb', 0) // 1024} → "
                         f"{r.get('broker_peak_rss_kb', 0) // 1024}"])
            self.target(f"scheduled delivery: no message early, none lost ({r['queue_type']})",
                        f"{r['early']} early, {r['lost']} lost of {r['messages']:,}",
                        r["early"] == 0 and r["lost"] == 0)
        self.table(["levels", "messages", "scheduled msg/s", "undelayed msg/s",
                    "client CPU µs/msg", "arrived", "early", "lost",
                    "lateness p50 / p99 / max ms", "broker RSS MB"], body, left=1)
        range_rows = []
        for r in rows:
            for name, late in r.get("late_ms_by_range", {}).items():
                range_rows.append([r["queue_type"], name, f"{late['samples']:,}",
                                   f"{late['p50']:.0f}", f"{late['p99']:.0f}",
                                   f"{late['max']:.0f}"])
        if range_rows:
            self.out()
            self.out("Lateness by delay range:")
            self.out()
            self.table(["levels", "delay", "messages", "p50 ms", "p99 ms", "max ms"], range_rows,
                       left=2)

    def lateness(self):
        rows = self.select("lateness")
        if not rows:
            return
        contenders = ["broker-ttl", "seed-pika", "retryloop-reject", "retryloop-republish"]
        contenders += [c for c in ("retryloop-in_queue", "delayed-pika")
                       if self.select("lateness", client=c)]
        self.out(f"Retry lateness with a 1 s delay: actual delay minus 1,000 ms, in ms. "
                 f"{self.meta['sizes']['lateness']:,} messages published at "
                 f"{self.meta['sizes']['lateness_rate']} msg/s while the consumer runs; each "
                 f"fails once. The actual delay is the time from the handler's failure to the "
                 f"next delivery of the message. `broker-ttl` is the broker's own precision: a "
                 f"message published to a queue with a 1 s TTL, measured from the publish to "
                 f"its delivery from the dead-letter target. Medians of the rounds' percentiles; "
                 f"max is the largest seen.")
        self.out()
        header = ["contender"]
        for q in self.meta["queue_types"]:
            header += [f"{q} p50", "p99", "max"]
        body = []
        for c in contenders:
            line = [c]
            for q in self.meta["queue_types"]:
                late = [r["late_ms"] for r in self.select("lateness", client=c, queue_type=q)]
                if not late:
                    line += ["–"] * 3
                    continue
                line += [f"{med([l['p50'] for l in late]):.1f}",
                         f"{med([l['p99'] for l in late]):.1f}",
                         f"{max(l['max'] for l in late):.1f}"]
                if c.startswith("retryloop"):
                    base = [r["late_ms"]["p99"]
                            for r in self.select("lateness", client="broker-ttl", queue_type=q)]
                    if base:
                        ours = med([l["p99"] for l in late])
                        p99s = [l["p99"] for l in late]
                        hop = ("rejected into the wait queue by the broker's dead-lettering"
                               if c.endswith("reject") else
                               "handed back to its queue, which holds it" if c.endswith("queue")
                               else "published into the wait queue with a confirm")
                        self.target(f"retry lateness p99 within 10 ms of the broker's TTL "
                                    f"precision ({c}, {q})",
                                    f"{ours:.1f} ms vs {med(base):.1f} ms",
                                    ours <= med(base) + 10,
                                    "" if ours <= med(base) + 10 else
                                    f"{ours - med(base) - 10:.1f} ms over; p99 "
                                    f"{min(p99s):.1f}–{max(p99s):.1f} ms over the rounds against "
                                    f"the broker's {min(base):.1f}–{max(base):.1f} ms. A retry "
                                    f"makes one more hop than the plain TTL measurement: it is "
                                    f"{hop} before the TTL starts"
                                    + (", and in a quorum queue every hop is a write to its "
                                       "replicated log" if q == "quorum" else "")
                                    + "; with the machine this busy, that hop's tail shows in "
                                    "the p99. The client's share is the time to run the "
                                    "handler and send the reject or the copy: microseconds")
            body.append(line)
        self.table(header, body)

    def memory(self):
        rows = self.select("memory")
        if not rows:
            return
        peak = [r["peak_rss_kb"] / 1024 for r in rows]
        start = [r["rss_start_kb"] / 1024 for r in rows]
        self.out("## 5. Memory")
        self.out()
        self.out(f"Peak RSS (VmHWM) of the retryloop consumer holding {rows[0]['held']:,} "
                 f"unacked 1 KB messages (prefetch {rows[0]['prefetch']:,}, a handler that "
                 f"sleeps): **{spread(peak, '{:.1f}')} MB** (the process started at "
                 f"{med(start):.1f} MB).")
        self.out()
        per_message = (med(peak) - med(start)) * 1024 / rows[0]["held"]
        self.out(f"That is {per_message:.1f} KB per held message: the body (1 KB), the decoded "
                 f"header table (the x-death array of two tables and the other headers, about "
                 f"1.3 KB as owned strings and vectors), and the consumer's record of the "
                 f"delivery (its properties, exchange and routing key; the attempt count, the "
                 f"decision and a copy's properties are made only when its handler starts).")
        self.out()
        self.target("RSS at 10,000 unacked 1 KB messages < 40 MB", f"{med(peak):.1f} MB",
                    med(peak) < 40, "" if med(peak) < 40 else
                    f"{per_message:.1f} KB per held message (section 5): the body, the decoded "
                    f"headers as owned strings and vectors, and the consumer's record of the "
                    f"delivery")

    def churn(self):
        rows = self.select("churn")
        if not rows:
            return
        row = rows[-1]
        rss = [kb / 1024 for kb in row["rss_kb"]]
        headers = row["header_bytes"]
        # The round from which a parked message's headers stopped growing (its history is full;
        # a counter in them may still gain a digit).
        full = next(k for k in range(len(headers)) if headers[k] * 100 >= headers[-1] * 99)
        after_full = rss[full + 1:]
        self.out("### Memory while parked messages come back again and again")
        self.out()
        self.out(f"{row['messages']:,} parked messages replayed {len(headers)} times into a "
                 f"`demo_consumer` (quorum queues, prefetch 50, 8 workers) that parks each again. "
                 f"Every round adds two entries to each message's `retryloop-history`, up to the "
                 f"last 20: a parked message's headers grow from {headers[0]:,} to "
                 f"{headers[-1]:,} bytes (as JSON), and stop growing from round {full + 1}.")
        self.out()
        self.out(f"RSS of the consumer: {rss[0]:.1f} MB with every message parked once, "
                 f"{rss[1]:.1f} MB after the first replay, and {spread(after_full, '{:.2f}')} MB "
                 f"over the rounds from the one where the headers stopped growing. By round: "
                 + ", ".join(f"{x:.2f}" for x in rss[1:]) + " MB.")
        self.out()

    def replay(self):
        rows = self.select("replay")
        if not rows:
            return
        ours = self.values("replay", client="retryloop")
        loop = self.values("replay", client="pika-loop")
        sizes = self.meta["sizes"]
        self.out("## 6. Replay")
        self.out()
        self.out(f"Parked 1 KB messages moved back to the service queue, each published with "
                 f"confirm and acked once confirmed. `retryloop parking replay` moves "
                 f"{sizes['replay']:,} (wall time of the command, start to exit); the pika loop "
                 f"(basic.get, publish, wait for the confirm, ack) moves "
                 f"{sizes['replay_pika']:,} (its rate is steady, one round trip pair per "
                 f"message).")
        self.out()
        self.table(["contender", "msg/s"], [["retryloop parking replay", spread(ours)],
                                            ["pika get-publish-confirm-ack loop", spread(loop)],
                                            ["ratio", fmt_ratio(ratio(med(ours), med(loop)))]])
        if ours and loop:
            publish = self.values("publish", client="retryloop", window=1000)
            self.target("replay ≥ 10x the pika loop", f"{med(ours) / med(loop):.1f}x",
                        med(ours) >= 10 * med(loop),
                        "" if med(ours) >= 10 * med(loop) else
                        f"the pika loop waits for each confirm, so its rate follows the broker's "
                        f"confirm latency, which is short on a quiet machine ({med(loop):.0f} "
                        f"msg/s); the replay is bound by the broker's work for each message "
                        f"(a delivery, a confirmed publish, an ack)" +
                        (f": its {med(ours):.0f} msg/s is {med(ours) / med(publish) * 100:.0f}% "
                         f"of what the broker takes for the confirmed publishes alone "
                         f"({med(publish):.0f} msg/s, section 3)" if publish else ""))

    def migrate(self):
        rows = self.select("migrate")
        if not rows:
            return
        self.out("## 6b. topology migrate")
        self.out()
        self.out("A service queue of 1 KB messages made again with another type while they wait "
                 "in it: each moved into a holding queue of the new type and back. `retryloop "
                 "topology migrate` is timed from start to exit (its survey, lock and records "
                 "included) and moves in a window of confirms; the pika loop does what "
                 "NServiceBus's migrate-to-quorum does: basic.get, publish, wait for the confirm, "
                 "ack, one message at a time, into the holding queue and back. Rates are messages "
                 "migrated a second (each moved twice); RSS is the command's peak.")
        self.out()
        table = []
        gains = []
        for (source, target) in sorted({(r["source"], r["target"]) for r in rows}):
            for count in sorted({r["messages"] for r in rows if r["source"] == source}):
                where = {"source": source, "target": target, "messages": count}
                ours = self.values("migrate", client="retryloop", **where)
                loop = self.values("migrate", client="pika-loop", **where)
                rss = self.values("migrate", key="rss_kb", client="retryloop", **where)
                table.append([f"{source} → {target}", f"{count:,}", spread(ours), spread(loop),
                              fmt_ratio(ratio(med(ours), med(loop))) if loop else "–",
                              spread([x / 1024 for x in rss], "{:.1f}") if rss else "–"])
                if ours and loop:
                    gains.append(med(ours) / med(loop))
        self.table(["change", "messages", "retryloop msg/s", "pika loop msg/s", "ratio",
                    "retryloop RSS MB"], table, left=1)
        loop_rate = med(self.values("migrate", client="pika-loop"))
        largest = max(r["messages"] for r in rows)
        at_largest = self.values("migrate", client="retryloop", messages=largest)
        if gains and loop_rate and at_largest:
            # The loop's rate is steady (one confirm at a time, whatever the depth), so the largest
            # size is compared with it too.
            large_gain = min(at_largest) / loop_rate
            self.target("migrate ≥ 10x the one-at-a-time mover",
                        f"{min(gains):.1f}x at the same size, {large_gain:.1f}x at {largest:,}",
                        min(gains) >= 10,
                        "" if min(gains) >= 10 else
                        "the command migrates the service's wait and parking queues as well as its "
                        "queue (3 queues made again, 32 steps, each recorded with a confirm), and "
                        "the move of a queue found empty waits about a second to be sure of it (a "
                        "quorum queue without a reachable leader answers 0): a few seconds whatever "
                        "the depth, which the one-queue loop does not pay; its rate against the "
                        f"loop's steady {loop_rate:.0f} msg/s at {largest:,} messages is "
                        f"{large_gain:.1f}x")

    def transfer(self):
        rows = self.select("transfer")
        if not rows:
            return
        sizes = self.meta["sizes"]
        target = self.meta["versions"].get("rabbitmq_target") or "the second broker"
        self.out("## 6c. topology transfer")
        self.out()
        self.out(f"A republish-mode service moved from this broker to {target}: "
                 f"{sizes['transfer']:,} 1 KB messages in its service queue, "
                 f"{sizes['transfer_retries']:,} retries waiting in its 20 s wait queue (each "
                 f"due 20 s after it was published there, in `retryloop-retry-due`; they had "
                 f"waited at least 10 s when the move began) and "
                 f"{sizes['transfer_parked']:,} parked. `retryloop topology transfer` is timed "
                 f"from start to exit (it applies the service on the new broker, takes its lock, "
                 f"declares the levels the retries wait out their delay in, then moves the three "
                 f"queues in a window of confirms); the pika loop moves each queue to the same "
                 f"queue on the new broker one message and one confirm at a time, as a shovel "
                 f"would, the wait queue first: a retry waits its whole delay again there. "
                 f"Lateness is how long after its due time each retry reached a consumer of the "
                 f"new service queue, started before the move as in a blue-green move; CPU is the "
                 f"contender's, and the old broker's over the same window.")
        self.out()
        table = []
        for queue_type in sorted({r["queue_type"] for r in rows}):
            for client, label in (("retryloop", "retryloop topology transfer"),
                                  ("pika-loop", "pika get-publish-confirm-ack loop")):
                where = {"queue_type": queue_type, "client": client}
                rates = self.values("transfer", **where)
                if not rates:
                    continue
                picked = [r for r in self.select("transfer", **where) if "failed" not in r]
                cpu = [r["cpu_seconds"] / r["messages"] * 1e6 for r in picked
                       if "cpu_seconds" in r]
                broker = [r["broker_cpu_seconds"] / r["messages"] * 1e6 for r in picked
                          if "broker_cpu_seconds" in r]
                late = lambda key: spread([r[key] / 1000 for r in picked
                                           if r.get(key) is not None], "{:.2f}")
                early = sum(r.get("early", 0) for r in picked)
                back = sum(r.get("retries_back", 0) for r in picked)
                table.append([queue_type, label, spread(rates),
                              spread(cpu, "{:.1f}") if cpu else "–",
                              spread(broker, "{:.1f}") if broker else "–", late("late_p50_ms"),
                              late("late_p99_ms"), late("late_max_ms"),
                              f"{early} of {back}"])
        self.table(["queue", "contender", "msg/s", "its CPU µs/msg", "old broker's µs/msg",
                    "late p50 s", "late p99 s", "late max s", "early"], table, left=2)

    def bluegreen(self):
        rows = [r for r in self.select("bluegreen") if "apply_s" in r]
        if not rows:
            return
        sizes = self.meta["sizes"]
        target = self.meta["versions"].get("rabbitmq_target") or "the second broker"
        self.out("## 6d. A blue-green move, step by step")
        self.out()
        self.out(f"docs/transfer.md's steps, from this broker (blue) to {target} (green), with the "
                 f"service running: {sizes['bluegreen']:,} messages in its queue, "
                 f"{sizes['transfer_retries']:,} retries waiting in its 20 s wait queue and "
                 f"{sizes['transfer_parked']:,} parked; a pika consumer on blue (0.2 ms a message, "
                 f"prefetch 50) and a publisher sending {sizes['bluegreen_rate']} messages a second "
                 f"to blue. 1. `topology apply` on green; 2. the same consumer on green; 3. "
                 f"`topology transfer --follow`; 4. once its first pass is over, the publisher "
                 f"switches to green; 5. the blue consumer stops (its unacked messages go back to "
                 f"blue's queue); 6. `--follow` ends by itself, 10 s (`--settle`) after blue's "
                 f"queues were last found empty.")
        self.out()
        table = []
        for queue_type in sorted({r["queue_type"] for r in rows}):
            picked = [r for r in rows if r["queue_type"] == queue_type]
            col = lambda key, fmt="{:.2f}": spread([r[key] for r in picked
                                                    if r.get(key) is not None], fmt)
            table.append([queue_type, col("apply_s"), col("first_pass_s"),
                          col("moved", "{:,.0f}"),
                          f"{col('handled_blue', '{:,.0f}')} / {col('handled_green', '{:,.0f}')}", col("switch_pause_ms", "{:.0f}"),
                          col("blue_stop_s"), col("finish_s"), col("transfer_cpu_s", "{:.2f}"),
                          col("longest_gap_s"),
                          f"{sum(r['lost'] for r in picked)} / {sum(r['twice'] for r in picked)}",
                          col("late_max_ms", "{:.0f}"),
                          f"{sum(r['early'] for r in picked)} of "
                          f"{sum(r['retries_on_green'] for r in picked)}",
                          f"{sum(r['parked_lost'] for r in picked)}"])
        self.table(["queue", "1. apply s", "3. first pass s", "moved", "handled on blue / green",
                    "4. publisher paused ms",
                    "5. blue consumer stop s", "6. follow ends s", "transfer CPU s",
                    "longest handling gap s", "lost / twice", "retries late max ms", "early",
                    "parked lost"], table, left=1)

    # ---- 7. Outbox and inbox ----

    def per(self, rows, key, scale=1e6):
        """Median of a per-row cost: rows[key] / messages, times `scale`."""
        return med([r[key] / r["messages"] * scale for r in rows if r.get(key) is not None])

    def cores(self, rows, key):
        return med([r[key] / r["seconds"] for r in rows if r.get(key) is not None and
                    r.get("seconds")])

    def outbox_bound(self, client, rows):
        """What held a contender back: its rate against the broker's ceiling for the same
        messages, and the CPU each process (and the whole machine) used over its window."""
        cpus = self.meta["machine"]["cpus"]
        broker = self.cores(rows, "broker_cpu_seconds") or 0
        client_cores = self.cores(rows, "cpu_seconds") or 0
        pg = self.cores(rows, "pg_cpu_seconds") or 0
        machine = med([r["machine_busy_cores"] for r in rows if "machine_busy_cores" in r])
        used = (f"broker {broker:.2f}, {'relays' if client.startswith('relay') else 'client'} "
                f"{client_cores:.2f}, PostgreSQL {pg:.2f} cores"
                + (f"; the whole machine {machine:.2f} of {cpus}" if machine else ""))
        if client.startswith("naive"):
            return (f"waiting, not CPU ({used}): every row waits for its own confirm, which the "
                    f"broker sends once the message is on disk, and for its own commit, which "
                    f"waits for the database's disk sync")
        rate = med([r["rate"] for r in rows])
        ceiling = med(self.values("outbox", client="broker-publish"))
        share = f"{rate / ceiling * 100:.0f}% of" if ceiling else "against"
        if ceiling and rate >= 0.8 * ceiling:
            ours = self.per(rows, "broker_cpu_seconds")
            theirs = self.per(self.select("outbox", client="broker-publish"),
                              "broker_cpu_seconds")
            return (f"the broker ({used}): {share} what it takes of the same messages with no "
                    f"database at all (broker-publish); its CPU per message "
                    f"{ours:.0f} µs against {theirs:.0f} µs there. One classic queue, whose "
                    f"process takes every publish in turn, however many relays publish")
        if machine and machine >= 0.85 * cpus:
            return (f"the machine's {cpus} CPUs, all busy ({used}"
                    + (": other work took the rest" if broker + client_cores + pg <
                       machine - 0.3 else "") + f"); {share} broker-publish")
        if client.endswith(("-2", "-4")):
            return (f"the relays' claims ({used}): {share} broker-publish. Each relay skips the "
                    f"rows the others hold (SKIP LOCKED) and the rows of every ordering key "
                    f"they hold, so its scan grows with the relays, and PostgreSQL spends more "
                    f"per row; one classic queue takes all the publishes")
        if "sqlite" in client:
            return (f"the relay's cycle ({used}): {share} broker-publish. On SQLite a relay has "
                    f"one batch out: it waits for every confirm, then settles the batch and "
                    f"claims the next, and the broker gets nothing new from it meanwhile")
        return (f"the relay's cycle ({used}): {share} broker-publish. Two batches out at once: "
                f"the broker gets the next batch while the relay settles one, but each batch "
                f"still waits for its last confirm")

    def outbox(self):
        rows = self.select("outbox")
        latency = self.select("outbox-latency")
        inbox = self.select("inbox")
        if not (rows or latency or inbox):
            return
        sizes, ver = self.meta["sizes"], self.meta["versions"]
        self.out("## 7. Outbox and inbox")
        self.out()
        self.out(f"PostgreSQL {ver.get('postgresql') or '?'} (a throwaway server on loopback, "
                 f"default settings: synchronous_commit on, fsync on) and SQLite "
                 f"{(ver.get('sqlite') or '?').split('-')[0]} (a WAL file on the same disk, "
                 f"synchronous FULL). CPU is the user + sys time of each process over the "
                 f"contender's window: the relays' and the clients' from their rusage, the "
                 f"broker's beam.smp from /proc, and PostgreSQL's cluster (backends, the ones that "
                 f"ended included, and its background processes) from /proc.")
        self.out()
        if rows:
            fills = [r for r in self.rows if r.get("bench") == "outbox-fill" and
                     r.get("method") == "enqueue"]
            self.out(f"**Relay throughput.** {sizes['outbox']:,} pending rows in "
                     f"`retryloop_outbox` (1 KB body, five headers, every other row with one of "
                     f"{sizes['outbox_keys']:,} ordering keys), drained by `retryloop outbox "
                     f"relay --until-idle` processes (the defaults: batches of 500, two out at once "
                     f"on PostgreSQL, one on SQLite) into one classic "
                     f"queue; rows per second from their start to the last one's exit. The naive "
                     f"loop ({sizes['outbox_naive']:,} rows) is written in the bench program with "
                     f"the same client and store layer: one transaction per row (select the "
                     f"oldest pending row, publish it with mandatory, wait for its confirm, delete "
                     f"it, commit). `broker-publish` is the broker's ceiling with no database: "
                     f"the same number of the same messages (1 KB body, the rows' headers and "
                     f"message-id length, persistent, mandatory) published with confirms to the "
                     f"same queue by the same client, 1,000 unconfirmed at most "
                     f"(`bench_retryloop publish --mandatory --outbox-headers`). CPU per 1,000 rows, in ms, "
                     f"and (in parentheses) the cores it kept busy.")
            self.out()
            order = [f"relay-postgresql-{n}" for n in self.meta.get("outbox_relays", [])] + \
                ["relay-sqlite-1", "naive-postgresql", "naive-sqlite", "broker-publish"]
            body, bounds = [], []
            for client in order:
                sel = self.select("outbox", client=client)
                if not sel:
                    continue
                rates = [r["rate"] for r in sel]
                # CPU seconds per row, times 1e6: ms per 1,000 rows.
                cost = lambda key: (f"{self.per(sel, key):.1f} ({self.cores(sel, key):.2f})"
                                    if self.per(sel, key) is not None else "–")
                body.append([client, spread(rates), cost("cpu_seconds"),
                             cost("broker_cpu_seconds"),
                             cost("pg_cpu_seconds") if "postgresql" in client else "–"])
                if client != "broker-publish":
                    bounds.append(f"- {client}: {self.outbox_bound(client, sel)}.")
            self.table(["contender", "rows/s", "relay or client CPU", "broker CPU",
                        "PostgreSQL CPU"], body)
            if bounds:
                self.out("What bounds each (cores: CPU seconds over the window's wall seconds, "
                         "medians):")
                self.out()
                for line in bounds:
                    self.out(line)
                self.out()
            if fills:
                self.out("Side figure: the first fill of each database, through "
                         "`outbox::enqueue` in transactions of 500 rows from one connection, "
                         "wrote " + ", ".join(f"{r['client']} {r['rate']:,.0f} rows/s"
                                              for r in fills) + ".")
                self.out()
            one = med(self.values("outbox", client="relay-postgresql-1"))
            naive = med(self.values("outbox", client="naive-postgresql"))
            ceiling = med(self.values("outbox", client="broker-publish"))
            if one:
                sel = self.select("outbox", client="relay-postgresql-1")
                self.target("outbox relay ≥ 5,000 rows/s (PostgreSQL, 1 relay)",
                            f"{one:,.0f} rows/s", one >= 5000, "" if one >= 5000 else
                            self.outbox_bound("relay-postgresql-1", sel) +
                            (f"; the broker alone takes {ceiling:,.0f} confirmed publishes a "
                             f"second here" if ceiling else ""))
            if one and naive:
                self.target("outbox relay ≥ 10x the naive loop (PostgreSQL)",
                            f"{one / naive:.1f}x ({one:,.0f} vs {naive:,.0f} rows/s)",
                            one >= 10 * naive, "" if one >= 10 * naive else
                            f"the relay runs at the broker's pace "
                            f"({ceiling:,.0f} confirmed publishes a second with no database), "
                            f"and the naive loop at the pace of two disk syncs per row, which "
                            f"are short on this disk" if ceiling else "")
        if latency:
            rate, seconds = sizes["outbox_latency_rate"], sizes["outbox_latency_seconds"]
            self.out(f"**Commit-to-publish latency.** An application thread commits one row per "
                     f"transaction at {rate} rows/s for {seconds} s (PostgreSQL); one `retryloop "
                     f"outbox relay` runs; a consumer on the queue takes each message. Latency is "
                     f"from the moment the row's COMMIT returned to the application to the "
                     f"message's delivery to the consumer, in ms: medians of the rounds' "
                     f"percentiles, max the largest seen. `notify`: the default (LISTEN/NOTIFY "
                     f"wakes the relay at each commit; it also polls every 5 s). `poll`: "
                     f"`--no-notify`, polling every 100 ms (the default interval without "
                     f"notifications); a relay that finds rows looks again at once, so only a "
                     f"row that arrives while it sleeps waits for the poll.")
            self.out()
            body = []
            for mode in ("notify", "poll"):
                sel = self.select("outbox-latency", client=mode)
                if not sel:
                    continue
                lat = [r["latency_ms"] for r in sel]
                relay = med([r["relay_cpu_seconds"] / r["messages"] * 1e6 for r in sel])
                body.append([mode, f"{med([l['p50'] for l in lat]):.1f}",
                             f"{med([l['p99'] for l in lat]):.1f}",
                             f"{max(l['max'] for l in lat):.1f}", f"{relay:.1f}"])
                if mode == "notify":
                    p99 = med([l["p99"] for l in lat])
                    self.target("commit-to-publish p99 < 50 ms (notify)", f"{p99:.1f} ms",
                                p99 < 50, "" if p99 < 50 else
                                "the relay settles a batch (the broker's confirm, its own "
                                "commit) before it looks for the next rows")
            self.table(["relay wakes by", "p50", "p99", "max", "relay CPU ms / 1,000 rows"],
                       body)
        if inbox:
            self.out(f"**Inbox overhead.** A retry consumer (worker-thread handler, prefetch "
                     f"200) handles {sizes['inbox']:,} messages, each with a message-id of its "
                     f"own; the handler writes one row in a transaction. `plain`: the handler "
                     f"opens the transaction itself (a connection per worker thread); `inbox`: "
                     f"`inbox::Inbox` wraps it, recording the message id in the same "
                     f"transaction. Messages per second from the first delivery to the last "
                     f"handler's return; the µs added is 1/inbox − 1/plain of the medians.")
            self.out()
            body = []
            for database in ("sqlite", "postgresql"):
                for concurrency in self.meta.get("inbox_concurrency", [1]):
                    plain = self.select("inbox", client="plain", database=database,
                                        concurrency=concurrency)
                    wrapped = self.select("inbox", client="inbox", database=database,
                                          concurrency=concurrency)
                    if not plain or not wrapped:
                        continue
                    a, b = med([r["rate"] for r in plain]), med([r["rate"] for r in wrapped])
                    pg = (f"{self.per(plain, 'pg_cpu_seconds'):.0f} / "
                          f"{self.per(wrapped, 'pg_cpu_seconds'):.0f}"
                          if database == "postgresql" and
                          self.per(plain, "pg_cpu_seconds") is not None else "–")
                    body.append([database, str(concurrency), spread([r["rate"] for r in plain]),
                                 spread([r["rate"] for r in wrapped]),
                                 f"{(1 / b - 1 / a) * 1e6:.0f}", f"{(1 - b / a) * 100:.0f}%",
                                 f"{self.per(plain, 'cpu_seconds'):.0f} / "
                                 f"{self.per(wrapped, 'cpu_seconds'):.0f}", pg])
            self.table(["database", "handlers at once", "plain msg/s", "inbox msg/s",
                        "µs added per message", "slower by", "consumer CPU µs/msg (plain / "
                        "inbox)", "PostgreSQL CPU µs/msg"], body, left=2)
        self.out("**Published figures to compare with** (quoted from their authors, not "
                 "measured here, on other machines and workloads): pgmq reads about 30,000 "
                 "messages a second on 16 vCPU; Watermill's PostgreSQL subscriber handles about "
                 "460 messages a second on 16 vCPU. This machine has "
                 f"{self.meta['machine']['cpus']} CPUs shared by the broker, the database and "
                 f"the relays.")
        self.out()

    def write(self, path_md, chart_name):
        self.header()
        body_start = len(self.lines)
        self.consume()
        self.consumer()
        self.cpu()
        self.publish()
        self.retry()
        self.delays()
        self.schedule()
        self.memory()
        self.churn()
        self.replay()
        self.migrate()
        self.transfer()
        self.bluegreen()
        self.outbox()
        self.scale(chart_name)
        body = self.lines[body_start:]
        self.lines = self.lines[:body_start]
        if self.targets:
            self.out("## Targets")
            self.out()
            self.table(["target", "figure", "", "why"],
                       [[n, f, s, w] for n, f, s, w in self.targets], left=4)
        if self.select("consume"):
            self.out(f"![consume and ack throughput]({chart_name})")
            self.out()
        self.lines += body
        failed = [r for r in self.rows if "failed" in r]
        if failed:
            self.out()
            self.out("## Failed runs")
            self.out()
            self.out("Left out of the figures above:")
            self.out()
            for r in failed:
                self.out(f"- {r.get('bench')} {r.get('client')} round {r.get('round')}: "
                         f"{r['failed'].splitlines()[0][:300]}")
        with open(path_md, "w") as f:
            f.write("\n".join(self.lines).rstrip() + "\n")


def chart(data, path_png):
    """Consume-and-ack throughput, one panel per queue type, one bar per client (gnuplot)."""
    meta, rows = data["meta"], [r for r in data["rows"] if r.get("bench") == "consume"]
    if not rows:
        return
    clients = [c for c in meta["clients"] if any(r["client"] == c for r in rows)]
    work = os.path.dirname(os.path.abspath(path_png))
    script = [
        "set terminal pngcairo size 1400,600 font 'DejaVu Sans,11'",
        f"set output '{path_png}'",
        f"set multiplot layout 1,{len(meta['queue_types'])} title 'Consume and ack, persistent "
        f"1 KB messages: median msg/s of {meta['rounds']} rounds (bars: lowest to highest)'",
        "set style data histograms",
        "set style histogram errorbars gap 1 lw 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.9",
        "set grid ytics",
        "set yrange [0:*]",
        "set ylabel 'msg/s'",
        "set key below horizontal maxrows 1 width -1",
    ]
    data_files = []
    for queue_type in meta["queue_types"]:
        lines = []
        for prefetch in meta["prefetches"]:
            cells = [f'"prefetch {prefetch}"']
            for c in clients:
                v = [r["rate"] for r in rows if r["client"] == c and
                     r["queue_type"] == queue_type and r["prefetch"] == prefetch]
                cells += [f"{med(v):.0f}", f"{min(v):.0f}", f"{max(v):.0f}"] if v else ["0"] * 3
            lines.append(" ".join(cells))
        name = os.path.join(work, f".chart-{queue_type}.dat")
        with open(name, "w") as f:
            f.write("\n".join(lines) + "\n")
        data_files.append(name)
        script.append(f"set title '{queue_type} queue'")
        plots = [f"'{name}' using {2 + 3 * i}:{3 + 3 * i}:{4 + 3 * i}"
                 + (":xtic(1)" if i == 0 else "") + f" title '{c}'"
                 for i, c in enumerate(clients)]
        script.append("plot " + ", ".join(plots))
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    for name in data_files:
        os.remove(name)


def scale_chart(data, path_png):
    """The scale curves, one panel each, a line per queue type (gnuplot)."""
    rows = [r for r in data["rows"] if r.get("bench") == "scale" and "failed" not in r]
    if not rows:
        return
    work = os.path.dirname(os.path.abspath(path_png))
    types = data["meta"]["queue_types"]
    panels = [
        ("parking: seconds (log)", "parked messages", "parking", "seconds",
         ["stats", "replay 1%", "replay all"], True),
        ("parking: client peak RSS, MB", "parked messages", "parking", "rss",
         ["stats", "replay all"], False),
        ("wait queue: lateness p99 of new retries, ms (log)", "messages waiting", "wait", "late",
         [None], True),
        ("topology: seconds (log)", "services in the file", "services", "seconds",
         ["apply", "apply again", "verify"], True),
        ("20 ms handlers: msg/s (log)", "concurrency", "handlers", "rate", [None], True),
    ]
    script = ["set terminal pngcairo size 1500,900 font 'DejaVu Sans,10'",
              f"set output '{path_png}'",
              "set multiplot layout 2,3 title 'Scale: how each cost grows with the work'",
              "set grid", "set key top left", "set logscale x", "set format x '%.0s%c'"]
    files = []
    for title, xlabel, part, value, ops, logy in panels:
        plots = []
        for q in types:
            for op in ops:
                points = sorted(
                    (r["count"], {"seconds": lambda r: r["seconds"],
                                  "rss": lambda r: r["peak_rss_kb"] / 1024,
                                  "late": lambda r: r["late_ms"]["p99"],
                                  "rate": lambda r: r["rate"]}[value](r))
                    for r in rows if r["part"] == part and r["queue_type"] == q and
                    (op is None or r.get("op") == op))
                if not points:
                    continue
                name = os.path.join(work, f".scale-{len(files)}.dat")
                with open(name, "w") as f:
                    f.write("\n".join(f"{x} {y}" for x, y in points) + "\n")
                files.append(name)
                label = q + ("" if op is None else f" {op}")
                plots.append(f"'{name}' using 1:2 with linespoints title '{label}'")
        script += [f"set title '{title}'", f"set xlabel '{xlabel}'",
                   "set logscale y" if logy else "unset logscale y", "set yrange [0:*]"
                   if not logy else "set yrange [*:*]"]
        script.append("plot " + ", ".join(plots) if plots else "plot 0 notitle")
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    for name in files:
        os.remove(name)


def readme_block(report, chart_path):
    """The summary bench/README.md shows: headline figures, the targets, the chart."""
    m = report.meta
    load = [r["load"] for r in report.rows if "load" in r]
    lines = [f"From the run of {m['started'][:16]}"
             + (f", {m['total_seconds'] / 60:.0f} minutes for all of `bench/run`"
                if m.get("total_seconds") else "")
             + f", on {m['machine']['cpus']} CPUs"
             + (f" kept busy by other work (load average median {med(load):.1f}, max "
                f"{max(load):.1f}: the broker, which needs CPU for every message, was short of "
                f"it, so absolute rates are low and spreads wide)"
                if load and med(load) > BENCHMARK_LOAD + 1 else
                f" with no other work (load average median {med(load):.1f}: the broker and the "
                f"client under test)" if load else "") + ".", ""]
    consume = report.select("consume")
    if consume:
        lines += ["**Consume and ack** (issue \"Foundation\": retryloop at least 3x pika), "
                  "persistent 1 KB messages, msg/s, median of "
                  f"{m['rounds']} rounds (lowest–highest):", ""]
        header = ["queue", "prefetch", "retryloop", "pika", "retryloop / pika", "best peer",
                  "retryloop / best peer"]
        body = []
        for q in m["queue_types"]:
            for p in m["prefetches"]:
                ours = report.values("consume", client="retryloop", queue_type=q, prefetch=p)
                pika = report.values("consume", client="pika", queue_type=q, prefetch=p)
                peers = {c: med(report.values("consume", client=c, queue_type=q, prefetch=p))
                         for c in PEERS}
                peers = {c: v for c, v in peers.items() if v}
                best = max(peers, key=peers.get) if peers else None
                body.append([q, str(p), spread(ours), spread(pika),
                             fmt_ratio(ratio(med(ours), med(pika))),
                             f"{best} {peers[best]:.0f}" if best else "–",
                             fmt_ratio(ratio(med(ours), peers.get(best)))])
        lines += ["| " + " | ".join(header) + " |",
                  "|---|" + "---:|" * (len(header) - 1)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        lines += ["", "Command: `BENCH_ONLY=consume bench/run` (add "
                  "`BENCH_CLIENTS=retryloop,pika` for those two only).", ""]
    ours = report.values("replay", client="retryloop")
    loop = report.values("replay", client="pika-loop")
    if ours and loop:
        lines += [f"**Replay** (target: at least 10x the pika loop): `retryloop parking replay` "
                  f"moved {m['sizes']['replay']:,} parked 1 KB messages at {spread(ours)} msg/s, "
                  f"the pika get-publish-confirm-ack loop at {spread(loop)} msg/s: "
                  f"**{med(ours) / med(loop):.1f}x**. Command: `BENCH_ONLY=replay bench/run`.", ""]
    relay = report.values("outbox", client="relay-postgresql-1")
    naive = report.values("outbox", client="naive-postgresql")
    ceiling = report.values("outbox", client="broker-publish")
    notify = [r["latency_ms"]["p99"] for r in report.select("outbox-latency", client="notify")]
    if relay:
        lines += [f"**Outbox relay** (targets: at least 5,000 rows/s and 10x the naive loop): one "
                  f"`retryloop outbox relay` drained {m['sizes']['outbox']:,} PostgreSQL rows at "
                  f"{spread(relay)} rows/s"
                  + (f", the naive loop (a transaction per row) {spread(naive)} rows/s: "
                     f"**{med(relay) / med(naive):.1f}x**" if naive else "")
                  + (f"; the broker alone takes the same publishes at {spread(ceiling)} msg/s"
                     if ceiling else "")
                  + (f". Commit-to-publish p99 with notifications: {med(notify):.1f} ms"
                     if notify else "")
                  + ". Command: `BENCH_ONLY=outbox bench/run`.", ""]
    if report.targets:
        lines += ["**Targets** (the reasons for each miss are in the report):", "",
                  "| target | figure | |", "|---|---|---|"]
        lines += [f"| {n} | {f} | {s} |" for n, f, s, _ in report.targets]
        lines += [""]
    lines += [f"![consume and ack throughput]({chart_path})"]
    return "\n".join(lines)


def write(path_json):
    with open(path_json) as f:
        data = json.load(f)
    base = path_json[:-len(".json")] if path_json.endswith(".json") else path_json
    chart(data, base + ".png")
    scale_chart(data, base + "-scale.png")
    report = Report(data)
    report.write(base + ".md", os.path.basename(base) + ".png")
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
    results = os.path.join(os.path.dirname(readme), "results")
    if os.path.abspath(base) == os.path.join(results, "latest") and os.path.exists(readme):
        with open(readme) as f:
            text = f.read()
        begin, end = "<!-- figures:begin -->", "<!-- figures:end -->"
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            tail = rest.split(end, 1)[1]
            block = readme_block(report, "results/latest.png")
            with open(readme, "w") as f:
                f.write(head + begin + "\n" + block + "\n" + end + tail)
