#include "fault_harness.hpp"

#include <signal.h>
#include <catch2/catch.hpp>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/topology_json.hpp"

namespace retryloop::test::fault {

using client::Error;
using consumer::Outcome;

const char* to_string(Expect expect) {
  switch (expect) {
    case Expect::acked:
      return "acked";
    case Expect::parked_exhausted:
      return "parked (exhausted)";
    case Expect::parked_permanent:
      return "parked (permanent)";
    case Expect::parked_poison:
      return "parked (poison)";
    case Expect::parked_unrouted:
      return "parked (no reason: alternate exchange)";
    case Expect::queued:
      return "queued";
  }
  return "?";
}

namespace {

/// The retryloop-reason a parked message must carry; "" for one the alternate exchange routed.
std::optional<std::string> parked_reason(Expect expect) {
  switch (expect) {
    case Expect::parked_exhausted:
      return "exhausted";
    case Expect::parked_permanent:
      return "permanent";
    case Expect::parked_poison:
      return "poison";
    case Expect::parked_unrouted:
      return "";
    default:
      return std::nullopt;
  }
}

std::string getenv_or_fail(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    FAIL(name << " is not set: run the fault suite against a broker of its own, through "
                 "scripts/test or scripts/with-broker");
  }
  return value;
}

template <class T>
struct Waiting {
  bool done = false;
  Error error;
  T value{};
};

}  // namespace

Expect expect_without_wait_queue(const Script& script, int64_t next_attempt) {
  switch (script.kind) {
    case Kind::success:
      return Expect::acked;
    case Kind::permanent:
      return Expect::parked_permanent;
    case Kind::poison:
      return Expect::parked_poison;
    case Kind::fail_then_ack:
    case Kind::exhausted:
      if (next_attempt > script.fail_times) return Expect::acked;
      return next_attempt >= max_attempts ? Expect::parked_exhausted : Expect::parked_unrouted;
  }
  return Expect::acked;
}

Outcome run_script(const consumer::Message& message, bool outage) {
  nlohmann::json body = nlohmann::json::parse(message.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return Outcome::poison("body is not a JSON object");
  if (auto sleep = body.find("sleep_ms");
      !outage && sleep != body.end() && sleep->is_number_unsigned()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep->get<uint64_t>()));
  }
  if (auto why = body.find("permanent"); why != body.end()) {
    return Outcome::permanent(why->is_string() ? why->get<std::string>() : why->dump());
  }
  if (outage) return Outcome::retry("downstream is down");
  if (auto fail = body.find("fail_times"); fail != body.end() && fail->is_number_integer()) {
    if (message.attempt <= fail->get<int64_t>()) {
      std::string error = "simulated failure " + std::to_string(message.attempt);
      if (auto after = body.find("retry_after_ms");
          after != body.end() && after->is_number_unsigned()) {
        return Outcome::retry_after(std::chrono::milliseconds(after->get<uint64_t>()),
                                    std::move(error));
      }
      return Outcome::retry(std::move(error));
    }
  }
  return Outcome::ack();
}

// ---- lanes -------------------------------------------------------------------------------------

Lane::Lane(const std::string& fault, topology::RetryMode mode_, topology::QueueType queue_type_,
           std::chrono::milliseconds delay_, bool delay_levels_)
    : mode(mode_), queue_type(queue_type_), delay_levels(delay_levels_), delay(delay_) {
  const std::string name = unique_name(
      fault + "." + (mode == topology::RetryMode::reject ? "rej" : "rep") + "." +
      (queue_type == topology::QueueType::classic ? "cl" : "qu") + (delay_levels ? ".lv" : ""));
  nlohmann::json file = {
      {"services",
       {{{"name", name},
         {"queue_type", topology::to_string(queue_type)},
         {"input", {{"exchange", name + ".in"}, {"type", "direct"}, {"bindings", {"key"}}}},
         {"retry",
          {{"mode", topology::to_string(mode)},
           {"delays", {topology::duration_label(delay)}},
           {"max_attempts", max_attempts}}}}}}};
  if (delay_levels) {
    file["services"][0]["retry"]["delay_levels"] = {
        {"base", topology::duration_label(delay_level_base)}, {"max", "10m"}};
  }
  topology::ParseResult parsed = topology::parse_topology(file.dump());
  std::string problems;
  for (const auto& line : parsed.messages())
    problems += line + "\n";
  INFO(problems);
  REQUIRE(parsed.ok());
  service = parsed.topology->services.at(0);
  topology_path = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream(topology_path) << file.dump(2);

  for (int i = 0; i < messages_per_lane; ++i) {
    Script script;
    script.id = name + "/" + std::to_string(i);
    const std::string id = "\"id\": \"" + script.id + "\"";
    const std::string sleep = ", \"sleep_ms\": " + std::to_string(handler_sleep_ms);
    switch (i % 10) {
      case 0:
        script.kind = Kind::poison;
        script.body = "poison " + script.id;
        script.expect = Expect::parked_poison;
        break;
      case 1:
        script.kind = Kind::permanent;
        script.body = "{" + id + ", \"permanent\": \"no such customer\"" + sleep + "}";
        script.expect = Expect::parked_permanent;
        break;
      case 2:
        script.kind = Kind::exhausted;
        script.fail_times = 9;
        script.expect = Expect::parked_exhausted;
        break;
      case 3:
      case 4:
        script.kind = Kind::fail_then_ack;
        script.fail_times = 1;
        break;
      case 5:
        script.kind = Kind::fail_then_ack;
        script.fail_times = 2;
        break;
      default:
        script.kind = Kind::success;
        break;
    }
    if (script.body.empty()) {
      // Delays from 0.5 to 3 s pass one to five levels.
      const std::string after =
          delay_levels ? ", \"retry_after_ms\": " + std::to_string(500 + (i * 97) % 2500) : "";
      script.body =
          "{" + id + ", \"fail_times\": " + std::to_string(script.fail_times) + after + sleep + "}";
    }
    expected[script.id] = script.expect;
    scripts.push_back(std::move(script));
  }
}

