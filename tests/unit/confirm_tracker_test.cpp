#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "retryloop/client/detail/confirm_tracker.hpp"

using retryloop::client::ClientError;
using retryloop::client::Error;
using retryloop::client::PublishOutcome;
using retryloop::client::PublishStatus;
using retryloop::client::detail::ConfirmTracker;
using retryloop::client::detail::publish_identity;

namespace {

/// Publishes whose callbacks record their outcomes, by index.
struct Recorder {
  std::vector<PublishOutcome> outcomes;
  std::vector<size_t> order;

  retryloop::client::PublishCallback callback(size_t index) {
    if (outcomes.size() <= index) outcomes.resize(index + 1);
    return [this, index](const PublishOutcome& outcome) {
      outcomes[index] = outcome;
      order.push_back(index);
    };
  }
};

void run(const ConfirmTracker::Ready& ready) {
  for (const auto& [callback, outcome] : ready)
    callback(outcome);
}

std::string identity(const std::string& body, const std::string& properties = "p") {
  return publish_identity("orders.parking", "", properties, body);
}

Error no_route() {
  Error error(ClientError::unroutable, "NO_ROUTE");
  error.reply_code = 312;
  return error;
}

}  // namespace

TEST_CASE("Confirms settle publishes by sequence, one or many at a time, in publish order",
          "[client][confirms]") {
  ConfirmTracker tracker;
  Recorder r;
  for (size_t i = 0; i < 5; ++i)
    CHECK(tracker.add(r.callback(i), false) == i + 1);
  CHECK(tracker.unconfirmed() == 5);
  CHECK(tracker.next_sequence() == 6);

  auto ready = tracker.confirm(2, false, true);  // ack 2 alone
  REQUIRE(ready);
  run(*ready);
  CHECK(r.order == std::vector<size_t>{1});
  ready = tracker.confirm(4, true, false);  // nack 1..4: only 1, 3 and 4 are still awaited
  REQUIRE(ready);
  run(*ready);
  CHECK(r.order == std::vector<size_t>{1, 0, 2, 3});
  CHECK(r.outcomes[1].status == PublishStatus::acked);
  CHECK(r.outcomes[0].status == PublishStatus::nacked);
  CHECK(r.outcomes[3].sequence == 4);
  CHECK(tracker.unconfirmed() == 1);

  // A tag already settled or never sent is not awaited.
  CHECK_FALSE(tracker.confirm(3, false, true));
  CHECK_FALSE(tracker.confirm(9, false, true));
  CHECK_FALSE(tracker.confirm(0, true, true));
}

TEST_CASE("A return marks the publish it matches byte for byte, and its ack reports it returned",
          "[client][confirms]") {
  ConfirmTracker tracker;
  Recorder r;
  tracker.add(r.callback(0), true, identity("same body"));
  tracker.add(r.callback(1), true, identity("same body", "other properties"));
  tracker.add(r.callback(2), true, identity("same body"));
  // The same bytes to the same exchange and key route alike, and returns come in publish order:
  // the oldest match not yet returned is the one. The middle one differs in its properties only
  // and is not taken while an exact match waits.
  CHECK(tracker.returned(identity("same body"), 1, no_route()));
  run(*tracker.confirm(1, false, true));
  CHECK(r.outcomes[0].status == PublishStatus::returned);
  // A second return of the same bytes is the third publish's.
  CHECK(tracker.returned(identity("same body"), 1, no_route()));
  run(*tracker.confirm(3, true, true));
  CHECK(r.outcomes[1].status == PublishStatus::acked);
  CHECK(r.outcomes[2].status == PublishStatus::returned);
  CHECK(r.outcomes[2].error.reply_code == 312);
}

TEST_CASE("Two same-body publishes, one unroutable, each get their own outcome",
          "[client][confirms]") {
  // The case a fingerprint of exchange, routing key and body hash got wrong: the copy that went
  // nowhere must not be reported confirmed.
  ConfirmTracker tracker;
  Recorder r;
  tracker.add(r.callback(0), true, publish_identity("orders.wait", "30s", "p", "body"));
  tracker.add(r.callback(1), true, publish_identity("orders.wait", "5m", "p", "body"));
  CHECK(tracker.returned(publish_identity("orders.wait", "5m", "p", "body"), 1, no_route()));
  run(*tracker.confirm(2, true, true));
  CHECK(r.outcomes[0].status == PublishStatus::acked);
  CHECK(r.outcomes[1].status == PublishStatus::returned);
}

TEST_CASE("A return whose properties the broker re-encoded still finds its publish",
          "[client][confirms]") {
  ConfirmTracker tracker;
  Recorder r;
  tracker.add(r.callback(0), true, identity("body", "as sent"));
  CHECK(tracker.returned(identity("body", "re-encoded!"), std::string("re-encoded!").size(),
                         no_route()));
  run(*tracker.confirm(1, false, true));
  CHECK(r.outcomes[0].status == PublishStatus::returned);
}

TEST_CASE("A return that matches nothing, or a publish without mandatory, changes nothing",
          "[client][confirms]") {
  ConfirmTracker tracker;
  Recorder r;
  tracker.add(r.callback(0), false);
  tracker.add(r.callback(1), true, identity("kept"));
  CHECK_FALSE(tracker.returned(identity("other"), 1, no_route()));
  run(*tracker.confirm(2, true, true));
  CHECK(r.outcomes[0].status == PublishStatus::acked);
  CHECK(r.outcomes[1].status == PublishStatus::acked);
}

TEST_CASE("When the channel ends, every publish still awaited fails, with the reason",
          "[client][confirms]") {
  ConfirmTracker tracker;
  Recorder r;
  for (size_t i = 0; i < 4; ++i)
    tracker.add(r.callback(i), false);
  run(*tracker.confirm(2, false, true));
  run(tracker.fail_all(Error(ClientError::connection_lost, "socket closed")));
  CHECK(r.order == std::vector<size_t>{1, 0, 2, 3});
  CHECK(r.outcomes[0].status == PublishStatus::failed);
  CHECK(r.outcomes[3].sequence == 4);
  CHECK(r.outcomes[3].error.code ==
        retryloop::client::make_error_code(ClientError::connection_lost));
  CHECK(tracker.unconfirmed() == 0);
  // Sequence numbers go on: a new channel would start again, this one never reuses them.
  CHECK(tracker.add(r.callback(4), false) == 5);
  CHECK_FALSE(tracker.confirm(3, false, true));
}
