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

int64_t outage_id(int64_t wall_ms, int64_t heard) {
  return std::max(wall_ms, heard + 1);
}

std::string encode_signal(const Signal& signal) {
  nlohmann::json body = {{"signal", to_string(signal.kind)},
                         {"at_ms", signal.at_ms},
                         {"sender", signal.sender},
                         {"outage", signal.outage}};
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
  signal.outage = signal.at_ms;
  if (auto outage = json.find("outage"); outage != json.end()) {
    if (!outage->is_number_integer()) {
      error = "\"outage\" is not an integer";
      return std::nullopt;
    }
    signal.outage = outage->get<int64_t>();
  }
  if (auto sender = json.find("sender"); sender != json.end() && sender->is_string()) {
    signal.sender = sender->get<std::string>();
  }
  if (auto reason = json.find("reason"); reason != json.end() && reason->is_string()) {
    signal.reason = reason->get<std::string>();
  }
  return signal;
}

std::string encode_token(const Token& token) {
  // opened_at_ms: what an older instance reads.
  nlohmann::json body = {{"outage", token.outage}, {"opened_at_ms", token.outage}};
  if (token.resume) body["resume"] = true;
  return body.dump();
}

std::optional<Token> decode_token(std::string_view body) {
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) return std::nullopt;
  auto at = json.find("outage");
  if (at == json.end()) at = json.find("opened_at_ms");
  if (at == json.end() || !at->is_number_integer()) return std::nullopt;
  Token token;
  token.outage = at->get<int64_t>();
  const auto resume = json.find("resume");
  token.resume = resume != json.end() && resume->is_boolean() && resume->get<bool>();
  return token;
}

Coordinator::Coordinator(Breaker& breaker, std::string instance)
    : breaker_(breaker), instance_(std::move(instance)) {}

void Coordinator::joined(const std::optional<Signal>& read, std::chrono::milliseconds now,
                         int64_t wall_ms) {
  const std::optional<Signal> last = heard_while_joining_ ? std::move(heard_while_joining_) : read;
  heard_while_joining_.reset();
  joined_ = true;
  token_tag_.reset();
  prober_heard_ = now;
  breaker_.set_may_probe(false, now);
  if (last) {
    heard(last->outage);
    if (last->kind == SignalKind::recovered) {
      ended_ = std::max(ended_, last->outage);
    } else if (last->kind != SignalKind::paused) {
      outage_ = std::max(outage_, last->outage);
    }
  }
  // The operator's pause that held this instance is over when the last signal is not that pause:
  // its resume, or what came after the resume, was sent while this instance was away.
  const bool pause_over = breaker_.state() == State::paused && paused_by_signal_ &&
                          (!last || last->kind != SignalKind::paused);
  if (pause_over) {
    paused_by_signal_ = false;
    if (!last) {
      // Nothing tells how the service stands: this instance finds out with a call of its own.
      probing_alone_ = true;
      breaker_.set_may_probe(true, now);
    }
    breaker_.resume(now);
  }
  const bool open_here = is_open(breaker_.state());
  if (!last) {
    if (open_here && !probing_alone_) announce_open("tripped while not connected", wall_ms);
  } else {
    switch (last->kind) {
      case SignalKind::open:
      case SignalKind::probing:
        if (last->outage > ended_) breaker_.opened_elsewhere(now);
        break;
      case SignalKind::recovered:
        if (!open_here) break;
        if (tripped_alone_) {
          announce_open("tripped while not connected", wall_ms);
        } else {
          breaker_.recovered_elsewhere(now);
        }
        break;
      case SignalKind::paused:
        pause_by_signal(now);
        break;
      case SignalKind::resumed:
        if (tripped_alone_ && open_here) {
          announce_open("tripped while not connected", wall_ms);
        } else if (breaker_.state() != State::paused && !pause_over) {
          // Resumed, its probe not answered yet (or no instance ran to make it).
          follow_resume(now);
        }  // else paused on its own (Consumer::pause), which outlasts a reconnection
        break;
    }
  }
  tripped_alone_ = false;
  if (early_token_) {
    EarlyToken early = std::move(*early_token_);
    early_token_.reset();
    token(early.delivery_tag, early.token, now, wall_ms);
  }
}

void Coordinator::left(std::chrono::milliseconds now) {
  joined_ = false;
  probing_alone_ = false;
  token_tag_.reset();  // the broker gives it to another instance
  early_token_.reset();
  heard_while_joining_.reset();
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
      tripped_alone_ = true;  // told to the others once joined
    }
    return;
  }
  if (!joined_) {
    if (event.reason == Reason::probe_succeeded) tripped_alone_ = false;
    return;
  }
  if (event.to == State::probing) {
    signal(SignalKind::probing, wall_ms, outage_);
  } else if (event.reason == Reason::probe_succeeded) {
    ended_ = std::max(ended_, outage_);
    signal(SignalKind::recovered, wall_ms, outage_);
    drop_token(event.at);
  }
}

