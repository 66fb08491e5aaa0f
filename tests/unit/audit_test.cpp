#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/console/detail/audit_trail.hpp"
#include "retryloop/parking/audit.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/retry/history.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"

using namespace retryloop;

TEST_CASE("An audit record survives its JSON form, and a foreign one is refused by name",
          "[audit]") {
  parking::AuditRecord record;
  record.id = "0123456789abcdef0123456789abcdef";
  record.at_ms = 1'700'000'000'123;
  record.who = "ana at 127.0.0.1";
  record.via = "console";
  record.action = "replay";
  record.state = "done";
  record.service = "orders";
  record.filter = {{"reasons", {"exhausted"}}};
  record.asked = 3;
  record.done = 2;
  record.failed = 1;
  record.error = "returned";
  const nlohmann::json json = parking::audit_json(record);
  CHECK(json["at"] == "2023-11-14T22:13:20Z");
  const parking::AuditRecord back = parking::audit_from_json(json);
  CHECK(back.id == record.id);
  CHECK(back.at_ms == record.at_ms);
  CHECK(back.who == record.who);
  CHECK(back.filter == record.filter);
  CHECK(back.asked == record.asked);
  CHECK(back.done == record.done);
  CHECK(back.failed == 1);
  CHECK(back.error == "returned");
  CHECK_FALSE(json.contains("note"));

  CHECK_THROWS_WITH(parking::audit_from_json(nlohmann::json::array()),
                    Catch::Contains("JSON object"));
  CHECK_THROWS_WITH(parking::audit_from_json({{"id", "x"}}), Catch::Contains("needs an id and"));
  CHECK_THROWS_WITH(parking::audit_from_json({{"id", "x"}, {"action", "replay"}, {"asked", -1}}),
                    Catch::Contains("asked is not a whole number"));
  CHECK_THROWS_WITH(parking::audit_from_json({{"id", 5}, {"action", "replay"}}),
                    Catch::Contains("id is not a string"));
}

TEST_CASE("A topology file's audit declares one stream with its retention, never deleted",
          "[audit][topology]") {
  auto parsed = topology::parse_topology(R"({"audit": {"max_age": "30d"}})", "t.json");
  REQUIRE(parsed.ok());
  const topology::Plan plan = topology::make_plan(*parsed.topology);
  REQUIRE(plan.actions.size() == 1);
  const topology::Action& stream = plan.actions[0];
  CHECK(stream.kind == topology::ActionKind::declare_queue);
  CHECK(stream.role == topology::Role::audit_stream);
  CHECK(stream.name == "retryloop.audit");
  CHECK(*stream.arguments.find("x-queue-type")->as_string() == "stream");
  CHECK(*stream.arguments.find("x-max-age")->as_string() == "2592000s");
  CHECK(topology::make_delete_plan(*parsed.topology).actions.empty());

  auto defaults = topology::parse_topology(R"({"audit": {}})", "t.json");
  REQUIRE(defaults.ok());
  CHECK(*topology::make_plan(*defaults.topology)
             .actions[0]
             .arguments.find("x-max-age")
             ->as_string() == "31536000s");
  auto too_short = topology::parse_topology(R"({"audit": {"max_age": "500ms"}})", "t.json");
  REQUIRE_FALSE(too_short.ok());
  CHECK_THAT(too_short.messages().front(), Catch::Contains("audit.max_age"));
  auto unknown = topology::parse_topology(R"({"audit": {"keep": "1d"}})", "t.json");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.messages().front(), Catch::Contains("unknown key \"keep\""));
}

