#!/usr/bin/python3
"""Publish one message from pika, the Python client, with every basic property set and a
headers table holding every field type pika can encode; print what a decoder must find.

    /usr/bin/python3 tests/interop/pika_headers.py URL QUEUE [--verify]

Declares QUEUE (non-durable, not auto-delete), publishes the message with publisher confirms
(mandatory, so an unroutable message is an error) and prints JSON on stdout:

  headers            for each header key: {"type": AMQP type letter, "value": ...}. Values:
                     t bool, I/l integer, S string, x bytes as hex, D {"scale", "value"},
                     T integer seconds, F object of the same form, A list of the same form,
                     V null
  headers_table_hex  the table exactly as pika encodes it (pika.data.encode_table), with its
                     4-byte length: golden bytes for a codec test
  properties         every basic property as set (headers left out: see above)
  properties_hex     the content header's property flags and list, as pika encodes them
  body_hex           the body
  pika_type_letters  the letter pika picks for each Python type (null: pika cannot encode it)

The expected letters and values come from a model of pika 1.2's encoder (pika/data.py,
encode_value); the bytes pika actually produces are decoded independently, with RabbitMQ's
type letters, and must match the model, or the script fails.

With --verify, the message is then fetched back (basic.get) and acked, and the property bytes
the broker delivered must equal the ones pika sent. Without it the message stays in QUEUE for
another client to read.
"""

import calendar
import datetime
import decimal
import json
import struct
import sys

import pika
import pika.compat
import pika.data
import pika.exceptions
import pika.spec

# ---- the message ---------------------------------------------------------------------------

TS = datetime.datetime(2024, 2, 29, 12, 34, 56)  # naive: pika takes it as UTC
TS_AWARE = datetime.datetime(2024, 2, 29, 14, 34, 56, 789000,
                             tzinfo=datetime.timezone(datetime.timedelta(hours=2)))


def headers_table():
    # Insertion order is the wire order.
    return {
        "bool-true": True,
        "bool-false": False,
        "int-zero": 0,
        "int-8bit": 100,
        "int-16bit": 30000,
        "int-32bit-max": 2**31 - 1,
        "int-32bit-min": -(2**31),
        "int-33bit": 2**31,
        "int-below-32bit": -(2**31) - 1,
        "int-64bit": 2**40,
        "int-64bit-max": 2**63 - 1,
        "int-64bit-min": -(2**63),
        "int-negative": -1,
        "int-negative-16bit": -300,
        "int-forced-long": pika.compat.long(5),
        "decimal": decimal.Decimal("3.14"),
        "decimal-trailing-zero": decimal.Decimal("1.50"),
        "decimal-integral": decimal.Decimal("100"),
        "decimal-small": decimal.Decimal("0.001"),
        "str": "hello",
        "str-empty": "",
        "str-utf8": "Привіт, світ — ✓ 日本語 🐇",
        "str-nul": "a\x00b",
        "bytes": b"\x00\x01\x7f\x80\xfe\xff",
        "bytes-empty": b"",
        "bytes-not-utf8": b"\xc3\x28\xa0\xa1\xff",
        "bytes-utf8-text": "ü".encode(),
        "void": None,
        "timestamp": TS,
        "timestamp-aware": TS_AWARE,
        "table": {
            "inner-int": 1,
            "inner-str": "x",
            "inner-bytes": b"\xff",
            "deeper": {"flag": True, "none": None},
        },
        "table-empty": {},
        "array": [1, "two", True, None, b"\x03", decimal.Decimal("0.5"), TS, {"k": "v"},
                  [1, [2]], 2**40, -7, ""],
        "array-empty": [],
        "ключ-ü": "non-ASCII key",
    }


def properties(user_id):
    return pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers_table(),
        delivery_mode=2,
        priority=5,
        correlation_id="corr-42",
        reply_to="interop.replies",  # not amq.rabbitmq.reply-to: the broker refuses (406) it
                                     # unless the publisher consumes from it
        expiration="3600000",  # ms; long enough for a test to read the message
        message_id="msg-0001",
        timestamp=1700000000,
        type="retryloop.interop",
        user_id=user_id,  # the broker insists it is the connection's user
        app_id="pika-interop",
        cluster_id="cluster-7",  # deprecated in 0-9-1; RabbitMQ 3.10 still carries it through
    )


