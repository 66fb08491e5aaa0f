#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "retryloop/amqp/field_table.hpp"
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
