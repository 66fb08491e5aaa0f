#include <catch2/catch.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "retryloop/outage/breaker.hpp"
#include "retryloop/outage/coordinator.hpp"

using namespace std::chrono_literals;
using namespace retryloop::outage;

namespace {

constexpr int concurrency = 32;

/// One instance of a service: its breaker, and the coordinator that keeps it in step with the
/// others. The breaker's events wait in `pending`, as the consumer's do, until the call that
/// caused them has returned.
struct Instance {
  explicit Instance(const std::string& id)
      : breaker(Settings{}, concurrency, [this](const Event& event) { pending.push_back(event); }),
        coordinator(breaker, id) {}

  std::vector<Event> pending;
  Breaker breaker;
  Coordinator coordinator;
  int probes = 0;
  /// Whether it holds deliveries to probe with.
  bool has_work = true;
};

/// The broker's part, as RabbitMQ does it: every signal reaches every joined instance in the
/// order published and the last one is kept; tokens wait in a queue whose one active consumer
/// (the first instance that joined and is still there) gets one at a time, and the broker gives
/// an unacked token back when its holder leaves.
struct SimulatedService {
  std::vector<std::unique_ptr<Instance>> instances;
  std::optional<Signal> last;
  std::deque<Token> tokens;
  struct Held {
    Instance* holder;
    uint64_t tag;
    Token token;
  };
  std::optional<Held> held;
  uint64_t next_tag = 1;
  int64_t wall = 1'800'000'000'000;
  std::chrono::milliseconds now{1000};
  std::vector<Signal> published;
  std::vector<Instance*> passed;

  Instance& add(const std::string& id) {
    instances.push_back(std::make_unique<Instance>(id));
    instances.back()->coordinator.joined(last, now, wall);
    settle();
    return *instances.back();
  }

  /// Moves time on by `step`, ticking every breaker and coordinator on the way.
  void advance(std::chrono::milliseconds by, std::chrono::milliseconds step = 100ms) {
    for (auto end = now + by; now < end;) {
      now += step;
      wall += step.count();
      for (auto& instance : instances) {
        instance->breaker.tick(now);
        instance->coordinator.tick(now, wall);
        instance->coordinator.can_probe(instance->has_work, now);
      }
      settle();
      for (auto& instance : instances)
        start_probe(*instance);
    }
  }

  /// A probing instance starts its probe (a call) if it has none running; the dependency answers
  /// `up` when it ends.
  void start_probe(Instance& instance) {
    if (instance.breaker.state() != State::probing || !instance.has_work) return;
    if (auto call = instance.breaker.try_start(0, now)) {
      ++instance.probes;
      probe_calls.emplace_back(&instance, std::move(*call));
    }
    settle();
  }

  void answer_probes(bool up) {
    auto calls = std::move(probe_calls);
    probe_calls.clear();
    for (auto& [instance, call] : calls) {
      instance->breaker.finished(call, up ? Verdict::success : Verdict::unavailable, now);
    }
    settle();
  }

  void trip(Instance& instance) {
    for (int i = 0; i < instance.breaker.settings().consecutive_unavailable; ++i) {
      auto call = instance.breaker.try_start(0, now);
      REQUIRE(call);
      instance.breaker.finished(*call, Verdict::unavailable, now);
    }
    settle();
  }

  void leave(Instance& instance) {
    instance.coordinator.left(now);
    if (held && held->holder == &instance) {
      tokens.push_front(held->token);
      held.reset();
    }
    for (auto it = instances.begin(); it != instances.end(); ++it) {
      if (it->get() == &instance) {
        instances.erase(it);
        break;
      }
    }
    settle();
  }

