#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/outage/breaker.hpp"

namespace retryloop::outage {

/// What one instance of a service tells the others about their shared breaker, or what an
/// operator tells them all (docs/outage.md, "One breaker per service").
enum class SignalKind {
  /// An instance tripped: every instance stops taking deliveries.
  open,
  /// The prober is probing (once per probe interval): the service is open, and its prober lives.
  probing,
  /// The prober's probe succeeded: every instance ramps up.
  recovered,
  /// An operator paused the service: nothing runs until resumed.
  paused,
  /// An operator resumed it: the prober probes at once, then the ramp.
  resumed,
};

struct Signal {
  SignalKind kind = SignalKind::open;
  /// The sender's wall clock, milliseconds since the Unix epoch, for people: `retryloop service
  /// status` shows it. Nothing is ordered by it.
  int64_t at_ms = 0;
  /// Who sent it: an instance's id, or "operator" for the command line.
  std::string sender;
  /// Why, for people: the trip's reason, the operator's note.
  std::string reason;
  /// The outage it belongs to (outage_id): open and resumed begin one, probing and recovered name
  /// the one they are about, paused names the last one the operator knew of. This, not `at_ms`,
  /// orders outages and their ends across instances. A signal without it (from an older sender)
  /// decodes with its `at_ms` here, as that sender ordered it.
  int64_t outage = 0;
};

/// The number of a new outage (or an operator's resume): at least the wall clock's milliseconds,
/// and above every number already heard (`heard`), so that it orders after what its sender knew
/// whatever the clocks of the others say (a hybrid logical clock).
int64_t outage_id(int64_t wall_ms, int64_t heard);

/// The signal as the body of a message (a JSON object), and back. decode_signal returns
/// nullopt, with `error` naming what is wrong, for anything that is not a signal.
std::string encode_signal(const Signal& signal);
std::optional<Signal> decode_signal(std::string_view body, std::string& error);
const char* to_string(SignalKind kind);
std::optional<SignalKind> signal_kind_from_string(std::string_view text);

/// A probe token: the outage it lets its holder probe for, and whether an operator's resume
/// published it (a resume of a service that turns out not to be open or paused needs no probe).
struct Token {
  int64_t outage = 0;
  bool resume = false;
};
/// The token's body; decode_token also reads an older sender's `{"opened_at_ms": N}`.
std::string encode_token(const Token& token);
std::optional<Token> decode_token(std::string_view body);

/// What the coordinator asks of the broker; the consumer carries it out, in this order.
struct Actions {
  /// Publish each to the service's breaker exchange (every instance and the state queue).
  std::vector<Signal> signals;
  /// Publish a probe token.
  std::optional<Token> token;
  /// Ack the token delivered with this tag (its outage is over, or it is one too many).
  std::vector<uint64_t> ack_tokens;
  /// Hand the token delivered with this tag on to the next instance in line: cancel the token
  /// consumer (so that the broker's single active consumer moves on), requeue the token, and
  /// consume the token queue again, at the end of the line.
  std::optional<uint64_t> pass_token;
};

/// Makes one breaker of a service's instances: each instance's own outage::Breaker, kept in step
/// through the broker. A state machine with no I/O: the consumer hands it what the broker
/// delivered and what its breaker did, and carries out the actions it returns (take_actions).
///
/// The broker's part (docs/outage.md): a fanout exchange every instance hears signals on; a
/// queue holding the last signal, so that an instance that starts, or a broker that restarted,
/// knows whether the service is open or paused; and a single-active-consumer queue of probe
/// tokens. The instance that trips publishes `open` and a token; the broker gives tokens to one
/// instance at a time, and the holder is the only one that probes. When the holder dies, the
/// broker gives its token to another. The holder's successful probe publishes `recovered` and
/// acks the token, and every instance ramps. When an instance has heard no prober for
/// 3 probe intervals + 2 s while open, it publishes a token again (a lost token, a lost queue).
/// A token delivered before the instance has joined is kept until it has, and then taken as any
/// other. Outages are ordered by their numbers (Signal::outage), never by the senders' clocks.
///
/// Times: `now` is the breaker's monotonic milliseconds; `wall_ms` the wall clock, shown to
/// people and the floor of a new outage's number. Call it from the consumer's loop thread only.
class Coordinator {
 public:
  Coordinator(Breaker& breaker, std::string instance);

