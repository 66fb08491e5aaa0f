#!/usr/bin/python3
"""Every metric the Grafana dashboard and the alert rules in ops/ name is one that retryloop
serves: a live demo consumer (its operations endpoint), a console (retryloop parking serve), an
outbox relay (retryloop outbox relay --metrics-listen, on an SQLite file) and a dispatcher
(retryloop dispatch --http, of a second service, its application absent) are scraped against the
broker of scripts/with-broker (RETRYLOOP_TEST_URL), and the names in the dashboard's queries and
the rules' expressions are looked up among the families they served."""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

NAME = re.compile(r'\b((?:retryloop|messaging)_[a-z0-9_]+)\b')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def scrape(url, headers=None, timeout=30):
    """The text at url once it answers 200, trying for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.read().decode()
        except Exception as error:  # not up yet
            last = error
            time.sleep(0.2)
    sys.exit(f'FAIL: {url} did not answer: {last}')


def families(text):
    """The names a scrape can be queried by: each family, and a histogram's series."""
    names = set()
    for line in text.splitlines():
        match = re.match(r'# TYPE (\S+) (\S+)', line)
        if not match:
            continue
        name, kind = match.groups()
        names.add(name)
        if kind == 'histogram':
            names.update({name + '_bucket', name + '_sum', name + '_count'})
    return names


def named_in(text):
    """Metric names in PromQL text, leaving out label names (followed by = or ~) and words of
    annotations, which the caller does not pass."""
    found = set()
    for match in NAME.finditer(text):
        rest = text[match.end():].lstrip()
        if rest[:1] in ('=', '!') or rest[:2] == '=~':
            continue  # a label matcher
        found.add(match.group(1))
    return found


def rule_expressions(path):
    """The `expr:` of each rule, block scalars included, read without a YAML library."""
    exprs, current, indent = [], None, 0
    for line in open(path):
        stripped = line.strip()
        if current is not None:
            if stripped and len(line) - len(line.lstrip()) > indent:
                current.append(stripped)
                continue
            exprs.append(' '.join(current))
            current = None
        match = re.match(r'(\s*)expr:\s*(.*)', line)
        if match:
            indent = len(match.group(1))
            value = match.group(2).strip()
            if value in ('|', '>', '|-', '>-'):
                current = []
            else:
                exprs.append(value)
    if current is not None:
        exprs.append(' '.join(current))
    return exprs


def dashboard_expressions(path):
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ('expr', 'definition') and isinstance(value, str):
                    exprs.append(value)
                elif key == 'query' and isinstance(value, (str, dict)):
                    walk(value) if isinstance(value, dict) else exprs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.load(open(path)))
    return exprs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--retryloop', required=True)
    parser.add_argument('--demo-consumer', required=True)
    parser.add_argument('--ops', required=True)
    args = parser.parse_args()
    url = os.environ.get('RETRYLOOP_TEST_URL')
    if not url:
        sys.exit('FAIL: RETRYLOOP_TEST_URL is not set: run through scripts/with-broker')

    work = tempfile.mkdtemp(prefix='retryloop-ops-')
    service = f'opsnames{os.getpid()}'
    topology = os.path.join(work, 'topology.json')
    json.dump({'services': [{
        'name': service, 'queue_type': 'quorum',
        'input': {'exchange': f'{service}.in', 'type': 'direct', 'bindings': ['key']},
        'retry': {'delays': ['1s'], 'max_attempts': 2}}]}, open(topology, 'w'))
    dispatched = os.path.join(work, 'dispatched.json')
    json.dump({'services': [{
        'name': service + 'd',
        'input': {'exchange': f'{service}d.in', 'type': 'direct', 'bindings': ['key']},
        'retry': {'delays': ['1s'], 'max_attempts': 2}}]}, open(dispatched, 'w'))
    subprocess.run([args.retryloop, 'topology', 'apply', topology, '--url', url], check=True,
                   stdout=subprocess.DEVNULL)
    children = []
    try:
        consumer_port, console_port, relay_port = free_port(), free_port(), free_port()
        dispatch_port = free_port()
        children.append(subprocess.Popen(
            [args.retryloop, 'dispatch', '-t', dispatched, service + 'd', '--url', url,
             '--to', f'http://127.0.0.1:{free_port()}/', '--http', f'127.0.0.1:{dispatch_port}'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        children.append(subprocess.Popen(
            [args.demo_consumer, '--url', url, '--topology', topology, '--service', service,
             '--http', f'127.0.0.1:{consumer_port}'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        token = 't' * 32
        children.append(subprocess.Popen(
            [args.retryloop, 'parking', 'serve', '-t', topology, service, '--url', url,
             '--listen', f'127.0.0.1:{console_port}', '--token', token],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        database = 'sqlite:' + os.path.join(work, 'outbox.db')
        subprocess.run([args.retryloop, 'outbox', 'init', '--db', database], check=True,
                       stdout=subprocess.DEVNULL)
        children.append(subprocess.Popen(
            [args.retryloop, 'outbox', 'relay', '--db', database, '--url', url,
             '--metrics-listen', f'127.0.0.1:{relay_port}'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        served = {}
        served['consumer'] = families(scrape(f'http://127.0.0.1:{consumer_port}/metrics'))
        served['console'] = families(scrape(f'http://127.0.0.1:{console_port}/metrics',
                                            {'Authorization': f'Bearer {token}'}))
        served['relay'] = families(scrape(f'http://127.0.0.1:{relay_port}/metrics'))
        served['dispatch'] = families(scrape(f'http://127.0.0.1:{dispatch_port}/metrics'))
        every = set().union(*served.values())
        for source, names in served.items():
            if not names:
                sys.exit(f'FAIL: the {source} served no metric family')
            print(f'{source}: {len(names)} names')

        failures = []
        checked = 0
        for path, exprs in [
                (os.path.join(args.ops, 'grafana', 'retryloop-dashboard.json'),
                 dashboard_expressions(os.path.join(args.ops, 'grafana', 'retryloop-dashboard.json'))),
                (os.path.join(args.ops, 'prometheus', 'retryloop-alerts.yml'),
                 rule_expressions(os.path.join(args.ops, 'prometheus', 'retryloop-alerts.yml')))]:
            if not exprs:
                failures.append(f'{path}: no expression found')
            for expr in exprs:
                for name in sorted(named_in(expr)):
                    checked += 1
                    if name not in every:
                        failures.append(f'{path}: {name} is served by none of consumer, console, '
                                        f'relay, dispatch (in: {expr})')
        for failure in failures:
            print('FAIL:', failure)
        if failures:
            sys.exit(1)
        print(f'ok: {checked} metric names in the dashboard and the rules, each served')
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
        for path in (topology, dispatched):
            subprocess.run([args.retryloop, 'topology', 'delete', path, '--url', url, '--yes',
                            '--force'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == '__main__':
    main()