void Coordinator::received(const Signal& signal, std::chrono::milliseconds now) {
  heard(signal.outage);
  if (signal.sender == instance_) {
    // What this instance said itself: it is in that state already.
    if (signal.kind == SignalKind::probing || signal.kind == SignalKind::open) prober_heard_ = now;
    return;
  }
  if (!joined_) heard_while_joining_ = signal;
  switch (signal.kind) {
    case SignalKind::open:
    case SignalKind::probing:
      if (signal.outage <= ended_) return;  // an outage that has ended
      outage_ = std::max(outage_, signal.outage);
      prober_heard_ = now;
      breaker_.opened_elsewhere(now);
      break;
    case SignalKind::recovered:
      if (signal.outage < outage_) return;  // the end of an earlier outage
      outage_ = std::max(outage_, signal.outage);
      ended_ = std::max(ended_, signal.outage);
      breaker_.recovered_elsewhere(now);
      drop_token(now);
      break;
    case SignalKind::paused:
      pause_by_signal(now);
      break;
    case SignalKind::resumed:
      outage_ = std::max(outage_, signal.outage);
      prober_heard_ = now;
      // A pause of this instance's own (Consumer::pause) lasts until Consumer::resume.
      if (breaker_.state() == State::paused && paused_by_signal_) {
        paused_by_signal_ = false;
        breaker_.resume(now);
      }
      break;
  }
}

void Coordinator::token(uint64_t delivery_tag, const std::optional<Token>& token,
                        std::chrono::milliseconds now, int64_t wall_ms) {
  if (!joined_) {
    // Not yet joined: what the service's state says decides what the token is for, once known.
    early_token_ = EarlyToken{delivery_tag, token};
    return;
  }
  if (token) heard(token->outage);
  if (token_tag_ || (token && token->outage <= ended_)) {
    actions_.ack_tokens.push_back(delivery_tag);  // one too many, or its outage has ended
    return;
  }
  const State state = breaker_.state();
  if (token && token->resume && (state == State::closed || state == State::ramping)) {
    // An operator's resume of a service this instance finds handling: there is nothing to probe
    // for. Its resume is over, and the others waiting for its verdict ramp.
    actions_.ack_tokens.push_back(delivery_tag);
    outage_ = std::max(outage_, token->outage);
    ended_ = std::max(ended_, token->outage);
    signal(SignalKind::recovered, wall_ms, token->outage, "not paused");
    return;
  }
  if (token) outage_ = std::max(outage_, token->outage);
  hold_token(delivery_tag, now);
}

void Coordinator::resume_here(std::chrono::milliseconds now) {
  paused_by_signal_ = false;
  if (joined_ && !token_tag_ && outage_ <= ended_ && breaker_.state() == State::paused) {
    probing_alone_ = true;
    breaker_.set_may_probe(true, now);
  }
  breaker_.resume(now);
}

void Coordinator::tick(std::chrono::milliseconds now, int64_t /*wall_ms*/) {
  if (!joined_ || token_tag_ || breaker_.state() != State::open) return;
  if (now - prober_heard_ < silence_limit()) return;
  prober_heard_ = now;
  if (outage_ <= ended_) {
    // Open here, though the outage it knows of has ended and it has not tripped since (a trip
    // is always told): its recovery was missed.
    breaker_.recovered_elsewhere(now);
    return;
  }
  // Nobody probes: the token was lost, or its queue was. Another one; if the old one turns up,
  // the single active consumer acks it as one too many.
  actions_.token = Token{outage_, false};
}

void Coordinator::can_probe(bool can, std::chrono::milliseconds now) {
  const State state = breaker_.state();
  const bool paused_alone = state == State::paused && !paused_by_signal_;
  const bool starved = token_tag_ && ((state == State::probing && !can) || paused_alone);
  if (!starved) {
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

void Coordinator::follow_resume(std::chrono::milliseconds now) {
  paused_by_signal_ = false;
  breaker_.pause(now);
  breaker_.resume(now);
}

void Coordinator::drop_token(std::chrono::milliseconds now) {
  if (!token_tag_) return;
  actions_.ack_tokens.push_back(*token_tag_);
  token_tag_.reset();
  // Closed or ramping: whether it may probe matters again at the next outage, and then only the
  // holder of that outage's token does.
  breaker_.set_may_probe(false, now);
}

void Coordinator::heard(int64_t outage) {
  heard_ = std::max(heard_, outage);
}

void Coordinator::announce_open(const std::string& reason, int64_t wall_ms) {
  outage_ = outage_id(wall_ms, std::max(heard_, ended_));
  tripped_alone_ = false;
  signal(SignalKind::open, wall_ms, outage_, reason);
  actions_.token = Token{outage_, false};
}

void Coordinator::signal(SignalKind kind, int64_t wall_ms, int64_t outage, std::string reason) {
  heard(outage);
  actions_.signals.push_back(Signal{kind, wall_ms, instance_, std::move(reason), outage});
}

std::chrono::milliseconds Coordinator::silence_limit() const {
  return 3 * breaker_.settings().probe_interval + silence_margin;
}

}  // namespace retryloop::outage
