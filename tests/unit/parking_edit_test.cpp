// The copy an edit-and-retry sends: only what the operator changed differs from the parked
// message, and every header they did not touch keeps its AMQP type and bytes.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/retry/history.hpp"

using namespace retryloop;

namespace {

std::string encoded(const amqp::FieldValue& value) {
  std::string out;
  amqp::Writer writer(out);
  writer.field_value(value);
  REQUIRE_FALSE(writer.error());
  return out;
}

/// A parked message whose application headers hold every AMQP field type, with the parking and
/// death headers a parked message carries.
amqp::BasicProperties parked_with_every_type() {
  amqp::FieldTable nested{{"region", amqp::FieldValue("eu")},
                          {"weight", amqp::FieldValue(int16_t(-3))}};
  amqp::FieldTable headers;
  headers.append("x-tenant-id", "tenant-7");
  headers.append("flag", true);
  headers.append("i8", int8_t(-8));
  headers.append("u8", uint8_t(200));
  headers.append("i16", int16_t(-1600));
  headers.append("u16", uint16_t(60000));
  headers.append("i32", int32_t(-320000));
  headers.append("u32", uint32_t(4000000000u));
  headers.append("i64", int64_t(-6400000000));
  headers.append("f32", 1.5f);
  headers.append("f64", 2.25);
  headers.append("price", amqp::Decimal{2, 1999});
  headers.append("text", "héllo");
  headers.append("binary", amqp::ByteArray{std::string("\x00\xff\x10 text", 8)});
  headers.append("utf8-bytes", amqp::ByteArray{"readable"});
  headers.append("list", amqp::FieldArray{amqp::FieldValue(int32_t(1)), amqp::FieldValue("two"),
                                          amqp::FieldValue(amqp::Timestamp{5})});
  headers.append("sent-at", amqp::Timestamp{1700000123});
  headers.append("context", nested);
  headers.append("nothing", amqp::Void{});
  headers.append(
      "x-death",
      amqp::FieldArray{amqp::FieldValue(amqp::FieldTable{
          {"count", amqp::FieldValue(int64_t(2))}, {"reason", amqp::FieldValue("rejected")}})});
  headers.append("x-first-death-queue", "orders");
  headers.append("retryloop-reason", "exhausted");
  headers.append("retryloop-error", "boom");
  headers.append("retryloop-attempts", int64_t(3));
  headers.append("retryloop-parked-at", amqp::Timestamp{1700000000});
  headers.append("retryloop-original-routing-key", "order.created");
  amqp::BasicProperties properties;
  properties.message_id = "original-1";
  properties.content_type = "application/json";
  properties.headers = std::move(headers);
  return properties;
}

parking::EditOptions body_only() {
  parking::EditOptions options;
  options.message_id = "original-1";
  options.body = "{\"fixed\": true}";
  options.note.by = "bob";
  options.note.via = "console";
  options.note.now_seconds = 1700000500;
  return options;
}

}  // namespace

TEST_CASE("An edit that changes only the body keeps every application header, type and bytes",
          "[parking][edit]") {
  const amqp::BasicProperties original = parked_with_every_type();
  const amqp::BasicProperties copy = parking::make_edited_copy(original, body_only(), "new-id-1");
  REQUIRE(copy.headers);
  size_t application = 0;
  for (const auto& entry : *original.headers) {
    if (!parking::header_editable(entry.name)) continue;
    ++application;
    INFO(entry.name);
    const amqp::FieldValue* kept = copy.headers->find(entry.name);
    REQUIRE(kept != nullptr);
    CHECK(kept->type_letter() == entry.value.type_letter());
    CHECK(encoded(*kept) == encoded(entry.value));
  }
  CHECK(application == 19);  // every type letter, and x-tenant-id
  CHECK(copy.message_id == "new-id-1");
  CHECK(copy.content_type == original.content_type);
  const amqp::FieldValue* from = copy.headers->find(parking::edited_from_header);
  REQUIRE(from != nullptr);
  CHECK(from->as_string() == "original-1");
  // retryloop's own headers follow a replay's rules: no parking or death headers, a history.
  CHECK(copy.headers->find("retryloop-reason") == nullptr);
  CHECK(copy.headers->find("retryloop-parked-at") == nullptr);
  CHECK(copy.headers->find("x-death") == nullptr);
  CHECK(copy.headers->find("x-first-death-queue") == nullptr);
  CHECK(copy.headers->find("retryloop-original-routing-key") != nullptr);
  const auto history = retry::read_history(&*copy.headers);
  REQUIRE_FALSE(history.entries.empty());
  CHECK(history.entries.back().outcome == retry::history_outcome::edited);
  CHECK(history.entries.back().by == "bob");
}

