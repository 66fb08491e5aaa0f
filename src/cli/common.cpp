#include "common.hpp"

#include <uv.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <sstream>
#include <utility>

#include "retryloop/move/error.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/topology_json.hpp"

namespace retryloop::cli {

const char* const exit_codes_help =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage error (unknown option, missing argument, bad --url)\n"
    "  2  the topology file is unreadable or invalid\n"
    "  3  the broker refused, differs from the file, or holds messages (delete)\n"
    "  4  cannot connect to the broker, or the connection failed\n"
    "  6  standard output could not be written (a closed pipe, a full disk): the command ran,\n"
    "     its output is incomplete";

void add_connection_option(CLI::App& command, ConnectionArgs& args) {
  command
      .add_option("--url", args.url,
                  "Broker URL, amqp://USER:PASS@HOST:PORT/VHOST (vhost \"/\" is %2F); default: "
                  "user guest on localhost:5672, vhost /")
      ->envname("RETRYLOOP_URL")
      ->type_name("URL");
}

std::string hide_passwords(std::string text) {
  size_t pos = 0;
  while ((pos = text.find("://", pos)) != std::string::npos) {
    size_t start = pos + 3;
    size_t line_end = std::min(text.find('\n', start), text.size());
    size_t at = text.rfind('@', line_end == 0 ? 0 : line_end - 1);
    size_t colon = text.find(':', start);
    if (at == std::string::npos || at < start || colon == std::string::npos || colon > at) {
      pos = start;
      continue;
    }
    text.replace(colon + 1, at - colon - 1, "***");
    pos = colon + 4;
  }
  return text;
}

namespace {

/// The part of a URL that may be its password, as [begin, end) in `url`: between the first ':'
/// after `://` and the last '@'. Empty when the URL has no password.
std::pair<size_t, size_t> password_span(const std::string& url) {
  size_t scheme = url.find("://");
  size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  size_t at = url.rfind('@');
  if (at == std::string::npos || at < start) return {0, 0};
  size_t colon = url.find(':', start);
  if (colon == std::string::npos || colon > at) return {0, 0};
  return {colon + 1, at};
}

/// `text` with each valid %XX replaced by its byte; the rest is kept as it is.
std::string lenient_percent_decode(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

/// A URL parser's message with every quoted '...' value that may come from the password replaced
/// by '***'. A value is kept when it occurs in `url` outside the password (a scheme, a port, a
/// query option), or nowhere in `url` (what the parser expected, such as ']'), and is no part of
/// the password, as written or decoded.
std::string hide_quoted_secrets(const std::string& message, const std::string& url) {
  auto [begin, end] = password_span(url);
  if (begin == end) return hide_passwords(message);
  const std::string secret = url.substr(begin, end - begin);
  const std::string decoded_secret = lenient_percent_decode(secret);
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t open = message.find('\'', pos);
    size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
    if (close == std::string::npos) {
      out += message.substr(pos);
      break;
    }
    std::string value = message.substr(open + 1, close - open - 1);
    bool outside = url.find(value) == std::string::npos;
    for (size_t at = url.find(value); !value.empty() && at != std::string::npos;
         at = url.find(value, at + 1)) {
      if (at + value.size() <= begin || at >= end) outside = true;
    }
    bool secret_part = !value.empty() && (secret.find(value) != std::string::npos ||
                                          value.find(secret) != std::string::npos ||
                                          decoded_secret.find(value) != std::string::npos ||
                                          value.find(decoded_secret) != std::string::npos);
    out += message.substr(pos, open - pos);
    out += outside && !secret_part ? "'" + value + "'" : std::string("'***'");
    pos = close + 1;
  }
  return hide_passwords(out);
}

}  // namespace

client::Uri parse_url(const ConnectionArgs& args) {
  try {
    return client::parse_uri(args.url);
  } catch (const std::exception& e) {
    throw Failure(exit_usage, "invalid broker URL (--url or RETRYLOOP_URL): " +
                                  hide_quoted_secrets(e.what(), args.url));
  }
}

int with_connection(const client::Uri& uri, const ConnectedWork& work) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  client::ConnectionOptions options;
  options.uri = uri;
  options.connection_name = "retryloop command line";
  options.connect_timeout = uri.connect_timeout.value_or(std::chrono::seconds(10));
  int code = exit_ok;
  bool finished = false;
  client::Error connect_error;
  auto connection = client::Connection::create(&loop, options);
  client::Error immediate = connection->connect([&](const client::Error& error) {
    if (error) {
      connect_error = error;
      return;
    }
    work(connection, [&](int result) {
      if (finished) return;
      finished = true;
      code = result;
      connection->close();
    });
  });
  if (immediate) connect_error = immediate;
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0) {
    uv_walk(
        &loop,
        [](uv_handle_t* handle, void*) {
          if (!uv_is_closing(handle)) uv_close(handle, nullptr);
        },
        nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  connection.reset();
  if (connect_error) {
    std::cerr << "retryloop: cannot connect to " << uri.redacted() << ": "
              << connect_error.message() << "\n";
    return exit_connection;
  }
  if (!finished) {
    std::cerr << "retryloop: the connection to " << uri.redacted() << " ended unexpectedly\n";
    return exit_connection;
  }
  return code;
}

topology::Topology load_topology_or_fail(const std::string& path,
                                         const std::vector<std::string>& services) {
  topology::ParseResult result = topology::load_topology(path);
  if (!result.ok()) {
    for (const auto& line : result.messages())
      std::cerr << line << "\n";
    throw Failure(exit_invalid_file, path + " is not a valid topology file (" +
                                         plural(result.errors.size(), "problem") +
                                         "); nothing was sent to a broker");
  }
  return select_services_or_fail(*result.topology, services);
}

topology::Topology select_services_or_fail(const topology::Topology& topology,
                                           const std::vector<std::string>& services) {
  try {
    return topology::select_services(topology, services);
  } catch (const std::invalid_argument& e) {
    throw Failure(exit_usage, std::string("--service: ") + e.what());
  }
}

int run_per_service(
    const std::string& path, const std::vector<std::string>& services, bool json,
    const std::function<int(const topology::Service& service, nlohmann::json& services)>& run) {
  return run_per_service(load_topology_or_fail(path, services), json, run);
}

int run_per_service(
    const topology::Topology& topology, bool json,
    const std::function<int(const topology::Service& service, nlohmann::json& services)>& run) {
  nlohmann::json results = nlohmann::json::array();
  int code = exit_ok;
  for (const topology::Service& service : topology.services) {
    code = run(service, results);
    if (code != exit_ok) break;
  }
  if (json) std::cout << dump(nlohmann::json{{"services", results}}) << "\n";
  return code;
}

namespace {

/// Columns a cell takes: UTF-8 continuation bytes take none.
size_t display_width(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace

std::vector<size_t> Table::widths() const {
  std::vector<size_t> widths;
  for (const auto& [verbatim, row] : rows_) {
    if (verbatim) continue;
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i + 1 < row.size(); ++i)
      widths[i] = std::max(widths[i], row[i].size());
  }
  return widths;
}

void Table::print_row(std::ostream& out, const std::vector<std::string>& row,
                      const std::vector<size_t>& widths, const std::string& indent) {
  std::string line = indent;
  for (size_t i = 0; i < row.size(); ++i) {
    line += row[i];
    if (i + 1 < row.size()) {
      const size_t width = i < widths.size() ? widths[i] : 0;
      const size_t used = display_width(row[i]);
      line += std::string(width > used ? width - used + 2 : 2, ' ');
    }
  }
  while (!line.empty() && line.back() == ' ')
    line.pop_back();
  out << line << "\n";
}

void Table::print(std::ostream& out, const std::string& indent) const {
  const std::vector<size_t> column_widths = widths();
  for (const auto& [verbatim, row] : rows_) {
    if (verbatim) {
      out << row.front() << "\n";
      continue;
    }
    print_row(out, row, column_widths, indent);
  }
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : separator) + items[i];
  return out;
}

std::string plural(size_t count, const std::string& singular, const std::string& plural_form) {
  return std::to_string(count) + " " +
         (count == 1 ? singular : (plural_form.empty() ? singular + "s" : plural_form));
}

std::string wrap(const std::string& text, size_t width) {
  std::string out;
  size_t column = 0;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (column > 0 && column + 1 + word.size() > width) {
      out += "\n";
      column = 0;
    } else if (column > 0) {
      out += " ";
      ++column;
    }
    out += word;
    column += word.size();
  }
  return out;
}

