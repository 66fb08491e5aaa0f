"""The outage benchmark's pika consumer: a fixed retry count, no breaker (bench/outage.py).

    outage_pika.py AMQP_URL SERVICE DEPENDENCY_URL CONCURRENCY

Consumes SERVICE's queue with a prefetch of CONCURRENCY and as many worker threads. Each message
calls GET DEPENDENCY_URL?id=ID (2 s timeout). A 2xx is an ack. Anything else republishes the
message at once to its queue with x-retries + 1 and acks the original, until the 4th attempt,
which goes to SERVICE.parking. A body that is not JSON is parked at once. One JSON line per
outcome on stdout, as examples/demo_consumer prints them.
"""
import concurrent.futures
import functools
import json
import sys
import urllib.error
import urllib.request

import pika

MAX_ATTEMPTS = 4


def call(url, message_id):
    try:
        with urllib.request.urlopen(f"{url}?id={message_id}", timeout=2) as answer:
            return 200 <= answer.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main():
    amqp_url, service, dependency, concurrency = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_qos(prefetch_count=concurrency)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency)

    def settle(method, properties, body, message_id, attempt, ok):
        headers = dict(properties.headers or {})
        if ok:
            outcome = "ack"
        elif message_id is None or attempt >= MAX_ATTEMPTS:
            outcome = "parked"
            channel.basic_publish(service + ".parking", "", body, properties)
        else:
            outcome = "retry"
            headers["x-retries"] = attempt
            properties.headers = headers
            channel.basic_publish("", service, body, properties)
        channel.basic_ack(method.delivery_tag)
        print(json.dumps({"id": message_id, "attempt": attempt, "outcome": outcome},
                         separators=(",", ":")), flush=True)

    def work(method, properties, body):
        attempt = int((properties.headers or {}).get("x-retries", 0)) + 1
        try:
            message_id = json.loads(body)["id"]
        except (ValueError, KeyError, TypeError):
            message_id = None
        ok = message_id is not None and call(dependency, message_id)
        connection.add_callback_threadsafe(
            functools.partial(settle, method, properties, body, message_id, attempt, ok))

    def on_message(_channel, method, properties, body):
        pool.submit(work, method, properties, body)

    channel.basic_consume(service, on_message)
    try:
        channel.start_consuming()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
