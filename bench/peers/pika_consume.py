"""Consume-and-ack with pika, the seed article's client: the idiomatic BlockingConnection
consumer with a no-op callback that acks each message.

    /usr/bin/python3 bench/peers/pika_consume.py URL QUEUE COUNT PREFETCH
"""
import json
import resource
import sys
import time

import pika


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    url, queue, count, prefetch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    state = {"received": 0, "first": 0.0, "cpu_first": 0.0}

    def on_message(ch, method, properties, body):
        if state["received"] == 0:
            state["first"] = time.monotonic()
            state["cpu_first"] = cpu_seconds()
        ch.basic_ack(delivery_tag=method.delivery_tag)
        state["received"] += 1
        if state["received"] == count:
            state["last"] = time.monotonic()
            state["cpu_last"] = cpu_seconds()
            ch.stop_consuming()

    channel.basic_consume(queue=queue, on_message_callback=on_message)
    channel.start_consuming()
    connection.close()
    seconds = state["last"] - state["first"]
    print(json.dumps({"client": "pika", "messages": count, "prefetch": prefetch,
                      "seconds": round(seconds, 4), "rate": round(count / seconds, 1),
                      "cpu_seconds": round(state["cpu_last"] - state["cpu_first"], 4)}))


if __name__ == "__main__":
    main()
