#include <sys/mman.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "codec_support.hpp"
#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/frame.hpp"

using namespace retryloop::amqp;
using retryloop::amqp::test::from_hex;
using retryloop::amqp::test::to_hex;

namespace {

std::string encode_value(const FieldValue& v) {
  std::string out;
  Writer w(out);
  w.field_value(v);
  REQUIRE_FALSE(w.error());
  return out;
}

std::string encode_table(const FieldTable& t, int max_nesting = kDefaultMaxNesting) {
  std::string out;
  Writer w(out, max_nesting);
  w.table(t);
  REQUIRE_FALSE(w.error());
  return out;
}

std::error_code decode_table(std::string_view bytes, FieldTable& out,
                             int max_nesting = kDefaultMaxNesting) {
  Reader r(bytes, max_nesting);
  r.table(out);
  if (!r.ok()) return r.error();
  if (!r.at_end()) return make_error_code(CodecError::trailing_bytes);
  return {};
}

struct TypeCase {
  FieldValue value;
  const char* hex;  // the type letter and the encoded value
};

// One value of every type, with its bounds, as RabbitMQ encodes them.
std::vector<TypeCase> type_cases() {
  const std::string non_utf8("\xff\xfe\x00\xc3\x28 ok", 8);
  return {
      {FieldValue(true), "74 01"},
      {FieldValue(false), "74 00"},
      {FieldValue(std::numeric_limits<int8_t>::min()), "62 80"},
      {FieldValue(std::numeric_limits<int8_t>::max()), "62 7f"},
      {FieldValue(uint8_t{0}), "42 00"},
      {FieldValue(std::numeric_limits<uint8_t>::max()), "42 ff"},
      {FieldValue(std::numeric_limits<int16_t>::min()), "73 8000"},
      {FieldValue(std::numeric_limits<int16_t>::max()), "73 7fff"},
      {FieldValue(std::numeric_limits<uint16_t>::max()), "75 ffff"},
      {FieldValue(std::numeric_limits<int32_t>::min()), "49 80000000"},
      {FieldValue(std::numeric_limits<int32_t>::max()), "49 7fffffff"},
      {FieldValue(int32_t{-1}), "49 ffffffff"},
      {FieldValue(std::numeric_limits<uint32_t>::max()), "69 ffffffff"},
      {FieldValue(std::numeric_limits<int64_t>::min()), "6c 8000000000000000"},
      {FieldValue(std::numeric_limits<int64_t>::max()), "6c 7fffffffffffffff"},
      {FieldValue(1.5f), "66 3fc00000"},
      {FieldValue(-std::numeric_limits<float>::max()), "66 ff7fffff"},
      {FieldValue(std::numeric_limits<float>::denorm_min()), "66 00000001"},
      {FieldValue(-2.25), "64 c002000000000000"},
      {FieldValue(std::numeric_limits<double>::lowest()), "64 ffefffffffffffff"},
      {FieldValue(std::numeric_limits<double>::infinity()), "64 7ff0000000000000"},
      {FieldValue(Decimal{2, 12345}), "44 02 00003039"},
      {FieldValue(Decimal{255, 0xffffffff}), "44 ff ffffffff"},
      {FieldValue(""), "53 00000000"},
      {FieldValue("orders"), "53 00000006 6f7264657273"},
      {FieldValue(non_utf8), "53 00000008 fffe00c3 28206f6b"},
      {FieldValue(ByteArray{}), "78 00000000"},
      {FieldValue(ByteArray{non_utf8}), "78 00000008 fffe00c3 28206f6b"},
      {FieldValue(FieldArray{}), "41 00000000"},
      {FieldValue(FieldArray{FieldValue(int32_t{1}), FieldValue("a")}),
       "41 0000000b 49 00000001 53 00000001 61"},
      {FieldValue(Timestamp{1700000000}), "54 000000006553f100"},
      {FieldValue(Timestamp{std::numeric_limits<uint64_t>::max()}), "54 ffffffffffffffff"},
      {FieldValue(FieldTable{}), "46 00000000"},
      {FieldValue(FieldTable{{"k", FieldValue(Void{})}}), "46 00000003 01 6b 56"},
      {FieldValue(Void{}), "56"},
  };
}

// A table holding one value of every type, nested containers included.
FieldTable every_type_table() {
  FieldTable t;
  int i = 0;
  for (const TypeCase& c : type_cases())
    t.append("field-" + std::to_string(i++), c.value);
  t.append("nested", FieldTable{{"array", FieldArray{FieldTable{{"deep", FieldValue(true)}}}}});
  return t;
}

// Tables nested `depth` deep, built from the inside out: each level holds one entry "a".
std::string nested_tables_bytes(int depth, char letter) {
  std::string inner("\x00\x00\x00\x00", 4);
  for (int i = 1; i < depth; ++i) {
    std::string body = letter == 'F' ? std::string(
                                           "\x01"
                                           "a"
                                           "F",
                                           3)
                                     : std::string("A", 1);
    body += inner;
    std::string framed;
    Writer w(framed);
    w.u32(static_cast<uint32_t>(body.size()));
    framed += body;
    inner = framed;
  }
  return inner;
}

FieldTable nested_table(int depth) {
  FieldTable t;
  for (int i = 1; i < depth; ++i) {
    FieldTable outer;
    outer.append("a", std::move(t));
    t = std::move(outer);
  }
  return t;
}

}  // namespace