Lane::~Lane() {
  std::error_code ignored;
  std::filesystem::remove(topology_path, ignored);
}

std::vector<std::string> Lane::waiting_queues() const {
  std::vector<std::string> queues = {wait_queue()};
  if (!delay_levels) return queues;
  for (int k = 0; k < service.retry.delay_levels->levels; ++k)
    queues.push_back(topology::delay_level_name(service, k));
  queues.push_back(topology::delay_unrouted_name(service));
  return queues;
}

size_t Lane::expected_count(Expect expect) const {
  return size_t(std::count_if(expected.begin(), expected.end(),
                              [expect](const auto& entry) { return entry.second == expect; }));
}

size_t Lane::expected_parked() const {
  size_t n = 0;
  for (const auto& [id, expect] : expected)
    n += parked_reason(expect) ? 1 : 0;
  return n;
}

std::vector<std::unique_ptr<Lane>> make_lanes(const std::string& fault,
                                              std::chrono::milliseconds delay,
                                              const std::vector<topology::QueueType>& types,
                                              bool delay_levels) {
  std::vector<std::unique_ptr<Lane>> lanes;
  for (auto mode : {topology::RetryMode::reject, topology::RetryMode::republish}) {
    for (auto type : types) {
      lanes.push_back(std::make_unique<Lane>(fault, mode, type, delay));
    }
  }
  if (delay_levels) {
    for (auto type : types) {
      lanes.push_back(
          std::make_unique<Lane>(fault, topology::RetryMode::republish, type, delay, true));
    }
  }
  return lanes;
}

// ---- evidence ----------------------------------------------------------------------------------

void Ledger::add(const consumer::Message& message, consumer::OutcomeKind outcome) {
  add(Call{std::string(message.message_id()), message.attempt, message.redelivered, outcome});
}

void Ledger::add(Call call) {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.push_back(std::move(call));
}

std::vector<Ledger::Call> Ledger::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

size_t Ledger::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

std::multiset<std::string> Ledger::acks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::multiset<std::string> ids;
  for (const auto& call : calls_) {
    if (call.outcome == consumer::OutcomeKind::ack) ids.insert(call.id);
  }
  return ids;
}

void add_demo_output(Ledger& ledger, const std::string& output) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    auto json = nlohmann::json::parse(line, nullptr, false);
    if (!json.is_object()) continue;
    Ledger::Call call;
    if (json["id"].is_string()) call.id = json["id"].get<std::string>();
    call.attempt = json.value("attempt", int64_t(0));
    const std::string outcome = json.value("outcome", "");
    if (outcome == "ack") {
      call.outcome = consumer::OutcomeKind::ack;
    } else if (outcome == "retry") {
      call.outcome = consumer::OutcomeKind::retry;
    } else if (outcome == "permanent") {
      call.outcome = consumer::OutcomeKind::permanent;
    } else if (outcome == "poison") {
      call.outcome = consumer::OutcomeKind::poison;
    } else {
      continue;
    }
    ledger.add(std::move(call));
  }
}

void Gate::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = false;
  }
  changed_.notify_all();
}

void Gate::pass() {
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiting_;
  changed_.wait(lock, [this] { return !closed_; });
  --waiting_;
}

int Gate::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

// ---- processes
// -------------------------------------------------------------------------------------

bool poll_until(TestLoop& loop, std::chrono::milliseconds timeout,
                const std::function<bool()>& done, std::chrono::milliseconds interval) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (Clock::now() >= until) return false;
    loop.run_for(interval);
  }
}

int run_async(TestLoop& loop, std::vector<std::string> argv, std::chrono::milliseconds timeout,
              std::string* output) {
  ChildProcess child(std::move(argv));
  const bool exited = poll_until(
      loop, timeout, [&] { return !child.running(); }, 20ms);
  if (!exited) child.signal(SIGKILL);
  const int code = child.wait(10000);
  if (output != nullptr) *output = child.out() + child.err();
  return exited ? code : -1;
}

int ctl_async(TestLoop& loop, std::vector<std::string> args, std::string* output) {
  args.insert(args.begin(), getenv_or_fail("RETRYLOOP_TEST_CTL"));
  return run_async(loop, std::move(args), 120s, output);
}

int broker_script_async(TestLoop& loop, const std::string& command, std::string* output) {
  return run_async(loop,
                   {std::string(RETRYLOOP_SOURCE_DIR) + "/scripts/broker", command,
                    getenv_or_fail("RETRYLOOP_TEST_BROKER_DIR")},
                   180s, output);
}

namespace {

// The lanes' quorum queues (service and wait queues, and with `parking` the parking queue) as the
// elements of an Erlang list of binaries: <<"a">>, <<"b">>. Empty when no lane is quorum.
std::string quorum_queue_binaries(const std::vector<const Lane*>& lanes, bool parking) {
  std::string names;
  for (const Lane* lane : lanes) {
    if (lane->queue_type != topology::QueueType::quorum) continue;
    std::vector<std::string> queues = lane->waiting_queues();
    queues.push_back(lane->input_queue());
    if (parking) queues.push_back(lane->parking_queue());
    for (const auto& queue : queues) {
      names += std::string(names.empty() ? "" : ", ") + "<<\"" + queue + "\">>";
    }
  }
  return names;
}

}  // namespace

std::vector<std::string> elect_leaderless_quorum_queues(TestLoop& loop,
                                                        const std::vector<const Lane*>& lanes) {
  const std::string names = quorum_queue_binaries(lanes, true);
  if (names.empty()) return {};
  // Ra names a quorum queue's server "<vhost, percent-encoded>_<queue>". A server that answers
  // with a leader is left alone; any other answer (no leader known, a timeout) gets an election.
  const std::string program =
      "Elect = fun(Q) -> S = {binary_to_atom(<<\"%2F_\", Q/binary>>, utf8), node()}, "
      "case catch ra:members(S, 5000) of {ok, _, {_, _}} -> false; "
      "_ -> catch ra:trigger_election(S), true end end, "
      "io:format(\"~s~n\", [[[Q, \" \"] || Q <- [" +
      names + "], Elect(Q)]]).";
  std::string output;
  const int code = ctl_async(loop, {"eval", program}, &output);
  INFO(output);
  CHECK(code == 0);
  std::vector<std::string> elected;
  std::istringstream words(output.substr(0, output.find('\n')));
  for (std::string word; words >> word;) {
    if (word != "ok") elected.push_back(word);
  }
  return elected;
}

