#include "retryloop/migrate/copied_log.hpp"

#include <cstdint>
#include <utility>

#include "retryloop/move/queue_walker.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::migrate {
namespace {

using client::Error;

constexpr std::string_view migration_header = "retryloop-migration";
constexpr std::string_view destination_header = "retryloop-moved-to";
/// The newest entries the log keeps. A stamp takes about 70 bytes: some 240,000 copies, seconds
/// of moving, where a rerun needs at most the last rounds' (a window's originals unacked, and the
/// acks a channel's close dropped).
constexpr int64_t kLogBytes = 16 * 1024 * 1024;

bool header_is(const amqp::BasicProperties& properties, std::string_view name,
               std::string_view value) {
  const amqp::FieldValue* found = properties.headers ? properties.headers->find(name) : nullptr;
  const auto text = found ? found->as_string() : std::nullopt;
  return text && *text == value;
}

}  // namespace

std::string encode_copied(const std::vector<std::string>& stamps) {
  std::string body;
  for (const std::string& stamp : stamps) {
    body += stamp;
    body += '\n';
  }
  return body;
}

std::vector<std::string> decode_copied(std::string_view body) {
  std::vector<std::string> stamps;
  while (!body.empty()) {
    const size_t end = body.find('\n');
    const std::string_view line = body.substr(0, end);
    if (!line.empty()) stamps.emplace_back(line);
    if (end == std::string_view::npos) break;
    body.remove_prefix(end + 1);
  }
  return stamps;
}

struct CopiedLog::State {
  std::shared_ptr<client::Connection> connection;
  std::shared_ptr<client::Channel> channel;
  std::string queue;
  std::string migration;
  std::string destination;
};

CopiedLog::CopiedLog(std::shared_ptr<State> state) : state_(std::move(state)) {}

Error CopiedLog::open(const std::shared_ptr<client::Connection>& connection,
                      const std::string& service, std::string migration, std::string destination,
                      OpenCallback done) {
  if (!connection || !connection->is_open()) return Error(client::ClientError::not_open);
  auto state = std::make_shared<State>();
  state->connection = connection;
  state->queue = topology::migration_copied_queue_name(service);
  state->migration = std::move(migration);
  state->destination = std::move(destination);
  auto fail = [done](const Error& error) { done(error, nullptr, {}); };
  // Declared, then read back: every entry is held and goes back to its place when the walk ends.
  auto read_back = [state, done, fail] {
    auto copied = std::make_shared<std::vector<std::string>>();
    move::WalkOptions walk;
    walk.queue = state->queue;
    walk.empty_answers = 1;  // a classic queue's count of 0 is its own
    walk.readers = "a migration's reruns";
    Error error = move::QueueWalker::start(
        state->connection, std::move(walk),
        [state, copied](move::WalkedMessage& walked) {
          const client::Message& message = walked.delivery.message;
          if (header_is(message.properties, migration_header, state->migration) &&
              header_is(message.properties, destination_header, state->destination)) {
            for (std::string& stamp : decode_copied(message.body))
              copied->push_back(std::move(stamp));
          }
          return move::Decision{};  // kept
        },
        [state, copied, done](const Error& error, const move::Progress&, bool) {
          if (error) return done(error, nullptr, {});
          done({}, std::make_shared<CopiedLog>(state), std::move(*copied));
        });
    if (error) fail(error);
  };
  return connection->open_channel([state, read_back, fail](
                                      const Error& error,
                                      std::shared_ptr<client::Channel> channel) {
    if (error) return fail(error);
    state->channel = std::move(channel);
    Error selected = state->channel->confirm_select([state, read_back, fail](const Error& error) {
      if (error) return fail(error);
      client::QueueOptions options;
      options.arguments.append("x-max-length-bytes", amqp::FieldValue(kLogBytes));
      options.arguments.append("x-overflow", amqp::FieldValue(std::string("drop-head")));
      Error declared = state->channel->queue_declare(
          state->queue, options, [read_back, fail](const Error& error, const client::QueueInfo&) {
            if (error) return fail(error);
            read_back();
          });
      if (declared) fail(declared);
    });
    if (selected) fail(selected);
  });
}

void CopiedLog::append(const std::vector<std::string>& stamps,
                       std::function<void(const Error& error)> done) {
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  amqp::FieldTable& headers = properties.headers.emplace();
  headers.set(std::string(migration_header), amqp::FieldValue(state_->migration));
  headers.set(std::string(destination_header), amqp::FieldValue(state_->destination));
  const std::string queue = state_->queue;
  Error error = state_->channel->publish(
      "", state_->queue, properties, encode_copied(stamps), client::Mandatory::yes,
      [queue, done](const client::PublishOutcome& outcome) {
        if (outcome.ok()) return done({});
        if (outcome.error) return done(outcome.error);
        done(Error(client::ClientError::invalid_argument,
                   "the broker did not take the record of copies made in " + queue));
      });
  if (error) done(error);
}

void CopiedLog::close() {
  if (state_->channel && state_->channel->is_open()) static_cast<void>(state_->channel->close());
}

}  // namespace retryloop::migrate