TEST_CASE("Every field type encodes with its RabbitMQ type letter and decodes back", "[codec]") {
  for (const TypeCase& c : type_cases()) {
    CAPTURE(c.hex);
    std::string expected = from_hex(c.hex);
    std::string encoded = encode_value(c.value);
    CHECK(to_hex(encoded) == to_hex(expected));
    CHECK(c.value.type_letter() == expected[0]);

    Reader r(encoded);
    char type = static_cast<char>(r.u8());
    FieldValue decoded;
    r.field_value(type, decoded);
    REQUIRE(r.ok());
    CHECK(r.at_end());
    CHECK(decoded == c.value);
    CHECK(decoded.type_letter() == type);
  }
}

TEST_CASE("A table with every type round-trips to the same bytes", "[codec]") {
  FieldTable table = every_type_table();
  std::string bytes = encode_table(table);
  FieldTable decoded;
  REQUIRE_FALSE(decode_table(bytes, decoded));
  CHECK(decoded == table);
  CHECK(encode_table(decoded) == bytes);
}

TEST_CASE("A table keeps entry order and duplicate names through a round trip", "[codec]") {
  // Entries in non-alphabetical order with a duplicate name, as a peer may send them.
  std::string bytes = from_hex(
      "00000016"
      "01 7a 53 00000001 31"  // z = "1"
      "01 61 62 ff"           // a = int8 -1
      "01 7a 49 00000002"     // z = int32 2
      "01 6d 56");            // m = void
  FieldTable t;
  REQUIRE_FALSE(decode_table(bytes, t));
  REQUIRE(t.size() == 4);
  std::vector<std::string> names;
  for (const FieldEntry& e : t)
    names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"z", "a", "z", "m"});
  CHECK(*t.find("z")->as_string() == "1");
  CHECK(encode_table(t) == bytes);
}

TEST_CASE("An empty table and an empty array are four zero bytes", "[codec]") {
  CHECK(encode_table(FieldTable{}) == std::string(4, '\0'));
  std::string out;
  Writer w(out);
  w.array(FieldArray{});
  CHECK(out == std::string(4, '\0'));
  FieldArray array{FieldValue(1.0)};
  Reader r(out);
  r.array(array);
  CHECK(r.ok());
  CHECK(array.empty());
}

TEST_CASE("Decoding a table replaces what the output table held", "[codec]") {
  FieldTable t{{"old", FieldValue("x")}};
  REQUIRE_FALSE(decode_table(from_hex("00000006 03 6e6577 74 01"), t));
  REQUIRE(t.size() == 1);
  CHECK(t.find("old") == nullptr);
  CHECK(*t.find("new")->get_if<bool>());
}

TEST_CASE("A bool with a value other than 0 or 1 decodes as true like RabbitMQ does", "[codec]") {
  FieldTable t;
  REQUIRE_FALSE(decode_table(from_hex("00000004 01 62 74 02"), t));
  REQUIRE(t.find("b")->get_if<bool>() != nullptr);
  CHECK(*t.find("b")->get_if<bool>());
}

