// The outbox and the inbox in two small services sharing one database, for the demo:
//
//   outbox_orders place --db URL ORDER...     the order service: each order and its event
//                                              commit together; an order named "fail-*" rolls
//                                              back, and its event with it
//   outbox_orders bill --db URL --url AMQP --topology FILE --service NAME
//                                              the billing service: a retry consumer whose
//                                              handler writes an invoice through the inbox, so
//                                              that an event delivered twice is billed once
//
// `place` creates table orders, `bill` table invoices, if missing (the retryloop tables come
// from `retryloop outbox init`). `bill` prints one line per delivery: "billed ORDER" or
// "skipped: duplicate ..."; SIGINT or SIGTERM stops it.
#include <uv.h>

#include <retryloop/consumer/consumer.hpp>
#include <retryloop/inbox/inbox.hpp>
#include <retryloop/outbox/outbox.hpp>
#include <retryloop/store/database.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <mutex>

using namespace retryloop;

namespace {

const char* create_orders =
    "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount_cents bigint NOT NULL)";
const char* create_invoices =
    "CREATE TABLE IF NOT EXISTS invoices (order_id text NOT NULL, amount_cents bigint NOT NULL)";

int place(const std::string& url, const std::vector<std::string>& orders) {
  auto db = store::Database::open(url);
  db->execute_script(create_orders);
  int64_t amount = 1000;
  for (const auto& order : orders) {
    amount += 250;
    store::Transaction transaction(*db);
    db->execute("INSERT INTO orders (id, amount_cents) VALUES ($1, $2)", {order, amount});
    outbox::OutboxMessage event;
    event.exchange = "orders";
    event.routing_key = "order.created";
    event.message_id = order + ".created";
    event.ordering_key = order;
    event.properties.content_type = "application/json";
    event.body = "{\"order\": \"" + order + "\", \"amount_cents\": " + std::to_string(amount) + "}";
    outbox::enqueue(*db, event);
    if (order.rfind("fail-", 0) == 0) {
      std::printf("order %s: rolled back (a failed payment check), and its event with it\n",
                  order.c_str());
      continue;  // the transaction's destructor rolls back
    }
    transaction.commit();
    std::printf("order %s: committed with its event %s\n", order.c_str(), event.message_id.c_str());
  }
  return 0;
}

int bill(const std::string& db_url, const std::string& url, const std::string& topology_file,
         const std::string& service_name) {
  store::Database::open(db_url)->execute_script(create_invoices);
  auto parsed = topology::load_topology(topology_file);
  if (!parsed.ok()) {
    for (const auto& line : parsed.messages())
      std::fprintf(stderr, "%s\n", line.c_str());
    return 2;
  }
  consumer::ConsumerOptions options;
  options.service = topology::select_services(*parsed.topology, {service_name}).services.at(0);
  options.connection.uri = client::parse_uri(url);
  options.stop_on_signals = true;
  options.logger = spdlog::stderr_color_mt("billing");
  options.logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");

  inbox::InboxOptions inbox_options;
  inbox_options.database = db_url;
  inbox_options.consumer = service_name;
  auto inbox = inbox::Inbox::create(inbox_options);

  static std::mutex output;
  auto handler = inbox->wrap([](const consumer::Message& message, store::Database& db) {
    auto event = nlohmann::json::parse(message.body, nullptr, false);
    if (!event.is_object() || !event.contains("order")) {
      return consumer::Outcome::poison("not an order event");
    }
    const std::string order = event["order"].get<std::string>();
    db.execute("INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)",
               {order, event.value("amount_cents", int64_t{0})});
    std::lock_guard<std::mutex> lock(output);
    std::printf("billed %s (message id %s)\n", order.c_str(),
                std::string(message.message_id()).c_str());
    std::fflush(stdout);
    return consumer::Outcome::ack();
  });
  auto counting = [handler](const consumer::Message& message) {
    auto outcome = handler(message);
    if (outcome.kind == consumer::OutcomeKind::drop) {  // the inbox's answer to a duplicate
      std::lock_guard<std::mutex> lock(output);
      std::printf("skipped: %s\n", outcome.text.c_str());
      std::fflush(stdout);
    }
    return outcome;
  };

  uv_loop_t* loop = uv_default_loop();
  auto billing = consumer::Consumer::create(loop, options, consumer::Handler(counting));
  if (client::Error error = billing->start()) {
    std::fprintf(stderr, "billing: %s\n", error.message().c_str());
    return 1;
  }
  billing->set_ready_handler([] {
    std::printf("consuming\n");
    std::fflush(stdout);
  });
  billing.reset();  // it keeps itself alive until it stops
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"An order service and a billing service joined by the outbox and the inbox."};
  app.require_subcommand(1);
  std::string db_url, url, topology_file, service = "billing";
  std::vector<std::string> orders;
  CLI::App* place_command = app.add_subcommand("place", "Commit orders with their events");
  place_command->add_option("--db", db_url, "database URL")->required();
  place_command->add_option("orders", orders, "order ids")->required();
  CLI::App* bill_command = app.add_subcommand("bill", "Bill each order event once");
  bill_command->add_option("--db", db_url, "database URL")->required();
  bill_command->add_option("--url", url, "broker URL")->envname("RETRYLOOP_URL")->required();
  bill_command->add_option("--topology", topology_file, "topology file")->required();
  bill_command->add_option("--service", service, "service in the topology file");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*place_command) return place(db_url, orders);
    return bill(db_url, url, topology_file, service);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox_orders: %s\n", e.what());
    return 1;
  }
}
