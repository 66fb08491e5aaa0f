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
        self.out("## 4. Retry loop")
        self.out()
        self.out(f"{self.meta['sizes']['retry']:,} messages in the queue, each failing twice "
                 f"and acked on its third attempt, with a 10 ms wait queue; completed messages "
                 f"per second from the first delivery to the last ack. The seed recipe is the "
                 f"seed article's own code pattern with pika (reject with requeue=false, count "
                 f"from x-death[0], wait queue dead-lettering back through the input exchange); "
                 f"retryloop runs its retry consumer (handler on the loop) in reject mode and in "
                 f"republish mode. Prefetch 200 for all.")
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
                if c != "seed-pika" and v and seed[q]:
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
        self.lateness()

    def lateness(self):
        rows = self.select("lateness")
        if not rows:
            return
        contenders = ["broker-ttl", "seed-pika", "retryloop-reject", "retryloop-republish"]
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
                               "published into the wait queue with a confirm")
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

    def write(self, path_md, chart_name):
        self.header()
        body_start = len(self.lines)
        self.consume()
        self.cpu()
        self.publish()
        self.retry()
        self.memory()
        self.replay()
        body = self.lines[body_start:]
        self.lines = self.lines[:body_start]
        if self.targets:
            self.out("## Targets")
            self.out()
            self.table(["target", "figure", "", "why"],
                       [[n, f, s, w] for n, f, s, w in self.targets], left=4)
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