TEST_CASE("An x-death header from RabbitMQ 3.10 decodes to the values the broker wrote",
          "[codec]") {
  std::string frame = from_hex(test::kXDeathHeader310);
  std::error_code ec;
  auto frames = test::parse_frames(frame, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(frames.size() == 1);
  ContentHeader header;
  REQUIRE_FALSE(decode_header_frame(frames[0].payload, header));
  CHECK(header.body_size == 5);
  CHECK(header.properties.content_type == "text/plain");
  CHECK(header.properties.delivery_mode == 2);
  CHECK(header.properties.message_id == "m-1");
  REQUIRE(header.properties.headers);
  const FieldTable& headers = *header.properties.headers;

  std::vector<std::string> names;
  for (const FieldEntry& e : headers)
    names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"app", "x-death", "x-first-death-exchange",
                                          "x-first-death-queue", "x-first-death-reason"});
  CHECK(headers.find("x-first-death-exchange")->type_letter() == 'S');
  CHECK(*headers.find("x-first-death-exchange")->as_string() == "");
  CHECK(*headers.find("x-first-death-queue")->as_string() == "rl.work");
  CHECK(*headers.find("x-first-death-reason")->as_string() == "rejected");

  const FieldValue* x_death = headers.find("x-death");
  REQUIRE(x_death->type_letter() == 'A');
  const FieldArray& deaths = *x_death->get_if<FieldArray>();
  REQUIRE(deaths.size() == 2);

  // Most recent first: the wait queue's expiry, then the work queue's rejection.
  const FieldTable& expired = *deaths[0].get_if<FieldTable>();
  CHECK(expired.find("count")->type_letter() == 'l');
  CHECK(*expired.find("count")->get_if<int64_t>() == 1);
  CHECK(*expired.find("reason")->as_string() == "expired");
  CHECK(*expired.find("queue")->as_string() == "rl.wait");
  CHECK(expired.find("exchange")->type_letter() == 'S');
  CHECK(*expired.find("exchange")->as_string() == "");
  CHECK(expired.find("time")->type_letter() == 'T');
  CHECK(expired.find("time")->get_if<Timestamp>()->seconds > 1600000000);
  const FieldArray& keys = *expired.find("routing-keys")->get_if<FieldArray>();
  REQUIRE(keys.size() == 1);
  CHECK(keys[0].type_letter() == 'S');
  CHECK(*keys[0].as_string() == "rl.wait");

  const FieldTable& rejected = *deaths[1].get_if<FieldTable>();
  CHECK(*rejected.find("count")->as_int64() == 1);
  CHECK(*rejected.find("reason")->as_string() == "rejected");
  CHECK(*rejected.find("queue")->as_string() == "rl.work");
  // RabbitMQ 3.10 leaves the older entry unsorted: count first, then the order it was built in.
  std::vector<std::string> keys_in_order;
  for (const FieldEntry& e : rejected)
    keys_in_order.push_back(e.name);
  CHECK(keys_in_order ==
        std::vector<std::string>{"count", "reason", "queue", "time", "exchange", "routing-keys"});

  std::string reencoded;
  REQUIRE_FALSE(
      append_header_frame(reencoded, frames[0].channel, header.body_size, header.properties));
  CHECK(to_hex(reencoded) == to_hex(frame));
}

TEST_CASE("An x-death count of 2 after a second loop re-encodes to the broker's bytes", "[codec]") {
  std::string frame = from_hex(test::kXDeathHeaderCount2);
  ContentHeader header;
  REQUIRE_FALSE(decode_header_frame(test::payload_of(frame), header));
  const FieldArray& deaths = *header.properties.headers->find("x-death")->get_if<FieldArray>();
  REQUIRE(deaths.size() == 2);
  for (const FieldValue& death : deaths) {
    CHECK(*death.get_if<FieldTable>()->find("count")->get_if<int64_t>() == 2);
  }
  std::string reencoded;
  REQUIRE_FALSE(append_header_frame(reencoded, 1, header.body_size, header.properties));
  CHECK(to_hex(reencoded) == to_hex(frame));
}

TEST_CASE("A headers table with x-death is four levels deep and a limit of three rejects it",
          "[codec]") {
  // headers (table) > x-death (array) > entry (table) > routing-keys (array)
  std::string payload = test::payload_of(from_hex(test::kXDeathHeader310));
  // Skip class, weight, body size, flags and the content type to reach the headers table.
  std::string rest = payload.substr(14 + 1 + 10);
  FieldTable decoded;
  Reader four(rest, 4);
  four.table(decoded);
  CHECK(four.ok());
  std::string table = rest.substr(0, four.position());
  FieldTable t;
  Reader three(table, 3);
  three.table(t);
  CHECK(three.error() == CodecError::nesting_too_deep);

  std::string out;
  Writer w4(out, 4);
  w4.table(decoded);
  CHECK_FALSE(w4.error());
  CHECK(out == table);
  out.clear();
  Writer w3(out, 3);
  w3.table(decoded);
  CHECK(w3.error() == CodecError::nesting_too_deep);
}

TEST_CASE("Tables nested to the default limit round-trip and one more level is rejected",
          "[codec]") {
  std::string at_limit = nested_tables_bytes(kDefaultMaxNesting, 'F');
  FieldTable t;
  REQUIRE_FALSE(decode_table(at_limit, t));
  CHECK(encode_table(t) == at_limit);

  FieldTable over;
  CHECK(decode_table(nested_tables_bytes(kDefaultMaxNesting + 1, 'F'), over) ==
        CodecError::nesting_too_deep);
}