  /// The instance is connected and hears signals and tokens; `last` is the state queue's newest
  /// signal, if any. Brings the breaker to the service's state: open, paused, or resumed (open,
  /// its probe due at once, waiting for the token's holder); a pause of the operator's that has
  /// ended since ends here too. When this breaker is open on its own and the service is not, it
  /// says so to the others. A token delivered before this is taken now.
  void joined(const std::optional<Signal>& last, std::chrono::milliseconds now, int64_t wall_ms);
  /// The connection is gone: the broker gives the token to another instance. Until joined()
  /// again the breaker is this instance's alone and may probe.
  void left(std::chrono::milliseconds now);
  bool joined() const { return joined_; }

  /// One of the breaker's events, after it happened (the breaker's own or one this coordinator
  /// caused): a trip of its own, a probe, a probe's success are told to the others.
  void breaker_event(const Event& event, int64_t wall_ms);
  /// A signal heard on the exchange, this instance's own included.
  void received(const Signal& signal, std::chrono::milliseconds now);
  /// A probe token delivered (`delivery_tag` on the token channel); nullopt when its body was not
  /// a token (it is then taken as one for the outage this instance knows of).
  void token(uint64_t delivery_tag, const std::optional<Token>& token,
             std::chrono::milliseconds now, int64_t wall_ms);
  /// This instance alone was resumed (Consumer::resume after Consumer::pause). During an outage
  /// it waits for the prober's verdict; otherwise it makes the one call a resume starts with
  /// itself, and a failure of that call is a trip told to the others.
  void resume_here(std::chrono::milliseconds now);
  /// Time passed: publishes a token again when no prober has been heard for too long.
  void tick(std::chrono::milliseconds now, int64_t wall_ms);
  /// Whether this instance has something to probe with now: a delivery waiting or running, or the
  /// service's probe function. Call it as time passes (with tick). The token's holder that cannot
  /// probe for a whole probe interval while its probe is due, for want of something to probe with
  /// or because it is paused on its own (Consumer::pause), passes the token on
  /// (Actions::pass_token): with a prefetch, one instance may hold every message of a quiet
  /// service, and it is the one that can probe.
  void can_probe(bool can, std::chrono::milliseconds now);

  /// What to do now; empties the list.
  Actions take_actions();
  bool has_actions() const {
    return !actions_.signals.empty() || actions_.token || !actions_.ack_tokens.empty() ||
           actions_.pass_token;
  }
  bool holds_token() const { return token_tag_.has_value(); }
  /// Whether this instance probes for the service when its breaker is open: it holds the token,
  /// or it is not joined and its breaker is its own.
  bool prober() const { return !joined_ || token_tag_.has_value() || probing_alone_; }
  const std::string& instance() const { return instance_; }

 private:
  struct EarlyToken {
    uint64_t delivery_tag = 0;
    std::optional<Token> token;
  };
  void hold_token(uint64_t delivery_tag, std::chrono::milliseconds now);
  /// An operator's pause: marks it as the signal's unless the instance was paused on its own.
  void pause_by_signal(std::chrono::milliseconds now);
  /// Joins an operator's resume: from a pause of the signal's (or from closed, when the pause was
  /// missed), open with a probe due at once, for the token's holder to make.
  void follow_resume(std::chrono::milliseconds now);
  void drop_token(std::chrono::milliseconds now);
  /// Learns the outage numbers a signal or token carries.
  void heard(int64_t outage);
  void announce_open(const std::string& reason, int64_t wall_ms);
  void signal(SignalKind kind, int64_t wall_ms, int64_t outage, std::string reason = {});
  std::chrono::milliseconds silence_limit() const;

  Breaker& breaker_;
  std::string instance_;
  bool joined_ = false;
  std::optional<uint64_t> token_tag_;
  /// A token delivered before joined(), taken then.
  std::optional<EarlyToken> early_token_;
  /// The newest signal of another's heard before joined(): newer than the state read it joins
  /// with (signals are consumed only once the state has been read).
  std::optional<Signal> heard_while_joining_;
  /// Probing without the token, for resume_here().
  bool probing_alone_ = false;
  /// The breaker is paused because an operator's signal said so (not Consumer::pause alone).
  bool paused_by_signal_ = false;
  /// It tripped while not joined: told to the others when it joins.
  bool tripped_alone_ = false;
  /// The outage this instance knows of (its number), the highest number known to have ended,
  /// and the highest number heard at all.
  int64_t outage_ = 0;
  int64_t ended_ = 0;
  int64_t heard_ = 0;
  /// When a prober was last heard from (or the outage began), monotonic.
  std::chrono::milliseconds prober_heard_{0};
  /// Since when this instance has held the token, its probe due, unable to probe.
  std::optional<std::chrono::milliseconds> starved_since_;
  Actions actions_;
};

}  // namespace retryloop::outage