  /// What `retryloop service pause|resume` sends, from a machine whose clock is `skew` off.
  /// The instance's connection is lost: it hears nothing until reconnect(), and the broker gives
  /// its token back.
  std::unique_ptr<Instance> disconnect(Instance& instance) {
    instance.coordinator.left(now);
    if (held && held->holder == &instance) {
      tokens.push_front(held->token);
      held.reset();
    }
    std::unique_ptr<Instance> away;
    for (auto it = instances.begin(); it != instances.end(); ++it) {
      if (it->get() != &instance) continue;
      away = std::move(*it);
      instances.erase(it);
      break;
    }
    settle();
    return away;
  }

  /// A process that has connected and consumes the signals and the token queue, but has not read
  /// the state queue yet (not joined): what the broker delivers meanwhile reaches it first.
  Instance& connect(std::unique_ptr<Instance> instance) {
    instances.push_back(std::move(instance));
    settle();
    return *instances.back();
  }

  /// It has read the state queue (`read`: what the read found) and joins.
  void join(Instance& instance, const std::optional<Signal>& read) {
    instance.coordinator.joined(read, now, wall);
    settle();
  }

  void operator_says(SignalKind kind, bool with_token = false,
                     std::chrono::milliseconds skew = 0ms) {
    const int64_t at = wall + skew.count();
    const int64_t known = last ? last->outage : 0;
    const int64_t outage = kind == SignalKind::resumed ? outage_id(at, known) : known;
    deliver(Signal{kind, at, "operator", "", outage});
    if (with_token) tokens.push_back(Token{outage, true});
    settle();
  }

  void settle() {
    for (bool moved = true; moved;) {
      moved = false;
      for (auto& instance : instances) {
        auto events = std::move(instance->pending);
        instance->pending.clear();
        for (const Event& event : events)
          instance->coordinator.breaker_event(event, wall);
        Actions actions = instance->coordinator.take_actions();
        for (const Signal& signal : actions.signals) {
          published.push_back(signal);
          deliver(signal);
          moved = true;
        }
        if (actions.token) {
          tokens.push_back(*actions.token);
          moved = true;
        }
        for (uint64_t tag : actions.ack_tokens) {
          if (held && held->tag == tag) held.reset();
          moved = true;
        }
        if (actions.pass_token && held && held->tag == *actions.pass_token) {
          // Cancelled, then requeued: the token goes to the next in line, and the passer to the
          // end of the line.
          tokens.push_front(held->token);
          held.reset();
          passed.push_back(instance.get());
          moved = true;
        }
        if (!instance->pending.empty()) moved = true;
      }
      for (Instance* passer : std::exchange(passed, {})) {
        for (auto it = instances.begin(); it != instances.end(); ++it) {
          if (it->get() != passer) continue;
          auto moving = std::move(*it);
          instances.erase(it);
          instances.push_back(std::move(moving));
          break;
        }
      }
      if (!held && !tokens.empty() && !instances.empty()) {
        Instance* active = instances.front().get();
        held = Held{active, next_tag++, tokens.front()};
        tokens.pop_front();
        active->coordinator.token(held->tag, held->token, now, wall);
        moved = true;
      }
    }
  }

  void deliver(const Signal& signal) {
    last = signal;
    for (auto& instance : instances)
      instance->coordinator.received(signal, now);
  }

  std::vector<State> states() const {
    std::vector<State> out;
    for (const auto& instance : instances)
      out.push_back(instance->breaker.state());
    return out;
  }

  int probes() const {
    int total = 0;
    for (const auto& instance : instances)
      total += instance->probes;
    return total;
  }

  std::vector<std::pair<Instance*, Call>> probe_calls;
};

}  // namespace

