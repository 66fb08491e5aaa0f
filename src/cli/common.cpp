#include "common.hpp"

#include <uv.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>

#include "retryloop/topology/topology_json.hpp"

namespace retryloop::cli {

const char* const exit_codes_help =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage error (unknown option, missing argument, bad --url)\n"
    "  2  the topology file is unreadable or invalid\n"
    "  3  the broker refused, differs from the file, or holds messages (delete)\n"
    "  4  cannot connect to the broker, or the connection failed";

void add_connection_option(CLI::App& command, ConnectionArgs& args) {
  command
      .add_option("--url", args.url,
                  "Broker URL, amqp://USER:PASS@HOST:PORT/VHOST (vhost \"/\" is %2F); default: "
                  "user guest on localhost:5672, vhost /")
      ->envname("RETRYLOOP_URL")
      ->type_name("URL");
}

client::Uri parse_url(const ConnectionArgs& args) {
  try {
    return client::parse_uri(args.url);
  } catch (const std::exception& e) {
    throw Failure(exit_usage,
                  std::string("invalid broker URL (--url or RETRYLOOP_URL): ") + e.what());
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
  try {
    return topology::select_services(*result.topology, services);
  } catch (const std::invalid_argument& e) {
    throw Failure(exit_usage, std::string("--service: ") + e.what());
  }
}

namespace {

/// Columns a cell takes: UTF-8 continuation bytes take none.
size_t display_width(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace

void Table::print(std::ostream& out, const std::string& indent) const {
  std::vector<size_t> widths;
  for (const auto& [verbatim, row] : rows_) {
    if (verbatim) continue;
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i + 1 < row.size(); ++i)
      widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& [verbatim, row] : rows_) {
    if (verbatim) {
      out << row.front() << "\n";
      continue;
    }
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - display_width(row[i]) + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    out << line << "\n";
  }
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

void describe_command(CLI::App& command) {
  command.footer(exit_codes_help);
}

}  // namespace retryloop::cli
