#include "retryloop/outage/coordinator.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>

namespace retryloop::outage {
namespace {

constexpr std::chrono::milliseconds silence_margin = std::chrono::seconds(2);

bool is_open(State state) {
  return state == State::open || state == State::probing;
}

/// A trip of this instance's own, as opposed to a state another instance or an operator caused.
bool own_trip(const Event& event) {
  if (event.to != State::open) return false;
  return event.reason == Reason::consecutive_unavailable || event.reason == Reason::failure_rate;
}

}  // namespace

const char* to_string(SignalKind kind) {
  switch (kind) {
    case SignalKind::open:
      return "open";
    case SignalKind::probing:
      return "probing";
    case SignalKind::recovered:
      return "recovered";
    case SignalKind::paused:
      return "paused";
    case SignalKind::resumed:
      return "resumed";
  }
  return "unknown";
}

std::optional<SignalKind> signal_kind_from_string(std::string_view text) {
  for (SignalKind kind : {SignalKind::open, SignalKind::probing, SignalKind::recovered,
                          SignalKind::paused, SignalKind::resumed}) {
    if (text == to_string(kind)) return kind;
  }
  return std::nullopt;
}

std::string encode_signal(const Signal& signal) {
  nlohmann::json body = {
      {"signal", to_string(signal.kind)}, {"at_ms", signal.at_ms}, {"sender", signal.sender}};
  if (!signal.reason.empty()) body["reason"] = signal.reason;
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<Signal> decode_signal(std::string_view body, std::string& error) {
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    error = "the body is not a JSON object";
    return std::nullopt;
  }
  Signal signal;
  const auto kind = json.find("signal");
  if (kind == json.end() || !kind->is_string()) {
    error = "\"signal\" is missing or not a string";
    return std::nullopt;
  }
  const auto parsed = signal_kind_from_string(kind->get<std::string>());
  if (!parsed) {
    error = "\"signal\" is not one of open, probing, recovered, paused, resumed";
    return std::nullopt;
  }
  signal.kind = *parsed;
  const auto at = json.find("at_ms");
  if (at == json.end() || !at->is_number_integer()) {
    error = "\"at_ms\" is missing or not an integer";
    return std::nullopt;
  }
  signal.at_ms = at->get<int64_t>();
  if (auto sender = json.find("sender"); sender != json.end() && sender->is_string()) {
    signal.sender = sender->get<std::string>();
  }
  if (auto reason = json.find("reason"); reason != json.end() && reason->is_string()) {
    signal.reason = reason->get<std::string>();
  }
  return signal;
}

std::string encode_token(int64_t opened_at_ms) {
  return nlohmann::json{{"opened_at_ms", opened_at_ms}}.dump();
}

std::optional<int64_t> decode_token(std::string_view body) {
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) return std::nullopt;
  const auto at = json.find("opened_at_ms");
  if (at == json.end() || !at->is_number_integer()) return std::nullopt;
  return at->get<int64_t>();
}

Coordinator::Coordinator(Breaker& breaker, std::string instance)
    : breaker_(breaker), instance_(std::move(instance)) {}

void Coordinator::joined(const std::optional<Signal>& last, std::chrono::milliseconds now,
                         int64_t wall_ms) {
  joined_ = true;
  token_tag_.reset();
  prober_heard_ = now;
  breaker_.set_may_probe(false, now);
  const bool open_here = is_open(breaker_.state());
  if (!last) {
    if (open_here) announce_open("tripped while not connected", wall_ms);
    return;
  }
  switch (last->kind) {
    case SignalKind::open:
    case SignalKind::probing:
      if (last->at_ms <= recovered_at_ms_) break;
      opened_at_ms_ = std::max(opened_at_ms_, last->at_ms);
      breaker_.opened_elsewhere(now);
      break;
    case SignalKind::recovered:
      recovered_at_ms_ = std::max(recovered_at_ms_, last->at_ms);
      if (!open_here) break;
      if (opened_at_ms_ > last->at_ms) {
        announce_open("tripped while not connected", wall_ms);
      } else {
        breaker_.recovered_elsewhere(now);
      }
      break;
    case SignalKind::paused:
      pause_by_signal(now);
      break;
    case SignalKind::resumed:
      opened_at_ms_ = std::max(opened_at_ms_, last->at_ms);
      if (breaker_.state() == State::paused) {
        // A pause of this instance alone (Consumer::pause) outlasts a reconnection.
        if (paused_by_signal_) breaker_.resume(now);
      } else if (open_here) {
        announce_open("tripped while not connected", wall_ms);
      }
      break;
  }
}

void Coordinator::left(std::chrono::milliseconds now) {
  joined_ = false;
  probing_alone_ = false;
  token_tag_.reset();  // the broker gives it to another instance
  breaker_.set_may_probe(true, now);
}