TEST_CASE(
    "One instance trips, every instance stops, only the token's holder probes, and its success "
    "ramps them all",
    "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  Instance& c = service.add("c");
  service.trip(b);
  CHECK(service.states() == std::vector<State>{State::open, State::open, State::open});
  REQUIRE(service.published.size() == 1);
  CHECK(service.published[0].kind == SignalKind::open);
  CHECK(service.published[0].sender == "b");
  CHECK(service.published[0].reason == "consecutive_unavailable");
  CHECK(b.breaker.stats(service.now).trips == 1);
  CHECK(a.breaker.stats(service.now).trips == 0);
  // The token went to the queue's active consumer, a: it alone may probe.
  CHECK(a.coordinator.holds_token());
  CHECK_FALSE(b.coordinator.holds_token());
  CHECK(a.breaker.may_probe());
  CHECK_FALSE(b.breaker.may_probe());
  CHECK_FALSE(c.breaker.wake_at());

  // A dependency down for 30 s: one probe per interval for the whole service.
  for (int i = 0; i < 6; ++i) {
    service.advance(5s);
    service.answer_probes(false);
  }
  CHECK(service.probes() == 6);
  CHECK(a.probes == 6);
  CHECK(service.states() == std::vector<State>{State::open, State::open, State::open});

  service.advance(5s);
  service.answer_probes(true);
  CHECK(service.states() == std::vector<State>{State::ramping, State::ramping, State::ramping});
  CHECK(a.breaker.limit() == 4);
  CHECK(c.breaker.limit() == 4);
  CHECK_FALSE(service.held);  // acked
  CHECK(service.last->kind == SignalKind::recovered);
  service.advance(8s);
  CHECK(service.states() == std::vector<State>{State::closed, State::closed, State::closed});
}

TEST_CASE(
    "Instances that trip together publish two tokens, and the second is acked, not probed with",
    "[outage]") {
  // Both trip before either hears the other: each publishes an open and a token.
  SimulatedService twin;
  Instance& x = twin.add("x");
  Instance& y = twin.add("y");
  for (Instance* instance : {&x, &y}) {
    for (int i = 0; i < 5; ++i) {
      auto call = instance->breaker.try_start(0, twin.now);
      REQUIRE(call);
      instance->breaker.finished(*call, Verdict::unavailable, twin.now);
    }
  }
  twin.settle();
  CHECK(x.breaker.stats(twin.now).trips == 1);
  CHECK(y.breaker.stats(twin.now).trips == 1);
  CHECK(twin.tokens.size() == 1);  // the second waits behind the one x holds
  twin.advance(5s);
  CHECK(twin.probes() == 1);
  twin.answer_probes(true);
  // x acked its token at the recovery; the second is delivered, found stale and acked too.
  CHECK(twin.tokens.empty());
  CHECK_FALSE(twin.held);
  CHECK(twin.states() == std::vector<State>{State::ramping, State::ramping});
}

TEST_CASE(
    "The token's holder with nothing to probe with passes it on after a probe interval, until an "
    "instance that holds deliveries has it and probes",
    "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  Instance& c = service.add("c");
  a.has_work = false;  // c holds every message of the service (a prefetch of 200)
  b.has_work = false;
  service.trip(c);
  REQUIRE(a.coordinator.holds_token());
  // a's probe is due after 5 s; after 5 s more with nothing to probe with it passes the token.
  service.advance(9900ms);
  CHECK(a.coordinator.holds_token());
  service.advance(200ms);
  CHECK_FALSE(a.coordinator.holds_token());
  CHECK(b.coordinator.holds_token());
  CHECK(a.breaker.state() == State::open);
  // b gets it with its probe due, and passes it after one interval; c probes at once.
  service.advance(5100ms);
  CHECK(c.coordinator.holds_token());
  CHECK(c.probes == 1);
  CHECK(a.probes + b.probes == 0);
  service.answer_probes(true);
  CHECK(service.states() == std::vector<State>{State::ramping, State::ramping, State::ramping});
  // No token left over, none published again: the passes kept the prober "heard".
  CHECK(service.tokens.empty());
  CHECK_FALSE(service.held);
}

