#include "retryloop/outbox/outbox.hpp"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "rows.hpp"

namespace retryloop::outbox {
namespace {

using nlohmann::json;

json value_to_json(const amqp::FieldValue& value);

json table_to_json(const amqp::FieldTable& table) {
  json out = json::object();
  for (const auto& entry : table)
    out[entry.name] = value_to_json(entry.value);
  return out;
}

json value_to_json(const amqp::FieldValue& value) {
  return std::visit(
      [](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, amqp::Void>) {
          return nullptr;
        } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
          return v;
        } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          return static_cast<double>(v);
        } else if constexpr (std::is_integral_v<T>) {
          return static_cast<int64_t>(v);
        } else if constexpr (std::is_same_v<T, amqp::Decimal>) {
          return v.value / std::pow(10.0, v.scale);
        } else if constexpr (std::is_same_v<T, amqp::ByteArray>) {
          return v.bytes;
        } else if constexpr (std::is_same_v<T, amqp::Timestamp>) {
          return v.seconds;
        } else if constexpr (std::is_same_v<T, amqp::FieldArray>) {
          json out = json::array();
          for (const auto& item : v)
            out.push_back(value_to_json(item));
          return out;
        } else {
          return table_to_json(v);
        }
      },
      value.storage());
}

amqp::FieldValue value_from_json(const json& value);

amqp::FieldTable table_from_json(const json& object) {
  amqp::FieldTable table;
  for (auto it = object.begin(); it != object.end(); ++it) {
    table.append(it.key(), value_from_json(it.value()));
  }
  return table;
}

amqp::FieldValue value_from_json(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return amqp::Void{};
    case json::value_t::boolean:
      return value.get<bool>();
    case json::value_t::number_integer:
      return value.get<int64_t>();
    case json::value_t::number_unsigned: {
      auto number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(INT64_MAX)) return static_cast<double>(number);
      return static_cast<int64_t>(number);
    }
    case json::value_t::number_float:
      return value.get<double>();
    case json::value_t::string:
      return value.get<std::string>();
    case json::value_t::array: {
      amqp::FieldArray out;
      for (const auto& item : value)
        out.push_back(value_from_json(item));
      return out;
    }
    case json::value_t::object:
      return table_from_json(value);
    default:
      throw store::StoreError(store::ErrorKind::usage,
                              "outbox headers: unsupported JSON value " + value.dump());
  }
}

std::string dump(const json& value, const char* what) {
  try {
    return value.dump();
  } catch (const json::type_error&) {
    throw store::StoreError(store::ErrorKind::usage,
                            std::string("outbox ") + what + ": text that is not UTF-8");
  }
}

// The properties column: every property but headers and message-id, which have columns.
json properties_to_json(const amqp::BasicProperties& p) {
  json out = json::object();
  auto text = [&](const char* name, const std::optional<std::string>& value) {
    if (value) out[name] = *value;
  };
  text("content_type", p.content_type);
  text("content_encoding", p.content_encoding);
  if (p.delivery_mode) out["delivery_mode"] = *p.delivery_mode;
  if (p.priority) out["priority"] = *p.priority;
  text("correlation_id", p.correlation_id);
  text("reply_to", p.reply_to);
  text("expiration", p.expiration);
  if (p.timestamp) out["timestamp"] = *p.timestamp;
  text("type", p.type);
  text("user_id", p.user_id);
  text("app_id", p.app_id);
  return out;
}

template <class T>
std::optional<T> number_property(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    throw store::StoreError(store::ErrorKind::usage,
                            std::string("outbox properties: ") + name + " is not an integer");
  }
  return it->get<T>();
}

std::optional<std::string> text_property(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    throw store::StoreError(store::ErrorKind::usage,
                            std::string("outbox properties: ") + name + " is not text");
  }
  return it->get<std::string>();
}

json parse(const std::string& text, const char* what) {
  try {
    auto value = json::parse(text);
    if (!value.is_object()) throw json::other_error::create(501, "not an object", nullptr);
    return value;
  } catch (const json::exception& e) {
    throw store::StoreError(store::ErrorKind::usage,
                            std::string("outbox ") + what + ": not a JSON object: " + e.what());
  }
}