BODY = '{"hello": "world", "ü": 1}'.encode()

# ---- what pika 1.2 does with each Python type (pika/data.py, encode_value) ------------------
#
# In order: str -> S (UTF-8); bytes -> x; bool -> t (checked before int); pika.compat.long ->
# l; int -> I when it fits int32, else l (and an error past int64); Decimal -> D, normalized,
# scale = -exponent when negative, else 0; datetime -> T, calendar.timegm(utctimetuple()),
# whole seconds; dict -> F; list -> A; None -> V. Anything else, float included, raises
# UnsupportedAMQPFieldException. pika never writes b, B, s, u, i, f, d or L.


def pika_letter(value):
    if isinstance(value, str):
        return "S"
    if isinstance(value, bytes):
        return "x"
    if isinstance(value, bool):
        return "t"
    if isinstance(value, pika.compat.long):
        return "l"
    if isinstance(value, int):
        return "I" if -(2**31) <= value < 2**31 else "l"
    if isinstance(value, decimal.Decimal):
        return "D"
    if isinstance(value, datetime.datetime):
        return "T"
    if isinstance(value, dict):
        return "F"
    if isinstance(value, list):
        return "A"
    if value is None:
        return "V"
    raise TypeError(f"pika cannot encode {type(value).__name__}")


def expected(value):
    """The {"type", "value"} a decoder must produce for a Python value pika encoded."""
    letter = pika_letter(value)
    if letter == "S":
        out = value
    elif letter == "x":
        out = value.hex()
    elif letter in "tIl":
        out = int(value) if letter != "t" else value
    elif letter == "D":
        normal = value.normalize()
        exponent = normal.as_tuple().exponent
        if exponent < 0:
            out = {"scale": -exponent, "value": int(normal * (decimal.Decimal(10) ** -exponent))}
        else:
            out = {"scale": 0, "value": int(normal)}
    elif letter == "T":
        out = calendar.timegm(value.utctimetuple())
    elif letter == "F":
        out = {k: expected(v) for k, v in value.items()}
    elif letter == "A":
        out = [expected(v) for v in value]
    else:
        out = None
    return {"type": letter, "value": out}


# ---- an independent decoder, with RabbitMQ's letters (not pika's decoder, which reads l as
# ---- unsigned, swaps b and B, and truncates f and d to integers) ---------------------------

FIXED = {"t": ">B", "b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I",
         "l": ">q", "f": ">f", "d": ">d", "T": ">Q"}


def decode_value(data, pos):
    letter = chr(data[pos])
    pos += 1
    if letter in FIXED:
        (value,) = struct.unpack_from(FIXED[letter], data, pos)
        pos += struct.calcsize(FIXED[letter])
        if letter == "t":
            value = bool(value)
        elif letter in "fd":
            value = repr(value)
    elif letter == "D":
        scale, raw = struct.unpack_from(">Bi", data, pos)
        pos += 5
        value = {"scale": scale, "value": raw}
    elif letter in "Sx":
        (length,) = struct.unpack_from(">I", data, pos)
        raw = bytes(data[pos + 4:pos + 4 + length])
        pos += 4 + length
        value = raw.decode("utf-8") if letter == "S" else raw.hex()
    elif letter == "F":
        value, pos = decode_table(data, pos)
    elif letter == "A":
        (length,) = struct.unpack_from(">I", data, pos)
        pos += 4
        end = pos + length
        value = []
        while pos < end:
            item, pos = decode_value(data, pos)
            value.append(item)
        assert pos == end, "array overruns its length"
    elif letter == "V":
        value = None
    else:
        raise ValueError(f"unknown field type {letter!r} at byte {pos - 1}")
    return {"type": letter, "value": value}, pos


