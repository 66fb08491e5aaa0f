// The console's edit-and-retry against a scripted peer that holds the edited copy's confirm back:
// what a stop does meanwhile, and what the console says when the confirm never comes.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "retryloop/console/detail/audit_trail.hpp"
#include "retryloop/console/detail/core.hpp"
#include "retryloop/topology/topology.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/scripted_peer.hpp"

using namespace retryloop;
using console::detail::Core;
using test::Received;
using test::ScriptedPeer;
using test::TestLoop;

namespace {

/// A console on one service whose parking queue, as the scripted peer plays it, holds one
/// message, `parked-1`: every consumer is sent it. The peer confirms no publish by itself.
struct EditingConsole {
  TestLoop& loop;
  ScriptedPeer peer;
  topology::Service service;
  std::shared_ptr<Core> core;
  bool stopped = false;

  explicit EditingConsole(TestLoop& l)
      : loop(l),
        peer(l.get(), ScriptedPeer::Options{2047, 131072, 0, false}),
        service(test::make_service("edits", R"("delays": ["1s"], "max_attempts": 3)")) {
    peer.script_message_counts(topology::parking_queue_name(service.name), {1});
    peer.on<amqp::BasicConsume>([this](const Received& r) {
      amqp::BasicConsumeOk ok;
      ok.consumer_tag = "walk-" + std::to_string(r.channel);
      peer.send(r.channel, ok, r.connection);
      amqp::BasicDeliver deliver;
      deliver.consumer_tag = ok.consumer_tag;
      deliver.delivery_tag = 1;
      amqp::BasicProperties properties;
      properties.message_id = "parked-1";
      properties.headers = amqp::FieldTable{{"retryloop-reason", amqp::FieldValue("poison")}};
      peer.send_content(r.channel, deliver, properties, "broken", r.connection);
    });
    console::Options options;
    options.connection.uri = client::parse_uri(peer.url());
    options.services = {service};
    options.rescan_after = std::chrono::milliseconds(0);
    auto audit = std::make_shared<console::detail::AuditTrail>(false, nullptr);
    core = std::make_shared<Core>(loop.get(), options, service, audit, false);
    bool ready = false;
    core->start([&](console::ServeResult result) {
      CHECK(result.status == console::ServeResult::Status::stopped);
      ready = true;
    });
    REQUIRE(loop.run_until([&] { return ready; }));
  }

  ~EditingConsole() {
    if (!stopped) core->stop(true, [this] { stopped = true; });
    loop.run_until([this] { return stopped; });
  }

  nlohmann::json state() { return nlohmann::json::parse(core->state().body); }

  /// Asks for an edit of `parked-1` and runs until the peer has its copy, unconfirmed.
  Received edit_until_published() {
    const auto reply =
        core->request_edit({{"message_id", "parked-1"}, {"body", "fixed"}}, "tester at test");
    REQUIRE(reply.status == 200);
    REQUIRE(loop.run_until([&] { return peer.count<amqp::BasicPublish>() == 1; }));
    for (const auto& r : peer.received()) {
      if (r.is<amqp::BasicPublish>()) return r;
    }
    FAIL("no publish");
    return {};
  }

  /// Where the first frame of `Method` the client sent is in the conversation; -1: none.
  template <class Method>
  long position() const {
    const auto& received = peer.received();
    for (size_t i = 0; i < received.size(); ++i) {
      if (received[i].is<Method>()) return long(i);
    }
    return -1;
  }
};

}  // namespace

TEST_CASE(
    "A console stop during an edit waits for the copy's confirm, then acks the original "
    "and reports the edit sent",
    "[conversation][console]") {
  TestLoop loop;
  EditingConsole console(loop);
  const Received publish = console.edit_until_published();
  CHECK(publish.body == "fixed");

  console.core->stop(false, [&] { console.stopped = true; });
  amqp::BasicAck confirm;
  confirm.delivery_tag = console.peer.last_sequence(publish.channel);
  console.peer.send(publish.channel, confirm);
  REQUIRE(loop.run_until([&] { return console.stopped; }));

  // The original's ack went out before the connection closed.
  const long ack = console.position<amqp::BasicAck>();
  const long close = console.position<amqp::ConnectionClose>();
  CHECK(ack >= 0);
  CHECK(close > ack);
  const nlohmann::json job = console.state().at("job");
  INFO(job.dump());
  CHECK(job.at("state") == "done");
  CHECK(job.at("outcome") == "sent");
  CHECK(job.at("progress").at("moved") == 1);
}

TEST_CASE(
    "An edit whose connection ends before the copy's confirm says the copy may have been "
    "sent, never that it was not",
    "[conversation][console]") {
  TestLoop loop;
  EditingConsole console(loop);
  const Received publish = console.edit_until_published();
  const std::string new_id = publish.properties->message_id.value_or("");
  REQUIRE_FALSE(new_id.empty());

  console.peer.drop();
  REQUIRE(loop.run_until([&] { return console.state().at("job").at("state") == "failed"; }));
  const nlohmann::json job = console.state().at("job");
  INFO(job.dump());
  CHECK(job.at("outcome") == "unknown");
  CHECK(job.at("new_message_id") == new_id);
  CHECK(job.at("progress").at("uncertain") == 1);
  CHECK(job.at("progress").at("failed") == 0);
  const std::string error = job.at("error");
  CHECK_THAT(error, Catch::Contains("may have been sent"));
  CHECK_THAT(error, Catch::Contains("look for message " + new_id, Catch::CaseSensitive::No));
  CHECK_THAT(error, !Catch::Contains("not sent"));
  CHECK(console.position<amqp::BasicAck>() == -1);  // the original stays parked
}