TEST_CASE("An edited copy gets the new headers, a new id, a link to the original and an entry",
          "[audit][history]") {
  amqp::BasicProperties original;
  original.message_id = "order-6";
  original.headers.emplace();
  original.headers->set("tenant", "acme");
  original.headers->set("old", "gone");
  original.headers->set("x-death", amqp::FieldArray{});
  original.headers->set("retryloop-reason", "poison");
  original.headers->set("retryloop-attempts", int64_t(1));
  original.headers->set("retryloop-original-routing-key", "order.created");
  parking::EditOptions options;
  options.message_id = "order-6";
  options.set_headers.set("tenant", "beta");
  options.set_headers.set("x-death", "forged");              // never taken from the editor
  options.set_headers.set("retryloop-replays", int64_t(9));  // nor retryloop's own
  options.remove_headers = {"old", "retryloop-original-routing-key"};
  options.note.via = "console";
  options.note.by = "bob at 127.0.0.1";
  const amqp::BasicProperties copy = parking::make_edited_copy(original, options, "new-id");
  CHECK(copy.message_id == std::optional<std::string>("new-id"));
  CHECK(*copy.headers->find("retryloop-edited-from")->as_string() == "order-6");
  CHECK(*copy.headers->find("tenant")->as_string() == "beta");
  CHECK(copy.headers->find("old") == nullptr);
  CHECK(copy.headers->find("x-death") == nullptr);
  CHECK(copy.headers->find("retryloop-reason") == nullptr);
  CHECK(*copy.headers->find("retryloop-replays")->as_int64() == 1);
  CHECK(*copy.headers->find("retryloop-original-routing-key")->as_string() == "order.created");
  const retry::History history = retry::read_history(&*copy.headers);
  REQUIRE(history.entries.size() == 1);
  CHECK(history.entries[0].outcome == "edited");
  CHECK(history.entries[0].by == "bob at 127.0.0.1");
  CHECK(history.entries[0].attempt == 1);

  options.set_headers.clear();  // no changes: the original's application headers stay
  options.remove_headers.clear();
  const amqp::BasicProperties kept = parking::make_edited_copy(original, options, "id-2");
  CHECK(*kept.headers->find("old")->as_string() == "gone");
}

namespace {

/// A record of `action` as the console writes it.
parking::AuditRecord console_record(const std::string& action, uint64_t at_ms) {
  parking::AuditRecord record;
  record.id = "id-" + std::to_string(at_ms);
  record.at_ms = at_ms;
  record.who = "ana at 127.0.0.1";
  record.via = "console";
  record.action = action;
  record.state = "done";
  record.service = "orders";
  return record;
}

/// The text of a filter of `count` message ids, each 32 hex digits as retryloop makes them.
nlohmann::json id_list_filter(size_t count) {
  nlohmann::json ids = nlohmann::json::array();
  for (size_t i = 0; i < count; ++i) {
    std::string id = std::to_string(i);
    ids.push_back(std::string(32 - id.size(), '0') + id);
  }
  return {{"message_ids", std::move(ids)}, {"reasons", {"exhausted"}}};
}

}  // namespace

TEST_CASE("An audit record read back is refused before parsing when it is too large or too deep",
          "[audit]") {
  // Deep inside a record, where reading it copies the filter recursively.
  const size_t depth = 500'000;
  const std::string deep = R"({"id": "x", "action": "note", "filter": )" + std::string(depth, '[') +
                           std::string(depth, ']') + "}";
  CHECK_THROWS_WITH(parking::audit_from_text(deep), Catch::Contains("more than 65536"));
  const std::string deeper = R"({"id": "x", "action": "note", "filter": )" + std::string(20, '[') +
                             std::string(20, ']') + "}";
  CHECK_THROWS_WITH(parking::audit_from_text(deeper), Catch::Contains("nests deeper than 16"));
  const std::string large = R"({"id": "x", "action": "note", "note": ")" +
                            std::string(parking::max_audit_record_bytes, 'n') + R"("})";
  CHECK_THROWS_WITH(parking::audit_from_text(large), Catch::Contains("more than 65536"));
  CHECK_THROWS_WITH(parking::audit_from_text("{\"id\": "), Catch::Contains("not JSON"));
  CHECK_THROWS_WITH(parking::audit_from_text("[]"), Catch::Contains("JSON object"));

  // What a record says of itself is not believed.
  const parking::AuditRecord claimed = parking::audit_from_text(
      R"({"id": "x", "action": "note", "who": "admin", "verified": true, "offset": 3})");
  CHECK(claimed.who == "admin");
  CHECK_FALSE(claimed.verified);
  CHECK_FALSE(claimed.offset);
  CHECK(parking::audit_json(claimed)["verified"] == false);
}

