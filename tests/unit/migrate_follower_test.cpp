#include <catch2/catch.hpp>

#include <string>

#include "cli/migrate_command.hpp"
#include "retryloop/migrate/follower.hpp"
#include "retryloop/migrate/migration.hpp"

using retryloop::migrate::Follower;
using retryloop::migrate::Record;

namespace {

Record record(const std::string& id, size_t next_step, const std::string& holding,
              bool finished = false, int64_t started_at_ms = 1000) {
  Record r;
  r.service = "orders";
  r.id = id;
  r.next_step = next_step;
  r.holding = holding;
  r.finished = finished;
  r.started_at_ms = started_at_ms;
  r.updated_at_ms = started_at_ms + int64_t(next_step);
  return r;
}

}  // namespace

TEST_CASE("An instance consumes the service queue until a migration announces its holding queue",
          "[migrate]") {
  Follower follower("orders", "orders");
  CHECK(follower.queue() == "orders");
  CHECK_FALSE(follower.migrating());
  CHECK_FALSE(follower.migrated());

  // Declares and binds before the announce: the queue stays.
  CHECK_FALSE(follower.heard(record("m1", 3, "")));
  CHECK(follower.migrating());
  CHECK(follower.queue() == "orders");

  CHECK(follower.heard(record("m1", 4, "orders.migrating")));
  CHECK(follower.queue() == "orders.migrating");
  CHECK(follower.describe() == "migration m1: at step 5");
  // The steps after it keep the holding queue.
  CHECK_FALSE(follower.heard(record("m1", 8, "orders.migrating")));
  CHECK(follower.queue() == "orders.migrating");

  // The second announce gives the service queue back.
  CHECK(follower.heard(record("m1", 13, "")));
  CHECK(follower.queue() == "orders");
  CHECK_FALSE(follower.heard(record("m1", 16, "", true)));
  CHECK_FALSE(follower.migrating());
  CHECK(follower.migrated());
  CHECK(follower.describe() == "migration m1: finished");
}

TEST_CASE(
    "A record read when an instance starts that is older than one it heard changes nothing, and "
    "another service's record is not followed",
    "[migrate]") {
  Follower follower("orders", "orders");
  // Heard first (the watch listens before it reads), then the read finds the record of the step
  // before: the heard one stands.
  CHECK(follower.heard(record("m1", 13, "orders.migrating")));
  CHECK_FALSE(follower.heard(record("m1", 4, "")));
  CHECK(follower.queue() == "orders.migrating");

  // A later migration's first record replaces a finished one's.
  CHECK(follower.heard(record("m1", 16, "", true)));
  CHECK(follower.queue() == "orders");
  CHECK_FALSE(follower.heard(record("m0", 4, "orders.migrating", false, 10)));
  CHECK(follower.queue() == "orders");
  CHECK(follower.heard(record("m2", 4, "orders.migrating", false, 5000)));
  CHECK(follower.queue() == "orders.migrating");

  Record other = record("m3", 4, "payments.migrating", false, 9000);
  other.service = "payments";
  CHECK_FALSE(follower.heard(other));
  CHECK(follower.queue() == "orders.migrating");
  CHECK(follower.newest()->id == "m2");
}

TEST_CASE("A finished record with a holding queue left in it does not send an instance there",
          "[migrate]") {
  Follower follower("orders", "orders");
  CHECK_FALSE(follower.heard(record("m1", 16, "orders.migrating", true)));
  CHECK(follower.queue() == "orders");
  CHECK(follower.migrated());
  CHECK_FALSE(follower.migrating());
}

TEST_CASE("A move's progress bar fills with what is moved and stops full past the depth",
          "[migrate]") {
  using retryloop::cli::progress_bar;
  CHECK(progress_bar(0, 10000, 10) == "[..........] 0% 0 of 10000");
  CHECK(progress_bar(6400, 10000, 10) == "[######....] 64% 6400 of 10000");
  CHECK(progress_bar(10000, 10000, 10) == "[##########] 100% 10000 of 10000");
  // Messages that came while it moved: counted, the bar full.
  CHECK(progress_bar(10200, 10000, 10) == "[##########] 100% 10200 of 10000");
  // An empty queue's move, and a width that makes no sense.
  CHECK(progress_bar(0, 0, 10) == "[..........] 0% 0 of 0");
  CHECK(progress_bar(1, 2, 0) == "[.] 50% 1 of 2");
}
