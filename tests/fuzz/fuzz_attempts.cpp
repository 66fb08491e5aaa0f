// Reads arbitrary bytes as a delivery's headers table and runs the consumer's header
// interpretation on it: the attempt rule, the retry policy and the three copies (retry, parking,
// replay). Oracle: nothing crashes; the attempt is at least 1; a retry copy carries no death
// headers and every attempt so far, so that its count never goes down; every copy encodes; a
// replay copy starts fresh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/frame.hpp"
#include "retryloop/parking/parked_message.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/retry_policy.hpp"

using namespace retryloop;
using namespace retryloop::retry;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

bool encodes(const amqp::BasicProperties& properties) {
  std::string out;
  return !amqp::append_header_frame(out, 1, 0, properties);
}

bool has_death_header(const amqp::FieldTable& headers) {
  for (const auto& entry : headers)
    if (is_death_header(entry.name)) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  amqp::Reader reader(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  amqp::FieldTable headers;
  reader.table(headers);
  if (!reader.ok()) return 0;

  amqp::BasicProperties properties;
  properties.message_id = "m";
  properties.headers = headers;
  const AttemptInfo info = read_attempt_info(properties, "orders", "orders.in", "order.created");
  check(info.attempt >= 1);
  check(info.rejected >= 0 && info.retries >= 0);

  topology::Service service;
  service.name = "orders";
  service.retry.mode = (mode & 1) ? topology::RetryMode::republish : topology::RetryMode::reject;
  service.retry.delays = {std::chrono::milliseconds(100), std::chrono::milliseconds(1000)};
  if (service.retry.mode == topology::RetryMode::reject) service.retry.delays.resize(1);
  service.retry.max_attempts = 1 + (mode >> 1);

  for (auto kind : {OutcomeKind::ack, OutcomeKind::retry, OutcomeKind::permanent,
                    OutcomeKind::poison, OutcomeKind::drop, OutcomeKind::unavailable}) {
    const Decision decision = decide(service, info, Outcome{kind, "error", {}});
    if ((kind == OutcomeKind::retry || kind == OutcomeKind::unavailable) &&
        !info.malformed.empty()) {
      check(decision.action == Action::park && decision.reason == ParkReason::poison);
    }
    if (decision.action == Action::publish_to_wait) {
      const amqp::BasicProperties copy = make_retry_copy(properties, info, 1700000000);
      check(encodes(copy));
      check(!has_death_header(*copy.headers));
      const AttemptInfo next = read_attempt_info(copy, "orders", "", "orders");
      check(next.retries == info.attempt);
      check(next.rejected == 0);
      check(next.attempt > info.attempt || info.attempt == INT64_MAX);
    }
    if (decision.action == Action::park) {
      ParkingNote note;
      note.reason = decision.reason;
      note.error = decision.error;
      note.queue = "orders";
      note.consumer = "fuzz:1";
      note.now_seconds = 1700000000;
      const amqp::BasicProperties parked = make_parking_copy(properties, info, note);
      check(encodes(parked));
      const amqp::BasicProperties replayed = parking::make_replay_copy(parked);
      check(encodes(replayed));
      check(!has_death_header(*replayed.headers));
      check(replayed.headers->find(header::retries) == nullptr);
      check(replayed.headers->find(header::reason) == nullptr);
      check(read_attempt_info(replayed, "orders", "", "orders").attempt == 1);
    }
  }
  return 0;
}
