#include "command_line.hpp"

#include <string>

#include "common.hpp"
#include "dispatch_command.hpp"
#include "migrate_command.hpp"
#include "outbox_command.hpp"
#include "parking_command.hpp"
#include "schedule_command.hpp"
#include "service_command.hpp"
#include "topology_command.hpp"
#include "transfer_command.hpp"

namespace retryloop::cli {

void build_command_line(CLI::App& app, int& exit_code) {
  app.description("retryloop: delayed retries on RabbitMQ, done by the broker itself.");
  app.name("retryloop");
  describe_command(app);
  app.footer(wrap("A service that consumes from RabbitMQ hands each message to a handler that "
                  "sometimes fails. retryloop lets the broker do the waiting: a failed message "
                  "waits in a TTL queue of the service's retry loop and comes back to the "
                  "service's queue when its delay is over, and a message that has used its "
                  "attempts, or can never succeed, is parked with the reason and the error. "
                  "These commands declare each service's queues and exchanges from a topology "
                  "file and check them, inspect and replay parked messages, relay an outbox "
                  "table to the broker, schedule messages for later, and pause and resume a "
                  "service's instances. The library does the rest, inside each service.") +
             "\n\n" + exit_codes_help);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("retryloop ") + RETRYLOOP_VERSION,
                       "Print the version and exit");
  app.get_formatter()->column_width(32);
  add_topology_commands(app, exit_code);
  add_migrate_command(*app.get_subcommand("topology"), exit_code);
  add_transfer_command(*app.get_subcommand("topology"), exit_code);
  add_parking_commands(app, exit_code);
  add_outbox_commands(app, exit_code);
  add_schedule_commands(app, exit_code);
  add_service_commands(app, exit_code);
  add_dispatch_command(app, exit_code);
}

}  // namespace retryloop::cli
