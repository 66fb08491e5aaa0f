"""The pika peer (python3-pika, the seed article's client), written the way pika's own examples are.

    pika_bench.py consume URL QUEUE COUNT PREFETCH      BlockingConnection consumer, ack each
    pika_bench.py handle URL QUEUE COUNT PREFETCH       the same, parsing each JSON body (json.loads)
                                                        and reading a field before the ack
    pika_bench.py publish URL QUEUE COUNT WINDOW        confirms; WINDOW 1: BlockingChannel,
                                                        one at a time; more: SelectConnection
    pika_bench.py seed-setup URL NAME TTL_MS TYPE       the seed recipe's exchanges and queues
    pika_bench.py seed URL NAME COUNT FAIL PREFETCH [lateness TTL_MS]
                                                        the seed recipe's consumer: reject
                                                        (requeue=False) while x-death[0].count < FAIL
    pika_bench.py replay URL FROM TO COUNT              get, publish with confirm, ack: the loop
                                                        one writes to move parked messages back
    pika_bench.py delayed-setup URL NAME MIN_MS         a quorum queue with RabbitMQ 4.3's delayed
                                                        retry (x-delayed-retry-type failed)
    pika_bench.py delayed URL NAME COUNT FAIL PREFETCH [lateness MIN_MS]
                                                        its consumer: reject (requeue=True) while
                                                        x-delivery-count < FAIL; the broker holds
                                                        each return for MIN_MS x delivery count

Each prints one JSON line: the time from the first delivery (or publish) to the last ack (or
confirm), and the process's CPU time over the same window.
"""
import datetime
import json
import resource
import sys
import time

import pika

HEADERS = {
    "x-death": [
        {"count": 2, "reason": reason, "queue": queue,
         "time": datetime.datetime.fromtimestamp(1700000000, datetime.timezone.utc),
         "exchange": "orders.in", "routing-keys": ["order.created"]}
        for queue, reason in (("orders.wait.30s", "expired"), ("orders", "rejected"))
    ],
    "x-first-death-exchange": "orders.in",
    "x-first-death-queue": "orders",
    "x-first-death-reason": "rejected",
    "trace-id": "4bf92f3577b34da6a3ce929d0e0e4736",
}
PROPERTIES = pika.BasicProperties(delivery_mode=2, content_type="application/json",
                                  message_id="bench", headers=HEADERS)
BODY = b"x" * 1024


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Window:
    """Time and CPU from start() to stop()."""

    def start(self):
        self.t0, self.cpu0 = time.time(), cpu_seconds()

    def stop(self):
        self.t1, self.cpu = time.time(), cpu_seconds() - self.cpu0

    def report(self, client, bench, count, **extra):
        seconds = self.t1 - self.t0
        print(json.dumps({"client": client, "bench": bench, "messages": count, **extra,
                          "seconds": round(seconds, 4), "rate": round(count / seconds, 1),
                          "cpu_seconds": round(self.cpu, 4), "t0": self.t0, "t1": self.t1}))


def consume(url, queue, count, prefetch, parse=False):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    window, received = Window(), 0

    def on_message(ch, method, properties, body):
        nonlocal received
        if received == 0:
            window.start()
        if parse and "order_id" not in json.loads(body):
            raise SystemExit("not a JSON order")
        ch.basic_ack(delivery_tag=method.delivery_tag)
        received += 1
        if received == count:
            window.stop()
            ch.stop_consuming()

    channel.basic_consume(queue=queue, on_message_callback=on_message)
    channel.start_consuming()
    connection.close()
    window.report("pika", "handle" if parse else "consume", count, prefetch=prefetch)


def publish_one_at_a_time(url, queue, count):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    window = Window()
    window.start()
    for _ in range(count):
        channel.basic_publish("", queue, BODY, PROPERTIES)  # returns once confirmed
    window.stop()
    connection.close()
    window.report("pika", "publish", count, window=1)


def publish_pipelined(url, queue, count, limit):
    """BlockingChannel waits for each confirm; a window needs the asynchronous SelectConnection."""
    window, state = Window(), {"published": 0, "confirmed": 0}

    def publish_more(channel):
        while state["published"] < count and state["published"] - state["confirmed"] < limit:
            channel.basic_publish("", queue, BODY, PROPERTIES)
            state["published"] += 1

    def on_confirm(frame):
        ack = frame.method
        if not isinstance(ack, pika.spec.Basic.Ack):
            raise SystemExit("publish was nacked")
        state["confirmed"] = ack.delivery_tag if ack.multiple else state["confirmed"] + 1
        if state["confirmed"] == count:
            window.stop()
            connection.close()
        else:
            publish_more(channel)

    def on_channel(ch):
        global channel
        channel = ch
        ch.confirm_delivery(on_confirm, callback=lambda _: (window.start(), publish_more(ch)))

    connection = pika.SelectConnection(
        pika.URLParameters(url), on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda c, reason: c.ioloop.stop())
    connection.ioloop.start()
    window.report("pika", "publish", count, window=limit)