size_t held_by_dead_letter_workers(TestLoop& loop, const std::vector<const Lane*>& lanes) {
  const std::string names = quorum_queue_binaries(lanes, false);
  if (names.empty()) return 0;
  // messages_dlx is a queue info key that rabbitmqctl list_queues does not accept.
  const std::string program =
      "Held = fun(N) -> case rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>, queue, N)) of "
      "{ok, Q} -> case catch rabbit_amqqueue:info(Q, [messages_dlx]) of "
      "[{messages_dlx, C}] when is_integer(C) -> C; _ -> 0 end; _ -> 0 end end, "
      "io:format(\"~p~n\", [lists:sum([Held(N) || N <- [" +
      names + "]])]).";
  std::string output;
  const int code = ctl_async(loop, {"eval", program}, &output);
  INFO(output);
  CHECK(code == 0);
  try {
    return std::stoul(output);
  } catch (const std::exception&) {
    return 0;
  }
}

// ---- probe
// ---------------------------------------------------------------------------------------

Probe::Probe(TestLoop& loop, std::string url) : loop_(loop), url_(std::move(url)) {}

Probe::~Probe() {
  close();
}

void Probe::close() {
  if (!connection_) return;
  auto closed = std::make_shared<bool>(false);
  connection_->close([closed](const Error&) { *closed = true; });
  loop_.run_until([closed] { return *closed; }, 10s);
  connection_.reset();
}

std::shared_ptr<client::Connection> Probe::connection() {
  if (connection_ && connection_->is_open()) return connection_;
  if (connection_) close();
  client::ConnectionOptions options;
  options.uri = client::parse_uri(url_);
  options.connect_timeout = 5s;
  options.connection_name = "fault suite probe";
  auto connection = client::Connection::create(loop_.get(), options);
  auto state = std::make_shared<Waiting<bool>>();
  if (connection->connect([state](const Error& error) {
        state->error = error;
        state->done = true;
      })) {
    return nullptr;
  }
  loop_.run_until([state] { return state->done; }, 10s);
  connection_ = connection;
  if (!state->done || state->error) {
    close();
    return nullptr;
  }
  return connection_;
}

std::shared_ptr<client::Channel> Probe::channel(Error& error) {
  auto connection = this->connection();
  if (!connection) {
    error = Error(client::ClientError::connect_failed, "cannot connect to the broker");
    return nullptr;
  }
  auto state = std::make_shared<Waiting<std::shared_ptr<client::Channel>>>();
  error = connection->open_channel([state](const Error& e, std::shared_ptr<client::Channel> c) {
    state->error = e;
    state->value = std::move(c);
    state->done = true;
  });
  if (error) return nullptr;
  if (!loop_.run_until([state] { return state->done; }, 10s)) {
    error = Error(client::ClientError::connection_lost, "no channel.open-ok within 10 s");
    close();
    return nullptr;
  }
  error = state->error;
  return error ? nullptr : state->value;
}

namespace {

/// Waits for one callback-reported operation on a probe channel.
Error wait_op(TestLoop& loop, const std::function<Error(client::CompletionCallback)>& start) {
  auto state = std::make_shared<Waiting<bool>>();
  Error immediate = start([state](const Error& error) {
    state->error = error;
    state->done = true;
  });
  if (immediate) return immediate;
  if (!loop.run_until([state] { return state->done; }, 30s)) {
    return Error(client::ClientError::connection_lost, "no answer within 30 s");
  }
  return state->error;
}

void close_channel(TestLoop& loop, const std::shared_ptr<client::Channel>& channel) {
  if (!channel || !channel->is_open()) return;
  auto done = std::make_shared<bool>(false);
  if (channel->close([done](const Error&) { *done = true; })) return;
  loop.run_until([done] { return *done; }, 10s);
}

}  // namespace

Probe::Depth Probe::depth(const std::string& queue) {
  Depth depth;
  Error error;
  auto ch = channel(error);
  if (!ch) return depth;
  client::QueueOptions passive;
  passive.passive = true;
  auto info = std::make_shared<client::QueueInfo>();
  error = wait_op(loop_, [&](client::CompletionCallback done) {
    return ch->queue_declare(queue, passive,
                             [info, done](const Error& e, const client::QueueInfo& i) {
                               *info = i;
                               done(e);
                             });
  });
  if (error.reply_code == 404) {
    depth.ok = true;
    depth.missing = true;
    return depth;
  }
  close_channel(loop_, ch);
  if (error) return depth;
  depth.ok = true;
  depth.messages = info->message_count;
  depth.consumers = info->consumer_count;
  return depth;
}

bool Probe::drain(const std::string& queue, std::vector<client::GetResult>& out) {
  Error error;
  auto ch = channel(error);
  if (!ch) return false;
  for (;;) {
    auto got = std::make_shared<std::optional<client::GetResult>>();
    error = wait_op(loop_, [&](client::CompletionCallback done) {
      return ch->get(queue, false,
                     [got, done](const Error& e, std::optional<client::GetResult>&& r) {
                       *got = std::move(r);
                       done(e);
                     });
    });
    if (error.reply_code == 404) return true;
    if (error) return false;
    if (!*got) break;
    if (ch->ack((*got)->delivery_tag)) return false;
    out.push_back(std::move(**got));
  }
  close_channel(loop_, ch);
  return true;
}

