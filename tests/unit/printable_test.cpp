#include <catch2/catch.hpp>

#include <string>

#include "retryloop/amqp/printable.hpp"
#include "retryloop/topology/topology.hpp"

using retryloop::amqp::printable;

TEST_CASE("Printable text cannot end a log line or forge the next one", "[codec]") {
  const std::string forged = "x\n01:45:00.000 info service=svc FAKE LOG LINE all good\r";
  const std::string shown = printable(forged);
  CHECK(shown == "x\\n01:45:00.000 info service=svc FAKE LOG LINE all good\\r");
  CHECK(shown.find('\n') == std::string::npos);
  CHECK(printable("a\tb\x1b[31mred\x7f") == "a\\tb\\x1B[31mred\\x7F");
  CHECK(printable(std::string("nul\0byte", 8)) == "nul\\x00byte");
  // A backslash is doubled, so that an escape in the text reads differently from one made here.
  CHECK(printable("C:\\n") == "C:\\\\n");
}

TEST_CASE("Printable text keeps UTF-8 but escapes C1 and bidirectional controls", "[codec]") {
  CHECK(printable("Zürich 東京") == "Zürich 東京");
  CHECK(printable("\xc2\x85next") == "\\u0085next");  // NEL, a C1 control
  CHECK(printable("abc\xe2\x80\xae"
                  "evil") == "abc\\u202Eevil");                        // right-to-left override
  CHECK(printable("\xe2\x81\xa6x\xe2\x81\xa9") == "\\u2066x\\u2069");  // isolates
  CHECK(printable("line\xe2\x80\xa8sep") == "line\\u2028sep");
  // Bytes that are not UTF-8: an overlong '/', a lone continuation byte, a cut sequence.
  CHECK(printable("\xc0\xaf") == "\\xC0\\xAF");
  CHECK(printable("\x80") == "\\x80");
  CHECK(printable("\xe6\x9d") == "\\xE6\\x9D");
}

TEST_CASE("A topology error quotes a name with a bidirectional override escaped", "[topology]") {
  retryloop::topology::Topology topology;
  retryloop::topology::Service service;
  service.name = "orders\xe2\x80\xae";
  service.input.exchange = "orders.in";
  service.input.bindings = {{"k", {}, {}}, {"k", {}, {}}};
  service.retry.delays = {std::chrono::seconds(1)};
  topology.services = {service};
  auto errors = retryloop::topology::validate(topology);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(retryloop::topology::to_string(errors.front(), "f.json"),
             Catch::Contains("(service \"orders\\u202E\")"));
}