amqp::BasicProperties properties_from_json(const std::string& text) {
  json object = parse(text, "properties");
  amqp::BasicProperties p;
  p.content_type = text_property(object, "content_type");
  p.content_encoding = text_property(object, "content_encoding");
  p.delivery_mode = number_property<uint8_t>(object, "delivery_mode");
  if (!p.delivery_mode) p.delivery_mode = 2;
  p.priority = number_property<uint8_t>(object, "priority");
  p.correlation_id = text_property(object, "correlation_id");
  p.reply_to = text_property(object, "reply_to");
  p.expiration = text_property(object, "expiration");
  p.timestamp = number_property<uint64_t>(object, "timestamp");
  p.type = text_property(object, "type");
  p.user_id = text_property(object, "user_id");
  p.app_id = text_property(object, "app_id");
  return p;
}

}  // namespace

const char* const detail::row_columns =
    "id, exchange, routing_key, message_id, properties, headers, body, ordering_key, created_at, "
    "state, attempts, last_error, updated_at, due_at";

OutboxRow detail::decode_row(const store::Row& row, bool lenient) {
  OutboxRow out;
  out.id = row.integer(0);
  out.exchange = row.text(1).value_or("");
  out.routing_key = row.text(2).value_or("");
  out.message_id = row.text(3).value_or("");
  try {
    out.properties = properties_from_json(row.text(4).value_or("{}"));
    auto headers = headers_from_json(row.text(5).value_or("{}"));
    if (!headers.empty()) out.properties.headers = std::move(headers);
  } catch (const store::StoreError&) {
    if (!lenient) throw;
    out.properties = amqp::BasicProperties{};
  }
  out.properties.message_id = out.message_id;
  out.body = row.text(6).value_or("");
  out.ordering_key = row.text(7);
  out.created_at_ms = row.integer(8);
  out.state = row_state_from(row.text(9).value_or("")).value_or(RowState::pending);
  out.attempts = row.integer(10);
  out.last_error = row.text(11);
  if (!row.is_null(12)) out.updated_at_ms = row.integer(12);
  if (!row.is_null(13)) out.due_at_ms = row.integer(13);
  return out;
}

namespace {

std::vector<store::Value> id_values(const std::vector<int64_t>& ids) {
  std::vector<store::Value> values;
  values.reserve(ids.size());
  for (int64_t id : ids)
    values.emplace_back(id);
  return values;
}

// The failed rows to act on: every one, or those of `ids`, in batches of ids numbered from
// placeholder $first on.
template <class Act>
uint64_t on_failed(const std::vector<int64_t>& ids, size_t first_placeholder, Act act) {
  if (ids.empty()) return act("state = 'failed'", std::vector<store::Value>{});
  uint64_t total = 0;
  constexpr size_t chunk = 500;
  for (size_t first = 0; first < ids.size(); first += chunk) {
    std::vector<int64_t> part(ids.begin() + first,
                              ids.begin() + std::min(ids.size(), first + chunk));
    total += act(
        "state = 'failed' AND id IN (" + store::placeholders(first_placeholder, part.size()) + ")",
        id_values(part));
  }
  return total;
}

}  // namespace

std::string headers_to_json(const amqp::FieldTable& table) {
  return dump(table_to_json(table), "headers");
}

