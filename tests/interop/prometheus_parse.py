#!/usr/bin/python3
"""Parses a Prometheus text exposition with the official Python client's parser
(python3-prometheus-client) and prints what it read as JSON, one object per sample:

    {"family": NAME, "type": TYPE, "name": SAMPLE_NAME, "labels": {...}, "value": FLOAT}

Usage: prometheus_parse.py FILE. Exits 1, with the parser's error on stderr, when the text does not
parse.
"""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    with open(sys.argv[1], encoding="utf-8") as exposition:
        text = exposition.read()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as error:  # the parser raises ValueError and others
        print(f"prometheus_client cannot parse the exposition: {error!r}", file=sys.stderr)
        return 1
    for family in families:
        for sample in family.samples:
            print(json.dumps({"family": family.name, "type": family.type, "name": sample.name,
                              "labels": sample.labels, "value": sample.value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
