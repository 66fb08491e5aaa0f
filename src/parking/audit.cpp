#include "retryloop/parking/audit.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <utility>

#include "retryloop/parking/parked_json.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::parking {

using client::ClientError;
using client::Error;

namespace {

/// Streams need a prefetch; records are small.
constexpr uint16_t reader_prefetch = 200;

std::string text_of(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return {};
  if (!it->is_string()) throw std::invalid_argument(std::string(key) + " is not a string");
  return it->get<std::string>();
}

std::optional<uint64_t> count_of(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_unsigned()) {
    throw std::invalid_argument(std::string(key) + " is not a whole number");
  }
  return it->get<uint64_t>();
}

std::string hex(const unsigned char* bytes, size_t size) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 0xf];
  }
  return out;
}

/// `value` kept, or as a count and a digest when it is long (audit_filter).
nlohmann::json bounded(const nlohmann::json& value) {
  size_t count = 0;
  if (value.is_array() && value.size() > max_audit_filter_items) {
    count = value.size();
  } else if (value.is_string() &&
             value.get_ref<const std::string&>().size() > max_audit_filter_text_bytes) {
    count = value.get_ref<const std::string&>().size();
  } else {
    return value;
  }
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return {{"count", count}, {"sha256", hex(digest, sizeof digest)}};
}

}  // namespace

nlohmann::json audit_filter(const nlohmann::json& filter) {
  if (!filter.is_object()) return bounded(filter);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : filter.items())
    out[key] = bounded(value);
  return out;
}

void bound_audit_record(AuditRecord& record) {
  record.filter = audit_filter(record.filter);
  if (record.error.size() > max_audit_error_bytes) record.error.resize(max_audit_error_bytes);
}

std::string read_audit_key(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::invalid_argument("cannot read the audit key file " + path);
  std::string key(std::istreambuf_iterator<char>(file), {});
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r'))
    key.pop_back();
  if (key.size() < 32) {
    throw std::invalid_argument(
        "the audit key file " + path +
        " holds fewer than 32 bytes (make one with `openssl rand -hex 32`)");
  }
  return key;
}

std::string audit_signature(std::string_view key, std::string_view body) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), int(key.size()),
       reinterpret_cast<const unsigned char*>(body.data()), body.size(), mac, &size);
  return hex(mac, size);
}

bool audit_signature_valid(std::string_view key, std::string_view body,
                           std::string_view signature) {
  if (key.empty()) return false;
  const std::string expected = audit_signature(key, body);
  return signature.size() == expected.size() &&
         CRYPTO_memcmp(expected.data(), signature.data(), expected.size()) == 0;
}

nlohmann::json audit_json(const AuditRecord& record) {
  nlohmann::json out;
  out["id"] = record.id;
  out["at_ms"] = record.at_ms;
  out["at"] = iso_time(record.at_ms / 1000);
  out["who"] = record.who;
  out["via"] = record.via;
  out["action"] = record.action;
  out["state"] = record.state;
  out["service"] = record.service;
  out["filter"] = record.filter;
  out["asked"] = record.asked ? nlohmann::json(*record.asked) : nullptr;
  out["done"] = record.done ? nlohmann::json(*record.done) : nullptr;
  out["failed"] = record.failed;
  if (!record.error.empty()) out["error"] = record.error;
  if (!record.note.empty()) out["note"] = record.note;
  if (!record.group.empty()) out["group"] = record.group;
  if (!record.message_id.empty()) out["message_id"] = record.message_id;
  if (!record.new_message_id.empty()) out["new_message_id"] = record.new_message_id;
  if (record.offset) out["offset"] = *record.offset;
  out["verified"] = record.verified;
  return out;
}

AuditRecord audit_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw std::invalid_argument("an audit record is a JSON object");
  AuditRecord record;
  record.id = text_of(json, "id");
  record.at_ms = count_of(json, "at_ms").value_or(0);
  record.who = text_of(json, "who");
  record.via = text_of(json, "via");
  record.action = text_of(json, "action");
  record.state = text_of(json, "state");
  record.service = text_of(json, "service");
  if (auto filter = json.find("filter"); filter != json.end()) record.filter = *filter;
  record.asked = count_of(json, "asked");
  record.done = count_of(json, "done");
  record.failed = count_of(json, "failed").value_or(0);
  record.error = text_of(json, "error");
  record.note = text_of(json, "note");
  record.group = text_of(json, "group");
  record.message_id = text_of(json, "message_id");
  record.new_message_id = text_of(json, "new_message_id");
  if (record.id.empty() || record.action.empty()) {
    throw std::invalid_argument("an audit record needs an id and an action");
  }
  return record;
}

