"""The `scale` benchmark: how each cost grows with the work (bench.py runs it as `scale`).

Four curves, each on every queue type of the run:

- parking at depth: `retryloop parking stats` (twice), `list --limit 50`, a filtered replay that
  moves 1% and a full replay of a parking queue holding N messages; the wall time and the peak RSS
  of the command;
- a wait queue at depth: N messages already waiting in a 20 s delay tier when new retries join
  them; the new retries' lateness and the broker's peak memory;
- many services: `topology apply`, `verify` and `export` of a file with K services;
- handlers that wait on I/O: a handler that sleeps 20 ms, at each concurrency, with the library's
  default prefetch of 200.
"""
import json
import os
import subprocess
import threading
import time

import bench as b

WAIT_DELAY_S = 20
WAIT_NEW_RETRIES = 500
WAIT_NEW_RATE = 50
HANDLER_SLEEP_MS = 20


def measured(command, timeout=3600):
    """Runs a command; returns (seconds, peak RSS in KB, stdout). Fails loudly on a non-zero exit."""
    t0 = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_chunks, err_chunks = [], []
    readers = [threading.Thread(target=lambda s=s, c=c: c.append(s.read()), daemon=True)
               for s, c in ((process.stdout, out_chunks), (process.stderr, err_chunks))]
    for reader in readers:
        reader.start()
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.time() > deadline:
            process.kill()
            raise RuntimeError(f"{' '.join(command)} timed out")
        time.sleep(0.01)
    seconds = time.time() - t0
    for reader in readers:
        reader.join()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}: "
                           f"{''.join(err_chunks)[-2000:]}")
    return seconds, usage.ru_maxrss, "".join(out_chunks)


def service(name, queue_type, mode="reject", delays=("1s",), parking=None):
    s = {"name": name, "queue_type": queue_type,
         "input": {"exchange": name + ".in", "type": "direct", "bindings": [name]},
         "retry": {"mode": mode, "delays": list(delays), "max_attempts": 5}}
    if parking:
        s["parking"] = parking
    return s


def write_topology(bench, name, services):
    path = os.path.join(bench.work, name + ".json")
    with open(path, "w") as f:
        json.dump({"services": services}, f)
    return path


