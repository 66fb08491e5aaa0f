#!/usr/bin/env python3
"""How long a normal request waits while idle and slow clients hold connections.

Opens IDLE connections that send nothing and SLOW connections that send a request head one byte
a second, then times normal GETs of PATH, one after another, and prints the latencies (median and
worst) with the clients' state. Works against both HTTP endpoints:

  bench/http_stall.py --url http://127.0.0.1:8080/api/whoami --header 'X-Retryloop-Token: TOKEN'
  bench/http_stall.py --url http://127.0.0.1:9464/healthz

The target: with 300 idle and 12 slow clients open, every normal request is answered within 1 s.
"""

import argparse
import socket
import statistics
import threading
import time
import urllib.parse


def open_idle(host, port, count):
    sockets = []
    for _ in range(count):
        sockets.append(socket.create_connection((host, port), timeout=10))
    return sockets


def trickle(host, port, path, stop, closed):
    """Sends a request head one byte a second until the server closes or `stop` is set."""
    head = f'GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Slow: ' + 'x' * 4096
    try:
        with socket.create_connection((host, port), timeout=10) as sock:
            for byte in head.encode():
                if stop.wait(1):
                    return
                sock.sendall(bytes([byte]))
    except OSError:
        pass
    closed.append(time.monotonic())


def timed_get(host, port, path, headers):
    request = f'GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n'
    request += ''.join(f'{h}\r\n' for h in headers) + '\r\n'
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=120) as sock:
        sock.sendall(request.encode())
        answer = b''
        while b'\r\n' not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return time.monotonic() - start, answer.split(b'\r\n', 1)[0].decode(errors='replace')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--url', required=True, help='the normal request, http://HOST:PORT/PATH')
    parser.add_argument('--header', action='append', default=[], help='NAME: VALUE, repeatable')
    parser.add_argument('--idle', type=int, default=300)
    parser.add_argument('--slow', type=int, default=12)
    parser.add_argument('--requests', type=int, default=20)
    args = parser.parse_args()
    url = urllib.parse.urlsplit(args.url)
    host, port, path = url.hostname, url.port or 80, url.path or '/'

    idle = open_idle(host, port, args.idle)
    stop = threading.Event()
    closed = []
    slow = [threading.Thread(target=trickle, args=(host, port, path, stop, closed), daemon=True)
            for _ in range(args.slow)]
    for thread in slow:
        thread.start()
    time.sleep(1.5)  # every slow client has sent a byte or two

    latencies = []
    statuses = set()
    for _ in range(args.requests):
        seconds, status = timed_get(host, port, path, args.header)
        latencies.append(seconds)
        statuses.add(status)
    stop.set()
    for sock in idle:
        sock.close()
    print(f'{args.idle} idle and {args.slow} slow clients; {args.requests} requests of {path}: '
          f'median {statistics.median(latencies) * 1000:.1f} ms, '
          f'worst {max(latencies) * 1000:.1f} ms; answers: {", ".join(sorted(statuses))}')


if __name__ == '__main__':
    main()
