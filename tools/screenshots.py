#!/usr/bin/python3
"""The parking console's pictures in docs/images, taken from a real console in headless Chromium.

    /usr/bin/python3 tools/screenshots.py --retryloop PATH [--out DIR]

scripts/screenshots runs this against a throwaway broker; run alone, it needs RETRYLOOP_TEST_URL.

It declares three services of the shipped topology files (`orders` of topology/example.json,
`payments` of quorum.json, `webhooks` of delays.json) and an audit stream, and parks messages in
them with the headers and history the consumer writes: exhausted, permanent and poison ones, with
errors that share causes. It pauses the webhooks' breaker, starts `retryloop parking serve` for
every service with named tokens and an audit key, and does through the console's API what an
operator would: replays the payments that timed out during an outage (one of them then fails
again and is parked anew, as its consumer would park it), counts and purges two smoke-test
messages, edits and retries a message whose body was cut, and writes a note on a cause. Then, in
a browser viewport of 1600x1000 CSS pixels at device scale 1, it saves:

    parking-console.png   the main view: the services, the groups and the list of the cause
                          with the note, one of its messages open
    message-timeline.png  the history of the payment that was replayed and parked again
    audit-trail.png       this run's audit records (1200 pixels wide, to stay readable)

The pictures show the page as the console serves it: nothing in it is edited afterwards. The
run stops the browser and the console, and deletes its services, however it ends (SIGTERM and
SIGHUP included).
"""

import argparse
import base64
import datetime
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The broker's channel, the console's process and the browser, as the console's browser test
# drives them.
sys.path.insert(0, os.path.join(ROOT, 'tests', 'console'))
import console_driver  # noqa: E402
from console_driver import Failure, check, chromium, click, listed_ids, log, wait_for  # noqa: E402

# The browser's viewport: wide enough that the open message leaves the list's first columns
# in view, tall enough for the services, the groups and the list at once. The audit trail is
# taken narrower, AUDIT_WIDTH, so that its picture is readable at a page's width.
WIDTH, HEIGHT = 1600, 1000
AUDIT_WIDTH = 1200
# How long, in seconds, the page may take to show what is waited for.
WAIT = 30
# The names the console's users have in the pictures, and what each may do.
USERS = {'maria': 'admin', 'jonas': 'operator'}


def utc(seconds):
    """A header timestamp (pika writes a naive datetime as UTC)."""
    return datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc).replace(tzinfo=None)


# ---- the topology -----------------------------------------------------------------------------

def shipped_service(file_name, name):
    with open(os.path.join(ROOT, 'topology', file_name), encoding='utf-8') as source:
        for service in json.load(source)['services']:
            if service['name'] == name:
                return service
    raise Failure(f'topology/{file_name} has no service {name!r}')


def write_topology(path):
    """Three services as the repository ships them, with the vhost's audit stream."""
    topology = {'audit': {'max_age': '30d'},
                'services': [shipped_service('example.json', 'orders'),
                             shipped_service('quorum.json', 'payments'),
                             shipped_service('delays.json', 'webhooks')]}
    with open(path, 'w', encoding='utf-8') as out:
        json.dump(topology, out, indent=2)


# ---- parked messages, as the consumer writes them ---------------------------------------------

