// The retryloop command. Each command group (topology, parking) adds its subcommands;
// this file only parses the command line and turns failures into exit codes.

#include <CLI/CLI.hpp>

#include <iostream>

#include "common.hpp"
#include "parking_command.hpp"
#include "topology_command.hpp"

int main(int argc, char** argv) {
  using namespace retryloop::cli;
  CLI::App app{"retryloop: delayed retries on RabbitMQ, done by the broker itself.", "retryloop"};
  describe_command(app);
  app.require_subcommand(1);
  app.get_formatter()->column_width(32);

  int exit_code = exit_ok;
  add_topology_commands(app, exit_code);
  add_parking_commands(app, exit_code);

  if (argc < 2) {
    std::cout << app.help();
    return exit_usage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int printed = app.exit(e);
    return printed == 0 ? exit_ok : exit_usage;
  } catch (const Failure& f) {
    std::cerr << "retryloop: " << f.what() << "\n";
    return f.code();
  } catch (const std::exception& e) {
    std::cerr << "retryloop: " << e.what() << "\n";
    return exit_usage;
  }
  return exit_code;
}