client::Error Probe::apply(const topology::Plan& plan) {
  auto connection = this->connection();
  if (!connection)
    return Error(client::ClientError::connect_failed, "cannot connect to the broker");
  auto report = std::make_shared<topology::Report>();
  Error error = wait_op(loop_, [&](client::CompletionCallback done) {
    return topology::apply(connection, plan, [report, done](const topology::Report& r) {
      *report = r;
      done({});
    });
  });
  if (error) return error;
  if (report->connection_error) return report->connection_error;
  for (const auto& result : report->results) {
    if (result.outcome == topology::Outcome::drifted ||
        result.outcome == topology::Outcome::failed ||
        result.outcome == topology::Outcome::missing ||
        result.outcome == topology::Outcome::not_run) {
      Error problem = result.error;
      problem.reply_text = topology::describe(result.action) + ": " +
                           topology::to_string(result.outcome) + " " + problem.reply_text;
      if (!problem.code) problem.code = make_error_code(client::ClientError::invalid_argument);
      return problem;
    }
  }
  return {};
}

client::Error Probe::remove(const topology::Plan& plan) {
  auto connection = this->connection();
  if (!connection)
    return Error(client::ClientError::connect_failed, "cannot connect to the broker");
  topology::DeleteOptions options;
  options.execute = true;
  options.force = true;
  auto report = std::make_shared<topology::Report>();
  Error error = wait_op(loop_, [&](client::CompletionCallback done) {
    return topology::remove(connection, plan, options, [report, done](const topology::Report& r) {
      *report = r;
      done({});
    });
  });
  if (error) return error;
  return report->connection_error;
}

client::Error Probe::declare_queue(const std::string& name, const amqp::FieldTable& arguments) {
  Error error;
  auto ch = channel(error);
  if (!ch) return error;
  client::QueueOptions options;
  options.arguments = arguments;
  error = wait_op(loop_, [&](client::CompletionCallback done) {
    return ch->queue_declare(name, options,
                             [done](const Error& e, const client::QueueInfo&) { done(e); });
  });
  close_channel(loop_, ch);
  return error;
}

client::Error Probe::bind_queue(const std::string& queue, const std::string& exchange,
                                const std::string& routing_key) {
  Error error;
  auto ch = channel(error);
  if (!ch) return error;
  error = wait_op(loop_, [&](client::CompletionCallback done) {
    return ch->queue_bind(queue, exchange, routing_key, {}, done);
  });
  close_channel(loop_, ch);
  return error;
}

client::Error Probe::unbind_queue(const std::string& queue, const std::string& exchange,
                                  const std::string& routing_key) {
  Error error;
  auto ch = channel(error);
  if (!ch) return error;
  error = wait_op(loop_, [&](client::CompletionCallback done) {
    return ch->queue_unbind(queue, exchange, routing_key, {}, done);
  });
  close_channel(loop_, ch);
  return error;
}

client::Error Probe::delete_queue(const std::string& name, bool if_empty) {
  Error error;
  auto ch = channel(error);
  if (!ch) return error;
  error = wait_op(loop_, [&](client::CompletionCallback done) {
    return ch->queue_delete(name, false, if_empty, [done](const Error& e, uint32_t) { done(e); });
  });
  close_channel(loop_, ch);
  return error;
}

size_t Probe::publish(const std::string& exchange, const std::string& routing_key,
                      const std::vector<std::pair<std::string, std::string>>& id_and_body,
                      const std::vector<size_t>& header_frame_size) {
  Error error;
  auto ch = channel(error);
  if (!ch) return 0;
  error = wait_op(loop_, [&](client::CompletionCallback done) { return ch->confirm_select(done); });
  if (error) return 0;
  struct Counts {
    size_t settled = 0;
    size_t ok = 0;
  };
  auto counts = std::make_shared<Counts>();
  size_t sent = 0;
  for (const auto& [id, body] : id_and_body) {
    amqp::BasicProperties properties;
    properties.message_id = id;
    properties.delivery_mode = 2;
    const size_t frame_size = sent < header_frame_size.size() ? header_frame_size[sent] : 0;
    if (frame_size != 0) {
      properties.headers = amqp::FieldTable{};
      properties.headers->append("padding", std::string());
      std::string frame;
      REQUIRE_FALSE(amqp::append_header_frame(frame, 1, body.size(), properties));
      REQUIRE(frame.size() <= frame_size);
      properties.headers = amqp::FieldTable{};
      properties.headers->append("padding", std::string(frame_size - frame.size(), 'p'));
    }
    if (ch->publish(exchange, routing_key, properties, body, client::Mandatory::yes,
                    [counts](const client::PublishOutcome& outcome) {
                      ++counts->settled;
                      if (outcome.ok()) ++counts->ok;
                    })) {
      break;
    }
    ++sent;
  }
  loop_.run_until([&] { return counts->settled == sent; }, 60s);
  close_channel(loop_, ch);
  return counts->ok;
}

// ---- the alarm witness
// ---------------------------------------------------------------------------

AlarmWitness::AlarmWitness(TestLoop& loop, const std::string& url) : loop_(loop) {
  client::ConnectionOptions options;
  options.uri = client::parse_uri(url);
  options.connection_name = "fault suite alarm witness";
  connection_ = test::connect(loop_, std::move(options));
  connection_->set_blocked_handler([state = state_](bool blocked, const std::string&) {
    state->blocked = blocked;
    if (blocked && !state->blocked_at) state->blocked_at = Clock::now();
    if (!blocked && state->blocked_at && !state->unblocked_at) state->unblocked_at = Clock::now();
  });
  channel_ = test::open_channel(loop_, *connection_);
}

AlarmWitness::~AlarmWitness() {
  channel_.reset();
  auto closed = std::make_shared<bool>(false);
  connection_->close([closed](const Error&) { *closed = true; });
  loop_.run_until([closed] { return *closed; }, 10s);
}

std::optional<Clock::time_point> AlarmWitness::wait_blocked(std::chrono::milliseconds timeout) {
  poll_until(
      loop_, timeout,
      [&] {
        if (state_->blocked_at) return true;
        // To the default exchange, with a routing key no queue has: the broker drops it.
        (void)channel_->publish("", "retryloop.fault.alarm-witness", {}, "witness");
        return false;
      },
      100ms);
  return state_->blocked_at;
}

std::optional<Clock::time_point> AlarmWitness::wait_unblocked(std::chrono::milliseconds timeout) {
  poll_until(
      loop_, timeout, [&] { return state_->unblocked_at.has_value(); }, 20ms);
  return state_->unblocked_at;
}