TEST_CASE("When the token's holder leaves, another instance gets it and probes", "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  service.trip(b);
  REQUIRE(a.coordinator.holds_token());
  service.advance(5s);
  CHECK(a.probes == 1);
  service.leave(a);  // killed with its probe running
  service.probe_calls.clear();
  CHECK(b.coordinator.holds_token());
  CHECK(b.breaker.may_probe());
  service.advance(5s);
  CHECK(b.probes == 1);
  service.answer_probes(true);
  CHECK(b.breaker.state() == State::ramping);
}

TEST_CASE("An open service whose prober is not heard for 3 probe intervals + 2 s gets a new token",
          "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  service.trip(a);
  // a reconnects, and the token is lost meanwhile (its queue deleted, say).
  a.coordinator.left(service.now);
  service.held.reset();
  service.tokens.clear();
  a.coordinator.joined(service.last, service.now, service.wall);
  service.settle();
  REQUIRE(service.states() == std::vector<State>{State::open, State::open});
  service.advance(16900ms);
  CHECK_FALSE(service.held);
  service.advance(200ms);
  REQUIRE(service.held);
  CHECK(service.held->token.outage == service.published.front().outage);
  service.advance(5s);
  CHECK(service.probes() == 1);
  CHECK(a.probes + b.probes == 1);
}

TEST_CASE("A joining instance takes the service's state: open, paused, then resumed", "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  service.trip(a);
  Instance& late = service.add("late");
  CHECK(late.breaker.state() == State::open);
  CHECK_FALSE(late.breaker.may_probe());

  service.operator_says(SignalKind::paused);
  CHECK(service.states() == std::vector<State>{State::paused, State::paused});
  Instance& restarted = service.add("restarted");
  CHECK(restarted.breaker.state() == State::paused);
  service.advance(20s);
  CHECK(service.probes() == 0);

  // Resumed: the holder probes at once, the others wait for its verdict.
  service.operator_says(SignalKind::resumed, true);
  service.advance(100ms);
  CHECK(a.breaker.state() == State::probing);
  CHECK(late.breaker.state() == State::open);
  CHECK(restarted.breaker.state() == State::open);
  service.answer_probes(true);
  CHECK(service.states() == std::vector<State>{State::ramping, State::ramping, State::ramping});
  service.advance(100ms);
  CHECK_FALSE(service.held);  // the operator's token, stale now, acked
  CHECK(service.tokens.empty());
}

TEST_CASE("A service paused while closed resumes through one probe and the ramp", "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  service.operator_says(SignalKind::paused);
  CHECK(service.states() == std::vector<State>{State::paused, State::paused});
  service.operator_says(SignalKind::resumed, true);
  service.advance(100ms);
  CHECK(a.breaker.state() == State::probing);
  CHECK(b.breaker.state() == State::open);
  service.answer_probes(true);
  CHECK(service.states() == std::vector<State>{State::ramping, State::ramping});
}

TEST_CASE("An instance that tripped while not connected tells the others once it joins",
          "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  a.coordinator.left(service.now);
  service.trip(a);
  CHECK(service.published.empty());
  CHECK(a.breaker.may_probe());
  a.coordinator.joined(service.last, service.now, service.wall);
  service.settle();
  REQUIRE(service.published.size() == 1);
  CHECK(service.published[0].kind == SignalKind::open);
  CHECK(a.coordinator.holds_token());
}

