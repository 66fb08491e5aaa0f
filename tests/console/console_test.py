#!/usr/bin/python3
"""The parking console (`retryloop parking serve`) in a real browser: headless Chromium driven by
Selenium, against the broker of scripts/with-broker.

    /usr/bin/python3 tests/console/console_test.py --retryloop BUILD/retryloop

It makes a quorum service, parks messages in it as the consumer does (reasons, errors, original
routing keys, timestamps), among them one whose body and error are HTML that would run a script
if the page used them as HTML; starts the console on a free loopback port and checks, in the
browser, the groups and their counts, a message's headers and pretty-printed body, that the
hostile texts are shown as text and never run, a group replay (the counts change, and the
messages really are in the service's queue, fresh), the live depth, a purge of a selection whose
confirmation counts the duplicates of its ids, and "purge older than", which deletes what it
counted even when more messages have come of age by the time it is confirmed; and, over plain
HTTP, that requests without the token, with another Origin or Host, or from another site are
refused and move nothing, and that a deeply nested request body is refused and harms nothing;
a message's history timeline, the audit trail of a replay and a purge, edit-and-retry end to
end, a note on a cause, each role's refusals, and a console of every service of the file with
its summary and switcher.

Environment: RETRYLOOP_TEST_URL (the broker; scripts/with-broker sets it). The documentation's
pictures of the console are made by scripts/screenshots, not by this test; what the two share
(the broker's channel, the console's process, the browser) is in console_driver.py.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import pika
from selenium.webdriver.common.by import By

import console_driver
from console_driver import Failure, check, chromium, click, listed_ids, log, wait_for

HOSTILE_BODY = ('<script>window.__xss = "script";</script>'
                '<img src=x onerror="window.__xss = \'img\'">')
HOSTILE_ERROR = '<img src=x onerror="window.__xss = \'error\'"> broke it'
HOSTILE_HEADER = '<b onmouseover="window.__xss = \'header\'">bold</b>'
SIGNATURE = b'\x00\xffsig'
SENT_AT = datetime.datetime(2024, 3, 1, 12, 0, 0)
TIMEOUT_ERROR = 'Timeout talking to payments after 5000 ms'
PERMANENT_ERROR = 'customer 42 does not exist'


# ---- the broker -------------------------------------------------------------------------------

class Broker(console_driver.Broker):
    def park(self, exchange, message_id, body, reason, error, routing_key, parked_at,
             extra_headers=None, content_type='application/json'):
        """Publishes a message to the parking exchange with the headers the consumer sets."""
        headers = {
            'tenant': 'acme',
            'retryloop-attempts': 3 if reason == 'exhausted' else 1,
            'retryloop-reason': reason,
            'retryloop-error': error,
            'retryloop-queue': self.service,
            'retryloop-original-exchange': f'{self.service}.in',
            'retryloop-original-routing-key': routing_key,
            'retryloop-first-failure': parked_at - datetime.timedelta(seconds=3),
            'retryloop-parked-at': parked_at,
            'retryloop-consumer': 'console-test',
        }
        headers.update(extra_headers or {})
        properties = pika.BasicProperties(message_id=message_id, content_type=content_type,
                                          delivery_mode=2, headers=headers)
        # Confirmed (the channel is in confirm mode) and routed (mandatory), or an exception.
        self.channel.basic_publish(exchange, '', body.encode(), properties, mandatory=True)

    def depth(self, queue):
        return self.channel.queue_declare(queue, passive=True).method.message_count


# ---- the console ------------------------------------------------------------------------------

class Console(console_driver.Console):
    """`retryloop parking serve` on a free loopback port, counting again 1 s after a change."""

    def __init__(self, retryloop, topology_file, service, url, work, extra=()):
        super().__init__(retryloop, topology_file, service, url, ['--rescan-after', '1s', *extra],
                         os.path.join(work, f'console{len(extra)}.err'))


# ---- the browser ------------------------------------------------------------------------------

def group_counts(driver, table):
    """{key: count} of a group table (#reason-groups or #error-groups), read in one go."""
    return driver.execute_script("""
        const out = {};
        for (const row of document.querySelectorAll(`#${arguments[0]} tbody tr`)) {
          const cells = row.querySelectorAll('td');
          if (cells.length === 3) out[cells[0].textContent] = Number(cells[1].textContent);
        }
        return out;""", table)


def text(driver, element_id):
    return driver.execute_script('return document.getElementById(arguments[0]).textContent;',
                                 element_id)


def table_values(driver, table_id):
    """{key: value} of a detail table, as the page shows them (textContent), read in one go."""
    return driver.execute_script("""
        const out = {};
        for (const row of document.querySelectorAll(`#${arguments[0]} tbody tr`)) {
          const cells = row.querySelectorAll('th, td');
          if (cells.length === 2) out[cells[0].textContent] = cells[1].textContent;
        }
        return out;""", table_id)


def open_message(driver, message_id):
    click(driver, f'#messages tr[data-id="{message_id}"] td.id')
    wait_for(driver, f'the detail of {message_id}',
             lambda d: d.find_element(By.ID, 'detail').is_displayed()
             and text(d, 'detail-id') == message_id)


def confirm(driver, expect, meanwhile=None):
    """Checks the confirmation dialog's text and accepts it, after meanwhile() if given."""
    dialog_text = wait_for(driver, 'the confirmation dialog',
                           lambda d: d.find_element(By.ID, 'confirm').is_displayed()
                           and text(d, 'confirm-text'))
    check(expect in dialog_text, f'the confirmation says {dialog_text!r}, not {expect!r}')
    if meanwhile:
        meanwhile()
    driver.find_element(By.ID, 'confirm-ok').click()


def job_id(driver):
    return driver.find_element(By.ID, 'job').get_attribute('data-id')


def wait_job(driver, kind, contains, previous):
    """Waits for an action other than job `previous` to end; returns its text."""
    def finished(d):
        box = d.find_element(By.ID, 'job')
        return (box.get_attribute('data-id') != previous
                and box.get_attribute('data-kind') == kind
                and box.get_attribute('data-state') in ('done', 'failed')
                and text(d, 'job-text'))
    job_text = wait_for(driver, f'the {kind} to finish', finished, timeout=40)
    check(contains in job_text, f'the {kind} reports {job_text!r}, not {contains!r}')
    return job_text


def audit_rows(driver, service):
    """The audit table's rows about `service`, newest first: [{action, state, asked, done, what, who}]."""
    return driver.execute_script("""
        return [...document.querySelectorAll('#audit-table tbody tr[data-action]')]
            .filter((row) => row.children[2].textContent === arguments[0])
            .map((row) => ({action: row.dataset.action, state: row.dataset.state,
                            who: row.children[1].textContent, what: row.children[4].textContent,
                            asked: row.children[5].textContent, done: row.children[6].textContent}));""",
                                 service)


def wait_audit(driver, service, action, asked, done):
    """Waits until the newest `action` in the audit view ended `done` with these counts."""
    def found(d):
        rows = [r for r in audit_rows(d, service) if r['action'] == action]
        return rows and rows[0]['state'] == 'done' and rows[0]
    row = wait_for(driver, f'the audit trail to show the {action}', found)
    check(row['asked'] == str(asked) and row['done'] == str(done) and
          row['who'].startswith('console at 127.0.0.1'), f'the audit trail shows {row}')
    started = [r for r in audit_rows(driver, service) if r['action'] == action]
    check(len(started) >= 2 and started[1]['state'] == 'started',
          f'the {action} has no "started" record before its end: {started[:2]}')
    return row


def xss_ran(driver):
    return driver.execute_script('return window.__xss === undefined ? null : window.__xss;')


# ---- the test ---------------------------------------------------------------------------------

def run(args):
    url = os.environ.get('RETRYLOOP_TEST_URL')
    check(url, 'RETRYLOOP_TEST_URL is not set: run this through scripts/with-broker')
    service = f'console-{os.getpid()}-{int(time.time() * 1000) % 1000000}'
    parking = f'{service}.parking'
    work = tempfile.mkdtemp(prefix='retryloop-console-')
    topology_file = os.path.join(work, 'topology.json')
    mail = f'{service}-mail'
    with open(topology_file, 'w', encoding='utf-8') as out:
        json.dump({'audit': {}, 'services': [{
            'name': service, 'queue_type': 'quorum',
            'input': {'exchange': f'{service}.in', 'type': 'direct', 'bindings': ['order.created']},
            'retry': {'mode': 'reject', 'delays': ['1s'], 'max_attempts': 3}}, {
            'name': mail,
            'input': {'exchange': f'{mail}.in', 'type': 'direct', 'bindings': ['mail.sent']},
            'retry': {'mode': 'republish', 'delays': ['1s'], 'max_attempts': 2}}]}, out)
    subprocess.run([args.retryloop, 'topology', 'apply', topology_file, '--url', url],
                   check=True, stdout=subprocess.DEVNULL)

    broker = Broker(url)
    broker.service = service
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0, tzinfo=None)
    for i in range(1, 4):
        parked_at = now - datetime.timedelta(minutes=10 - i)
        history = [
            {'attempt': 1, 'at': parked_at - datetime.timedelta(seconds=3), 'outcome': 'retry',
             'error': TIMEOUT_ERROR, 'delay_ms': 1000, 'via': 'republish',
             'consumer': 'host-a:11'},
            {'attempt': 2, 'outcome': 'retry', 'delay_ms': 1000, 'via': 'reject'},
            {'attempt': 3, 'at': parked_at, 'outcome': 'parked', 'error': TIMEOUT_ERROR,
             'via': 'reject', 'reason': 'exhausted', 'consumer': 'host-a:11'}]
        broker.park(parking, f'order-{i}', json.dumps({'order': f'order-{i}', 'amount': 10 * i}),
                    'exhausted', f'{TIMEOUT_ERROR}\n  at payments.cpp:{40 + i}', 'order.created',
                    parked_at, {'retryloop-history': history, 'retryloop-history-older': 2})
    for i in range(4, 6):
        broker.park(parking, f'order-{i}', json.dumps({'order': f'order-{i}'}), 'permanent',
                    PERMANENT_ERROR, 'order.updated', now - datetime.timedelta(minutes=5))
    broker.park(parking, 'order-6', 'this is not JSON', 'poison', 'not JSON: Expecting value',
                'order.created', now - datetime.timedelta(minutes=2),
                {'x-tenant-id': 'acme-eu', 'signature': SIGNATURE, 'sent-at': SENT_AT},
                content_type='text/plain')
    broker.park(parking, 'hostile-1', HOSTILE_BODY, 'poison', HOSTILE_ERROR, 'order.created',
                now - datetime.timedelta(days=10), {'note': HOSTILE_HEADER},
                content_type='text/html')
    check(broker.depth(parking) == 7, 'the seven parked messages are not all in parking')
    log(f'parked 7 messages in {parking} (quorum)')

    console = Console(args.retryloop, topology_file, service, url, work)
    driver = None
    try:
        log(f'console at {console.base}')
        driver = chromium(1400, 1250)
        driver.set_script_timeout(10)

        # -- the page, the groups and their counts
        driver.get(f'{console.base}#token={console.token}')
        wait_for(driver, 'the reason groups',
                 lambda d: group_counts(d, 'reason-groups') == {
                     'exhausted': 3, 'permanent': 2, 'poison': 2})
        errors = group_counts(driver, 'error-groups')
        check(errors == {TIMEOUT_ERROR: 3, PERMANENT_ERROR: 2, 'not JSON: Expecting value': 1,
                         HOSTILE_ERROR: 1}, f'the error groups are {errors}')
        causes = driver.execute_script("""
            const out = {};
            for (const row of document.querySelectorAll('#cause-groups tbody tr')) {
              out[row.dataset.cause] = [Number(row.querySelector('.distinct').textContent),
                                        Number(row.querySelector('.count').textContent)];
            }
            return out;""")
        check(causes.get('Timeout talking to payments after <n> ms') == [1, 3] and
              causes.get('customer <n> does not exist') == [1, 2] and len(causes) == 4,
              f'the cause groups are {causes}')
        status, _ = console.request('GET', '/metrics')
        check(status == 403, f'/metrics without a token got HTTP {status}')
        request = urllib.request.Request(console.base + 'metrics',
                                         headers={'Authorization': f'Bearer {console.token}'})
        with urllib.request.urlopen(request, timeout=10) as response:
            metrics = response.read().decode()
        for line in [f'retryloop_parking_depth{{service="{service}",queue="{parking}"}} 7',
                     f'retryloop_parking_messages{{service="{service}",reason="exhausted"}} 3',
                     f'retryloop_parking_messages{{service="{service}",reason="poison"}} 2',
                     f'retryloop_queue_messages{{service="{service}",queue="{service}"}} 0']:
            check(line in metrics.splitlines(), f'/metrics lacks {line!r}:\n{metrics}')
        check('token' not in driver.current_url, 'the token stayed in the address bar')
        check(text(driver, 'depth') == '7', f'the depth shows {text(driver, "depth")!r}')
        wait_for(driver, 'the message list', lambda d: len(listed_ids(d)) == 7)
        log('the groups and counts are right')

        # -- the service's shared breaker: none yet, then paused and resumed by hand
        check(text(driver, 'breaker') == 'breaker –', f'the breaker shows {text(driver, "breaker")!r}')
        for verb, state in [('pause', 'paused'), ('resume', 'resuming')]:
            subprocess.run([args.retryloop, 'service', verb, '-t', topology_file, service,
                            '--url', url, '--reason', 'console test'],
                           check=True, stdout=subprocess.DEVNULL)
            wait_for(driver, f'the breaker {state}',
                     lambda d: text(d, 'breaker').startswith(f'breaker {state}'), timeout=15)
        title = driver.find_element(By.ID, 'breaker').get_attribute('title')
        check('console test' in title and '0 instances' in title, f'the breaker title is {title!r}')
        log('the breaker follows a pause and a resume')

        # -- a message's properties, headers and pretty-printed body
        open_message(driver, 'order-1')
        body = driver.find_element(By.ID, 'detail-body').get_attribute('textContent')
        check(json.loads(body) == {'order': 'order-1', 'amount': 10} and '\n  "amount": 10' in body,
              f'the body is not pretty-printed JSON: {body!r}')
        headers = table_values(driver, 'detail-headers')
        check(headers.get('retryloop-reason') == 'exhausted', f'headers: {headers}')
        check(headers.get('tenant') == 'acme', f'headers: {headers}')
        check(headers.get('retryloop-error', '').startswith(TIMEOUT_ERROR), f'headers: {headers}')
        properties = table_values(driver, 'detail-properties')
        check(properties.get('content_type') == 'application/json', f'properties: {properties}')
        check(properties.get('message_id') == 'order-1', f'properties: {properties}')
        events = driver.execute_script("""
            return [...document.querySelectorAll('#detail-history li')].map((li) => [
              li.dataset.outcome, li.querySelector('.when').textContent,
              li.querySelector('.what').textContent,
              li.querySelector('.error') ? li.querySelector('.error').textContent : null]);""")
        first_at = (now - datetime.timedelta(minutes=9, seconds=3)).strftime('%Y-%m-%dT%H:%M:%SZ')
        check([e[0] for e in events] == ['retry', 'retry', 'parked'], f'the timeline: {events}')
        check(events[0][1] == first_at and events[0][3] == TIMEOUT_ERROR and
              'attempt 1' in events[0][2] and 'via republish' in events[0][2] and
              'waits 1000 ms' in events[0][2], f'the first event: {events[0]}')
        check(events[1][1] == 'time not recorded' and events[1][3] is None and
              'via reject' in events[1][2], f'the second event: {events[1]}')
        check('exhausted' in events[2][2], f'the third event: {events[2]}')
        note = text(driver, 'detail-history-note')
        check(note == '(2 older events not kept)', f'the history note is {note!r}')
        log('a message shows its properties, headers, history timeline and indented body')

        # -- reading costs no parked message, even past RabbitMQ 4's default delivery limit (20)
        token = {'X-Retryloop-Token': console.token}
        for _ in range(22):
            scan_id = console.request('GET', '/api/state', headers=token)[1]['scan']['id']
            status, answer = console.request('POST', '/api/scan', {'filter': {}}, token)
            check(status == 200, f'a scan got HTTP {status}: {answer}')
            deadline = time.monotonic() + 20
            while console.request('GET', '/api/state', headers=token)[1]['scan']['id'] == scan_id:
                check(time.monotonic() < deadline, 'a scan did not end within 20 s')
                time.sleep(0.02)
        state = console.request('GET', '/api/state', headers=token)[1]
        check(broker.depth(parking) == 7 and state['scan']['matched'] == 7,
              f'after 23 scans parking holds {broker.depth(parking)}, the scan saw {state["scan"]}')
        log('23 scans later every parked message is still there')

        # -- a hostile body, error and header are text, and nothing of them runs
        open_message(driver, 'hostile-1')
        shown = driver.find_element(By.ID, 'detail-body').get_attribute('textContent')
        check(shown == HOSTILE_BODY, f'the hostile body is shown as {shown!r}')
        check(table_values(driver, 'detail-headers').get('note') == HOSTILE_HEADER,
              'the hostile header is not shown as its text')
        check(HOSTILE_ERROR in group_counts(driver, 'error-groups'),
              'the hostile error is not shown as its text')
        check(not driver.find_elements(By.CSS_SELECTOR, 'img, script:not([src]), b'),
              'a hostile text became HTML elements')
        time.sleep(0.3)  # an <img onerror> would have fired by now
        check(xss_ran(driver) is None, f'a hostile script ran ({xss_ran(driver)})')
        log('hostile texts are shown as text and never run')

        # -- replay a group: the counts change, and the messages are in the service's queue
        click(driver, '#detail-close')
        previous = job_id(driver)
        click(driver, '#reason-groups tr[data-reason="exhausted"] button.replay')
        confirm(driver, '3 messages with reason “exhausted”')
        wait_job(driver, 'replay', f'moved 3 messages to queue {service}', previous)
        wait_for(driver, 'the counts after the replay',
                 lambda d: group_counts(d, 'reason-groups') == {'permanent': 2, 'poison': 2})
        wait_for(driver, 'the depth after the replay', lambda d: text(d, 'depth') == '4')
        replayed = broker.take_all(service)
        ids = sorted(p.message_id for p, _ in replayed)
        check(ids == ['order-1', 'order-2', 'order-3'], f'queue {service} holds {ids}')
        for properties, body in replayed:
            check(properties.headers.get('retryloop-replays') == 1
                  and 'retryloop-reason' not in properties.headers
                  and properties.headers.get('tenant') == 'acme',
                  f'a replayed copy has the headers {properties.headers}')
            history = properties.headers.get('retryloop-history') or []
            check([e.get('outcome') for e in history] == ['retry', 'retry', 'parked', 'replayed']
                  and history[3].get('via') == 'console' and history[3].get('attempt') == 3
                  and history[3].get('by', '').startswith('console at 127.0.0.1')
                  and properties.headers.get('retryloop-history-older') == 2,
                  f'a replayed copy has the history {history}')
            check(json.loads(body)['order'] == properties.message_id, 'a body changed')
        check(broker.depth(parking) == 4, 'parking does not hold the four others')
        wait_audit(driver, service, 'replay', 3, 3)
        check('stream retryloop.audit' in text(driver, 'audit-where'),
              f'the audit view says {text(driver, "audit-where")!r}')
        log('the group replay moved 3 messages to the service queue, fresh; the audit trail '
            'recorded it before and after')

        # -- the depth refreshes by itself (with a second message of id order-5, for later)
        broker.park(parking, 'order-7', '{"order": "order-7"}', 'permanent', PERMANENT_ERROR,
                    'order.updated', now)
        broker.park(parking, 'order-5', '{"order": "order-5", "copy": 2}', 'permanent',
                    PERMANENT_ERROR, 'order.updated', now - datetime.timedelta(minutes=4))
        wait_for(driver, 'the live depth', lambda d: text(d, 'depth') == '6', timeout=15)
        wait_for(driver, 'the counts after the depth changed',
                 lambda d: group_counts(d, 'reason-groups') == {'permanent': 4, 'poison': 2},
                 timeout=15)
        log('the depth and, since it changed, the counts refreshed by themselves')

        # -- requests without the token, from another origin or for another host move nothing.
        # Plain HTTP, as any program could send them: a browser would block some of them itself,
        # which would hide a console that let them in.
        form = {'Content-Type': 'application/x-www-form-urlencoded'}
        other_page = f'http://127.0.0.1:{int(console.port) + 1}'
        for what, headers, expected in (
                ('without the token', {}, 403),
                ('with a wrong token', {'X-Retryloop-Token': '0' * 32}, 403),
                ('with another Origin', dict(token, Origin='http://evil.example'), 403),
                ('from another port of the same host',
                 dict(token, **{'Origin': other_page, 'Sec-Fetch-Site': 'same-site'}), 403),
                ('for another Host (DNS rebinding)',
                 dict(token, Host=f'evil.example:{console.port}'), 403),
                ('from another site', dict(token, **{'Sec-Fetch-Site': 'cross-site'}), 403),
                ('as a form post', dict(token, **form), 415),
                ('as a text/plain post', dict(token, **{'Content-Type': 'text/plain'}), 415),
                ('as application/jsonx', dict(token, **{'Content-Type': 'application/jsonx'}), 415)):
            status, answer = console.request('POST', '/api/replay', {'filter': {}}, headers)
            check(status == expected, f'a replay {what} got HTTP {status}, not {expected}: {answer}')
            check('Access-Control-Allow-Origin' not in console.headers,
                  f'a replay {what} was answered with CORS headers')
        status, _ = console.request('GET', '/api/state')
        check(status == 403, f'reading the state without the token got HTTP {status}')
        for origin in ('http://evil.example', other_page):
            status, _ = console.request('OPTIONS', '/api/replay', headers={
                'Origin': origin, 'Access-Control-Request-Method': 'POST',
                'Access-Control-Request-Headers': 'x-retryloop-token,content-type'})
            check(status == 403, f'a CORS preflight from {origin} got HTTP {status}')
            check(not any(name.startswith('Access-Control-Allow') for name in console.headers),
                  f'a CORS preflight from {origin} was allowed: {dict(console.headers)}')
        status, state = console.request('GET', '/api/state', headers=token)
        check(status == 200 and state['depth'] == 6, f'with the token: HTTP {status}, {state}')
        check(':guest@' not in json.dumps(state), 'the broker password is in the state')
        check(broker.depth(parking) == 6, 'a refused request moved messages')
        with urllib.request.urlopen(console.base + 'app.js', timeout=10) as response:
            script = response.read().decode()
            policy = response.headers.get('Content-Security-Policy', '')
        check('innerHTML' not in script and 'insertAdjacentHTML' not in script,
              'the page script writes HTML')
        check("script-src 'self'" in policy and 'unsafe-inline' not in policy,
              f'the Content-Security-Policy is {policy!r}')
        log('requests without the token, of another origin or another host are refused (403)')

        # -- purge a selection: messages are chosen by id, and the confirmation counts the
        # duplicate that shares one
        driver.get(f'{console.base}#token={console.token}')
        wait_for(driver, 'the list after a reload', lambda d: len(listed_ids(d)) == 6)
        for message_id in ('order-4', 'order-5'):
            click(driver, f'#messages tr[data-id="{message_id}"] input[type=checkbox]')
        previous = job_id(driver)
        driver.find_element(By.ID, 'purge-selected').click()
        confirm(driver, 'the 3 messages with the 2 selected ids')
        wait_job(driver, 'purge', 'deleted 3 messages', previous)
        wait_for(driver, 'the depth after the purge', lambda d: text(d, 'depth') == '3')
        row = wait_audit(driver, service, 'purge', 3, 3)
        check('order-4' in row['what'] and 'order-5' in row['what'], f'the purge row says {row}')
        log('purging a selection said, and deleted, every message with the selected ids; the '
            'audit trail shows it with its ids')

        # -- "purge older than" deletes what it counted, although another message comes of age
        # while the confirmation waits; meanwhile, deeply nested request bodies are refused. The
        # message comes of age 10 s after it is parked: the click, the count and the dialog must
        # come before that, which a loaded machine has taken more than 2 s for.
        second = int(time.time())
        of_age_after = 10
        broker.park(parking, 'edge-1', '{"order": "edge-1"}', 'poison', 'comes of age',
                    'order.created',
                    datetime.datetime.utcfromtimestamp(second + of_age_after)
                    - datetime.timedelta(days=7))
        older = driver.find_element(By.ID, 'older-than')
        older.clear()
        older.send_keys('7d')
        previous = job_id(driver)
        driver.find_element(By.CSS_SELECTOR, '#older-form button').click()

        def deep_bodies_then_edge_of_age():
            deep_filter = '{"filter": ' + '[' * 500000 + ']' * 500000 + '}'
            for path in ('/api/scan', '/api/replay'):
                status, answer = console.request('POST', path, deep_filter, token)
                check(status == 400 and 'deeper' in answer.get('error', ''),
                      f'a deeply nested body to {path} got HTTP {status}: {answer}')
            status, _ = console.request('GET', '/api/state', headers=token)
            check(status == 200 and console.process.poll() is None,
                  'the console stopped serving after a deeply nested request body')
            time.sleep(max(0.0, second + of_age_after + 0.3 - time.time()))

        confirm(driver, '1 message parked more than 7d ago', deep_bodies_then_edge_of_age)
        wait_job(driver, 'purge', 'deleted 1 message', previous)
        wait_for(driver, 'the depth after purge older than', lambda d: text(d, 'depth') == '3')
        wait_for(driver, 'the list after the purges',
                 lambda d: sorted(listed_ids(d)) == ['edge-1', 'order-6', 'order-7'])
        check(broker.depth(parking) == 3, 'parking does not hold the three messages left')
        log('purge older than 7d deleted the message it counted, not the one that came of age; '
            'deeply nested request bodies got 400')

        # -- edit and retry: the operator fixes a body that is not JSON, adds a header and sends
        # the copy; the original leaves parking only once the copy is confirmed
        open_message(driver, 'order-6')
        click(driver, '#detail-edit')
        wait_for(driver, 'the editor', lambda d: d.find_element(By.ID, 'edit-form').is_displayed())
        check(driver.find_element(By.ID, 'edit-body').get_attribute('value') == 'this is not JSON',
              'the editor does not start from the body')
        headers_shown = json.loads(driver.find_element(By.ID, 'edit-headers').get_attribute('value'))
        check(headers_shown == {'tenant': 'acme', 'x-tenant-id': 'acme-eu'},
              f'the editor offers the headers {headers_shown}')
        kept_shown = {row.get_attribute('data-key'): row.text
                      for row in driver.find_elements(By.CSS_SELECTOR, '#edit-kept tr')}
        check(sorted(kept_shown) == ['sent-at', 'signature'] and
              'binary, kept as is' in kept_shown['signature'] and
              'timestamp, kept as is' in kept_shown['sent-at'],
              f'the editor shows as kept {kept_shown}')
        body_box = driver.find_element(By.ID, 'edit-body')
        body_box.clear()
        body_box.send_keys('{"order": "order-6", "fixed": true}')
        headers_box = driver.find_element(By.ID, 'edit-headers')
        headers_box.clear()
        headers_box.send_keys('{"tenant": "beta", "x-tenant-id": "acme-eu", "ticket": 17}')
        click(driver, '#edit-send')
        confirm(driver, 'Send the edited message order-6')
        wait_for(driver, 'the edit to be sent', lambda d: 'Sent as' in text(d, 'notice'))
        kept_named = text(driver, 'notice').split('not editable here: ')[-1].rstrip('.').split(', ')
        check(sorted(kept_named) == ['sent-at', 'signature'],
              f'the notice after the edit says {text(driver, "notice")}')
        new_id = text(driver, 'notice').split('Sent as ')[1].split('.')[0]
        edited = broker.take_all(service)
        check(len(edited) == 1, f'queue {service} holds {len(edited)} messages after the edit')
        properties, body = edited[0]
        check(properties.message_id == new_id and len(new_id) == 32,
              f'the edited copy has the id {properties.message_id}, the page said {new_id}')
        check(json.loads(body) == {'order': 'order-6', 'fixed': True}, f'the edited body is {body}')
        check(properties.headers.get('retryloop-edited-from') == 'order-6' and
              properties.headers.get('tenant') == 'beta' and properties.headers.get('ticket') == 17
              and properties.headers.get('x-tenant-id') == 'acme-eu'
              and properties.headers.get('signature') == SIGNATURE
              and properties.headers.get('sent-at') == SENT_AT
              and 'retryloop-reason' not in properties.headers,
              f'the edited copy has the headers {properties.headers}')
        last = (properties.headers.get('retryloop-history') or [{}])[-1]
        check(last.get('outcome') == 'edited' and last.get('by', '').startswith('console at'),
              f'the edited copy\'s history ends with {last}')
        wait_for(driver, 'the depth after the edit', lambda d: text(d, 'depth') == '2')
        wait_for(driver, 'the list after the edit',
                 lambda d: sorted(listed_ids(d)) == ['edge-1', 'order-7'])
        row = wait_audit(driver, service, 'edit', 1, 1)
        check('order-6' in row['what'] and new_id in row['what'], f'the edit row says {row}')
        log('edit and retry sent a fixed copy with a new id and a link to the original, its '
            'byte-array and timestamp headers kept as they were, then took the original out of '
            'parking; the audit trail shows both ids')

        # -- a note on a cause, kept in the audit trail and shown beside the group
        cause = 'customer <n> does not exist'
        click(driver, f'#cause-groups tr[data-cause="{cause}"] button.note-edit')
        wait_for(driver, 'the note dialog', lambda d: d.find_element(By.ID, 'confirm-input').is_displayed())
        driver.find_element(By.ID, 'confirm-input').send_keys('looking into it: customer sync lag')
        driver.find_element(By.ID, 'confirm-ok').click()
        wait_for(driver, 'the note beside its cause', lambda d: 'looking into it: customer sync lag' in
                 d.find_element(By.CSS_SELECTOR, f'#cause-groups tr[data-cause="{cause}"] .note').text)
        log('a note on a cause is shown beside it, with who wrote it')

        # -- a JSON body nested 100,000 deep is shown as it is, not indented (which would
        # recurse); a body over 1 MiB is kept and shown cut, and the page says so
        deep = '[' * 100000 + ']' * 100000
        broker.park(parking, 'deep-1', deep, 'poison', 'nested too deep', 'order.created', now)
        big = '{"order": "big-1", "pad": "' + 'x' * (1536 * 1024) + '"}'
        broker.park(parking, 'big-1', big, 'poison', 'too big', 'order.created', now)
        click(driver, '#rescan')
        wait_for(driver, 'the deep message in the list', lambda d: 'deep-1' in listed_ids(d))
        open_message(driver, 'deep-1')
        shown = driver.find_element(By.ID, 'detail-body').get_attribute('textContent')
        check(shown == deep, 'the deeply nested body is not shown as it is')
        check(console.process.poll() is None, 'the console died on a deeply nested body')
        open_message(driver, 'big-1')
        note = text(driver, 'detail-body-note')
        shown = driver.find_element(By.ID, 'detail-body').get_attribute('textContent')
        check('1.5 MiB' in note and 'cut to the first MiB' in note, f'the big body says {note!r}')
        check(len(shown) == 1024 * 1024 and big.startswith(shown),
              f'the big body is shown as {len(shown)} characters')
        log('a deeply nested JSON body is shown as it is; a body over 1 MiB is shown cut, and said so')

        # -- named tokens with roles: each call is checked against the caller's role, and the
        # page offers only what the role may do
        tokens_file = os.path.join(work, 'tokens')
        tokens = {'ana': ('reader', 'a' * 32), 'bob': ('operator', 'b' * 32),
                  'cyd': ('admin', 'c' * 32)}
        with open(tokens_file, 'w', encoding='utf-8') as out:
            out.write('# name role token\n')
            for name, (role, secret) in tokens.items():
                out.write(f'{name} {role} {secret}\n')
        roles = Console(args.retryloop, topology_file, service, url, work, ['--tokens', tokens_file])
        try:
            as_user = {name: {'X-Retryloop-Token': secret} for name, (_, secret) in tokens.items()}
            nothing = {'filter': {'message_ids': ['no-such-message']}}
            for name, (role, _) in tokens.items():
                status, answer = roles.request('GET', '/api/whoami', headers=as_user[name])
                check(status == 200 and answer == {'name': name, 'role': role},
                      f'whoami for {name}: HTTP {status} {answer}')
                status, _ = roles.request('GET', '/api/state', headers=as_user[name])
                check(status == 200, f'{name} could not look: HTTP {status}')

            def idle():
                _, state = roles.request('GET', '/api/state', headers=as_user['ana'])
                job = state.get('job') or {}
                return job.get('state') not in ('running', 'queued')

            status, _ = roles.request('POST', '/api/count', nothing, as_user['ana'])
            check(status == 200, f'a reader could not count: HTTP {status}')
            wait_for(driver, 'the count to end', lambda d: idle())
            refusals = [('ana', '/api/replay', 'operator'), ('ana', '/api/purge', 'admin'),
                        ('ana', '/api/stop', 'operator'), ('ana', '/api/edit', 'operator'),
                        ('ana', '/api/note', 'operator'), ('bob', '/api/purge', 'admin')]
            for name, path, needed in refusals:
                status, answer = roles.request('POST', path, nothing, as_user[name])
                check(status == 403 and f'needs the {needed} role' in answer.get('error', ''),
                      f'{name} ({tokens[name][0]}) on {path}: HTTP {status} {answer}')
            status, answer = roles.request('POST', '/api/purge', nothing, as_user['cyd'])
            check(status == 200, f'the admin could not purge: HTTP {status} {answer}')
            status, answer = roles.request('GET', '/api/state', headers={'X-Retryloop-Token': console.token})
            check(status == 403, f'the single token works on the console with named tokens: {status}')
            for name, shown, hidden in [('ana', [], ['replay-matching', 'purge-matching', 'older-form']),
                                        ('bob', ['replay-matching'], ['purge-matching', 'older-form']),
                                        ('cyd', ['replay-matching', 'purge-matching'], [])]:
                driver.get('about:blank')  # a new hash alone would not load the page again
                driver.get(f'{roles.base}#token={tokens[name][1]}')
                wait_for(driver, f'the page to name {name}',
                         lambda d, name=name: text(d, 'identity') == f'{name} ({tokens[name][0]})')
                for element in shown:
                    check(driver.find_element(By.ID, element).is_displayed(),
                          f'{name} ({tokens[name][0]}) is not offered #{element}')
                for element in hidden:
                    check(not driver.find_element(By.ID, element).is_displayed(),
                          f'{name} ({tokens[name][0]}) is offered #{element}')
        finally:
            roles_status, roles_output = roles.stop()
        check(roles_status == 0, f'the console with named tokens exited {roles_status}')
        check('cyd at 127.0.0.1' in roles_output,
              f'the log does not name who purged:\n{roles_output}')
        log('reader, operator and admin tokens: each refused what its role may not do, by the '
            'API with the role it needs and by the page, which offers only the rest')

        # -- one console for every service of the file: a summary by service and reason, and a
        # switcher
        broker.park(f'{mail}.parking', 'mail-1', '{"to": "a@example.com"}', 'exhausted',
                    'SMTP 451 try again later', 'mail.sent', now)
        every = Console(args.retryloop, topology_file, None, url, work, ['--token', 'e' * 32])
        try:
            driver.get('about:blank')
            driver.get(f'{every.base}#token={"e" * 32}')
            wait_for(driver, 'the summary of both services', lambda d: d.execute_script("""
                const rows = {};
                for (const row of document.querySelectorAll('#service-summary tbody tr')) {
                  rows[row.dataset.service] = [row.querySelector('.depth').textContent,
                                               row.querySelector('.reasons').textContent];
                }
                return rows;""").get(mail) == ['1', 'exhausted 1'])
            summary = driver.execute_script("""
                return [...document.querySelectorAll('#service-summary tbody tr')]
                    .map((row) => [row.dataset.service, row.querySelector('.depth').textContent]);""")
            check(summary == [[service, str(broker.depth(parking))], [mail, '1']],
                  f'the summary is {summary}')
            # A switch while the list of the service shown is on its way: that list, arriving
            # after the switch, is dropped. Its scan id may be the one the new service's scan
            # has, and taken for it, the new service's messages would never be asked for.
            wait_for(driver, f'the messages of {service}', lambda d: len(listed_ids(d)) > 0)
            before = set(listed_ids(driver))
            driver.execute_script("""
                window.held = 0;
                window.listedAfterSwitch = [];
                const fetchNow = window.fetch;
                window.fetch = (path, options) => {
                  const answer = fetchNow(path, options);
                  if (!path.startsWith('/api/messages') || path.includes('service=')) return answer;
                  window.held += 1;
                  return answer.then((r) => new Promise((done) => setTimeout(() => {
                    done(r);
                    setTimeout(() => { window.held = -1; }, 300);
                  }, 1500)));
                };
                new MutationObserver(() => {
                  if (window.switched) {
                    window.listedAfterSwitch.push([...document.querySelectorAll(
                        '#messages tbody tr.message')].map((row) => row.dataset.id));
                  }
                }).observe(document.querySelector('#messages tbody'), {childList: true});""")
            click(driver, '#clear')
            wait_for(driver, f'a list of {service} held on its way',
                     lambda d: d.execute_script('return window.held') > 0)
            driver.execute_script('window.switched = true')
            click(driver, f'#service-summary tr[data-service="{mail}"] button.open')
            wait_for(driver, f'the held list of {service} to arrive',
                     lambda d: d.execute_script('return window.held') == -1)
            wait_for(driver, 'the mail service', lambda d: text(d, 'service') == mail and
                     listed_ids(d) == ['mail-1'])
            stale = [ids for ids in driver.execute_script('return window.listedAfterSwitch')
                     if before & set(ids)]
            check(not stale, f'after the switch to {mail}, the page listed {service}\'s: {stale}')
            check(driver.find_element(By.ID, 'service-switch').get_attribute('value') == mail,
                  'the switcher does not show the service shown')
            status, answer = every.request('GET', f'/api/state?service=nope',
                                           headers={'X-Retryloop-Token': 'e' * 32})
            check(status == 404 and mail in answer.get('error', ''),
                  f'an unknown service got HTTP {status} {answer}')
        finally:
            every_status, every_output = every.stop()
        check(every_status == 0, f'the console of every service exited {every_status}')
        check(f'services {service} (queue {parking}), {mail}' in every_output,
              f'the console of every service did not name both:\n{every_output}')
        log('a console without a service serves every service of the file, with a summary by '
            'service and reason and a switcher')
    finally:
        if driver is not None:
            driver.quit()
        status, output = console.stop()
        broker.close()
        subprocess.run([args.retryloop, 'topology', 'delete', topology_file, '--yes', '--force',
                        '--url', url], check=False, stdout=subprocess.DEVNULL)
    check(status == 0, f'the console exited {status} on SIGTERM:\n{output}')
    check(':guest@' not in output, f'the console printed the broker password:\n{output}')
    check('left open' not in output, f'the console did not close everything:\n{output}')
    check(f'console: {service}: replay' in output, f'the console logged no replay:\n{output}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--retryloop', required=True, help='the retryloop program')
    args = parser.parse_args()
    started = time.monotonic()
    try:
        run(args)
    except Failure as failure:
        print(f'FAILED: {failure}', file=sys.stderr)
        return 1
    log(f'passed in {time.monotonic() - started:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