def parking(bench, queue_type, count):
    name = f"bench.scale.park.{queue_type}.{count}"
    path = write_topology(bench, name, [service(name, queue_type)])
    b.run([b.CLI, "topology", "apply", path, "--url", bench.url])
    fill_t0 = time.time()
    bench.tool("fill", "--queue", name + ".parking", "--count", count, "--parked",
               "--rare-every", 100, timeout=7200)
    b.log(f"scale parking {queue_type} {count:,}: filled in {time.time() - fill_t0:.0f} s")
    operations = [
        ("stats", ["stats", "-t", path, name, "--json"], count),
        # The first read after the fill reads what the broker has paged out; the second, less.
        ("stats again", ["stats", "-t", path, name, "--json"], count),
        ("list 50", ["list", "-t", path, name, "--limit", "50", "--json"], 50),
        ("replay 1%", ["replay", "-t", path, name, "--where",
                       "retryloop-error=certificate expired"], count // 100),
        ("replay all", ["replay", "-t", path, name], count - count // 100),
    ]
    for op, args, moved in operations:
        bench.broker.wait_quiet()
        command = [b.CLI, "parking"] + args + ["--url", bench.url]
        try:
            seconds, rss, _ = measured(command)
        except RuntimeError as e:
            bench.record({"failed": str(e)[:500]}, bench="scale", part="parking", op=op,
                         queue_type=queue_type, count=count)
            continue
        # A filtered replay reads every parked message to find the 1%: its rate is of reading.
        rate = (count if op == "replay 1%" else moved) / seconds
        row = bench.record({"seconds": round(seconds, 3), "peak_rss_kb": rss, "moved": moved,
                            "rate": round(rate, 1)},
                           bench="scale", part="parking", op=op, queue_type=queue_type,
                           count=count)
        b.log(f"scale parking {queue_type} {count:,}: {op:10s} {seconds:7.2f} s, peak RSS "
              f"{rss / 1024:6.1f} MB" + (f", {row['rate']:,.0f} msg/s" if op.startswith("replay")
                                         else ""))
    b.run([b.CLI, "topology", "delete", path, "--yes", "--force", "--url", bench.url])


def waiting(bench, queue_type, depth):
    name = f"bench.scale.wait.{queue_type}.{depth}"
    path = write_topology(bench, name, [service(name, queue_type, delays=(f"{WAIT_DELAY_S}s",))])
    b.run([b.CLI, "topology", "apply", path, "--url", bench.url])
    consumer = [b.TOOL, "retry", "--url", bench.url, "--topology", path, "--service", name,
                "--count", str(WAIT_NEW_RETRIES), "--fail", "1", "--prefetch",
                str(b.RETRY_PREFETCH), "--lateness"]
    bench.broker.wait_quiet()
    rss_before = bench.broker.rss_kb()
    with bench.broker as memory:
        process = subprocess.Popen(consumer, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        time.sleep(1.5)
        fill_t0 = time.time()
        bench.tool("fill", "--queue", f"{name}.wait.{WAIT_DELAY_S}s", "--count", depth, "--fresh",
                   "--ballast", timeout=7200)
        fill_seconds = time.time() - fill_t0
        depth_rss = bench.broker.rss_kb()
        b.run([b.TOOL, "publish", "--url", bench.url, "--queue", name, "--count",
               str(WAIT_NEW_RETRIES), "--window", "100", "--rate", str(WAIT_NEW_RATE), "--fresh"])
        stdout, stderr = process.communicate(timeout=7200)
    if process.returncode != 0:
        bench.record({"failed": stderr[-500:]}, bench="scale", part="wait", queue_type=queue_type,
                     count=depth)
        return
    row = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    late = row["late_ms"]
    bench.record({"late_ms": late, "fill_seconds": round(fill_seconds, 2),
                  "broker_rss_before_kb": rss_before, "broker_rss_at_depth_kb": depth_rss,
                  "broker_peak_rss_kb": memory.peak_rss_kb, "messages": WAIT_NEW_RETRIES},
                 bench="scale", part="wait", queue_type=queue_type, count=depth)
    b.log(f"scale wait {queue_type} {depth:,}: lateness p50 {late['p50']:.1f} ms p99 "
          f"{late['p99']:.1f} ms, broker RSS {rss_before / 1024:.0f} -> {memory.peak_rss_kb / 1024:.0f}"
          f" MB (filled in {fill_seconds:.0f} s)")
    b.run([b.CLI, "topology", "delete", path, "--yes", "--force", "--url", bench.url])


def services(bench, queue_type, count):
    name = f"bench.scale.svc.{queue_type}.{count}"
    path = write_topology(bench, name, [
        service(f"{name}.{k}", queue_type, mode="republish", delays=("1s", "10s"),
                parking={"max_length": 100000}) for k in range(count)])
    bench.broker.wait_quiet()
    times = {}
    for op, command in (("apply", ["topology", "apply", path, "--url", bench.url]),
                        ("apply again", ["topology", "apply", path, "--url", bench.url]),
                        ("verify", ["topology", "verify", path, "--url", bench.url]),
                        ("export", ["topology", "export", path])):
        seconds, rss, _ = measured([b.CLI] + command)
        times[op] = seconds
        bench.record({"seconds": round(seconds, 3), "peak_rss_kb": rss}, bench="scale",
                     part="services", op=op, queue_type=queue_type, count=count)
    b.log(f"scale services {queue_type} {count}: apply {times['apply']:.2f} s (again "
          f"{times['apply again']:.2f} s), verify "
          f"{times['verify']:.2f} s, export {times['export']:.2f} s")
    b.run([b.CLI, "topology", "delete", path, "--yes", "--force", "--url", bench.url],
          timeout=3600)


def handlers(bench, queue_type, concurrency):
    name = f"bench.scale.handlers.{queue_type}.{concurrency}"
    path = write_topology(bench, name, [service(name, queue_type)])
    b.run([b.CLI, "topology", "apply", path, "--url", bench.url])
    count = min(200 * concurrency, 10000)
    bench.tool("fill", "--queue", name, "--count", count, "--fresh")
    bench.broker.wait_quiet()
    row = b.run([b.TOOL, "handlers", "--url", bench.url, "--topology", path, "--service", name,
                 "--count", str(count), "--concurrency", str(concurrency), "--sleep-ms",
                 str(HANDLER_SLEEP_MS)])
    bench.record(row, bench="scale", part="handlers", queue_type=queue_type,
                 count=concurrency)
    b.log(f"scale handlers {queue_type} concurrency {concurrency}: {row['rate']:,.0f} msg/s "
          f"(at most {1000 / HANDLER_SLEEP_MS * concurrency:,.0f}), peak RSS "
          f"{row['peak_rss_kb'] / 1024:.1f} MB")
    b.run([b.CLI, "topology", "delete", path, "--yes", "--force", "--url", bench.url])


def run(bench):
    sizes = b.SCALE_SIZES
    bench.meta["scale"] = sizes
    # The wall time of each curve's point, so that a full run also tells what the default
    # sizes cost.
    part_seconds = bench.meta.setdefault("scale_part_seconds", {})

    def timed(part, queue_type, size, function):
        t0 = time.time()
        function(bench, queue_type, size)
        part_seconds[f"{part} {queue_type} {size}"] = round(time.time() - t0, 1)

    for queue_type in b.QUEUE_TYPES:
        for concurrency in sizes["concurrency"]:
            timed("handlers", queue_type, concurrency, handlers)
        for count in sizes["services"]:
            timed("services", queue_type, count, services)
        for depth in sizes["wait"]:
            timed("wait", queue_type, depth, waiting)
        for count in sizes["parking"]:
            timed("parking", queue_type, count, parking)