std::shared_ptr<process::StopSignals> settle_on_interrupt(uv_loop_t* loop,
                                                          std::function<void()> settle,
                                                          std::function<void()> stop_now) {
  return std::make_shared<process::StopSignals>(
      loop,
      [settle = std::move(settle)](int) {
        std::cerr << "\nretryloop: interrupted: letting the copies in flight settle (Ctrl-C "
                     "again to stop at once)\n";
        settle();
      },
      std::move(stop_now));
}

void describe_command(CLI::App& command) {
  command.footer(exit_codes_help);
  command.failure_message([](const CLI::App* app, const CLI::Error& error) {
    return hide_passwords(CLI::FailureMessage::simple(app, error));
  });
}

std::string iso_time(uint64_t seconds) {
  return parking::iso_time(seconds);
}

std::string age_text(uint64_t seconds) {
  auto two = [](uint64_t big, const char* big_unit, uint64_t small, const char* small_unit) {
    return std::to_string(big) + big_unit + (small ? std::to_string(small) + small_unit : "");
  };
  if (seconds < 60) return std::to_string(seconds) + "s";
  if (seconds < 3600) return two(seconds / 60, "m", seconds % 60, "s");
  if (seconds < 86400) return two(seconds / 3600, "h", seconds % 3600 / 60, "m");
  return two(seconds / 86400, "d", seconds % 86400 / 3600, "h");
}

std::string dump(const nlohmann::json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string preview(std::string_view text, size_t width) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= width) break;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    } else {
      out.push_back(char(c));
    }
  }
  if (out.size() > width || text.size() > out.size()) {
    if (out.size() > width) out.resize(width);
    if (out.size() < text.size()) out += "...";
  }
  return out;
}

int error_exit(const client::Error& error, const std::string& what) {
  std::cerr << "retryloop: " << what << ": " << error.message() << "\n";
  const bool connection =
      error.code == client::make_error_code(client::ClientError::connection_lost) ||
      error.code == client::make_error_code(client::ClientError::heartbeat_timeout) ||
      error.code == client::make_error_code(client::ClientError::connection_closed) ||
      error.code == move::make_error_code(move::MoveError::queue_unanswered);
  return connection ? exit_connection : exit_broker_refused;
}

CLI::Validator whole_number(int64_t min, int64_t max) {
  const std::string range = max == INT64_MAX
                                ? std::to_string(min) + " or more"
                                : "from " + std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc() && stop == end && value >= min && value <= max) return {};
        return "must be a whole number " + range + ", not '" + preview(text, 30) + "'";
      },
      "N");
}

std::chrono::milliseconds duration_or_fail(const std::string& option, const std::string& text) {
  std::string error;
  auto duration = topology::parse_duration(text, &error);
  if (!duration) throw Failure(exit_usage, option + " '" + text + "' " + error);
  return *duration;
}

}  // namespace retryloop::cli
