#include "support/consumer_fixture.hpp"

#include "retryloop/parking/parking.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"

namespace retryloop::test {

using namespace std::chrono_literals;

topology::Service make_service(const std::string& name, const std::string& retry,
                               const std::string& extra) {
  std::string json = R"({"services": [{"name": ")" + name + R"(", "input": {"exchange": ")" + name +
                     R"(.in", "type": "direct", "bindings": ["key"]}, "retry": {)" + retry + "}" +
                     (extra.empty() ? "" : ", " + extra) + "}]}";
  topology::ParseResult parsed = topology::parse_topology(json);
  std::string problems;
  for (const auto& line : parsed.messages())
    problems += line + "\n";
  INFO(problems);
  REQUIRE(parsed.ok());
  return parsed.topology->services.at(0);
}

namespace {

std::vector<std::string> death_queues(const consumer::Message& message) {
  std::vector<std::string> queues;
  const amqp::FieldValue* x_death = message.headers().find("x-death");
  const amqp::FieldArray* deaths = x_death ? x_death->get_if<amqp::FieldArray>() : nullptr;
  if (deaths == nullptr) return queues;
  for (const auto& death : *deaths) {
    const amqp::FieldTable* entry = death.get_if<amqp::FieldTable>();
    const amqp::FieldValue* queue = entry ? entry->find("queue") : nullptr;
    queues.push_back(queue && queue->as_string() ? std::string(*queue->as_string()) : "");
  }
  return queues;
}

}  // namespace

void Recorder::add(const consumer::Message& message) {
  const auto at = std::chrono::steady_clock::now();
  std::vector<std::string> queues = death_queues(message);
  std::string newest = queues.empty() ? "" : queues.front();
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.push_back(Call{std::string(message.message_id()), message.attempt, message.redelivered,
                        message.properties.expiration, std::move(newest), std::move(queues), at});
}

std::vector<Call> Recorder::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

bool came_back_after(const Call& earlier, const Call& later, std::chrono::milliseconds delay) {
  return later.at - earlier.at + std::chrono::milliseconds(1) > delay;
}

std::vector<Call> Recorder::of(const std::string& id) const {
  std::vector<Call> out;
  for (const auto& call : calls())
    if (call.id == id) out.push_back(call);
  return out;
}

size_t Recorder::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

void Gate::pass(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  opened_.wait_for(lock, limit, [this] { return open_; });
}

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
  }
  opened_.notify_all();
}

Broker::Broker(TestLoop& l) : loop(l) {
  connection = connect(loop, broker_url());
  channel = open_channel(loop, *connection);
  REQUIRE_FALSE(wait(loop, [&](auto done) { return channel->confirm_select(done); }));
}

Broker::~Broker() {
  if (connection->is_open()) close(loop, connection);
}

void Broker::publish(const std::string& exchange, const std::string& key, const std::string& id,
                     const std::string& body, amqp::BasicProperties properties) {
  properties.message_id = id;
  if (!properties.delivery_mode) properties.delivery_mode = 2;
  publish_confirmed(loop, *channel, exchange, key, properties, body);
}

uint32_t Broker::depth(const std::string& queue) {
  return queue_depth(loop, *connection, queue);
}

void Broker::apply(const topology::Service& service) {
  bool done = false;
  topology::Report result;
  REQUIRE_FALSE(topology::apply(connection, topology::make_plan(topology::Topology{{service}}),
                                [&](const topology::Report& report) {
                                  result = report;
                                  done = true;
                                }));
  REQUIRE(loop.run_until([&] { return done; }));
  REQUIRE(result.ok());
}

void Broker::remove(const topology::Service& service) {
  bool done = false;
  topology::DeleteOptions options;
  options.execute = true;
  options.force = true;
  if (!topology::remove(connection, topology::make_delete_plan(topology::Topology{{service}}),
                        options, [&](const topology::Report&) { done = true; })) {
    loop.run_until([&] { return done; });
  }
}

std::vector<client::GetResult> Broker::drain(const std::string& queue) {
  return drain_queue(loop, *connection, queue);
}

consumer::ConsumerOptions options_for(const topology::Service& service) {
  consumer::ConsumerOptions options;
  options.service = service;
  options.connection.uri = client::parse_uri(broker_url());
  options.handler_on_loop = true;
  options.recovery = consumer::Backoff{100ms, 1000ms, 2.0, 0.1};
  return options;
}

void stop(TestLoop& loop, const std::shared_ptr<consumer::Consumer>& c) {
  bool stopped = false;
  c->set_stopped_handler([&stopped](const client::Error&) { stopped = true; });
  c->stop(5s);
  REQUIRE(loop.run_until([&] { return stopped; }));
}

std::vector<parking::ParkedMessage> list_parked(
    TestLoop& loop, const std::shared_ptr<client::Connection>& connection,
    const topology::Service& service) {
  bool listed = false;
  client::Error error;
  std::vector<parking::ParkedMessage> parked;
  REQUIRE_FALSE(parking::list(connection, service, {},
                              [&](const client::Error& e, std::vector<parking::ParkedMessage> m) {
                                error = e;
                                parked = std::move(m);
                                listed = true;
                              }));
  REQUIRE(loop.run_until([&] { return listed; }, 30s));
  INFO(error.message());
  REQUIRE_FALSE(error);
  return parked;
}

}  // namespace retryloop::test
