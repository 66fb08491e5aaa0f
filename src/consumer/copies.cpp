#include <spdlog/spdlog.h>

#include "consumer_impl.hpp"
#include "retryloop/amqp/buffer.hpp"
#include "retryloop/retry/history.hpp"
#include "retryloop/retry/move.hpp"

// The consumer's retry and parking copies: each is published with a confirm, mandatory, and its
// original acked only after the broker confirmed it and did not return it (client::
// move_delivery). A nacked or returned copy is published again with backoff while the original
// stays unacked; a copy that does not fit a frame is shortened, or the original rejected.
namespace retryloop::consumer::detail {

using client::ClientError;
using client::Error;

void ConsumerImpl::publish_copy(const std::shared_ptr<Pending>& pending) {
  if (!is_live(*pending) || !session_->publish_channel()) {
    settling_.erase(pending->id);
    abandon(*pending);
    return;
  }
  Handling& handling = *pending->handling;
  if (blocked_) {
    handling.paused = true;
    return;
  }
  handling.paused = false;
  const retry::Decision& decision = handling.decision;
  const bool to_wait = decision.action == retry::Action::publish_to_wait;
  if (!handling.copy && !handling.sent_copy.empty()) {
    // Published before (nacked, returned or timed out): as it was encoded then.
    handling.copy = std::make_unique<amqp::BasicProperties>();
    (void)client::decode_properties(handling.sent_copy, *handling.copy);
    std::string().swap(handling.sent_copy);
  } else if (!handling.copy) {
    if (to_wait) {
      handling.copy = std::make_unique<amqp::BasicProperties>(
          retry::make_retry_copy(pending->message->properties, handling.info, retry::unix_seconds(),
                                 retry::unix_milliseconds() + uint64_t(decision.delay.count())));
    } else {
      handling.copy = std::make_unique<amqp::BasicProperties>(retry::make_parking_copy(
          pending->message->properties, handling.info, parking_note(decision)));
    }
    record_attempt(handling);
    // The copy holds everything of the original's headers that is still wanted (a copy remade
    // without headers needs none): the handler is done with the message, so they go now, not
    // when the broker confirms. Decoded, they are the larger part of what a delivery in flight
    // holds once a message has been retried and replayed a few times.
    pending->message->properties.headers.reset();
  }
  const std::string exchange = !to_wait ? topology::parking_exchange_name(options_.service.name)
                               : decision.wait_exchange.empty()
                                   ? topology::wait_exchange_name(options_.service.name)
                                   : decision.wait_exchange;
  const std::string& routing_key =
      to_wait ? decision.wait_routing_key : topology::input_queue_name(options_.service);
  handling.published_at_ms = uv_now(loop_);
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  Error error = retry::move_delivery(
      *session_->publish_channel(), pending->channel, pending->delivery_tag,
      {exchange, routing_key, *handling.copy, pending->message->body},
      [weak, pending](const client::PublishOutcome& outcome, const Error& ack_error) {
        if (auto self = weak.lock()) self->copy_settled(pending, outcome, ack_error);
      });
  if (error.code == make_error_code(ClientError::properties_too_large)) {
    copy_too_large(pending, error);
  } else if (error) {
    session_failed(error, false);
  } else {
    // Until its confirm, the copy is kept in wire form: a third of its decoded size.
    amqp::Writer writer(handling.sent_copy);
    handling.copy->encode(writer);
    handling.copy.reset();
  }
}

void ConsumerImpl::copy_too_large(const std::shared_ptr<Pending>& pending, const Error& error) {
  // The same message would fail the same way after any reconnect, so it must end here. First
  // its history gives up its oldest entries, then retryloop-error is shortened, half at a time,
  // to what fits.
  Handling& handling = *pending->handling;
  amqp::BasicProperties& copy = *handling.copy;
  if (retry::shorten_history(copy)) {
    publish_copy(pending);
    return;
  }
  amqp::FieldValue* value = copy.headers ? copy.headers->find(retry::header::error) : nullptr;
  std::string* text = value ? value->get_if<std::string>() : nullptr;
  if (text != nullptr && !text->empty()) {
    *text = retry::truncate_utf8(*text, text->size() / 2);
    publish_copy(pending);
    return;
  }
  auto* log = options_.logger.get();
  const bool to_wait = handling.decision.action == retry::Action::publish_to_wait;
  ++metrics_.copies_too_large;
  if (to_wait) {
    // A retry by reject instead: Q dead-letters it into its first wait queue inside the broker,
    // where no frame_max applies, and it comes back with every byte and one more attempt counted
    // by x-death, so the attempt cap still ends it (in parking, below).
    if (reject_uncopyable(pending)) {
      handling.decision.action = retry::Action::reject_to_wait;  // through the first delay's queue
      handling.decision.wait_exchange.clear();
      handling.decision.delay = topology::delay_after_attempt(options_.service, 1);
      count_retry(handling.decision);
      if (log) {
        log->warn("{} outcome=retry via=reject error=\"its retry copy cannot be published ({})\"",
                  message_fields(*pending), error.message());
      }
      end_span(*pending, Settlement::retried);
    }
    maybe_finish_stop();
    return;
  }
  // A reject would bring it back through the wait queue, to fail again. It is parked without the
  // original's headers (or raw property bytes) that do not fit, and retryloop-error says so.
  if (copy.headers && copy.headers->size() > 0 && !handling.stripped) {
    handling.stripped = true;
    amqp::BasicProperties bare = pending->message->properties;
    bare.headers.reset();
    retry::ParkingNote note = parking_note(handling.decision);
    note.error = "its headers were removed, the copy needs a header frame over frame_max (" +
                 error.message() + "); " + handling.decision.error;
    handling.copy = std::make_unique<amqp::BasicProperties>(
        retry::make_parking_copy(bare, handling.info, note));
    record_attempt(handling);
    if (log) {
      log->error("{} parking copy too large ({}); parking it without its headers",
                 message_fields(*pending), error.message());
    }
    publish_copy(pending);
    return;
  }
  // Not even that fits (frame_max far below what the remaining properties need): the original
  // is rejected; the broker's dead-lettering keeps it whole.
  if (reject_uncopyable(pending)) {
    if (log) {
      log->error("{} no parking copy fits ({}); rejected to the wait queue",
                 message_fields(*pending), error.message());
    }
    end_span(*pending, Settlement::retried);
  }
  maybe_finish_stop();
}

retry::ParkingNote ConsumerImpl::parking_note(const retry::Decision& decision) const {
  retry::ParkingNote note;
  note.reason = decision.reason;
  note.error = decision.error;
  note.queue = topology::input_queue_name(options_.service);
  note.consumer = options_.consumer_name;
  note.now_seconds = retry::unix_seconds();
  return note;
}

void ConsumerImpl::record_attempt(Handling& handling) const {
  const retry::Decision& decision = handling.decision;
  const topology::RetryMode mode = options_.service.retry.mode;
  retry::HistoryEntry entry;
  entry.attempt = handling.info.attempt;
  entry.at = retry::unix_seconds();
  entry.error = decision.error;
  entry.consumer = options_.consumer_name;
  if (decision.action == retry::Action::publish_to_wait) {
    entry.outcome = retry::history_outcome::retry;
    entry.delay_ms = decision.delay.count();
    entry.via = "republish";
  } else {
    entry.outcome = retry::history_outcome::parked;
    entry.reason = to_string(decision.reason);
    entry.via = topology::to_string(mode);
  }
  // The attempts before this one that no copy recorded: the broker moved them (rejected into
  // the wait queue, or back into their own queue in in_queue mode).
  const bool in_queue = mode == topology::RetryMode::in_queue;
  std::optional<int64_t> delay;
  if (mode == topology::RetryMode::reject)
    delay = topology::delay_after_attempt(options_.service, 1).count();
  retry::record_history(*handling.copy, std::move(entry), in_queue ? "in_queue" : "reject", delay,
                        handling.info.first_failure);
}

bool ConsumerImpl::reject_uncopyable(const std::shared_ptr<Pending>& pending) {
  settling_.erase(pending->id);
  const bool rejected = !pending->channel->reject(pending->delivery_tag, false);
  if (!rejected) abandon(*pending);
  return rejected;
}

void ConsumerImpl::count_parked(ParkReason reason) {
  switch (reason) {
    case ParkReason::exhausted:
      ++metrics_.parked_exhausted;
      break;
    case ParkReason::permanent:
      ++metrics_.parked_permanent;
      break;
    case ParkReason::poison:
      ++metrics_.parked_poison;
      break;
    case ParkReason::delivery_limit:
      ++metrics_.parked_delivery_limit;
      break;
  }
}

void ConsumerImpl::copy_settled(const std::shared_ptr<Pending>& pending,
                                const client::PublishOutcome& outcome, const Error& ack_error) {
  pending->handling->published_at_ms = 0;
  if (outcome.status == client::PublishStatus::failed) {
    // The session is ending; the original is redelivered.
    if (settling_.erase(pending->id) != 0) abandon(*pending);
    maybe_finish_stop();
    return;
  }
  if (!outcome.ok()) return copy_refused(pending, outcome);
  if (settling_.erase(pending->id) == 0) return;
  if (ack_error) {
    // Copied but not acked: the original comes back too (a duplicate, never a loss).
    abandon(*pending);
    maybe_finish_stop();
    return;
  }
  const retry::Decision& decision = pending->handling->decision;
  if (decision.action == retry::Action::publish_to_wait) {
    count_retry(decision);
    log_outcome(*pending, "retry", decision.error);
    end_span(*pending, Settlement::retried);
  } else {
    count_parked(decision.reason);
    log_outcome(*pending, "parked", decision.error);
    end_span(*pending, Settlement::parked);
    parking_depth_.soon();
    if (options_.on_parked) {
      ParkedEvent event;
      event.service = options_.service.name;
      event.message_id = std::string(pending->message->message_id());
      event.reason = decision.reason;
      event.error = decision.error;
      event.attempts = pending->handling->info.attempt;
      options_.on_parked(event);
    }
  }
  maybe_finish_stop();
}

void ConsumerImpl::copy_refused(const std::shared_ptr<Pending>& pending,
                                const client::PublishOutcome& outcome) {
  ++metrics_.publish_failures;
  if (outcome.status == client::PublishStatus::nacked && session_)
    session_->renew_publish_channel();
  const auto delay = options_.publish_retry.delay(pending->handling->publish_tries++);
  pending->handling->retry_at_ms = uv_now(loop_) + uint64_t(delay.count());
  std::string why = outcome.status == client::PublishStatus::returned
                        ? "returned: " + outcome.error.message()
                        : std::string(
                              "nacked by the broker (a full queue with "
                              "reject-publish, or a broker error)");
  if (auto* log = options_.logger.get()) {
    log->warn("{} {} copy {}; the original stays unacked, publishing again in {} ms",
              message_fields(*pending),
              pending->handling->decision.action == retry::Action::park ? "parking" : "retry", why,
              delay.count());
  }
}

void ConsumerImpl::check_copies(uint64_t now_ms) {
  std::vector<std::shared_ptr<Pending>> due;
  for (const auto& [id, pending] : settling_) {
    if (pending->handling->published_at_ms != 0 &&
        now_ms - pending->handling->published_at_ms >= uint64_t(options_.confirm_timeout.count())) {
      session_failed(Error(ClientError::connection_lost,
                           "no publisher confirm within " +
                               std::to_string(options_.confirm_timeout.count()) + " ms"),
                     false);
      return;
    }
    if (pending->handling->retry_at_ms != 0 && now_ms >= pending->handling->retry_at_ms)
      due.push_back(pending);
  }
  for (const auto& pending : due) {
    pending->handling->retry_at_ms = 0;
    publish_copy(pending);
  }
}

void ConsumerImpl::on_blocked(bool blocked, const std::string& reason) {
  if (auto* log = options_.logger.get()) {
    if (blocked) {
      log->warn("service={} broker blocked publishing ({}): retry and parking copies wait",
                options_.service.name, reason);
    } else {
      log->info("service={} broker unblocked publishing", options_.service.name);
    }
  }
  blocked_ = blocked;
  if (blocked) return;
  const uint64_t now = uv_now(loop_);
  std::vector<std::shared_ptr<Pending>> paused;
  for (const auto& [id, pending] : settling_) {
    if (pending->handling->published_at_ms != 0)
      pending->handling->published_at_ms = now;  // time blocked is not late
    if (pending->handling->paused) paused.push_back(pending);
  }
  for (const auto& pending : paused)
    publish_copy(pending);
}

}  // namespace retryloop::consumer::detail