amqp::FieldTable headers_from_json(const std::string& text) {
  return table_from_json(parse(text, "headers"));
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t enqueue(store::Database& database, const OutboxMessage& message) {
  if (message.exchange.empty() && message.routing_key.empty()) {
    throw store::StoreError(store::ErrorKind::usage,
                            "outbox: a message needs an exchange or a routing key");
  }
  if (message.due_at_ms && !message.exchange.empty()) {
    throw store::StoreError(store::ErrorKind::usage,
                            "outbox: a message due later goes to one queue through the delay "
                            "levels: name the queue in routing_key and leave exchange empty (it is "
                            "\"" +
                                message.exchange + "\")");
  }
  std::vector<store::Value> values{
      message.exchange,
      message.routing_key,
      dump(properties_to_json(message.properties), "properties"),
      message.properties.headers ? headers_to_json(*message.properties.headers) : std::string("{}"),
      store::Blob{message.body},
      message.ordering_key ? store::Value(*message.ordering_key) : store::Value(),
      message.due_at_ms ? store::Value(*message.due_at_ms) : store::Value(),
  };
  std::string sql;
  const char* cast = database.dialect() == store::Dialect::postgresql ? "::jsonb" : "";
  if (message.message_id.empty()) {
    sql = std::string(
              "INSERT INTO retryloop_outbox (exchange, routing_key, properties, headers, "
              "body, ordering_key, due_at) VALUES ($1, $2, $3") +
          cast + ", $4" + cast + ", $5, $6, $7) RETURNING id";
  } else {
    values.emplace_back(message.message_id);
    sql = std::string(
              "INSERT INTO retryloop_outbox (exchange, routing_key, properties, headers, "
              "body, ordering_key, due_at, message_id) VALUES ($1, $2, $3") +
          cast + ", $4" + cast + ", $5, $6, $7, $8) RETURNING id";
  }
  auto result = database.execute(sql, values);
  return result.rows.at(0).integer(0);
}

int64_t due_in(std::chrono::milliseconds delay) {
  return now_ms() + delay.count();
}

const char* to_string(RowState state) {
  switch (state) {
    case RowState::pending:
      return "pending";
    case RowState::failed:
      return "failed";
    case RowState::published:
      return "published";
  }
  return "?";
}

std::optional<RowState> row_state_from(std::string_view text) {
  if (text == "pending") return RowState::pending;
  if (text == "failed") return RowState::failed;
  if (text == "published") return RowState::published;
  return std::nullopt;
}

std::vector<OutboxRow> list_rows(store::Database& database, std::optional<RowState> state,
                                 size_t limit, int64_t after_id) {
  std::string sql =
      std::string("SELECT ") + detail::row_columns + " FROM retryloop_outbox WHERE id > $1";
  std::vector<store::Value> values{after_id, static_cast<int64_t>(limit)};
  if (state) {
    sql += " AND state = $3";
    values.emplace_back(std::string(to_string(*state)));
  }
  sql += " ORDER BY id LIMIT $2";
  auto result = database.execute(sql, values);
  std::vector<OutboxRow> rows;
  rows.reserve(result.rows.size());
  for (const auto& row : result.rows)
    rows.push_back(detail::decode_row(row, true));
  return rows;
}

OutboxStats stats(store::Database& database) {
  OutboxStats out;
  auto counts = database.execute("SELECT state, count(*) FROM retryloop_outbox GROUP BY state");
  for (const auto& row : counts.rows) {
    auto state = row_state_from(row.text(0).value_or(""));
    auto count = static_cast<uint64_t>(row.integer(1));
    if (state == RowState::pending) out.pending = count;
    if (state == RowState::failed) out.failed = count;
    if (state == RowState::published) out.published = count;
  }
  auto oldest = database.execute(
      "SELECT created_at FROM retryloop_outbox WHERE state = 'pending' ORDER BY id LIMIT 1");
  if (!oldest.rows.empty()) out.oldest_pending_ms = oldest.rows[0].integer(0);
  return out;
}

uint64_t retry_failed(store::Database& database, const std::vector<int64_t>& ids) {
  store::Transaction transaction(database);
  uint64_t changed = on_failed(ids, 2, [&](const std::string& where, auto values) {
    values.insert(values.begin(), store::Value(now_ms()));
    return database
        .execute("UPDATE retryloop_outbox SET state = 'pending', updated_at = $1 WHERE " + where,
                 values)
        .affected;
  });
  if (changed && database.dialect() == store::Dialect::postgresql) {
    database.execute("SELECT pg_notify('retryloop_outbox', '')");
  }
  transaction.commit();
  return changed;
}

uint64_t purge_failed(store::Database& database, const std::vector<int64_t>& ids) {
  store::Transaction transaction(database);
  uint64_t deleted = on_failed(ids, 1, [&](const std::string& where, auto values) {
    return database.execute("DELETE FROM retryloop_outbox WHERE " + where, values).affected;
  });
  transaction.commit();
  return deleted;
}

uint64_t delete_published(store::Database& database, int64_t before_ms, size_t batch) {
  const bool postgres = database.dialect() == store::Dialect::postgresql;
  std::string sql = std::string(
                        "DELETE FROM retryloop_outbox WHERE id IN (SELECT id FROM retryloop_outbox "
                        "WHERE state = 'published' AND updated_at < $1 LIMIT $2") +
                    (postgres ? " FOR UPDATE SKIP LOCKED" : "") + ")";
  uint64_t total = 0;
  for (;;) {
    auto deleted =
        database.execute(sql, {store::Value(before_ms), store::Value(static_cast<int64_t>(batch))})
            .affected;
    total += deleted;
    if (deleted < batch) return total;
  }
}

}  // namespace retryloop::outbox
