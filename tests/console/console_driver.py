"""What the console's browser test and the documentation's pictures of the console both drive:
the broker, `retryloop parking serve` on a free loopback port, and headless Chromium through
Selenium.

    tests/console/console_test.py   imports it from its own directory
    tools/screenshots.py            adds tests/console to sys.path for it

A check or a wait that fails raises Failure, which each of them reports in its own way.
"""

import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pika
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def log(message):
    print(f'[{time.strftime("%H:%M:%S")}] {message}', flush=True)


# ---- the broker -------------------------------------------------------------------------------

class Broker:
    """A channel in confirm mode: a publish returns once the broker has taken the message."""

    def __init__(self, url):
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def take_all(self, queue):
        """Takes every message out of `queue`, as a consumer that handled them: [(properties,
        body)]."""
        out = []
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=False)
            if method is None:
                return out
            self.channel.basic_ack(method.delivery_tag)
            out.append((properties, body))

    def close(self):
        try:
            self.connection.close()
        except Exception:  # pylint: disable=broad-except
            pass


# ---- the console ------------------------------------------------------------------------------

class Console:
    """`retryloop parking serve` on a free loopback port. Once started, `base` is the address it
    printed, `port` that address's port and `token` the token in it (None with named tokens,
    which the console does not print)."""

    def __init__(self, retryloop, topology_file, service, url, options, errors):
        """Serves `service` of the file, or every service of it if None, with `options` after
        the console's own; what it writes to stderr goes to the file `errors`."""
        self.errors = open(errors, 'w+', encoding='utf-8')
        self.process = subprocess.Popen(
            [retryloop, 'parking', 'serve', '-t', topology_file, *([service] if service else []),
             '--url', url, '--listen', '127.0.0.1:0', *options],
            stdout=subprocess.PIPE, stderr=self.errors, text=True)
        self.output = []
        self.base = self.port = self.token = None
        started = threading.Event()
        self.reader = threading.Thread(target=self.read, args=(started,), daemon=True)
        self.reader.start()
        started.wait(30)
        if self.base is None:
            self.process.kill()
            self.process.wait()
            raise Failure('the console did not start:\n' + self.printed())

    def read(self, started):
        for line in self.process.stdout:
            self.output.append(line)
            match = re.search(r'open  (http://127\.0\.0\.1:(\d+)/)(?:#token=([0-9a-f]+))?', line)
            if match:
                self.base, self.port, self.token = match.group(1), match.group(2), match.group(3)
                started.set()
        started.set()

    def printed(self):
        self.errors.seek(0)
        return ''.join(self.output) + self.errors.read()

    def request(self, method, path, body=None, headers=None):
        """An HTTP request straight to the console: (status, JSON answer). A `body` that is a
        string is sent as it is. The answer's headers are left in self.headers."""
        if body is None or isinstance(body, str):
            data = body.encode() if body is not None else None
        else:
            data = json.dumps(body).encode()
        request = urllib.request.Request(self.base.rstrip('/') + path, data=data, method=method)
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        if data is not None and 'Content-Type' not in (headers or {}):
            request.add_header('Content-Type', 'application/json')
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                self.headers = response.headers
                return response.status, json.loads(response.read() or b'null')
        except urllib.error.HTTPError as error:
            self.headers = error.headers
            text = error.read()
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, text.decode(errors='replace')

    def stop(self):
        """SIGTERM; returns the exit status and everything it printed."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise Failure('the console did not stop within 20 s of SIGTERM:\n' + self.printed())
        self.reader.join(5)
        return self.process.returncode, self.printed()


# ---- the browser ------------------------------------------------------------------------------

def chromium(width, height, extra=()):
    """Headless Chromium (Debian's chromium and chromium-driver) in English, its window `width`
    by `height` CSS pixels at device scale 1; `extra` are more of its switches."""
    options = webdriver.ChromeOptions()
    options.binary_location = '/usr/bin/chromium'
    for argument in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
                     f'--window-size={width},{height}', '--lang=en-US',
                     '--force-device-scale-factor=1', *extra):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service('/usr/bin/chromedriver'), options=options)


def wait_for(driver, what, condition, timeout=20):
    """Waits until condition(driver) is truthy; its value, or a Failure naming `what`."""
    def attempt(d):
        try:
            return condition(d)
        except StaleElementReferenceException:
            return False
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(attempt)
    except Exception as error:  # pylint: disable=broad-except
        raise Failure(f'timed out waiting for {what}: {error.__class__.__name__}') from None


def click(driver, selector, timeout=20):
    """Clicks the element, again if the page replaced it meanwhile."""
    def attempt(d):
        d.find_element(By.CSS_SELECTOR, selector).click()
        return True
    wait_for(driver, selector, attempt, timeout)


def listed_ids(driver):
    """The ids of the messages in the page's list, in its order."""
    return driver.execute_script("""
        return [...document.querySelectorAll('#messages tbody tr.message')]
            .map((row) => row.dataset.id);""")
