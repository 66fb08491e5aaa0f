// W3C trace context: traceparent parsed by the spec's rules, read from a message's headers.

#include <catch2/catch.hpp>

#include "retryloop/retry/trace_context.hpp"

using namespace retryloop;
using retry::parse_traceparent;
using retry::trace_context;

namespace {
const char* const valid_traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
}

TEST_CASE("A version 00 traceparent gives its trace id, parent id and flags", "[trace]") {
  auto context = parse_traceparent(valid_traceparent, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  REQUIRE(context);
  CHECK(context->version == "00");
  CHECK(context->trace_id == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(context->parent_id == "00f067aa0ba902b7");
  CHECK(context->flags == 1);
  CHECK(context->sampled());
  CHECK(context->tracestate == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  CHECK(context->traceparent() == valid_traceparent);

  context = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe");
  REQUIRE(context);
  CHECK(context->flags == 0xfe);
  CHECK_FALSE(context->sampled());
  CHECK(context->tracestate.empty());
}

TEST_CASE("An invalid traceparent gives no trace context, and its tracestate is ignored",
          "[trace]") {
  const char* const invalid[] = {
      "",
      "00",
      // uppercase hex
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
      // all-zero trace id, all-zero parent id
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
      // version ff is forbidden; version 00 has exactly four fields
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
      // a later version must have a '-' after the flags if anything follows
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
      // wrong separators and lengths, non-hex characters
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
      "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  };
  for (const char* text : invalid) {
    INFO(text);
    CHECK_FALSE(parse_traceparent(text, "rojo=00f067aa0ba902b7"));
  }
}

TEST_CASE("A later version is read by its first four fields", "[trace]") {
  auto context =
      parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future");
  REQUIRE(context);
  CHECK(context->version == "cc");
  CHECK(context->trace_id == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(context->traceparent() == valid_traceparent);  // sent on as version 00
  CHECK(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
}

TEST_CASE("The trace context is read from string or byte-array headers, never made up", "[trace]") {
  amqp::FieldTable headers;
  CHECK_FALSE(trace_context(headers));
  headers.append("tracestate", "vendor=x");
  CHECK_FALSE(trace_context(headers));  // tracestate alone is nothing

  headers.set("traceparent", valid_traceparent);
  auto context = trace_context(headers);
  REQUIRE(context);
  CHECK(context->trace_id == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(context->tracestate == "vendor=x");

  headers.set("traceparent", amqp::ByteArray{valid_traceparent});
  CHECK(trace_context(headers));

  headers.set("traceparent", int64_t(1));
  CHECK_FALSE(trace_context(headers));
}