bool AlarmWitness::blocked() const {
  return state_->blocked;
}

// ---- consumers
// -----------------------------------------------------------------------------------

LaneConsumer::LaneConsumer(TestLoop& loop, Lane& lane, const std::string& url, Ledger& ledger,
                           Gate* gate, bool outage)
    : loop_(loop) {
  consumer::ConsumerOptions options;
  options.service = lane.service;
  options.connection.uri = client::parse_uri(url);
  options.prefetch = consumer_prefetch;
  options.concurrency = consumer_concurrency;
  options.recovery = consumer::Backoff{100ms, 1000ms, 2.0, 0.1};
  options.logger = std::make_shared<spdlog::logger>(lane.label(), lane.log);
  options.logger->set_level(spdlog::level::info);
  consumer_ = consumer::Consumer::create(loop.get(), options,
                                         [&ledger, gate, outage](const consumer::Message& message) {
                                           if (gate != nullptr) gate->pass();
                                           Outcome outcome = run_script(message, outage);
                                           ledger.add(message, outcome.kind);
                                           return outcome;
                                         });
}

LaneConsumer::~LaneConsumer() {
  if (started_ && !*stopped_) {
    consumer_->stop_now();
    loop_.run_until([stopped = stopped_] { return *stopped; }, 30s);
  }
  if (!started_) {
    delete watch_;
    return;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&watch_->timer),
           [](uv_handle_t* handle) { delete static_cast<Watch*>(handle->data); });
  loop_.drain(1s);
}

void LaneConsumer::start() {
  auto ready = ready_;
  auto stopped = stopped_;
  consumer_->set_ready_handler([ready] { *ready = true; });
  consumer_->set_stopped_handler([stopped](const Error&) { *stopped = true; });
  REQUIRE_FALSE(consumer_->start());
  started_ = true;
  watch_->consumer = consumer_.get();
  watch_->ready = ready;
  uv_timer_init(loop_.get(), &watch_->timer);
  watch_->timer.data = watch_;
  uv_timer_start(
      &watch_->timer,
      [](uv_timer_t* timer) {
        auto* watch = static_cast<Watch*>(timer->data);
        if (!*watch->ready) return;
        const bool consuming = watch->consumer->is_consuming();
        if (watch->consuming && !consuming) {
          const auto now = Clock::now();
          if (!watch->lost_at) watch->lost_at = now;
          watch->last_lost_at = now;
          ++watch->losses;
        } else if (!watch->consuming && consuming && watch->losses > 0) {
          watch->last_resumed_at = Clock::now();
        }
        watch->consuming = consuming;
      },
      2, 2);
  uv_unref(reinterpret_cast<uv_handle_t*>(&watch_->timer));
}

void LaneConsumer::stop() {
  if (!started_ || *stopped_) return;
  consumer_->stop(10s);
  REQUIRE(loop_.run_until([stopped = stopped_] { return *stopped; }, 30s));
}

std::unique_ptr<ChildProcess> start_demo_consumer(const Lane& lane, const std::string& url) {
  return std::make_unique<ChildProcess>(std::vector<std::string>{
      built_program("examples/demo_consumer"), "--url", url, "--topology", lane.topology_path,
      "--service", lane.service.name, "--concurrency", std::to_string(consumer_concurrency),
      "--prefetch", std::to_string(consumer_prefetch)});
}

// ---- the run
// -------------------------------------------------------------------------------------

void set_up(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes) {
  for (const auto& lane : lanes) {
    Error error = probe.apply(lane->plan());
    INFO(lane->label() << ": " << error.message());
    REQUIRE_FALSE(error);
  }
  for (const auto& lane : lanes) {
    std::vector<std::pair<std::string, std::string>> messages;
    std::vector<size_t> header_frame_size;
    for (const auto& script : lane->scripts) {
      messages.emplace_back(script.id, script.body);
      header_frame_size.push_back(script.header_frame_size);
    }
    INFO(lane->label());
    REQUIRE(probe.publish(lane->service.input.exchange, "key", messages, header_frame_size) ==
            messages.size());
  }
}

bool wait_quiet(TestLoop& loop, Probe& probe, const std::vector<QuietCheck>& checks,
                std::chrono::milliseconds timeout, std::chrono::milliseconds stable_limit) {
  // Gives up early once nothing has moved for `stable_limit` while every loop looks empty.
  std::string last_signature;
  auto last_change = Clock::now();
  bool complete = false;
  poll_until(
      loop, timeout,
      [&] {
        bool all_complete = true;
        bool all_settled = true;  // complete, or empty where the broker may have dropped some
        bool all_empty = true;
        std::string signature;
        for (const auto& check : checks) {
          const Lane& lane = *check.lane;
          const auto acks = check.acks();
          const bool idle = check.idle();
          const auto input = probe.depth(lane.input_queue());
          Probe::Depth wait;
          wait.ok = true;
          for (const auto& queue : lane.waiting_queues()) {
            const auto depth = probe.depth(queue);
            wait.ok = wait.ok && depth.ok;
            wait.messages += depth.messages;
          }
          const auto parking = probe.depth(lane.parking_queue());
          signature += std::to_string(acks.size()) + "/" + std::to_string(input.messages) + "/" +
                       std::to_string(wait.messages) + "/" + std::to_string(parking.messages) +
                       (idle ? "i" : "b") + (input.ok && wait.ok && parking.ok ? "" : "?") + " ";
          const bool empty = idle && input.ok && input.messages == 0 && wait.ok &&
                             wait.messages == 0 && parking.ok;
          bool done = empty && parking.messages >= lane.expected_parked();
          for (const auto& [id, expect] : lane.expected) {
            if (!done) break;
            if (expect == Expect::acked && acks.count(id) == 0) done = false;
          }
          all_empty = all_empty && empty;
          all_complete = all_complete && done;
          all_settled = all_settled && (done || (empty && check.may_lose));
        }
        if (signature != last_signature) {
          last_signature = signature;
          last_change = Clock::now();
        }
        if (all_complete) {
          complete = true;
          return true;
        }
        if (all_empty && Clock::now() - last_change >= stable_limit) {
          if (all_settled) {
            complete = true;
            return true;
          }
          WARN("the loops are empty but incomplete, and nothing moved for "
               << stable_limit.count() / 1000 << " s: " << signature);
          return true;
        }
        return false;
      },
      250ms);
  if (!complete) WARN("not quiet: " << last_signature);
  return complete;
}

