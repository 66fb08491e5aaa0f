#include <catch2/catch.hpp>

#include "retryloop/client/detail/ack_ledger.hpp"

using retryloop::client::detail::AckLedger;

TEST_CASE("Acks in delivery order are held and sent as one multiple ack", "[client][acks]") {
  AckLedger acks;
  CHECK(acks.ack(1, false));
  CHECK(acks.ack(2, false));
  CHECK(acks.ack(3, false));
  CHECK(acks.held() == 3);
  CHECK(acks.take_held() == 3u);
  CHECK(acks.held() == 0);
  CHECK_FALSE(acks.take_held());
  // The next in order starts a new held ack.
  CHECK(acks.ack(4, false));
  CHECK(acks.take_held() == 4u);
}

TEST_CASE("An ack past an unsettled tag is sent on its own, never folded over the gap",
          "[client][acks]") {
  AckLedger acks;
  CHECK(acks.ack(1, false));
  // Tag 2 is still with the application: a multiple ack through 3 would ack it too.
  CHECK_FALSE(acks.ack(3, false));
  CHECK(acks.take_held() == 1u);
  // Once 2 is acked, everything through 3 is settled, and 2 joins a held ack through 2 only:
  // 3 went out on its own already.
  CHECK(acks.ack(2, false));
  CHECK(acks.take_held() == 2u);
  CHECK(acks.ack(4, false));
  CHECK(acks.take_held() == 4u);
}

TEST_CASE("A kept (never settled) tag keeps every later ack single", "[client][acks]") {
  // The parking walker keeps some messages unacked until the channel closes.
  AckLedger acks;
  for (uint64_t tag = 2; tag <= 50; ++tag)
    CHECK_FALSE(acks.ack(tag, false));
  CHECK_FALSE(acks.take_held());
}

TEST_CASE("Nacks and rejects count as settled for the order, but never join the held ack",
          "[client][acks]") {
  AckLedger acks;
  CHECK(acks.ack(1, false));
  acks.settled_elsewhere(2, false);  // rejected
  CHECK(acks.ack(3, false));         // everything up to 3 is settled
  CHECK(acks.held() == 2);
  // A multiple ack through 3 acks 1 and 3; 2 is no longer outstanding at the broker.
  CHECK(acks.take_held() == 3u);
  acks.settled_elsewhere(10, true);  // nack multiple through 10
  CHECK(acks.ack(11, false));
  CHECK(acks.take_held() == 11u);
}

TEST_CASE("Out-of-order settling closes the gap once the missing tag is settled",
          "[client][acks]") {
  AckLedger acks;
  CHECK_FALSE(acks.ack(3, false));
  CHECK_FALSE(acks.ack(2, false));
  CHECK(acks.ack(1, false));  // 1..3 now settled
  CHECK(acks.take_held() == 1u);
  CHECK(acks.ack(4, false));
  CHECK(acks.take_held() == 4u);
}

TEST_CASE("A multiple ack from the application always joins, and a lost channel drops the held",
          "[client][acks]") {
  AckLedger acks;
  CHECK(acks.ack(5, true));
  CHECK(acks.held() == 1);
  acks.drop_held();
  CHECK_FALSE(acks.take_held());
  CHECK(acks.ack(6, false));
  CHECK(acks.take_held() == 6u);
}
