"""What a Python team writes instead of `retryloop dispatch`: a pika consumer that POSTs each
message to the application over one keep-alive connection (http.client) and settles it by hand:
ack on 2xx, requeue on 429 and 5xx, dead-letter (reject without requeue) on anything else. One
thread, as pika's BlockingConnection asks, with the prefetch given.

    pika_dispatch.py URL QUEUE PREFETCH APP_URL

It runs until it is sent SIGTERM.
"""
import http.client
import signal
import sys
import urllib.parse

import pika


def main():
    url, queue, prefetch, app = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    target = urllib.parse.urlsplit(app)
    session = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_message(ch, method, properties, body):
        headers = {"Content-Type": properties.content_type or "application/octet-stream",
                   "ce-id": properties.message_id or "", "ce-source": queue,
                   "ce-specversion": "1.0", "ce-type": method.routing_key}
        try:
            session.request("POST", target.path or "/", body, headers)
            response = session.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            session.close()  # reconnects on the next request
            status = 503
        if 200 <= status < 300:
            ch.basic_ack(method.delivery_tag)
        elif status == 429 or status >= 500:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_reject(method.delivery_tag, requeue=False)

    signal.signal(signal.SIGTERM, lambda *_: channel.stop_consuming())
    channel.basic_consume(queue=queue, on_message_callback=on_message)
    channel.start_consuming()
    connection.close()


main()