AuditRecord audit_from_text(std::string_view text) {
  if (text.size() > max_audit_record_bytes) {
    throw std::invalid_argument("the record is " + std::to_string(text.size()) +
                                " bytes, more than " + std::to_string(max_audit_record_bytes));
  }
  if (!nests_at_most(text, max_audit_record_depth)) {
    throw std::invalid_argument("the record nests deeper than " +
                                std::to_string(max_audit_record_depth) + " levels");
  }
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded()) throw std::invalid_argument("the record is not JSON");
  AuditRecord record = audit_from_json(json);
  bound_audit_record(record);
  return record;
}

Error append_audit(client::Channel& channel, const AuditRecord& record, AuditCallback done,
                   const std::string& key) {
  amqp::BasicProperties properties;
  properties.content_type = "application/json";
  properties.delivery_mode = 2;
  properties.message_id = record.id + "." + record.state;
  properties.timestamp = record.at_ms / 1000;
  properties.type = "retryloop.audit";
  nlohmann::json json = audit_json(record);
  json.erase("verified");  // the reader decides, from the signature
  const std::string body = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!key.empty()) {
    properties.headers = amqp::FieldTable{};
    properties.headers->append(audit_signature_header, audit_signature(key, body));
  }
  const std::string stream = topology::audit_stream_name();
  return channel.publish(
      "", stream, properties, body, client::Mandatory::yes,
      [done = std::move(done), stream](const client::PublishOutcome& outcome) {
        if (outcome.ok()) return done(Error{});
        if (outcome.status == client::PublishStatus::returned) {
          return done(Error(ClientError::unroutable,
                            "the audit stream " + stream +
                                " does not exist; declare it with `retryloop topology apply` of "
                                "a file with a top-level \"audit\""));
        }
        done(outcome.error ? outcome.error
                           : Error(ClientError::connection_lost,
                                   "the broker refused the audit record (nack)"));
      });
}

std::shared_ptr<AuditWriter> AuditWriter::open(
    const std::shared_ptr<client::Connection>& connection, AuditCallback on_error,
    std::string key) {
  std::shared_ptr<AuditWriter> writer(new AuditWriter());
  writer->on_error_ = std::move(on_error);
  writer->key_ = std::move(key);
  std::weak_ptr<AuditWriter> weak = writer;
  Error error = connection->open_channel(
      [weak](const Error& error, std::shared_ptr<client::Channel> channel) {
        auto self = weak.lock();
        if (!self || self->error_) {
          if (channel) (void)channel->close();
          return;
        }
        if (error) return self->fail(error);
        self->channel_ = channel;
        channel->set_close_handler([weak](const Error& error) {
          if (auto self = weak.lock()) self->fail(error);
        });
        Error confirm = channel->confirm_select([weak](const Error& error) {
          auto self = weak.lock();
          if (!self || self->error_) return;
          if (error) return self->fail(error);
          self->ready_ = true;
          for (auto& [record, done] : std::exchange(self->waiting_, {}))
            self->send(record, std::move(done));
        });
        if (confirm) self->fail(confirm);
      });
  if (error) writer->fail(error);
  return writer;
}

void AuditWriter::append(AuditRecord record, AuditCallback done) {
  if (error_) return done(error_);
  if (record.id.empty()) {
    std::error_code no_id;
    record.id = random::random_id(no_id);
    if (no_id) {
      return done(Error(no_id,
                        "cannot draw the audit record's id from the operating system "
                        "(getrandom)"));
    }
  }
  if (record.at_ms == 0) record.at_ms = retry::unix_milliseconds();
  bound_audit_record(record);
  if (!ready_) {
    waiting_.emplace_back(std::move(record), std::move(done));
    return;
  }
  send(record, std::move(done));
}

void AuditWriter::send(const AuditRecord& record, AuditCallback done) {
  if (Error error = append_audit(*channel_, record, done, key_)) done(error);
}

void AuditWriter::close() {
  if (!error_) error_ = Error(ClientError::not_open, "the audit trail's writer is closed");
  ready_ = false;
  if (channel_) (void)std::exchange(channel_, nullptr)->close();
  for (auto& [record, done] : std::exchange(waiting_, {}))
    done(error_);
}