TEST_CASE("An audit signature holds only for the same bytes and the same key", "[audit]") {
  const std::string key(32, 'k');
  const std::string body = parking::audit_json(console_record("purge", 1)).dump();
  const std::string signature = parking::audit_signature(key, body);
  CHECK(signature.size() == 64);
  CHECK(parking::audit_signature_valid(key, body, signature));
  CHECK_FALSE(parking::audit_signature_valid(std::string(32, 'x'), body, signature));
  std::string forged = body;
  forged.replace(forged.find("ana"), 3, "bob");
  CHECK_FALSE(parking::audit_signature_valid(key, forged, signature));
  CHECK_FALSE(parking::audit_signature_valid(key, body, signature.substr(1)));
  CHECK_FALSE(parking::audit_signature_valid("", body, parking::audit_signature("", body)));
}

TEST_CASE("A count of a 1 MiB list of message ids is audited as a count and a digest",
          "[audit][console]") {
  const nlohmann::json filter = id_list_filter(1024 * 1024 / 35);  // 35 bytes per id in JSON
  REQUIRE(filter.dump().size() >= 1024 * 1024);
  auto trail = std::make_shared<console::detail::AuditTrail>(false, nullptr);
  parking::AuditRecord record = console_record("count", 1'700'000'000'000);
  record.filter = filter;
  record.error = std::string(100'000, 'e');
  std::string answer = "none";
  trail->append(record, nullptr, [&](const std::string& error) { answer = error; });
  CHECK(answer.empty());

  const nlohmann::json kept = trail->json(10)["records"].at(0);
  INFO(kept.dump());
  CHECK(kept["filter"]["reasons"] == nlohmann::json{"exhausted"});
  CHECK(kept["filter"]["message_ids"]["count"] == filter["message_ids"].size());
  CHECK(kept["filter"]["message_ids"]["sha256"].get<std::string>().size() == 64);
  CHECK(kept["error"].get<std::string>().size() == parking::max_audit_error_bytes);
  CHECK(kept.dump().size() < 2048);
  CHECK(trail->bytes() < 4096);
  // The same list gives the same digest; another list another.
  nlohmann::json other = filter;
  other["message_ids"][0] = "another";
  CHECK(parking::audit_filter(filter) == parking::audit_filter(filter));
  CHECK(parking::audit_filter(filter) != parking::audit_filter(other));
  // A short list is kept as it is.
  CHECK(parking::audit_filter(id_list_filter(3)) == id_list_filter(3));
}

TEST_CASE(
    "The audit trail in memory stays within its byte bound while records of every kind arrive, "
    "and keeps the newest note of each cause",
    "[audit][console]") {
  const size_t bound = 64 * 1024;
  auto trail = std::make_shared<console::detail::AuditTrail>(false, nullptr, "", bound);
  const std::vector<std::string> actions = {"replay", "purge", "count", "edit", "note"};
  uint64_t at = 1'700'000'000'000;
  // Notes on three causes, the second one twice, then many records of every kind.
  for (const char* group : {"cause a", "cause b", "cause c", "cause b"}) {
    parking::AuditRecord note = console_record("note", ++at);
    note.group = group;
    note.note = std::string("about ") + group + " at " + std::to_string(at);
    trail->keep(note);
  }
  size_t most = 0;
  for (size_t i = 0; i < 3000; ++i) {
    parking::AuditRecord record = console_record(actions[i % actions.size()], ++at);
    if (record.action == "note") {
      record.group = "cause " + std::to_string(100 + i % 7);
      record.note = std::string(2000, 'n');
    } else {
      record.filter = id_list_filter(i % 50);
      record.error = std::string(i % 3000, 'e');
      record.message_id = "m" + std::to_string(i);
    }
    trail->keep(record);
    most = std::max(most, trail->bytes());
  }
  INFO("most bytes held: " << most);
  CHECK(most <= bound);
  const nlohmann::json notes = trail->notes("orders");
  CHECK(notes["cause a"]["note"] == "about cause a at 1700000000001");
  CHECK(notes["cause b"]["note"] == "about cause b at 1700000000004");
  CHECK(notes["cause c"]["note"] == "about cause c at 1700000000003");
  CHECK(notes.size() == 3 + 7);
  // The old records themselves are gone.
  const nlohmann::json records = trail->json(100000)["records"];
  CHECK(records.size() < 3000);
  CHECK(records.back()["at_ms"] > 1'700'000'000'004);
}
