#!/usr/bin/python3
"""The application that `retryloop dispatch` posts to in tests/integration/dispatch_test.cpp.

    dispatch_app.py LOG [--port N | --unix PATH] [--tls-cert PEM --tls-key PEM]

Each request's body says how to answer it, as a JSON object whose keys are all optional:

    status    the answer's status (default 204)
    times     answer so while Retryloop-Attempt is at most this, then 204
    requests  answer so to the first this many requests of the message (by ce-id), then 204
    headers   header fields of the answer, {"Retry-After": "2"}
    body      the answer's body
    huge      a body of this many bytes instead
    endless   true: a body that never ends (chunked, until the client hangs up)
    sleep_ms  wait this long before answering

A body that is not such an object gets 204. Each request adds one JSON line to LOG as it arrives,
before any wait: its time (seconds since the epoch), path, header fields as sent, body length and
the status it gets. The port (port 0, the default, picks a free one) or the socket's path is
printed once the server listens.
"""

import argparse
import json
import os
import socketserver
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = b"x" * 65536


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    lock = threading.Lock()
    requests_of = {}  # ce-id: requests seen
    log = None

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            plan = json.loads(body)
        except ValueError:
            plan = None
        if not isinstance(plan, dict):
            plan = {}
        message = self.headers.get("ce-id", "")
        with App.lock:
            seen = App.requests_of[message] = App.requests_of.get(message, 0) + 1
        attempt = int(self.headers.get("Retryloop-Attempt", "1"))
        status = plan.get("status", 204)
        if attempt > plan.get("times", attempt) or seen > plan.get("requests", seen):
            status, plan = 204, {}
        with App.lock:
            App.log.write(json.dumps({"time": time.time(), "path": self.path,
                                      "headers": dict(self.headers.items()),
                                      "body_length": len(body), "status": status}) + "\n")
            App.log.flush()
        time.sleep(plan.get("sleep_ms", 0) / 1000)
        try:
            self.answer(status, plan)
        except OSError:  # the client hung up: a timeout, or a body it cut
            self.close_connection = True

    def answer(self, status, plan):
        self.send_response(status)
        for name, value in plan.get("headers", {}).items():
            self.send_header(name, value)
        if plan.get("endless"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
        body = plan.get("body", "").encode()
        size = plan.get("huge", len(body))
        if status != 204:
            self.send_header("Content-Length", str(size))
        self.end_headers()
        if "huge" in plan:
            for start in range(0, size, len(CHUNK)):
                self.wfile.write(CHUNK[:size - start])
        else:
            self.wfile.write(body)

    def log_message(self, format, *args):
        pass


class UnixApp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--unix")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    App.log = open(args.log, "a")
    if args.unix:
        if os.path.exists(args.unix):
            os.unlink(args.unix)
        server = UnixApp(args.unix, App)
        listening = args.unix
    else:
        ThreadingHTTPServer.daemon_threads = True
        server = ThreadingHTTPServer(("127.0.0.1", args.port), App)
        listening = server.server_address[1]
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(listening, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