void AuditWriter::fail(const Error& error) {
  if (error_) return;
  error_ = error;
  ready_ = false;
  channel_.reset();
  for (auto& [record, done] : std::exchange(waiting_, {}))
    done(error_);
  if (on_error_) on_error_(error_);
}

AuditReader::AuditReader(RecordHandler on_record, AuditCallback on_error, std::string key,
                         SkippedHandler on_skipped)
    : on_record_(std::move(on_record)),
      on_error_(std::move(on_error)),
      key_(std::move(key)),
      on_skipped_(std::move(on_skipped)) {}

std::shared_ptr<AuditReader> AuditReader::start(
    const std::shared_ptr<client::Connection>& connection, uint64_t since_ms,
    std::optional<int64_t> after_offset, RecordHandler on_record, AuditCallback on_error,
    std::string key, SkippedHandler on_skipped) {
  auto reader = std::make_shared<AuditReader>(std::move(on_record), std::move(on_error),
                                              std::move(key), std::move(on_skipped));
  reader->last_offset_ = after_offset;
  std::weak_ptr<AuditReader> weak = reader;
  amqp::FieldTable arguments;
  if (after_offset) {
    arguments.append("x-stream-offset", int64_t(*after_offset + 1));
  } else {
    arguments.append("x-stream-offset", amqp::Timestamp{since_ms / 1000});
  }
  Error error = connection->open_channel(
      [weak, arguments](const Error& error, std::shared_ptr<client::Channel> channel) {
        auto self = weak.lock();
        if (!self || self->stopped_) {
          if (channel) (void)channel->close();
          return;
        }
        if (error) return self->fail(error);
        self->channel_ = channel;
        channel->set_close_handler([weak](const Error& error) {
          if (auto self = weak.lock()) self->fail(error);
        });
        Error qos = channel->qos(reader_prefetch, [weak, channel, arguments](const Error& error) {
          auto self = weak.lock();
          if (!self || self->stopped_) return;
          if (error) return self->fail(error);
          client::ConsumeOptions options;
          options.arguments = arguments;
          Error consume = channel->consume(
              topology::audit_stream_name(), std::move(options),
              [weak, channel](client::Delivery&& delivery) {
                auto self = weak.lock();
                (void)channel->ack(delivery.delivery_tag);  // credit for the next ones
                if (!self || self->stopped_) return;
                std::optional<int64_t> offset;
                if (const auto& headers = delivery.message.properties.headers) {
                  if (const amqp::FieldValue* value = headers->find("x-stream-offset")) {
                    offset = value->as_int64();
                  }
                }
                if (offset && self->last_offset_ && *offset <= *self->last_offset_) return;
                if (offset) self->last_offset_ = offset;
                self->read(delivery.message, offset);
              },
              [weak](const Error& error, const std::string&) {
                if (auto self = weak.lock(); self && error) self->fail(error);
              });
          if (consume) self->fail(consume);
        });
        if (qos) self->fail(qos);
      });
  if (error) reader->fail(error);
  return reader;
}

void AuditReader::read(const client::Message& message, std::optional<int64_t> offset) {
  AuditRecord record;
  try {
    record = audit_from_text(message.body);
  } catch (const std::exception& e) {
    ++unreadable_;
    if (on_skipped_) on_skipped_(e.what(), offset);
    return;
  }
  record.offset = offset;
  if (message.properties.headers) {
    if (const amqp::FieldValue* signature =
            message.properties.headers->find(audit_signature_header)) {
      if (auto text = signature->as_string()) {
        record.verified = audit_signature_valid(key_, message.body, *text);
      }
    }
  }
  on_record_(std::move(record));
}

void AuditReader::stop() {
  stopped_ = true;
  if (channel_) {
    auto channel = std::move(channel_);
    channel->set_close_handler({});
    (void)channel->close();
  }
}

void AuditReader::fail(const Error& error) {
  if (stopped_) return;
  stopped_ = true;
  channel_.reset();
  if (on_error_) {
    if (error.reply_code == 404) {
      on_error_(Error(error.code, "the audit stream " + topology::audit_stream_name() +
                                      " does not exist; declare it with `retryloop topology "
                                      "apply` of a file with a top-level \"audit\""));
    } else {
      on_error_(error);
    }
  }
}

}  // namespace retryloop::parking