TEST_CASE(
    "A signal round-trips through its JSON body, and a body that is not one is refused by name",
    "[outage]") {
  const Signal signal{SignalKind::recovered, 1'800'000'000'123, "host:42:ab12", "probe_succeeded",
                      1'800'000'000'100};
  std::string error;
  auto back = decode_signal(encode_signal(signal), error);
  REQUIRE(back);
  CHECK(back->kind == SignalKind::recovered);
  CHECK(back->at_ms == signal.at_ms);
  CHECK(back->sender == signal.sender);
  CHECK(back->reason == signal.reason);
  CHECK(back->outage == signal.outage);
  // An older sender's signal has no outage number: its clock's time stands for it.
  CHECK(decode_signal(R"({"signal":"open","at_ms":5,"sender":"old"})", error)->outage == 5);
  CHECK_FALSE(decode_signal(R"({"signal":"open","at_ms":5,"outage":"x"})", error));
  CHECK(error == "\"outage\" is not an integer");

  CHECK_FALSE(decode_signal("not json", error));
  CHECK(error == "the body is not a JSON object");
  CHECK_FALSE(decode_signal(R"({"signal":"closed","at_ms":1})", error));
  CHECK(error == "\"signal\" is not one of open, probing, recovered, paused, resumed");
  CHECK_FALSE(decode_signal(R"({"signal":"open","at_ms":"soon"})", error));
  CHECK(error == "\"at_ms\" is missing or not an integer");
  CHECK(decode_token(encode_token(Token{77, true}))->outage == 77);
  CHECK(decode_token(encode_token(Token{77, true}))->resume);
  CHECK_FALSE(decode_token(encode_token(Token{78, false}))->resume);
  CHECK(decode_token(R"({"opened_at_ms": 79})")->outage == 79);  // an older sender's
  CHECK_FALSE(decode_token("{}"));
}

TEST_CASE("A breaker that may not probe stays open, and resumed it waits with a probe due at once",
          "[outage]") {
  Breaker breaker(Settings{}, 8);
  breaker.set_may_probe(false, 0ms);
  breaker.opened_elsewhere(0ms);
  CHECK(breaker.state() == State::open);
  CHECK_FALSE(breaker.wake_at());
  breaker.tick(60s);
  CHECK(breaker.state() == State::open);
  breaker.set_may_probe(true, 60s);
  REQUIRE(breaker.wake_at());
  breaker.tick(60s);
  CHECK(breaker.state() == State::probing);
  // Probing, it is told another instance probes now: back to open, its probe's outcome ignored.
  auto probe = breaker.try_start(0, 60s);
  REQUIRE(probe);
  breaker.set_may_probe(false, 61s);
  CHECK(breaker.state() == State::open);
  breaker.finished(*probe, Verdict::success, 62s);
  CHECK(breaker.state() == State::open);
  breaker.recovered_elsewhere(63s);
  CHECK(breaker.state() == State::ramping);
  CHECK(breaker.limit() == 2);

  breaker.pause(64s);
  breaker.resume(65s);
  CHECK(breaker.state() == State::open);
  breaker.set_may_probe(true, 65s);
  breaker.tick(65s);
  CHECK(breaker.state() == State::probing);
}

TEST_CASE("An instance resumed alone probes for itself unless the service is in an outage",
          "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  b.breaker.pause(service.now);
  b.coordinator.resume_here(service.now);
  service.settle();
  CHECK(b.breaker.state() == State::probing);
  service.start_probe(b);
  service.answer_probes(true);
  CHECK(b.breaker.state() == State::ramping);
  CHECK_FALSE(b.breaker.may_probe());
  CHECK(service.published.empty());  // nothing to tell: the service was never open

  // Its own probe fails: a trip, told to the others.
  b.breaker.pause(service.now);
  b.coordinator.resume_here(service.now);
  service.settle();
  service.start_probe(b);
  service.answer_probes(false);
  CHECK(service.states() == std::vector<State>{State::open, State::open});
  REQUIRE(service.published.size() == 1);
  CHECK(service.published[0].kind == SignalKind::open);
  CHECK(a.coordinator.holds_token());
  CHECK_FALSE(b.breaker.may_probe());

  // During the outage, a resumed instance waits for the prober.
  b.breaker.pause(service.now);
  b.coordinator.resume_here(service.now);
  service.settle();
  CHECK(b.breaker.state() == State::open);
  CHECK_FALSE(b.breaker.may_probe());
}