void Coordinator::breaker_event(const Event& event, int64_t wall_ms) {
  if (probing_alone_ && event.to == State::probing) return;  // nobody else needs to know
  if (probing_alone_ && event.from == State::probing) {
    probing_alone_ = false;
    if (!token_tag_) breaker_.set_may_probe(false, event.at);
    if (event.reason == Reason::probe_failed && joined_) announce_open("probe_failed", wall_ms);
    return;
  }
  if (own_trip(event)) {
    if (joined_) {
      announce_open(to_string(event.reason), wall_ms);
    } else {
      opened_at_ms_ = wall_ms;  // told to the others once joined
    }
    return;
  }
  if (!joined_) return;
  if (event.to == State::probing) {
    signal(SignalKind::probing, wall_ms);
  } else if (event.reason == Reason::probe_succeeded) {
    recovered_at_ms_ = wall_ms;
    signal(SignalKind::recovered, wall_ms);
    drop_token(event.at);
  }
}

void Coordinator::received(const Signal& signal, std::chrono::milliseconds now) {
  if (signal.sender == instance_) {
    // What this instance said itself: it is in that state already.
    if (signal.kind == SignalKind::probing || signal.kind == SignalKind::open) prober_heard_ = now;
    return;
  }
  switch (signal.kind) {
    case SignalKind::open:
    case SignalKind::probing:
      if (signal.at_ms <= recovered_at_ms_) return;  // an outage that has ended
      opened_at_ms_ = std::max(opened_at_ms_, signal.at_ms);
      prober_heard_ = now;
      breaker_.opened_elsewhere(now);
      break;
    case SignalKind::recovered:
      if (signal.at_ms < opened_at_ms_) return;  // the end of an earlier outage
      recovered_at_ms_ = std::max(recovered_at_ms_, signal.at_ms);
      breaker_.recovered_elsewhere(now);
      drop_token(now);
      break;
    case SignalKind::paused:
      pause_by_signal(now);
      break;
    case SignalKind::resumed:
      opened_at_ms_ = std::max(opened_at_ms_, signal.at_ms);
      prober_heard_ = now;
      paused_by_signal_ = false;
      breaker_.resume(now);
      break;
  }
}

void Coordinator::token(uint64_t delivery_tag, std::optional<int64_t> opened_at_ms,
                        std::chrono::milliseconds now) {
  if (!joined_ || token_tag_ || (opened_at_ms && *opened_at_ms <= recovered_at_ms_)) {
    actions_.ack_tokens.push_back(delivery_tag);  // one too many, or its outage has ended
    return;
  }
  if (opened_at_ms) opened_at_ms_ = std::max(opened_at_ms_, *opened_at_ms);
  hold_token(delivery_tag, now);
}

void Coordinator::resume_here(std::chrono::milliseconds now) {
  paused_by_signal_ = false;
  if (joined_ && !token_tag_ && opened_at_ms_ <= recovered_at_ms_ &&
      breaker_.state() == State::paused) {
    probing_alone_ = true;
    breaker_.set_may_probe(true, now);
  }
  breaker_.resume(now);
}

void Coordinator::tick(std::chrono::milliseconds now, int64_t wall_ms) {
  if (!joined_ || token_tag_ || breaker_.state() != State::open) return;
  if (now - prober_heard_ < silence_limit()) return;
  // Nobody probes: the token was lost, or its queue was. Another one; if the old one turns up,
  // the single active consumer acks it as one too many.
  prober_heard_ = now;
  actions_.token_opened_at_ms = opened_at_ms_ != 0 ? opened_at_ms_ : wall_ms;
}

void Coordinator::can_probe(bool can, std::chrono::milliseconds now) {
  if (can || !token_tag_ || breaker_.state() != State::probing) {
    starved_since_.reset();
    return;
  }
  if (!starved_since_) starved_since_ = now;
  if (now - *starved_since_ < breaker_.settings().probe_interval) return;
  starved_since_.reset();
  actions_.pass_token = *token_tag_;
  token_tag_.reset();
  prober_heard_ = now;  // the token lives: the next holder probes within an interval
  breaker_.set_may_probe(false, now);
}

Actions Coordinator::take_actions() {
  Actions actions = std::move(actions_);
  actions_ = Actions{};
  return actions;
}

void Coordinator::hold_token(uint64_t delivery_tag, std::chrono::milliseconds now) {
  token_tag_ = delivery_tag;
  prober_heard_ = now;
  // A token is an outage: an instance that has not heard the open yet stops now.
  breaker_.opened_elsewhere(now);
  breaker_.set_may_probe(true, now);
}

void Coordinator::pause_by_signal(std::chrono::milliseconds now) {
  if (breaker_.state() != State::paused) paused_by_signal_ = true;
  breaker_.pause(now);
}

void Coordinator::drop_token(std::chrono::milliseconds now) {
  if (!token_tag_) return;
  actions_.ack_tokens.push_back(*token_tag_);
  token_tag_.reset();
  // Closed or ramping: whether it may probe matters again at the next outage, and then only the
  // holder of that outage's token does.
  breaker_.set_may_probe(false, now);
}

void Coordinator::announce_open(const std::string& reason, int64_t wall_ms) {
  opened_at_ms_ = wall_ms;
  signal(SignalKind::open, wall_ms, reason);
  actions_.token_opened_at_ms = wall_ms;
}

void Coordinator::signal(SignalKind kind, int64_t wall_ms, std::string reason) {
  actions_.signals.push_back(Signal{kind, wall_ms, instance_, std::move(reason)});
}

std::chrono::milliseconds Coordinator::silence_limit() const {
  return 3 * breaker_.settings().probe_interval + silence_margin;
}

}  // namespace retryloop::outage