TEST_CASE("Tables or arrays nested 1000 deep are rejected by the decoder", "[codec]") {
  FieldTable t;
  CHECK(decode_table(nested_tables_bytes(1000, 'F'), t) == CodecError::nesting_too_deep);

  std::string arrays = nested_tables_bytes(1000, 'A');
  FieldArray a;
  Reader r(arrays);
  r.array(a);
  CHECK(r.error() == CodecError::nesting_too_deep);
}

TEST_CASE("Tables nested 1000 deep are rejected by the encoder", "[codec]") {
  FieldTable deep = nested_table(1000);
  std::string out;
  Writer w(out);
  w.table(deep);
  CHECK(w.error() == CodecError::nesting_too_deep);

  FieldArray arrays;
  for (int i = 0; i < 1000; ++i)
    arrays = FieldArray{FieldValue(std::move(arrays))};
  out.clear();
  Writer wa(out);
  wa.array(arrays);
  CHECK(wa.error() == CodecError::nesting_too_deep);
}

TEST_CASE("Every unknown type letter is rejected in tables and arrays", "[codec]") {
  const std::string known = "tbBsuIilfdDSxATFV";
  for (int letter = 0; letter < 256; ++letter) {
    if (known.find(static_cast<char>(letter)) != std::string::npos) continue;
    CAPTURE(letter);
    std::string table =
        from_hex("0000000b 01 6b") + static_cast<char>(letter) + std::string(8, '\0');
    FieldTable t;
    CHECK(decode_table(table, t) == CodecError::unknown_field_type);

    std::string array = from_hex("00000009") + static_cast<char>(letter) + std::string(8, '\0');
    FieldArray a;
    Reader r(array);
    r.array(a);
    CHECK(r.error() == CodecError::unknown_field_type);
  }
}

TEST_CASE("The 0-9-1 spec letters that RabbitMQ does not use are unknown", "[codec]") {
  for (char letter : {'U', 'L', 'X'}) {
    std::string table = from_hex("00000007 01 6b") + letter + std::string(4, '\0');
    FieldTable t;
    CHECK(decode_table(table, t) == CodecError::unknown_field_type);
  }
}

TEST_CASE("A table whose declared length overruns the data is truncated", "[codec]") {
  FieldTable t;
  CHECK(decode_table(from_hex("00000010 01 6b 56"), t) == CodecError::truncated);
  CHECK(decode_table(from_hex("ffffffff"), t) == CodecError::truncated);
  FieldArray a;
  const std::string bytes = from_hex("00000100 56");  // the Reader only views its input
  Reader r(bytes);
  r.array(a);
  CHECK(r.error() == CodecError::truncated);
}

TEST_CASE("An entry running past its table's declared length is an error", "[codec]") {
  // The table claims 4 bytes, but its int32 entry needs 7; the bytes after it must not be used.
  std::string bytes = from_hex("00000004 01 6b 49 00 000000 00000000");
  Reader r(bytes);
  FieldTable t;
  r.table(t);
  CHECK(r.error() == CodecError::truncated);

  // A nested table's length running past its parent's.
  std::string nested = from_hex("00000008 01 6b 46 00000010 56 56 56 56 56 56 56 56 56 56");
  Reader rn(nested);
  rn.table(t);
  CHECK(rn.error() == CodecError::truncated);
}

TEST_CASE("A table cut short at any byte fails as truncated", "[codec]") {
  std::string bytes = encode_table(every_type_table());
  for (size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    Reader r(std::string_view(bytes).substr(0, n));
    FieldTable t;
    r.table(t);
    CHECK(r.error() == CodecError::truncated);
  }
}

TEST_CASE("An x-death header cut short at any byte fails as truncated", "[codec]") {
  std::string payload = test::payload_of(from_hex(test::kXDeathHeader310));
  for (size_t n = 0; n < payload.size(); ++n) {
    CAPTURE(n);
    ContentHeader header;
    CHECK(decode_header_frame(std::string_view(payload).substr(0, n), header) ==
          CodecError::truncated);
  }
}

TEST_CASE("A table entry name over 255 bytes fails to encode", "[codec]") {
  FieldTable t{{std::string(256, 'n'), FieldValue(true)}};
  std::string out;
  Writer w(out);
  w.table(t);
  CHECK(w.error() == CodecError::string_too_long);

  FieldTable ok{{std::string(255, 'n'), FieldValue(true)}};
  FieldTable decoded;
  REQUIRE_FALSE(decode_table(encode_table(ok), decoded));
  CHECK(decoded == ok);
}