def seed_setup(url, name, ttl_ms, queue_type):
    """The seed article's init_rmq(), with its settings as arguments (and the queue type)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    arguments = {"x-queue-type": queue_type}
    channel.exchange_declare(exchange=name + ".inner_exch", exchange_type="fanout")
    channel.exchange_declare(exchange=name + ".dead_exch", exchange_type="fanout")
    channel.queue_declare(queue=name, durable=True,
                          arguments={**arguments, "x-dead-letter-exchange": name + ".dead_exch"})
    channel.queue_declare(queue=name + ".dead", durable=True,
                          arguments={**arguments, "x-message-ttl": ttl_ms,
                                     "x-dead-letter-exchange": name + ".inner_exch"})
    channel.queue_bind(exchange=name + ".dead_exch", queue=name + ".dead")
    channel.queue_bind(name, name + ".inner_exch")
    connection.close()


def retry_loop(url, name, count, prefetch, retry_now, requeue, wait_ms=None):
    """A consumer that rejects a delivery while retry_now(properties) says so (requeue as given)
    and acks it otherwise; the run ends after `count` acks. With wait_ms(properties), the delay
    the next delivery should have waited: then also each retry's time from the reject to that
    delivery, minus that delay."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    window, started, acked, rejected_at, late_ms = Window(), False, 0, {}, []

    def callback(ch, method, properties, body):
        nonlocal started, acked
        now = time.monotonic()
        if not started:
            window.start()
            started = True
        seq = (properties.headers or {}).get("bench-seq")
        if wait_ms is not None and seq in rejected_at:
            late_ms.append((now - rejected_at.pop(seq)) * 1000 - wait_ms(properties))
        if retry_now(properties):
            if wait_ms is not None:
                rejected_at[seq] = now
            ch.basic_reject(delivery_tag=method.delivery_tag, requeue=requeue)
            return
        ch.basic_ack(delivery_tag=method.delivery_tag)
        acked += 1
        if acked == count:
            window.stop()
            ch.stop_consuming()

    channel.basic_consume(queue=name, on_message_callback=callback)
    channel.start_consuming()
    connection.close()
    extra = {}
    if wait_ms is not None:
        late_ms.sort()
        extra["late_ms"] = {"p50": late_ms[len(late_ms) // 2],
                            "p99": late_ms[min(len(late_ms) - 1, int(len(late_ms) * 0.99))],
                            "max": late_ms[-1], "samples": len(late_ms)}
    return window, extra


def seed(url, name, count, fail, prefetch, ttl_ms=None):
    """The seed article's consumer: callback() and can_retry() as written there (x-death[0]'s
    count against RETRY_COUNT = `fail`), with the no-op work acked where the seed drops the
    message. The run ends after `count` acks. With ttl_ms, also the time from each reject to the
    next delivery."""
    def can_retry(properties):
        deaths = (properties.headers or {}).get("x-death")
        if not deaths:
            return True
        if deaths[0]["count"] >= fail:
            return False
        return True

    window, extra = retry_loop(url, name, count, prefetch, can_retry, False,
                               None if ttl_ms is None else lambda properties: ttl_ms)
    window.report("seed-pika", "lateness" if ttl_ms is not None else "retry", count, fail=fail,
                  **extra)


def delayed_setup(url, name, min_ms):
    """One quorum queue that holds a failed delivery in itself for min_ms x its delivery count
    (RabbitMQ 4.3), with a delivery limit it never reaches: no wait queue, no dead-lettering."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare(queue=name, durable=True,
                          arguments={"x-queue-type": "quorum", "x-delivery-limit": 1000000,
                                     "x-delayed-retry-type": "failed",
                                     "x-delayed-retry-min": min_ms,
                                     "x-delayed-retry-max": min_ms * 100})
    connection.close()


def delayed(url, name, count, fail, prefetch, min_ms=None):
    """The same work as seed() through the queue's delayed retry: reject with requeue while the
    broker's x-delivery-count (failed deliveries) is below `fail`, then ack. With min_ms, also
    the time from each reject to the next delivery against the delay the broker should hold it
    for (min_ms x the delivery count it then carries)."""
    def failed(properties):
        return (properties.headers or {}).get("x-delivery-count", 0)

    window, extra = retry_loop(url, name, count, prefetch,
                               lambda properties: failed(properties) < fail, True,
                               None if min_ms is None else
                               lambda properties: min_ms * failed(properties))
    window.report("delayed-pika", "lateness" if min_ms is not None else "retry", count, fail=fail,
                  **extra)


def move_one_at_a_time(channel, source, target, count):
    for _ in range(count):
        method, properties, body = channel.basic_get(source)
        if method is None:
            raise SystemExit(f"{source} is empty after fewer than {count} messages")
        # Waits for its confirm; raises if it was returned.
        channel.basic_publish("", target, body, properties, mandatory=True)
        channel.basic_ack(method.delivery_tag)


def replay(url, source, target, count):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    window = Window()
    window.start()
    move_one_at_a_time(channel, source, target, count)
    window.stop()
    connection.close()
    window.report("pika-loop", "replay", count)


def migrate(url, queue, queue_type, count):
    """What NServiceBus's `queue migrate-to-quorum` does, with the endpoint stopped: every
    message into a holding queue of the new type, one at a time (basic.get, publish, wait for the
    confirm, ack), the queue deleted and declared again with the new type, and every message
    moved back the same way. The queue's bindings are left to the caller (the benchmark binds
    none)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    arguments = {"x-queue-type": queue_type}
    holding = queue + ".pika-holding"
    window = Window()
    window.start()
    channel.queue_declare(holding, durable=True, arguments=arguments)
    move_one_at_a_time(channel, queue, holding, count)
    channel.queue_delete(queue)
    channel.queue_declare(queue, durable=True, arguments=arguments)
    # A new channel: RabbitMQ 3.10 closes the connection (541) when a channel that published to a
    # queue publishes to one declared again under its name with another type.
    channel.close()
    channel = connection.channel()
    channel.confirm_delivery()
    move_one_at_a_time(channel, holding, queue, count)
    channel.queue_delete(holding)
    window.stop()
    connection.close()
    window.report("pika-loop", "migrate", count, moved=2 * count)


