"""The `dispatch` benchmark (bench.py runs it as `dispatch`): a service's messages handed to an
HTTP application that answers 204 at once (bench/http_204.cpp: one thread, epoll, a few
microseconds a request, so that the dispatcher is what is measured).

Contenders, each draining the same N messages (1 KB JSON orders) from a classic queue:

- `retryloop dispatch` at concurrency 64 (a pool of 64 keep-alive connections);
- what a Python team writes instead (bench/peers/pika_dispatch.py): a pika consumer that POSTs
  each message over one keep-alive connection and acks by hand, prefetch 64;
- the in-process retry consumer with its handler on the loop, concurrency 64, whose handler parses
  the body and acks (bench_retryloop handle): the cost of the consumer without the HTTP exchange,
  against which the dispatcher's CPU per message is compared.

Each row: messages a second from the application's first request to its N-th (the in-process
consumer: from its first handler call to its N-th ack), the contender's CPU per message over that
window, the broker's, and the application's.
"""
import json
import os
import signal
import subprocess
import threading
import time

import bench as b

CONCURRENCY = 64


def process_cpu(pid):
    """User and system CPU seconds of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class App:
    """The 204 application: started before a contender, read line by line as it reports."""

    def __init__(self, count):
        self.process = subprocess.Popen([os.path.join(b.BUILD, "bench", "bench_http_204"),
                                         str(count)], stdout=subprocess.PIPE, text=True)
        self.lines = []
        self.first = threading.Event()
        self.done = threading.Event()
        self.on_first = None
        self.on_done = None
        self.port = json.loads(self.process.stdout.readline())["listening"]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            report = json.loads(line)
            if "last" in report:
                if self.on_done:
                    self.on_done()
                self.lines.append(report)
                self.done.set()
            elif "first" in report:
                if self.on_first:
                    self.on_first()
                self.first.set()

    def stop(self):
        cpu = process_cpu(self.process.pid)
        self.process.terminate()
        self.process.wait()
        return cpu


def measure(bench, command, count, label):
    """Runs `command` until the application has answered `count` requests; the contender's,
    the broker's and the application's CPU over the window from the first request to the last."""
    app = App(count)
    command = [part.replace("APP_PORT", str(app.port)) for part in command]
    quiet_wait = bench.broker.wait_quiet()
    contender = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
    marks = {}
    app.on_first = lambda: marks.update(cpu0=process_cpu(contender.pid),
                                        app0=process_cpu(app.process.pid))
    app.on_done = lambda: marks.update(cpu1=process_cpu(contender.pid),
                                       app1=process_cpu(app.process.pid))
    try:
        with bench.broker:
            if not app.done.wait(timeout=max(300, count / 20)):
                raise RuntimeError(f"{label}: the application saw "
                                   f"{'some' if app.first.is_set() else 'no'} requests, not "
                                   f"{count}, in time")
    except RuntimeError as e:
        contender.kill()
        contender.wait()
        app.stop()
        b.log(f"FAILED: {e}")
        return {"failed": str(e), "messages": count}
    contender.send_signal(signal.SIGTERM)
    try:
        contender.wait(timeout=60)
    except subprocess.TimeoutExpired:
        contender.kill()
        contender.wait()
    app.stop()
    report = app.lines[-1]
    seconds = report["last"] - report["first"]
    return {"messages": count, "seconds": round(seconds, 4), "rate": round(count / seconds, 1),
            "cpu_seconds": round(marks["cpu1"] - marks["cpu0"], 4),
            "app_cpu_seconds": round(marks["app1"] - marks["app0"], 4),
            "broker_cpu_seconds": round(bench.broker.cpu_between(report["first"], report["last"]),
                                        4),
            "broker_quiet_wait_seconds": quiet_wait}


def run(bench):
    count = b.SIZES["dispatch"]
    name = "bench.dispatch"
    path = bench.topology(name, "classic", "reject", "30s")
    contenders = {
        "retryloop-dispatch": [b.CLI, "dispatch", "-t", path, name, "--url", bench.url, "--to",
                               "http://127.0.0.1:APP_PORT/orders", "--concurrency",
                               str(CONCURRENCY), "--prefetch", str(2 * CONCURRENCY)],
        "pika-http.client": [b.PYTHON, os.path.join(b.HERE, "peers", "pika_dispatch.py"),
                             bench.url, name, str(CONCURRENCY),
                             "http://127.0.0.1:APP_PORT/orders"],
    }
    if "pika" not in b.CLIENTS:
        del contenders["pika-http.client"]
    for r in range(b.ROUNDS):
        for contender in b.rotate(list(contenders) + ["retryloop-in-process"], r):
            bench.tool("fill", "--queue", name, "--count", count, "--fresh", "--json",
                       timeout=3600)
            if contender == "retryloop-in-process":
                row = bench.timed([b.TOOL, "handle", "--url", bench.url, "--topology", path,
                                   "--service", name, "--count", str(count), "--prefetch",
                                   str(2 * CONCURRENCY), "--concurrency", str(CONCURRENCY),
                                   "--on-loop"], count)
            else:
                row = measure(bench, contenders[contender], count, contender)
            bench.record(row, bench="dispatch", client=contender, concurrency=CONCURRENCY,
                         round=r + 1)
            if "failed" not in row:
                app = (f"  app {row['app_cpu_seconds'] / count * 1e6:6.1f} us/msg"
                       if "app_cpu_seconds" in row else "")
                b.log_rate(f"dispatch round {r + 1}: {contender:20s}", row, count)
                if app:
                    b.log(f"{'':40s}{app}")
    bench.drop_topology(path)