TEST_CASE("An instance paused alone stays paused when it joins again after the service was resumed",
          "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  service.operator_says(SignalKind::paused);
  service.operator_says(SignalKind::resumed, true);
  service.advance(100ms);
  service.answer_probes(true);
  REQUIRE(service.last->kind == SignalKind::recovered);
  // The state queue keeps `resumed` when no probe has answered yet: a reconnection then.
  a.breaker.pause(service.now);
  a.coordinator.left(service.now);
  a.coordinator.joined(Signal{SignalKind::resumed, service.wall, "operator", ""}, service.now,
                       service.wall);
  service.settle();
  CHECK(a.breaker.state() == State::paused);
  // Paused by the operator's signal alone, the same reconnection resumes it.
  Instance& b = service.add("b");
  service.operator_says(SignalKind::paused);
  REQUIRE(b.breaker.state() == State::paused);
  b.coordinator.left(service.now);
  b.coordinator.joined(Signal{SignalKind::resumed, service.wall, "operator", ""}, service.now,
                       service.wall);
  service.settle();
  CHECK(b.breaker.state() != State::paused);
  CHECK(a.breaker.state() == State::paused);
}

TEST_CASE(
    "A token delivered before its instance has joined is kept, and probed with once it has: a "
    "single instance restarted during an outage probes within an interval",
    "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  service.trip(a);
  service.disconnect(a);  // killed: the broker gives its token back
  REQUIRE(service.tokens.size() == 1);
  Instance& restarted = service.connect(std::make_unique<Instance>("a-restarted"));
  REQUIRE(service.held);
  CHECK(service.held->holder == &restarted);
  service.join(restarted, service.last);
  CHECK(service.held);  // not acked away
  CHECK(restarted.coordinator.holds_token());
  CHECK(restarted.breaker.state() == State::open);
  service.advance(5s);
  CHECK(restarted.probes == 1);
  service.answer_probes(true);
  CHECK(restarted.breaker.state() == State::ramping);
  CHECK(service.last->kind == SignalKind::recovered);
  CHECK_FALSE(service.held);
}

TEST_CASE(
    "A resume sent while no instance runs is probed with by the first instance that starts, at "
    "once",
    "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  service.operator_says(SignalKind::paused);
  service.disconnect(a);
  service.operator_says(SignalKind::resumed, true);  // nobody hears it: the token waits
  REQUIRE(service.tokens.size() == 1);
  Instance& b = service.connect(std::make_unique<Instance>("b"));
  service.join(b, service.last);
  CHECK(b.coordinator.holds_token());
  service.advance(100ms);
  CHECK(b.probes == 1);
  service.answer_probes(true);
  CHECK(b.breaker.state() == State::ramping);
  CHECK(service.last->kind == SignalKind::recovered);  // `service status` says closed again
  CHECK_FALSE(service.held);
  CHECK(service.tokens.empty());
}

TEST_CASE(
    "An instance paused by the operator that missed the resume, and the probe's recovered after "
    "it, runs again when it joins",
    "[outage]") {
  SimulatedService service;
  service.add("a");
  Instance& b = service.add("b");
  service.operator_says(SignalKind::paused);
  REQUIRE(b.breaker.state() == State::paused);
  auto away = service.disconnect(b);
  service.operator_says(SignalKind::resumed, true);
  service.advance(100ms);
  service.answer_probes(true);
  REQUIRE(service.last->kind == SignalKind::recovered);
  Instance& back = service.connect(std::move(away));
  service.join(back, service.last);
  CHECK(back.breaker.state() == State::ramping);
}

TEST_CASE(
    "A resume heard between an instance's state read and its join is not undone by the pause it "
    "read",
    "[outage]") {
  SimulatedService service;
  service.add("a");
  service.operator_says(SignalKind::paused);
  Instance& b = service.connect(std::make_unique<Instance>("b"));
  const std::optional<Signal> read = service.last;  // paused
  service.operator_says(SignalKind::resumed, true);
  service.join(b, read);
  CHECK(b.breaker.state() != State::paused);
  service.advance(100ms);
  service.answer_probes(true);
  CHECK(service.states() == std::vector<State>{State::ramping, State::ramping});
}