def transfer(url, new_url, queues):
    """What a team moving a service by hand (or a shovel) does: each queue's messages published
    to the same queue on the new broker, one at a time (basic.get on the old broker, publish and
    wait for the confirm on the new one, then ack). A retry lands in the new wait queue as a new
    message and waits its whole delay again. `queues`: NAME=COUNT, in the order to move them."""
    old = pika.BlockingConnection(pika.URLParameters(url))
    new = pika.BlockingConnection(pika.URLParameters(new_url))
    source = old.channel()
    target = new.channel()
    target.confirm_delivery()
    total = 0
    window = Window()
    window.start()
    for spec in queues:
        queue, count = spec.rsplit("=", 1)
        for _ in range(int(count)):
            method, properties, body = source.basic_get(queue)
            if method is None:
                raise SystemExit(f"{queue} is empty after fewer than {count} messages")
            target.basic_publish("", queue, body, properties, mandatory=True)
            source.basic_ack(method.delivery_tag)
        total += int(count)
    window.stop()
    old.close()
    new.close()
    window.report("pika-loop", "transfer", total)


def main():
    mode, url, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode in ("consume", "handle"):
        consume(url, args[0], int(args[1]), int(args[2]), parse=mode == "handle")
    elif mode == "publish" and int(args[2]) == 1:
        publish_one_at_a_time(url, args[0], int(args[1]))
    elif mode == "publish":
        publish_pipelined(url, args[0], int(args[1]), int(args[2]))
    elif mode == "seed-setup":
        seed_setup(url, args[0], int(args[1]), args[2])
    elif mode == "seed":
        ttl_ms = int(args[5]) if len(args) > 5 and args[4] == "lateness" else None
        seed(url, args[0], int(args[1]), int(args[2]), int(args[3]), ttl_ms)
    elif mode == "replay":
        replay(url, args[0], args[1], int(args[2]))
    elif mode == "migrate":
        migrate(url, args[0], args[1], int(args[2]))
    elif mode == "transfer":
        transfer(url, args[0], args[1:])
    elif mode == "delayed-setup":
        delayed_setup(url, args[0], int(args[1]))
    elif mode == "delayed":
        min_ms = int(args[5]) if len(args) > 5 and args[4] == "lateness" else None
        delayed(url, args[0], int(args[1]), int(args[2]), int(args[3]), min_ms)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