def decode_table(data, pos):
    (length,) = struct.unpack_from(">I", data, pos)
    pos += 4
    end = pos + length
    table = {}
    while pos < end:
        key_length = data[pos]
        key = bytes(data[pos + 1:pos + 1 + key_length]).decode("utf-8")
        table[key], pos = decode_value(data, pos + 1 + key_length)
    assert pos == end, "table overruns its length"
    return table, pos


def unencodable():
    """Python types pika refuses, with the exception it raises."""
    found = {}
    for name, value in (("float", 1.5), ("int beyond int64", 2**63)):
        try:
            pika.data.encode_value([], value)
            found[name] = None
        except Exception as error:  # noqa: BLE001 - the exception type is the result
            found[name] = f"{type(error).__module__}.{type(error).__name__}"
    return found


def main():
    args = sys.argv[1:]
    verify = "--verify" in args
    args = [a for a in args if a != "--verify"]
    if len(args) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    url, queue = args

    parameters = pika.URLParameters(url)
    props = properties(parameters.credentials.username)

    # pika's bytes, decoded independently, must match the model of its encoder.
    pieces = []
    pika.data.encode_table(pieces, props.headers)
    table_bytes = b"".join(pieces)
    decoded, end = decode_table(table_bytes, 0)
    assert end == len(table_bytes)
    model = {k: expected(v) for k, v in props.headers.items()}
    if decoded != model:
        for key in model:
            if decoded.get(key) != model[key]:
                print(f"{key}: pika wrote {decoded.get(key)}, model says {model[key]}",
                      file=sys.stderr)
        sys.exit("pika_headers: pika's encoding differs from the model of its encoder")
    properties_bytes = b"".join(props.encode())

    refused = unencodable()

    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=False, auto_delete=False)
        # With confirms on, this returns once the broker acked, and raises if it nacked
        # (NackError) or returned the message (UnroutableError).
        channel.basic_publish("", queue, BODY, props, mandatory=True)
        if verify:
            check_round_trip(channel, queue, properties_bytes)
    finally:
        connection.close()

    out = {
        "pika_version": pika.__version__,
        "queue": queue,
        "body_hex": BODY.hex(),
        "properties": {
            name: getattr(props, name)
            for name in ("content_type", "content_encoding", "delivery_mode", "priority",
                         "correlation_id", "reply_to", "expiration", "message_id",
                         "timestamp", "type", "user_id", "app_id", "cluster_id")
        },
        "properties_hex": properties_bytes.hex(),
        "headers": decoded,
        "headers_table_hex": table_bytes.hex(),
        "pika_type_letters": {
            "bool": "t",
            "int in int32 range": "I",
            "int outside int32, within int64": "l",
            "pika.compat.long": "l",
            "decimal.Decimal": "D",
            "str": "S",
            "bytes": "x",
            "None": "V",
            "datetime.datetime": "T",
            "dict": "F",
            "list": "A",
            **{name: None for name in refused},
        },
        "unencodable": refused,
        "notes": [
            "pika writes the D mantissa as a signed int32; RabbitMQ parses it as unsigned, so "
            "only non-negative decimals are in this message",
            "T is whole seconds: microseconds are dropped; an aware datetime is converted to UTC",
        ],
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=2)
    print()


def check_round_trip(channel, queue, sent):
    captured = []
    original = pika.spec.BasicProperties.decode

    def capture(self, encoded, offset=0):
        captured.append(bytes(encoded[offset:]))
        return original(self, encoded, offset)

    pika.spec.BasicProperties.decode = capture
    try:
        method, _, body = channel.basic_get(queue, auto_ack=False)
    finally:
        pika.spec.BasicProperties.decode = original
    if method is None:
        sys.exit("pika_headers: --verify: the queue is empty")
    channel.basic_ack(method.delivery_tag)
    if body != BODY:
        sys.exit("pika_headers: --verify: the body came back changed")
    if captured[-1] != sent:
        sys.exit(f"pika_headers: --verify: properties came back changed:\n"
                 f"  sent     {sent.hex()}\n  received {captured[-1].hex()}")
    print("pika_headers: --verify: the broker delivered the same property bytes",
          file=sys.stderr)


if __name__ == "__main__":
    main()