TEST_CASE(
    "The token's holder paused on its own (Consumer::pause) passes the token after a probe "
    "interval, and another instance probes",
    "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  service.trip(b);
  REQUIRE(a.coordinator.holds_token());
  a.breaker.pause(service.now);
  service.settle();
  service.advance(5100ms);
  CHECK_FALSE(a.coordinator.holds_token());
  CHECK(b.coordinator.holds_token());
  service.advance(200ms);
  CHECK(b.probes == 1);
  CHECK(a.probes == 0);
  service.answer_probes(true);
  CHECK(b.breaker.state() == State::ramping);
  CHECK(a.breaker.state() == State::paused);  // its own pause lasts until Consumer::resume
}

TEST_CASE(
    "An operator's resume of a service that is not paused opens no instance: its token's holder "
    "finds itself handling and says the resume is over",
    "[outage]") {
  SimulatedService service;
  service.add("a");
  service.add("b");
  service.operator_says(SignalKind::resumed, true);
  CHECK(service.states() == std::vector<State>{State::closed, State::closed});
  CHECK_FALSE(service.held);
  CHECK(service.tokens.empty());
  REQUIRE(service.last);
  CHECK(service.last->kind == SignalKind::recovered);
  service.advance(20s);
  CHECK(service.states() == std::vector<State>{State::closed, State::closed});
  CHECK(service.probes() == 0);
}

TEST_CASE(
    "An operator whose clock is a minute ahead pauses and resumes the service, and the prober's "
    "recovered still ends the resume everywhere",
    "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  service.add("b");
  Instance& c = service.add("c");
  service.operator_says(SignalKind::paused, false, 60s);
  service.operator_says(SignalKind::resumed, true, 60s);
  const int64_t resume = service.last->outage;
  service.advance(100ms);
  CHECK(a.breaker.state() == State::probing);
  service.answer_probes(true);
  CHECK(service.states() == std::vector<State>{State::ramping, State::ramping, State::ramping});
  // The next outage, tripped by an instance whose clock is behind the operator's, is heard too.
  service.advance(10s);
  service.trip(c);
  CHECK(service.states() == std::vector<State>{State::open, State::open, State::open});
  CHECK(service.last->kind == SignalKind::open);
  CHECK(service.last->outage > resume);
}

TEST_CASE("An operator's resume does not end an instance's own pause, as a reconnection does not",
          "[outage]") {
  SimulatedService service;
  Instance& a = service.add("a");
  Instance& b = service.add("b");
  b.breaker.pause(service.now);  // Consumer::pause
  service.operator_says(SignalKind::paused);
  service.operator_says(SignalKind::resumed, true);
  service.advance(100ms);
  service.answer_probes(true);
  CHECK(a.breaker.state() == State::ramping);
  CHECK(b.breaker.state() == State::paused);
  b.coordinator.resume_here(service.now);
  service.settle();
  CHECK(b.breaker.state() != State::paused);
}

TEST_CASE(
    "A delivery's unavailable outcomes count in a row only while the breaker stays closed: an "
    "outage in between starts the row again",
    "[outage]") {
  int row = 0;
  CHECK(holds_unavailable(State::closed, row, 3));
  CHECK(holds_unavailable(State::closed, row, 3));
  CHECK(holds_unavailable(State::open, row, 3));  // the dependency's, whatever the row
  CHECK(holds_unavailable(State::ramping, row, 3));
  CHECK(holds_unavailable(State::closed, row, 3));
  CHECK(holds_unavailable(State::closed, row, 3));
  CHECK_FALSE(holds_unavailable(State::closed, row, 3));  // 3 in a row with the others answered
}