TEST_CASE(
    "An edited header takes its new value in the original's type where it fits, and a removed "
    "one goes",
    "[parking][edit]") {
  parking::EditOptions options = body_only();
  options.set_headers.append("i32", int64_t(41));             // fits int32: stays int32
  options.set_headers.append("u8", int64_t(300));             // does not fit uint8: int64
  options.set_headers.append("f64", int64_t(3));              // a number for a double: double
  options.set_headers.append("x-tenant-id", "tenant-8");      // a string for a string
  options.set_headers.append("added", "new");                 // not there before: appended
  options.remove_headers = {"text", "context", "not-there"};  // a missing one is no error
  REQUIRE_FALSE(parking::check_edit(options));
  const amqp::BasicProperties copy =
      parking::make_edited_copy(parked_with_every_type(), options, "new-id-2");
  const amqp::FieldTable& headers = *copy.headers;
  REQUIRE(headers.find("i32"));
  CHECK(headers.find("i32")->type_letter() == 'I');
  CHECK(headers.find("i32")->as_int64() == 41);
  CHECK(headers.find("u8")->type_letter() == 'l');
  CHECK(headers.find("u8")->as_int64() == 300);
  CHECK(headers.find("f64")->type_letter() == 'd');
  CHECK(*headers.find("f64")->get_if<double>() == 3.0);
  CHECK(headers.find("x-tenant-id")->as_string() == "tenant-8");
  CHECK(headers.find("added")->as_string() == "new");
  CHECK(headers.find("text") == nullptr);
  CHECK(headers.find("context") == nullptr);
  CHECK(headers.find("sent-at")->type_letter() == 'T');
  CHECK(headers.find("binary")->type_letter() == 'x');
}

TEST_CASE(
    "An edit that would change retryloop's or the broker's headers, or an unnamed, overlong "
    "or contradictory one, is refused naming the header",
    "[parking][edit]") {
  auto refusal = [](parking::EditOptions options) {
    const client::Error error = parking::check_edit(options);
    REQUIRE(error);
    return error.reply_text;
  };
  parking::EditOptions own = body_only();
  own.set_headers.append("retryloop-reason", "fixed");
  CHECK_THAT(refusal(own), Catch::Contains("retryloop-reason is retryloop's own"));
  parking::EditOptions death = body_only();
  death.remove_headers = {"x-death"};
  CHECK_THAT(refusal(death), Catch::Contains("x-death is the broker's"));
  parking::EditOptions unnamed = body_only();
  unnamed.set_headers.append("", "value");
  CHECK_THAT(refusal(unnamed), Catch::Contains("needs a name"));
  parking::EditOptions long_name = body_only();
  long_name.set_headers.append(std::string(256, 'h'), "value");
  CHECK_THAT(refusal(long_name), Catch::Contains("256 bytes; AMQP allows at most 255"));
  parking::EditOptions both = body_only();
  both.set_headers.append("tenant", "a");
  both.remove_headers = {"tenant"};
  CHECK_THAT(refusal(both), Catch::Contains("tenant is both set and removed"));
  parking::EditOptions longest = body_only();
  longest.set_headers.append(std::string(255, 'h'), "value");
  CHECK_FALSE(parking::check_edit(longest));
}

TEST_CASE("Only headers whose value text shows and types back without loss are editable as text",
          "[parking][edit]") {
  const amqp::BasicProperties parked = parked_with_every_type();
  std::vector<std::string> editable;
  for (const auto& entry : *parked.headers) {
    if (parking::header_editable_as_text(entry.name, entry.value)) editable.push_back(entry.name);
  }
  CHECK(editable == std::vector<std::string>{"x-tenant-id", "flag", "i8", "u8", "i16", "u16", "i32",
                                             "u32", "i64", "f32", "f64", "text"});
  CHECK_FALSE(parking::header_editable_as_text("bad-utf8", amqp::FieldValue("\xff\xfe")));
  CHECK(std::string(parking::field_type_name(amqp::FieldValue(amqp::Decimal{1, 5}))) == "decimal");
}
