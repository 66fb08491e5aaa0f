#!/usr/bin/env python3
"""An order service for `retryloop dispatch`, on Python's standard library only.

    python3 examples/dispatch/app.py 8000
    retryloop dispatch -t topology/demo.json demo --to http://127.0.0.1:8000/orders

retryloop POSTs each message here. The answer decides: 204 done, 422 parked (a message that can
never succeed), 503 the dependency is down (held by the breaker, not charged), 500 a retry
through the broker's wait queue (docs/dispatch.md).
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Orders(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: retryloop reuses its connections

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        attempt = int(self.headers["Retryloop-Attempt"])
        try:
            order = json.loads(body)
        except ValueError:
            return self.answer(422, b"not JSON")
        if order.get("fail_times", 0) >= attempt:
            return self.answer(500, b"payment gateway timed out")
        print(f"order {self.headers['ce-id']} done on attempt {attempt}", flush=True)
        self.answer(204)

    def answer(self, status, text=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Orders).serve_forever()