Tally classify(Probe& probe, const Lane& lane, const std::multiset<std::string>& acks) {
  struct Seen {
    size_t acks = 0;
    std::vector<std::string> parked;  // reasons
    std::vector<std::string> queued;  // queue names
  };
  std::map<std::string, Seen> seen;
  Tally tally;
  tally.published = lane.scripts.size();
  for (const auto& id : acks)
    ++seen[id].acks;

  std::vector<std::string> loop_queues = lane.waiting_queues();
  loop_queues.insert(loop_queues.begin(), lane.input_queue());
  for (const auto& queue : loop_queues) {
    std::vector<client::GetResult> messages;
    const bool drained = probe.drain(queue, messages);
    if (!drained) tally.problems.push_back("could not drain " + queue);
    for (const auto& m : messages) {
      const std::string id = m.message.properties.message_id.value_or("");
      seen[id].queued.push_back(queue);
    }
  }
  {
    std::vector<client::GetResult> messages;
    if (!probe.drain(lane.parking_queue(), messages)) {
      tally.problems.push_back("could not drain " + lane.parking_queue());
    }
    for (const auto& m : messages) {
      const std::string id = m.message.properties.message_id.value_or("");
      std::string reason;
      if (m.message.properties.headers) {
        if (const amqp::FieldValue* value =
                m.message.properties.headers->find("retryloop-reason")) {
          reason = value->as_string() ? std::string(*value->as_string()) : "(not a string)";
        }
      }
      seen[id].parked.push_back(reason);
    }
  }

  auto describe = [](const Seen& s) {
    std::string text = "acked " + std::to_string(s.acks) + "x";
    for (const auto& reason : s.parked)
      text += ", parked (" + (reason.empty() ? "no reason" : reason) + ")";
    for (const auto& queue : s.queued)
      text += ", in " + queue;
    return text;
  };
  for (const auto& [id, s] : seen) {
    if (s.acks > 0) ++tally.acked;
    if (!s.parked.empty()) ++tally.parked;
    if (!s.queued.empty()) ++tally.queued;
    auto expected = lane.expected.find(id);
    if (expected == lane.expected.end()) {
      ++tally.unexpected;
      tally.problems.push_back("unknown id \"" + id + "\": " + describe(s));
      continue;
    }
    const Expect expect = expected->second;
    const size_t copies = s.acks + s.parked.size() + s.queued.size();
    if (copies == 0) continue;  // counted as lost below
    bool right = false;
    size_t extra = 0;
    if (expect == Expect::acked) {
      right = s.acks > 0 && s.parked.empty() && s.queued.empty();
      extra = s.acks - 1;
    } else if (expect == Expect::queued) {
      right = s.acks == 0 && s.parked.empty() && !s.queued.empty();
      extra = s.queued.size() - 1;
    } else {
      const std::string reason = *parked_reason(expect);
      right = s.acks == 0 && s.queued.empty() && !s.parked.empty() &&
              std::all_of(s.parked.begin(), s.parked.end(),
                          [&](const std::string& r) { return r == reason; });
      extra = s.parked.size() - 1;
    }
    if (right) {
      tally.duplicated += extra;
      if (extra > 0) tally.duplicates.push_back(id + ": " + describe(s));
    } else {
      ++tally.unexpected;
      tally.problems.push_back(id + ": expected " + to_string(expect) + ", got " + describe(s));
    }
  }
  for (const auto& [id, expect] : lane.expected) {
    auto it = seen.find(id);
    if (it == seen.end() ||
        it->second.acks + it->second.parked.size() + it->second.queued.size() == 0) {
      ++tally.lost;
      tally.problems.push_back(id + ": LOST (expected " + to_string(expect) +
                               ", never acked and in no queue)");
    }
  }
  return tally;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void note(const std::string& text) {
  std::printf("  note: %s\n", text.c_str());
  std::fflush(stdout);
  if (const char* path = std::getenv("RETRYLOOP_FAULT_REPORT"); path != nullptr && *path != '\0') {
    std::ofstream(path, std::ios::app) << "  note: " << text << "\n";
  }
}

void report(const std::string& fault, const Lane& lane, const Tally& tally, double seconds,
            size_t allowed_duplicates, bool classic_may_lose) {
  static bool header_printed = false;
  char header[256];
  std::snprintf(header, sizeof header, "%-30s %-9s %-7s %9s %6s %6s %6s %4s %4s %10s %7s", "fault",
                "mode", "queue", "published", "acked", "parked", "queued", "lost", "dup",
                "unexpected", "seconds");
  char row[256];
  std::snprintf(row, sizeof row, "%-30s %-9s %-7s %9zu %6zu %6zu %6zu %4zu %4zu %10zu %7.1f",
                fault.c_str(), lane.mode_name().c_str(), lane.queue_type_name().c_str(),
                tally.published, tally.acked, tally.parked, tally.queued, tally.lost,
                tally.duplicated, tally.unexpected, seconds);
  if (!header_printed) {
    std::printf("%s\n", header);
    header_printed = true;
  }
  std::printf("%s\n", row);
  std::fflush(stdout);
  if (const char* path = std::getenv("RETRYLOOP_FAULT_REPORT"); path != nullptr && *path != '\0') {
    const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
    std::ofstream out(path, std::ios::app);
    if (fresh) out << header << "\n";
    out << row << "\n";
  }

  std::string problems;
  for (size_t i = 0; i < tally.problems.size() && i < 30; ++i)
    problems += tally.problems[i] + "\n";
  if (tally.problems.size() > 30) {
    problems += "... and " + std::to_string(tally.problems.size() - 30) + " more\n";
  }
  if (tally.duplicated > allowed_duplicates) {
    problems += "duplicated (at most " + std::to_string(allowed_duplicates) + " allowed):\n";
    for (size_t i = 0; i < tally.duplicates.size() && i < 30; ++i) {
      problems += "  " + tally.duplicates[i] + "\n";
    }
  }
  std::string log;
  if (tally.lost != 0 || tally.unexpected != 0 || tally.duplicated > allowed_duplicates) {
    for (const auto& line : lane.log->last_formatted(150))
      log += line;
  }
  INFO(fault << ", " << lane.label() << " (service " << lane.service.name << ")\n"
             << problems << (log.empty() ? "" : "the consumers' last log lines:\n" + log));
  if (classic_may_lose && lane.queue_type == topology::QueueType::classic) {
    if (tally.lost != 0) {
      note(fault + ", " + lane.label() + ": " + std::to_string(tally.lost) +
           " lost by the broker's at-most-once dead-lettering of classic queues");
    }
  } else {
    CHECK(tally.lost == 0);
  }
  CHECK(tally.unexpected == 0);
  CHECK(tally.duplicated <= allowed_duplicates);
}

void tear_down(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes) {
  for (const auto& lane : lanes) {
    Error error = probe.remove(topology::make_delete_plan(topology::Topology{{lane->service}}));
    if (error)
      WARN("could not delete the objects of " << lane->service.name << ": " << error.message());
  }
}

void park_everything(TestLoop& loop, Probe& probe,
                     const std::vector<std::unique_ptr<Lane>>& lanes) {
  std::vector<std::unique_ptr<Ledger>> ledgers;
  std::vector<std::unique_ptr<LaneConsumer>> outage;
  for (const auto& lane : lanes) {
    ledgers.push_back(std::make_unique<Ledger>());
    outage.push_back(std::make_unique<LaneConsumer>(loop, *lane, test::broker_url(),
                                                    *ledgers.back(), nullptr, true));
    outage.back()->start();
  }
  REQUIRE(poll_until(loop, 60s, [&] {
    for (const auto& lane : lanes) {
      if (probe.depth(lane->parking_queue()).messages < messages_per_lane) return false;
    }
    return true;
  }));
  for (const auto& c : outage)
    c->stop();
}

namespace {

/// Classifies and reports every lane against `acks[i]`, then deletes the lanes' objects.
void report_lanes(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes,
                  const std::vector<std::multiset<std::string>>& acks, const std::string& fault,
                  Clock::time_point started, size_t allowed_duplicates) {
  const double seconds = seconds_since(started);
  for (size_t i = 0; i < lanes.size(); ++i) {
    Tally tally = classify(probe, *lanes[i], acks[i]);
    report(fault, *lanes[i], tally, seconds, allowed_duplicates);
  }
  tear_down(probe, lanes);
}

}  // namespace

void drain_and_report(TestLoop& loop, Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes,
                      const std::string& fault, Clock::time_point started,
                      size_t allowed_duplicates) {
  std::vector<std::unique_ptr<Ledger>> ledgers;
  std::vector<std::unique_ptr<LaneConsumer>> consumers;
  std::vector<QuietCheck> checks;
  for (const auto& lane : lanes) {
    ledgers.push_back(std::make_unique<Ledger>());
    consumers.push_back(
        std::make_unique<LaneConsumer>(loop, *lane, test::broker_url(), *ledgers.back()));
    consumers.back()->start();
    LaneConsumer* c = consumers.back().get();
    Ledger* ledger = ledgers.back().get();
    checks.push_back({lane.get(), [c] { return c->idle(); }, [ledger] { return ledger->acks(); }});
  }
  CHECK(wait_quiet(loop, probe, checks));
  for (const auto& c : consumers)
    c->stop();
  std::vector<std::multiset<std::string>> acks;
  for (const auto& ledger : ledgers)
    acks.push_back(ledger->acks());
  report_lanes(probe, lanes, acks, fault, started, allowed_duplicates);
}

void finish_demo_consumers(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes,
                           const std::vector<std::unique_ptr<ChildProcess>>& consumers,
                           std::vector<Ledger>& ledgers, const std::string& fault,
                           Clock::time_point started, size_t allowed_duplicates) {
  std::vector<std::multiset<std::string>> acks;
  for (size_t i = 0; i < lanes.size(); ++i) {
    consumers[i]->signal(SIGTERM);
    INFO(consumers[i]->err());
    CHECK(consumers[i]->wait() == 0);  // a graceful stop
    add_demo_output(ledgers[i], consumers[i]->out());
    acks.push_back(ledgers[i].acks());
  }
  report_lanes(probe, lanes, acks, fault, started, allowed_duplicates);
}

// ---- a run with in-process consumers
// -------------------------------------------------------------

void expect_ok(int exit_code, const std::string& output) {
  INFO(output);
  REQUIRE(exit_code == 0);
}

BrokerBackUp::~BrokerBackUp() {
  const char* dir = std::getenv("RETRYLOOP_TEST_BROKER_DIR");
  if (dir == nullptr) return;
  const std::string broker = std::string(RETRYLOOP_SOURCE_DIR) + "/scripts/broker";
  const std::string quiet = " >/dev/null 2>&1";
  if (std::system((broker + " status " + dir + quiet).c_str()) != 0) {
    std::system((broker + " restart " + dir + quiet).c_str());
  }
  if (const char* ctl = std::getenv("RETRYLOOP_TEST_CTL")) {
    std::system((std::string(ctl) + " start_app" + quiet).c_str());
  }
}

InProcessRun::InProcessRun(const std::string& fault, bool gated,
                           const std::function<void(Lane&)>& adjust)
    : InProcessRun(fault, Options{gated, adjust}) {}

InProcessRun::InProcessRun(const std::string& fault, Options options) {
  lanes = make_lanes(fault, options.delay, options.types, options.delay_levels);
  classic_may_lose = options.classic_may_lose;
  if (options.adjust) {
    for (auto& lane : lanes)
      options.adjust(*lane);
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    ledgers.push_back(std::make_unique<Ledger>());
    gates.push_back(options.gated ? std::make_unique<Gate>() : nullptr);
  }
  set_up(probe, lanes);
}

InProcessRun::~InProcessRun() {
  for (auto& gate : gates) {
    if (gate) gate->open();
  }
  consumers.clear();
}

void InProcessRun::start(const std::string& url) {
  started = Clock::now();
  for (size_t i = 0; i < lanes.size(); ++i) {
    consumers.push_back(
        std::make_unique<LaneConsumer>(loop, *lanes[i], url, *ledgers[i], gates[i].get()));
    consumers.back()->start();
  }
  REQUIRE(poll_until(loop, 60s, [&] {
    for (const auto& c : consumers) {
      if (!c->ready()) return false;
    }
    return true;
  }));
}

void InProcessRun::wait_flowing(double fraction) {
  REQUIRE(poll_until(
      loop, 60s,
      [&] {
        for (const auto& ledger : ledgers) {
          if (double(ledger->size()) < fraction * messages_per_lane) return false;
        }
        return true;
      },
      5ms));
}

void InProcessRun::hold() {
  for (auto& gate : gates) {
    REQUIRE(gate != nullptr);  // InProcessRun::Options::gated
    gate->close();
  }
}

void InProcessRun::hold_settled() {
  hold();
  const bool settled = poll_until(
      loop, 60s,
      [&] {
        for (size_t i = 0; i < lanes.size(); ++i) {
          const auto& c = consumers[i]->get();
          const auto metrics = c.metrics();
          const uint64_t outcomes = metrics.acked + metrics.retried + metrics.parked() +
                                    metrics.dropped + metrics.abandoned;
          // Every handler still running waits at the gate, and every outcome is settled.
          if (c.handlers_running() != size_t(gates[i]->waiting()) || outcomes != ledgers[i]->size())
            return false;
        }
        return true;
      },
      5ms);
  INFO("the handlers' outcomes were not all settled within 60 s of closing the gates");
  REQUIRE(settled);
}

void InProcessRun::release() {
  for (auto& gate : gates) {
    if (gate) gate->open();
  }
}

void InProcessRun::check_mid_stream(std::optional<Clock::time_point> observed_at) {
  if (!observed_at) {
    const bool seen = poll_until(
        loop, 60s,
        [&] {
          for (const auto& c : consumers) {
            if (!c->lost_at()) return false;
          }
          return true;
        },
        5ms);
    INFO("a consumer did not lose its connection within 60 s of the fault");
    CHECK(seen);
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < lanes.size(); ++i) {
    const auto fault_at = observed_at ? *observed_at : consumers[i]->lost_at().value_or(now);
    std::set<std::string> acked;
    for (const auto& call : ledgers[i]->calls()) {
      if (call.outcome == consumer::OutcomeKind::ack && call.at < fault_at) acked.insert(call.id);
    }
    INFO(lanes[i]->label() << ": the fault came after the stream had ended");
    CHECK(acked.size() < lanes[i]->expected_count(Expect::acked));
  }
}

bool InProcessRun::wait_quiet(std::chrono::milliseconds timeout, std::chrono::milliseconds stable) {
  std::vector<QuietCheck> checks;
  for (size_t i = 0; i < lanes.size(); ++i) {
    LaneConsumer* c = consumers[i].get();
    Ledger* ledger = ledgers[i].get();
    const bool may_lose = classic_may_lose && lanes[i]->queue_type == topology::QueueType::classic;
    checks.push_back(
        {lanes[i].get(), [c] { return c->idle(); }, [ledger] { return ledger->acks(); }, may_lose});
  }
  return retryloop::test::fault::wait_quiet(loop, probe, checks, timeout, stable);
}

bool InProcessRun::wait_quiet_after_restart(const std::string& fault) {
  const bool ready = poll_until(loop, 30s, [&] {
    for (const auto& c : consumers) {
      if (!c->get().is_consuming()) return false;
    }
    return true;
  });
  if (ready && wait_quiet(60s)) return true;
  std::vector<const Lane*> all;
  for (const auto& lane : lanes)
    all.push_back(lane.get());
  const auto elected = elect_leaderless_quorum_queues(loop, all);
  if (!elected.empty()) {
    std::string names;
    for (const auto& name : elected)
      names += " " + name;
    note(fault +
         ": RabbitMQ restarted quorum queues without a leader (rabbitmq-server#10070); "
         "elected by hand:" +
         names);
  }
  if (wait_quiet(120s)) return true;
  // RabbitMQ 3.10 starts a quorum queue, and its at-least-once dead-letter worker, before it has
  // restored the bindings: a retry whose wait ended as the broker came back finds no queue that
  // confirms it, and the worker holds it, in no queue's count, for its confirm timeout
  // (dead_letter_worker_publisher_confirm_timeout, 180 s) before it sends it again.
  if (test::broker_is_4x()) return false;
  const size_t held = held_by_dead_letter_workers(loop, all);
  if (held == 0) return false;
  note(fault + ": RabbitMQ 3.10's dead-letter workers hold " + std::to_string(held) +
       " message(s) of the quorum queues dead-lettered as the broker started; waiting for them "
       "to be sent again");
  const auto held_since = Clock::now();
  poll_until(
      loop, 240s, [&] { return held_by_dead_letter_workers(loop, all) == 0; }, 2s);
  note(fault + ": the dead-letter workers held them " +
       std::to_string(
           std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - held_since).count()) +
       " s more");
  return wait_quiet(60s);
}

void InProcessRun::finish(const std::string& fault, const std::vector<size_t>& extra) {
  std::vector<uint64_t> reconnects;
  for (const auto& c : consumers) {
    c->stop();
    reconnects.push_back(c->get().metrics().reconnects);
  }
  const double seconds = seconds_since(started);
  for (size_t i = 0; i < lanes.size(); ++i) {
    Tally tally = classify(probe, *lanes[i], ledgers[i]->acks());
    report(fault, *lanes[i], tally, seconds,
           consumer_prefetch * reconnects[i] + (i < extra.size() ? extra[i] : 0), classic_may_lose);
  }
  tear_down(probe, lanes);
}

}  // namespace retryloop::test::fault