class Parker(console_driver.Broker):
    """Publishes parking copies with the headers and history of docs/headers.md."""

    def park(self, service, message_id, body, *, reason, error, attempts, parked_at, history,
             routing_key, exchange, first_failure, consumer, app_id, published_at,
             content_type='application/json', extra=None):
        headers = dict(extra or {})
        headers.update({
            'retryloop-attempts': attempts,
            'retryloop-reason': reason,
            'retryloop-error': error,
            'retryloop-queue': service,
            'retryloop-original-exchange': exchange,
            'retryloop-original-routing-key': routing_key,
            'retryloop-first-failure': utc(first_failure),
            'retryloop-parked-at': utc(parked_at),
            'retryloop-consumer': consumer,
            'retryloop-history': history,
        })
        properties = pika.BasicProperties(message_id=message_id, content_type=content_type,
                                          delivery_mode=2, app_id=app_id,
                                          timestamp=int(published_at), headers=headers)
        # Confirmed (confirm mode) and routed (mandatory), or an exception.
        self.channel.basic_publish(f'{service}.parking', '', body.encode(), properties,
                                   mandatory=True)

    def park_again(self, service, properties, body, *, reason, error, consumer, now):
        """The parking copy a consumer makes of a replayed message that failed on its first
        attempt: the copy's headers, history and all, plus a `parked` entry."""
        headers = dict(properties.headers or {})
        history = list(headers.get('retryloop-history') or [])
        history.append({'attempt': 1, 'at': utc(now), 'outcome': 'parked',
                        'error': error.split('\n')[0], 'via': 'republish', 'reason': reason,
                        'consumer': consumer})
        headers.update({
            'retryloop-attempts': 1,
            'retryloop-reason': reason,
            'retryloop-error': error,
            'retryloop-queue': service,
            'retryloop-first-failure': utc(now),
            'retryloop-parked-at': utc(now),
            'retryloop-consumer': consumer,
            'retryloop-history': history,
        })
        properties.headers = headers
        self.channel.basic_publish(f'{service}.parking', '', body, properties, mandatory=True)


def reject_mode_history(attempts, first_failure, parked_at, error, reason, consumer, delay_ms):
    """A reject-mode service's history: the broker moved the failed attempts, so only the first
    has a time and none an error; the parking entry has both (docs/headers.md, "History")."""
    history = [{'attempt': 1, 'at': utc(first_failure), 'outcome': 'retry', 'delay_ms': delay_ms,
                'via': 'reject'}] if attempts > 1 else []
    history += [{'attempt': k, 'outcome': 'retry', 'delay_ms': delay_ms, 'via': 'reject'}
                for k in range(2, attempts)]
    history.append({'attempt': attempts, 'at': utc(parked_at), 'outcome': 'parked',
                    'error': error.split('\n')[0], 'via': 'reject', 'reason': reason,
                    'consumer': consumer})
    return history


def republish_history(failures, consumers, reason):
    """A republish-mode service's history: each retry copy records its attempt, time, error and
    delay. `failures` is [(at, error, delay_ms)], the last one the parking attempt's (delay
    None). The last 20 entries, and how many older ones were dropped."""
    history = []
    for k, (at, error, delay_ms) in enumerate(failures, start=1):
        entry = {'attempt': k, 'at': utc(at), 'error': error.split('\n')[0],
                 'consumer': consumers[k % len(consumers)]}
        if delay_ms is None:
            entry.update({'outcome': 'parked', 'via': 'republish', 'reason': reason})
        else:
            entry.update({'outcome': 'retry', 'delay_ms': delay_ms, 'via': 'republish'})
        history.append(entry)
    return history[-20:], max(0, len(history) - 20)


# The consumers' names (host:pid), as `retryloop-consumer` and the history carry them.
ORDER_PODS = ['orders-1:3104', 'orders-2:3092']
PAYMENT_PODS = ['payments-1:2817', 'payments-2:2790']
WEBHOOK_PODS = ['notifier-1:1920']
INVENTORY_TIMEOUT = ('Timeout talking to inventory after {} ms\n'
                     '  at reserve_stock (inventory_client.cpp:88)')
PROCESSOR_TIMEOUT = 'card processor: no answer after 30000 ms'
PROCESSOR_DOWN = 'card processor answered 503 Service Unavailable'
ALREADY_CAPTURED = 'card processor: payment {} was already captured (HTTP 409)'