TEST_CASE("A long string over 4 GiB fails to encode instead of wrapping its length", "[codec]") {
  // Address space only: the pages are never touched, so no memory is used.
  const size_t size = size_t{std::numeric_limits<uint32_t>::max()} + 1;
  void* pages = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(pages != MAP_FAILED);
  std::string out;
  Writer w(out);
  w.long_string(std::string_view(static_cast<const char*>(pages), size));
  CHECK(w.error() == CodecError::value_too_long);
  CHECK(out.empty());
  w.long_string(std::string_view(static_cast<const char*>(pages), 3));
  CHECK(w.error() == CodecError::value_too_long);  // sticky
  munmap(pages, size);

  std::string fits;
  Writer ok(fits);
  ok.long_string("abc");
  CHECK_FALSE(ok.error());
  CHECK(fits == std::string("\0\0\0\3abc", 7));
}

TEST_CASE("The Writer's error is sticky", "[codec]") {
  std::string out;
  Writer w(out);
  w.short_string(std::string(300, 's'));
  w.short_string("fine");
  CHECK(w.error() == CodecError::string_too_long);
}

TEST_CASE("The Reader returns zeros past the end and keeps its first error", "[codec]") {
  Reader r(from_hex("01"));
  CHECK(r.u16() == 0);
  CHECK(r.error() == CodecError::truncated);
  CHECK(r.u8() == 0);
  CHECK(r.short_string_view().empty());
  FieldTable t;
  r.table(t);
  CHECK(r.error() == CodecError::truncated);
}

TEST_CASE("FieldTable set replaces in place and append keeps duplicates", "[codec]") {
  FieldTable t;
  t.set("a", FieldValue(int32_t{1}));
  t.set("b", FieldValue("x"));
  t.set("a", FieldValue(int64_t{2}));
  REQUIRE(t.size() == 2);
  CHECK(t.begin()->name == "a");
  CHECK(t.find("a")->type_letter() == 'l');
  t.append("a", FieldValue(true));
  CHECK(t.size() == 3);
  CHECK(t.erase("b"));
  CHECK_FALSE(t.erase("b"));
  CHECK(t.erase_if([](const std::string& name) { return name == "a"; }) == 2);
  CHECK(t.empty());
}

TEST_CASE("erase_if strips every x- header and keeps the order of the rest", "[codec]") {
  FieldTable t{{"x-death", FieldValue(FieldArray{})},
               {"retryloop-retries", FieldValue(int64_t{1})},
               {"x-first-death-queue", FieldValue("q")},
               {"app", FieldValue("demo")}};
  CHECK(t.erase_if([](const std::string& n) { return n.rfind("x-", 0) == 0; }) == 2);
  std::vector<std::string> names;
  for (const FieldEntry& e : t)
    names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"retryloop-retries", "app"});
}

TEST_CASE("as_int64 reads every integer type and nothing else", "[codec]") {
  CHECK(FieldValue(int8_t{-5}).as_int64() == -5);
  CHECK(FieldValue(uint8_t{200}).as_int64() == 200);
  CHECK(FieldValue(int16_t{-300}).as_int64() == -300);
  CHECK(FieldValue(uint16_t{60000}).as_int64() == 60000);
  CHECK(FieldValue(int32_t{-70000}).as_int64() == -70000);
  CHECK(FieldValue(uint32_t{4000000000u}).as_int64() == 4000000000);
  CHECK(FieldValue(std::numeric_limits<int64_t>::min()).as_int64() ==
        std::numeric_limits<int64_t>::min());
  CHECK_FALSE(FieldValue(true).as_int64());
  CHECK_FALSE(FieldValue(1.0).as_int64());
  CHECK_FALSE(FieldValue("1").as_int64());
  CHECK_FALSE(FieldValue(Timestamp{1}).as_int64());
}

TEST_CASE("as_string reads long strings and byte arrays only", "[codec]") {
  CHECK(FieldValue("abc").as_string() == "abc");
  CHECK(FieldValue(ByteArray{"\x01\x02"}).as_string() == "\x01\x02");
  CHECK_FALSE(FieldValue(int32_t{1}).as_string());
  CHECK_FALSE(FieldValue(Void{}).as_string());
}

TEST_CASE("Values of different types are not equal even when the number is", "[codec]") {
  CHECK(FieldValue(int32_t{1}) != FieldValue(int64_t{1}));
  CHECK(FieldValue("a") != FieldValue(ByteArray{"a"}));
  CHECK(FieldTable{{"a", FieldValue(true)}} != FieldTable{{"a", FieldValue(false)}});
}
