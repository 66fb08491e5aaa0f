// move::move_queue refuses options it cannot carry out before it touches the broker.

#include <catch2/catch.hpp>

#include <string>

#include "retryloop/move/queue_mover.hpp"

using namespace retryloop;

namespace {

move::MoveOptions valid() {
  move::MoveOptions options;
  options.from = "from";
  options.routing_key = "to";
  options.stamp_header = "retryloop-move-stamp";
  options.stamp_prefix = "run-1";
  return options;
}

}  // namespace

TEST_CASE("move_queue refuses a move it cannot carry out, and never calls done", "[move]") {
  bool called = false;
  auto done = [&](const client::Error&, const move::Progress&, bool) { called = true; };
  const auto invalid = make_error_code(client::ClientError::invalid_argument);

  move::MoveOptions no_from = valid();
  no_from.from.clear();
  CHECK(move::move_queue(nullptr, no_from, done).code == invalid);

  move::MoveOptions unstamped = valid();
  unstamped.stamp_header.clear();
  unstamped.deduplicate = true;
  const client::Error refused = move::move_queue(nullptr, unstamped, done);
  CHECK(refused.code == invalid);
  CHECK(refused.reply_text == "a move deduplicates by its stamps: give it a stamp header");

  move::MoveOptions long_name = valid();
  long_name.stamp_header = std::string(256, 'h');
  CHECK(move::move_queue(nullptr, long_name, done).code == invalid);
  long_name.stamp_header = std::string(255, 'h');
  CHECK(move::move_queue(nullptr, long_name, done).code ==
        make_error_code(client::ClientError::not_open));

  CHECK(move::move_queue(nullptr, valid(), done).code ==
        make_error_code(client::ClientError::not_open));
  CHECK_FALSE(called);
}