def park_orders(parker, now):
    """`orders` (reject mode, 30 s, 5 attempts): inventory timeouts, unknown customers, a body
    that is not JSON, one whose JSON was cut, and two smoke-test messages to purge."""
    delay = 30000

    def order(number, customer, items):
        return json.dumps({'order': f'order-{number}', 'customer': customer,
                           'items': [{'sku': sku, 'qty': qty} for sku, qty in items],
                           'currency': 'EUR'})

    def park(message_id, body, reason, error, attempts, ago, routing_key='order.created',
             content_type='application/json'):
        parked_at = now - ago
        first = parked_at - (attempts - 1) * (delay // 1000 + 1)
        consumer = ORDER_PODS[len(message_id) % 2]
        extra = {}
        if attempts > 1:
            # Reject mode: the broker's own record of the rejections and the waits.
            extra['x-death'] = [
                {'count': attempts - 1, 'reason': 'expired', 'queue': 'orders.wait.30s',
                 'time': utc(parked_at - 1), 'exchange': 'orders.wait', 'routing-keys': ['orders']},
                {'count': attempts - 1, 'reason': 'rejected', 'queue': 'orders',
                 'time': utc(parked_at - 31), 'exchange': 'shop.events',
                 'routing-keys': [routing_key]}]
        parker.park('orders', message_id, body, reason=reason, error=error, attempts=attempts,
                    parked_at=parked_at, first_failure=first,
                    history=reject_mode_history(attempts, first, parked_at, error, reason,
                                                consumer, delay),
                    routing_key=routing_key, exchange='shop.events', consumer=consumer,
                    app_id='checkout', published_at=first - 1, content_type=content_type,
                    extra=extra)

    park('order-10466', order(10466, 2204, [('SKU-1042', 1), ('SKU-2231', 2)]), 'exhausted',
         INVENTORY_TIMEOUT.format(5000), 5, 7300)
    park('order-10471', order(10471, 1879, [('SKU-1042', 3)]), 'exhausted',
         INVENTORY_TIMEOUT.format(5000), 5, 7010)
    park('order-10475', order(10475, 3310, [('SKU-0877', 1)]), 'exhausted',
         INVENTORY_TIMEOUT.format(5000), 5, 6650)
    park('order-10479', order(10479, 2950, [('SKU-2231', 1)]), 'exhausted',
         INVENTORY_TIMEOUT.format(8000), 5, 6420)
    park('order-10482', order(10482, 1187, [('SKU-3305', 2), ('SKU-1042', 1)]), 'permanent',
         'customer 1187 does not exist', 1, 3120)
    park('order-10488', order(10488, 2210, [('SKU-0877', 4)]), 'permanent',
         'customer 2210 does not exist', 1, 2730)
    park('order-10490', order(10490, 1187, [('SKU-3305', 1)]), 'permanent',
         'customer 1187 does not exist', 1, 2460)
    park('order-10493', order(10493, 3021, [('SKU-1042', 1)]).replace('"EUR"', '"XBT"'),
         'permanent', 'unknown currency "XBT"', 1, 2010, routing_key='order.paid')
    park('order-10497', 'this is not JSON', 'poison', 'body is not a JSON object', 1, 1500,
         content_type='text/plain')
    park('order-10502', order(10502, 3301, [('SKU-1009', 1), ('SKU-2231', 1)])[:-24], 'poison',
         'body is not a JSON object', 1, 960)
    for i in (1, 2):
        park(f'smoke-test-{i}', json.dumps({'order': f'smoke-test-{i}', 'smoke': True}),
             'permanent', 'unknown customer "smoke-test"', 1, 600 - i * 40)


def park_payments(parker, now):
    """`payments` (quorum, republish mode, 5 s, 30 s, 5 min, then 30 min; 10 attempts): four
    payments the card processor did not answer during an outage, and two declined cards."""
    delays = [5000, 30000, 300000] + [1800000] * 6

    def payment(number, order_number, amount):
        return json.dumps({'payment': f'pay-{number}', 'order': f'order-{order_number}',
                           'amount': amount, 'currency': 'EUR', 'method': 'card'})

    def park(message_id, body, reason, failures, routing_key='payment.requested'):
        history, older = republish_history(failures, PAYMENT_PODS, reason)
        parked_at, error = failures[-1][0], failures[-1][1]
        extra = {'retryloop-retries': len(failures) - 1} if len(failures) > 1 else {}
        if older:
            extra['retryloop-history-older'] = older
        parker.park('payments', message_id, body, reason=reason, error=error,
                    attempts=len(failures), parked_at=parked_at, first_failure=failures[0][0],
                    history=history, routing_key=routing_key, exchange='payments.in',
                    consumer=PAYMENT_PODS[len(failures) % 2], app_id='checkout',
                    published_at=failures[0][0] - 1, extra=extra)

    for number, order_number, amount, ago in ((58113, 10412, '42.50', 1740),
                                              (58117, 10415, '18.00', 1690),
                                              (58120, 10419, '129.00', 1655),
                                              (58124, 10423, '64.90', 1600)):
        parked_at = now - ago
        at = parked_at - sum(delays) // 1000 - 9 * 30
        failures = []
        for attempt, delay in enumerate(delays + [None], start=1):
            failures.append((at, PROCESSOR_DOWN if attempt in (3, 6) else PROCESSOR_TIMEOUT, delay))
            at += (delay or 0) // 1000 + 30
        park(f'pay-{number}', payment(number, order_number, amount), 'exhausted', failures)
    park('pay-58131', payment(58131, 10437, '310.00'), 'permanent',
         [(now - 1210, 'card declined: insufficient funds (code 51)', None)])
    park('pay-58140', payment(58140, 10444, '24.99'), 'permanent',
         [(now - 815, 'card declined: expired card (code 54)', None)],
         routing_key='payment.refund.requested')


def park_webhooks(parker, now):
    """`webhooks` (quorum, republish, backoff 5 s doubling to 1 h, parked after 30 attempts or a
    day): a partner's endpoint that stopped answering, and one that is gone."""
    endpoint = 'https://hooks.partner.example/v2/events'

    def event(number, kind):
        return json.dumps({'event': f'evt-{number}', 'type': kind, 'endpoint': endpoint})

    def park(message_id, body, reason, failures):
        history, older = republish_history(failures, WEBHOOK_PODS, reason)
        extra = {'retryloop-retries': len(failures) - 1} if len(failures) > 1 else {}
        if older:
            extra['retryloop-history-older'] = older
        parker.park('webhooks', message_id, body, reason=reason, error=failures[-1][1],
                    attempts=len(failures), parked_at=failures[-1][0],
                    first_failure=failures[0][0], history=history, routing_key='webhook',
                    exchange='webhooks.in', consumer=WEBHOOK_PODS[0], app_id='notifier',
                    published_at=failures[0][0] - 1, extra=extra)

    timeout = f'POST {endpoint}: connect timeout after 10 s'
    for number, ago in ((90211, 3900), (90218, 3720)):
        delays = [min(5000 * 2 ** k, 3600000) for k in range(29)]
        at = now - ago - sum(delays) // 1000 - 29 * 10
        failures = []
        for delay in delays + [None]:
            failures.append((at, timeout, delay))
            at += (delay or 0) // 1000 + 10
        park(f'evt-{number}', event(number, 'order.shipped'), 'exhausted', failures)
    park('evt-90230', event(90230, 'order.cancelled'), 'permanent',
         [(now - 2400, f'POST {endpoint} answered 410 Gone', None)])


# ---- the console ------------------------------------------------------------------------------

class Console(console_driver.Console):
    """`retryloop parking serve` for every service of the file, on a free loopback port."""

    def __init__(self, retryloop, topology_file, url, work, tokens_file, audit_key_file):
        super().__init__(retryloop, topology_file, None, url,
                         ['--tokens', tokens_file, '--audit-key', audit_key_file],
                         os.path.join(work, 'console.err'))

    def api(self, token, method, path, body=None):
        """A request to the console's API as the user of `token`: its JSON answer."""
        status, answer = self.request(method, path, body, {'X-Retryloop-Token': token})
        check(200 <= status < 300, f'{method} {path}: HTTP {status} {answer}')
        return answer

    def stop(self):
        # Only in the run's finally block: a console that ignores SIGTERM is killed without a
        # word, so that the run reports what ended it.
        try:
            super().stop()
        except Failure:
            pass


def until(what, condition, timeout=30):
    """condition()'s first truthy value, polled; a Failure naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f'timed out waiting for {what}')
        time.sleep(0.1)


class Operator:
    """What a user does through the console's API, each action waited for to its end."""

    def __init__(self, console, token):
        self.console = console
        self.token = token

    def state(self, service):
        return self.console.api(self.token, 'GET', f'/api/state?service={service}')

    def rescan(self, service):
        """A whole count of `service`: the groups, the list and the services table."""
        before = (self.state(service).get('scan') or {}).get('id')
        self.console.api(self.token, 'POST', f'/api/scan?service={service}', {'filter': {}})
        return until(f'a count of {service}', lambda: (
            (s := self.state(service).get('scan')) and s['id'] != before and not
            self.state(service).get('scanning') and s))

    def act(self, service, kind, body):
        """Starts an action and waits for it to end: its job."""
        before = (self.state(service).get('job') or {}).get('id')
        self.console.api(self.token, 'POST', f'/api/{kind}?service={service}', body)

        def ended():
            job = self.state(service).get('job') or {}
            return job.get('id') != before and job.get('state') not in (None, 'running', 'queued') \
                and job
        job = until(f'the {kind} on {service}', ended)
        check(job['state'] == 'done', f'the {kind} on {service} ended {job}')
        return job

    def note(self, service, cause, text):
        self.console.api(self.token, 'POST', f'/api/note?service={service}',
                         {'group': cause, 'text': text})


def operate(console, parker, tokens, now):
    """The operators' day, through the console: what the audit trail and the timeline show."""
    maria = Operator(console, tokens['maria'])
    jonas = Operator(console, tokens['jonas'])

    # The card processor is back: the payments that timed out go back to their queue. Three go
    # through; one had been captured after all, and is parked again as permanent.
    scan = maria.rescan('payments')
    timeouts = [g for g in scan['by_cause'] if g['example'].startswith('card processor: no answer')]
    check(len(timeouts) == 1 and timeouts[0]['count'] == 4,
          f'the payments causes: {scan["by_cause"]}')
    maria.act('payments', 'replay', {'filter': {'error_cause': timeouts[0]['cause']}, 'asked': 4})
    replayed = parker.take_all('payments')
    check(sorted(p.message_id for p, _ in replayed) == ['pay-58113', 'pay-58117', 'pay-58120',
                                                        'pay-58124'],
          f'queue payments holds {[p.message_id for p, _ in replayed]} after the replay')
    for properties, body in replayed:
        if properties.message_id == 'pay-58120':
            parker.park_again('payments', properties, body, reason='permanent',
                              error=ALREADY_CAPTURED.format('pay-58120'),
                              consumer=PAYMENT_PODS[0], now=int(time.time()))
    log('payments: replayed the 4 that timed out; pay-58120 parked again, already captured')

    # Two messages of a smoke test: counted, then purged.
    smoke = {'message_ids': ['smoke-test-1', 'smoke-test-2']}
    maria.rescan('orders')
    counted = maria.act('orders', 'count', {'filter': smoke})['progress']['moved']
    check(counted == 2, f'the count of the smoke-test messages found {counted}')
    maria.act('orders', 'purge', {'filter': smoke, 'asked': counted})

    # A message whose JSON was cut on its way: fixed by hand and sent again.
    listed = console.api(tokens['maria'], 'GET', '/api/messages?service=orders')['messages']
    cut = next(m for m in listed if m['message_id'] == 'order-10502')
    fixed = json.dumps({'order': 'order-10502', 'customer': 3301,
                        'items': [{'sku': 'SKU-1009', 'qty': 1}, {'sku': 'SKU-2231', 'qty': 1}],
                        'currency': 'EUR'})
    maria.act('orders', 'edit', {'message_id': 'order-10502', 'parked_at': cut['parked_at'],
                                 'body': fixed})
    handled = parker.take_all('orders')
    check(len(handled) == 1 and handled[0][0].headers.get('retryloop-edited-from') == 'order-10502',
          'queue orders does not hold the edited copy alone')

    # A note on the unknown customers, for whoever looks next.
    cause = next(g['cause'] for g in maria.rescan('orders')['by_cause']
                 if g['example'].startswith('customer '))
    jonas.note('orders', cause, 'CRM sync lagging since 09:40 (CRM-2231); replay after the fix')
    log('orders: purged 2 smoke-test messages, edited and retried order-10502, noted a cause')
    for service in ('orders', 'payments', 'webhooks'):
        maria.rescan(service)


# ---- the browser ------------------------------------------------------------------------------

def browser():
    driver = chromium(WIDTH, HEIGHT, ['--hide-scrollbars'])
    viewport(driver, WIDTH, HEIGHT)
    return driver


def viewport(driver, width, height):
    """The viewport itself at this size, whatever the headless window's frame takes."""
    driver.execute_cdp_cmd('Emulation.setDeviceMetricsOverride',
                           {'width': width, 'height': height, 'deviceScaleFactor': 1,
                            'mobile': False})


def script(driver, text, *args):
    return driver.execute_script(text, *args)


def show_service(driver, service, ids):
    click(driver, f'#service-summary tr[data-service="{service}"] button.open', WAIT)
    wait_for(driver, f'the list of {service}',
             lambda d: script(d, "return document.getElementById('service').textContent") == service
             and sorted(listed_ids(d)) == sorted(ids), WAIT)


def open_message(driver, message_id):
    click(driver, f'#messages tr[data-id="{message_id}"] td.id', WAIT)
    wait_for(driver, f'the detail of {message_id}', lambda d: script(d, """
        return !document.getElementById('detail').hidden
            && document.getElementById('detail-id').textContent === arguments[0]
            && document.querySelectorAll('#detail-history li').length > 0;""", message_id), WAIT)


def save(driver, path, clip=None):
    """A PNG of the viewport, or of `clip` ({x, y, width, height} in the page's CSS pixels)."""
    time.sleep(0.3)  # the last layout painted
    arguments = {'format': 'png', 'captureBeyondViewport': clip is not None}
    if clip is not None:
        arguments['clip'] = dict(clip, scale=1)
    shot = driver.execute_cdp_cmd('Page.captureScreenshot', arguments)
    with open(path, 'wb') as out:
        out.write(base64.b64decode(shot['data']))
    log(f'saved {os.path.relpath(path)} ({os.path.getsize(path) // 1024} KiB)')


def rect(driver, selector):
    """An element's box in the page's coordinates (not the viewport's)."""
    return script(driver, """
        const r = document.querySelector(arguments[0]).getBoundingClientRect();
        return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height,
                bottom: r.bottom + scrollY};""", selector)


def photograph(driver, console, token, out, since_ms):
    driver.get(f'{console.base}#token={token}')
    orders = ['order-10466', 'order-10471', 'order-10475', 'order-10479', 'order-10482',
              'order-10488', 'order-10490', 'order-10493', 'order-10497']
    wait_for(driver, 'the services, their counts and the orders', lambda d: script(d, """
        const rows = [...document.querySelectorAll('#service-summary tbody tr')];
        return rows.length === 3 && rows.every((r) => !/not counted/.test(r.textContent))
            && [...document.querySelectorAll('#cause-groups .note')].some((n) => n.textContent)
            && document.querySelectorAll('#audit-table tbody tr[data-action]').length > 0;""")
             and sorted(listed_ids(d)) == orders, WAIT)

    # The main view: every service; the orders of one cause (the one with a note), their groups
    # and list; one of them open.
    click(driver, '#cause-groups tr[data-cause="customer <n> does not exist"] button.show', WAIT)
    wait_for(driver, 'the orders of unknown customers',
             lambda d: sorted(listed_ids(d)) == ['order-10482', 'order-10488', 'order-10490'], WAIT)
    open_message(driver, 'order-10482')
    script(driver, 'window.scrollTo(0, 0);')
    save(driver, os.path.join(out, 'parking-console.png'))

    # The timeline: the payment that was replayed and parked again.
    click(driver, '#detail-close', WAIT)
    show_service(driver, 'payments', ['pay-58120', 'pay-58131', 'pay-58140'])
    open_message(driver, 'pay-58120')
    panel = rect(driver, '#detail')
    history = rect(driver, '#detail-history')
    save(driver, os.path.join(out, 'message-timeline.png'),
         {'x': panel['x'], 'y': panel['y'], 'width': panel['width'],
          'height': history['bottom'] - panel['y'] + 14})

    # The audit trail, newest first: this run's records only, as a broker used again holds
    # those of earlier runs too.
    click(driver, '#detail-close', WAIT)
    viewport(driver, AUDIT_WIDTH, HEIGHT)
    records = console.api(token, 'GET', '/api/audit?limit=100')['records']
    recent = sum(1 for r in records if r['at_ms'] >= since_ms)
    script(driver, "document.getElementById('audit').scrollIntoView();")
    audit = rect(driver, '#audit')
    last = rect(driver, f'#audit-table tbody tr:nth-child({recent})')
    margin = 16 if recent == len(records) else 1  # no sliver of an older record
    save(driver, os.path.join(out, 'audit-trail.png'),
         {'x': 0, 'y': audit['y'] - 2, 'width': AUDIT_WIDTH,
          'height': last['bottom'] - audit['y'] + 2 + margin})


# ---- main -------------------------------------------------------------------------------------

def run(args, url, work):
    topology_file = os.path.join(work, 'topology.json')
    write_topology(topology_file)

    def retryloop(*command, check_status=True):
        subprocess.run([args.retryloop, *command, '--url', url], check=check_status,
                       stdout=subprocess.DEVNULL)

    # What an interrupted run may have left on a broker that is used again.
    retryloop('topology', 'delete', topology_file, '--yes', '--force', check_status=False)
    retryloop('topology', 'apply', topology_file)
    retryloop('service', 'pause', '-t', topology_file, 'webhooks', '--reason',
              'partner endpoint down, INC-4821')

    tokens = {name: secrets.token_hex(16) for name in USERS}
    tokens_file = os.path.join(work, 'tokens')
    audit_key_file = os.path.join(work, 'audit.key')
    # Readable by this user alone, as the console asks of a token file.
    with open(os.open(tokens_file, os.O_WRONLY | os.O_CREAT, 0o600), 'w', encoding='utf-8') as out:
        out.writelines(f'{name} {role} {tokens[name]}\n' for name, role in USERS.items())
    with open(os.open(audit_key_file, os.O_WRONLY | os.O_CREAT, 0o600), 'w',
              encoding='utf-8') as out:
        out.write(secrets.token_hex(32))

    parker = Parker(url)
    console = None
    driver = None
    try:
        now = int(time.time())
        since_ms = now * 1000
        park_orders(parker, now)
        park_payments(parker, now)
        park_webhooks(parker, now)
        log('parked 12 messages in orders, 6 in payments, 3 in webhooks')
        console = Console(args.retryloop, topology_file, url, work, tokens_file, audit_key_file)
        log(f'console at {console.base}')
        operate(console, parker, tokens, now)
        driver = browser()
        photograph(driver, console, tokens['maria'], args.out, since_ms)
    finally:
        if driver is not None:
            driver.quit()
        if console is not None:
            console.stop()
        parker.close()
        retryloop('topology', 'delete', topology_file, '--yes', '--force', check_status=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--retryloop', required=True, help='the retryloop program')
    parser.add_argument('--out', default=os.path.join(ROOT, 'docs', 'images'),
                        help='where the PNG files go (default: docs/images)')
    args = parser.parse_args()
    url = os.environ.get('RETRYLOOP_TEST_URL')
    if not url:
        print('screenshots: RETRYLOOP_TEST_URL is not set: run scripts/screenshots',
              file=sys.stderr)
        return 2
    # SIGTERM and SIGHUP end the run as Ctrl-C does: through the finally blocks, which stop the
    # browser and the console.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, _: sys.exit(128 + number))
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix='retryloop-screenshots-')
    try:
        run(args, url, work)
    except Failure as failure:
        print(f'screenshots: {failure}', file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f'done in {time.monotonic() - started:.0f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
