// Least privilege: the consumer, `retryloop topology` and `retryloop parking` each work with
// exactly the permissions docs/permissions.md lists for them, and with less each fails with a
// 403 that names the refused resource and the permission it takes.

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "retryloop/amqp/methods.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using consumer::Consumer;
using consumer::Outcome;
using test::ChildProcess;
using test::TestLoop;

namespace {

/// A name as a regular expression that matches only that name.
std::string quote(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::string_view(".^$|()[]{}*+?\\").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

/// `^(a|b|...)$`, or `^$` (nothing) for no names.
std::string only(const std::vector<std::string>& names) {
  if (names.empty()) return "^$";
  std::string alternatives;
  for (const auto& name : names)
    alternatives += (alternatives.empty() ? "" : "|") + name;
  return "^(" + alternatives + ")$";
}

struct Permissions {
  std::string configure = "^$";
  std::string write = "^$";
  std::string read = "^$";
};

/// The regexes of docs/permissions.md for a service N with queue Q and input exchange X.
struct Documented {
  std::string n, q, x;

  explicit Documented(const topology::Service& s)
      : n(quote(s.name)), q(quote(topology::input_queue_name(s))), x(quote(s.input.exchange)) {}

  std::vector<std::string> loop() const {
    return {q, n + "\\.wait", n + "\\.wait\\..*", n + "\\.parking"};
  }
  std::vector<std::string> with(std::vector<std::string> names, const std::string& more) const {
    names.push_back(more);
    return names;
  }
  /// `retryloop topology apply`, and a consumer with declare_topology (the default).
  Permissions apply() const { return {only(with(loop(), x)), only(loop()), only(with(loop(), x))}; }
  Permissions verify() const { return {only(with(loop(), x)), "^$", "^$"}; }
  /// verify --exists-only and delete without --yes: nothing on RabbitMQ 3.10 and 4.0, where
  /// anyone may look at an object; read on the objects from 4.2.6 and 4.3 on.
  Permissions look() const { return {"^$", "^$", only(with(loop(), x))}; }
  /// delete --yes: the loop, and the shared breaker's and a migration's objects, which it deletes
  /// too.
  Permissions remove() const {
    return {only(with(with(loop(), n + "\\.breaker(\\..*)?"), n + "\\.migration(\\..*)?")), "^$",
            "^$"};
  }
  /// A consumer with declare_topology false.
  Permissions consumer(topology::RetryMode mode) const {
    std::vector<std::string> write{n + "\\.parking"};
    if (mode == topology::RetryMode::republish) write.insert(write.begin(), n + "\\.wait");
    return {"^$", only(write), only({q})};
  }
  Permissions parking_read() const { return {"^$", "^$", only({n + "\\.parking"})}; }
  Permissions replay() const { return {"^$", "^amq\\.default$", only({n + "\\.parking"})}; }
};

/// Broker users, one per permission set (on vhost "/"), all made by one `rabbitmqctl
/// import_definitions` and all deleted, however the test ends, when this goes out of scope. (Each
/// rabbitmqctl call starts an Erlang VM, a second or more: add_user and set_permissions per user
/// would make these tests slow.)
class Users {
 public:
  explicit Users(const std::vector<Permissions>& sets) {
    nlohmann::json users = nlohmann::json::array();
    nlohmann::json permissions = nlohmann::json::array();
    for (const auto& p : sets) {
      names_.push_back(test::unique_name("user"));
      users.push_back({{"name", names_.back()}, {"password", password_}, {"tags", ""}});
      permissions.push_back({{"user", names_.back()},
                             {"vhost", "/"},
                             {"configure", p.configure},
                             {"write", p.write},
                             {"read", p.read}});
    }
    // In the broker's directory: rabbitmqctl may run in a root of its own that sees only that.
    const auto file = std::filesystem::path(test::broker_dir()) / (names_.at(0) + ".json");
    std::ofstream(file) << nlohmann::json{{"users", users}, {"permissions", permissions}}.dump();
    std::string output;
    const int rc = test::broker_ctl("import_definitions '" + file.string() + "'", &output);
    std::filesystem::remove(file);
    INFO(output);
    REQUIRE(rc == 0);
    // The import may finish after the command returns: wait until the last user may connect.
    TestLoop loop;
    client::ConnectionOptions options;
    options.uri = client::parse_uri(url(names_.size() - 1));
    std::shared_ptr<client::Connection> connection;
    Error error;
    for (int tries = 0; tries < 100; ++tries) {
      error = test::try_connect(loop, options, connection);
      if (!error) break;
      std::this_thread::sleep_for(100ms);
    }
    INFO(error.message());
    REQUIRE_FALSE(error);
    test::close(loop, connection);
  }
  ~Users() {
    std::string list;
    for (const auto& name : names_)
      list += (list.empty() ? "<<\"" : ", <<\"") + name + "\">>";
    if (test::broker_ctl("eval '[rabbit_auth_backend_internal:delete_user(U, <<\"tests\">>) || "
                         "U <- [" +
                         list + "]].'") != 0) {
      for (const auto& name : names_)
        test::broker_ctl("delete_user '" + name + "'");
    }
  }
  Users(const Users&) = delete;
  Users& operator=(const Users&) = delete;

  /// The test broker's URL with user `i`'s name and password.
  std::string url(size_t i) const {
    std::string url = test::broker_url();
    const size_t start = url.find("://") + 3;
    const size_t at = url.find('@', start);
    REQUIRE(at != std::string::npos);
    return url.substr(0, start) + names_.at(i) + ":" + password_ + url.substr(at);
  }

 private:
  std::vector<std::string> names_;
  std::string password_ = "least-privilege";
};

/// A service with unique names (its queue and input exchange named apart from it), its topology
/// file on disk, and a guest connection to set up and inspect the broker. Everything it made is
/// deleted at the end.
struct Service {
  TestLoop& loop;
  topology::Service service;
  std::string file;
  std::shared_ptr<client::Connection> guest;
  std::shared_ptr<client::Channel> channel;

  /// `delay_levels`: the JSON of the retry's delay levels, when it has them.
  Service(TestLoop& l, const std::string& mode, const std::string& delay_levels = "") : loop(l) {
    const std::string name = test::unique_name("perm");
    const std::string json =
        R"({"services": [{"name": ")" + name + R"(", "queue": ")" + name +
        R"(.q", "input": {"exchange": ")" + name +
        R"(.in", "type": "direct", "bindings": ["key"]}, "retry": {"mode": ")" + mode +
        R"(", "delays": ["200ms"], "max_attempts": 3)" +
        (delay_levels.empty() ? "" : R"(, "delay_levels": )" + delay_levels) + "}}]}";
    file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
    std::ofstream(file) << json;
    topology::ParseResult parsed = topology::parse_topology(json);
    REQUIRE(parsed.ok());
    service = parsed.topology->services.at(0);
    guest = test::connect(loop, test::broker_url());
    channel = test::open_channel(loop, *guest);
    REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  }
  ~Service() {
    std::filesystem::remove(file);
    if (!guest->is_open()) return;
    // No REQUIRE here: this may run while a failed test unwinds.
    bool removed = false;
    auto plan = topology::make_delete_plan(topology::Topology{{service}});
    if (!topology::remove(guest, plan, {true, true},
                          [&](const topology::Report&) { removed = true; })) {
      loop.run_until([&] { return removed; }, 10s);
    }
    bool deleted = false;
    REQUIRE_FALSE(channel->exchange_delete(service.input.exchange, false,
                                           [&](const Error&) { deleted = true; }));
    loop.run_until([&] { return deleted || !channel->is_open(); }, 10s);
    if (guest->is_open()) test::close(loop, guest);
  }

  const std::string& queue() const { return topology::input_queue_name(service); }
  std::string parking() const { return topology::parking_queue_name(service.name); }
  Documented documented() const { return Documented(service); }

  /// Declares the topology as guest, as an operator would beforehand.
  void apply() {
    bool done = false;
    REQUIRE_FALSE(topology::apply(guest, topology::make_plan(topology::Topology{{service}}),
                                  [&](const topology::Report& report) {
                                    CHECK(report.ok());
                                    done = true;
                                  }));
    REQUIRE(loop.run_until([&] { return done; }));
  }

  void publish(const std::string& exchange, const std::string& key, const std::string& id) {
    amqp::BasicProperties properties;
    properties.message_id = id;
    properties.delivery_mode = 2;
    test::publish_confirmed(loop, *channel, exchange, key, properties, "{}");
  }
  uint32_t depth(const std::string& queue) { return test::queue_depth(loop, *guest, queue); }
  std::vector<std::string> drain(const std::string& queue) {
    std::vector<std::string> ids;
    for (const auto& m : test::drain_queue(loop, *guest, queue)) {
      ids.push_back(m.message.properties.message_id.value_or(""));
    }
    return ids;
  }

  /// Runs `retryloop ARGS... --url URL` (with `-t FILE SERVICE` after a parking command, FILE
  /// after a topology one) and waits for it.
  std::unique_ptr<ChildProcess> cli(std::vector<std::string> args, const std::string& url) {
    std::vector<std::string> argv{test::built_program("retryloop")};
    argv.insert(argv.end(), args.begin(), args.end());
    if (args.at(0) == "parking") {
      argv.insert(argv.end(), {"-t", file, service.name});
    } else {
      argv.push_back(file);
    }
    argv.insert(argv.end(), {"--url", url});
    auto child = std::make_unique<ChildProcess>(argv);
    child->wait(30000);
    return child;
  }
};

/// What the consumer under test did.
struct ConsumerRun {
  std::map<std::string, std::vector<int64_t>> attempts;  ///< attempts seen, by message id
  bool ready = false;
  bool stopped = false;
  Error fatal;
};

/// Starts a consumer as the user of `url`: "once" fails once then succeeds, "after" the same
/// with Outcome::retry_after (50 ms), "park" is parked at once.
std::shared_ptr<Consumer> start_consumer(TestLoop& loop, const topology::Service& service,
                                         const std::string& url, bool declare, ConsumerRun& run) {
  consumer::ConsumerOptions options;
  options.service = service;
  options.connection.uri = client::parse_uri(url);
  options.declare_topology = declare;
  options.handler_on_loop = true;
  options.recovery = consumer::Backoff{100ms, 1000ms, 2.0, 0.1};
  auto c = Consumer::create(loop.get(), options, [&run](const consumer::Message& m) {
    const std::string id(m.message_id());
    run.attempts[id].push_back(m.attempt);
    if (id.rfind("park", 0) == 0) return Outcome::permanent("the customer is gone");
    if (id.rfind("after", 0) == 0 && m.attempt == 1) {
      return Outcome::retry_after(50ms, "HTTP 429, Retry-After");
    }
    return m.attempt == 1 ? Outcome::retry("the upstream said 503") : Outcome::ack();
  });
  c->set_ready_handler([&run] { run.ready = true; });
  c->set_stopped_handler([&run](const Error& error) {
    run.stopped = true;
    run.fatal = error;
  });
  REQUIRE_FALSE(c->start());
  return c;
}

void stop_cleanly(TestLoop& loop, const std::shared_ptr<Consumer>& c, ConsumerRun& run) {
  c->stop(5s);
  REQUIRE(loop.run_until([&] { return run.stopped; }));
  CHECK_FALSE(run.fatal);
}

/// Runs the consumer until it stops by itself, and returns its fatal error.
Error fatal_error(TestLoop& loop, const topology::Service& service, const std::string& url,
                  bool declare, const std::function<void(ConsumerRun&)>& meanwhile = {}) {
  ConsumerRun run;
  auto c = start_consumer(loop, service, url, declare, run);
  if (meanwhile) meanwhile(run);
  REQUIRE(loop.run_until([&] { return run.stopped; }, 10s));
  INFO(run.fatal.message());
  CHECK(run.fatal.reply_code == 403);
  CHECK_THAT(run.fatal.message(), Catch::Contains("ACCESS_REFUSED"));
  return run.fatal;
}

/// Whether an error text names the permission that `method` lacked on `object` (e.g. "queue 'q'"):
/// RabbitMQ 4.x says it itself ("read access to queue 'q' ... in basic.consume"); for 3.10, whose
/// text leaves it out, the client adds it ("in basic.consume, which needs read permission on ...").
bool names_permission(const std::string& text, const std::string& method,
                      const std::string& permission, const std::string& object) {
  auto has = [&](const std::string& part) { return text.find(part) != std::string::npos; };
  return (has(permission + " access to " + object) && has(" in " + method)) ||
         has(" in " + method + ", which needs " + permission + " permission on " + object);
}

/// Whether a report names the permission lacked on `object`, in the broker's words (4.x) or the
/// client's (3.10).
bool says_permission(const std::string& text, const std::string& permission,
                     const std::string& object) {
  return text.find(permission + " access to " + object) != std::string::npos ||
         text.find(permission + " permission on " + object) != std::string::npos;
}

}  // namespace

TEST_CASE("A 403 names the permission the refused method needs, unless the broker already does",
          "[integration][permissions]") {
  Error refused(client::ClientError::channel_closed,
                "ACCESS_REFUSED - access to queue 'orders' in vhost '/' refused for user 'svc'");
  refused.reply_code = 403;
  refused.class_id = amqp::BasicConsume::class_id;
  refused.method_id = amqp::BasicConsume::method_id;
  CHECK(refused.needed_permission() == "read permission on queue 'orders'");
  CHECK(refused.message() ==
        "broker closed the channel (403 ACCESS_REFUSED - access to queue 'orders' in vhost '/' "
        "refused for user 'svc') in basic.consume, which needs read permission on queue 'orders'");

  refused.reply_text =
      "ACCESS_REFUSED - access to exchange 'orders.in' in vhost '/' refused for user 'svc'";
  refused.class_id = amqp::QueueBind::class_id;
  refused.method_id = amqp::QueueBind::method_id;
  CHECK(refused.needed_permission() == "read permission on exchange 'orders.in'");
  refused.method_id = amqp::QueueDelete::method_id;
  CHECK(refused.needed_permission() == "configure permission on exchange 'orders.in'");

  // Newer brokers say which permission it was.
  refused.reply_text =
      "ACCESS_REFUSED - read access to exchange 'orders.in' in vhost '/' refused for user 'svc'";
  CHECK(refused.needed_permission().empty());
  CHECK_THAT(refused.message(), !Catch::Contains("which needs"));
  refused.reply_code = 406;
  refused.reply_text = "PRECONDITION_FAILED - access to queue 'q' in vhost '/' refused";
  CHECK(refused.needed_permission().empty());
}

/// Runs a consumer as the user of `url` until it has retried "once" and parked "park".
static void consume_and_park(TestLoop& loop, Service& s, const std::string& url, bool declare) {
  ConsumerRun run;
  auto c = start_consumer(loop, s.service, url, declare, run);
  REQUIRE(loop.run_until([&] { return run.ready || run.stopped; }));
  INFO(run.fatal.message());
  REQUIRE(run.ready);
  s.publish(s.service.input.exchange, "key", "once");
  s.publish(s.service.input.exchange, "key", "park");
  REQUIRE(loop.run_until(
      [&] { return c->metrics().acked == 1 && c->metrics().parked_permanent == 1; }, 10s));
  stop_cleanly(loop, c, run);
  CHECK(run.attempts["once"] == std::vector<int64_t>{1, 2});
  CHECK(run.attempts["park"] == std::vector<int64_t>{1});
  CHECK(s.drain(s.parking()) == std::vector<std::string>{"park"});
  CHECK(s.depth(s.queue()) == 0);
}

TEST_CASE(
    "A consumer that declares its topology works from an empty broker with exactly the "
    "documented permissions, and stops with a 403 naming the resource and the permission "
    "when one is missing",
    "[integration][permissions]") {
  TestLoop loop;
  // Each case declares a topology of its own from nothing: RabbitMQ checks some permissions
  // (the dead-letter and alternate exchanges) only when it creates a queue or exchange.
  Service exact(loop, "reject"), no_configure(loop, "reject"), no_write(loop, "reject"),
      no_read(loop, "reject");
  const Documented a = no_configure.documented(), b = no_write.documented(),
                   c = no_read.documented();
  Permissions configure_less = a.apply(), write_less = b.apply(), read_less = c.apply();
  configure_less.configure = only(a.loop());  // not the input exchange
  write_less.write = only({b.q, b.n + "\\.wait\\..*", b.n + "\\.parking"});  // not N.wait
  read_less.read = only(c.loop());  // not the input exchange
  Users users({exact.documented().apply(), configure_less, write_less, read_less});

  consume_and_park(loop, exact, users.url(0), true);

  const std::string in = "exchange '" + no_configure.service.input.exchange + "'";
  Error fatal = fatal_error(loop, no_configure.service, users.url(1), true);
  CHECK_THAT(fatal.message(), Catch::Contains("access to " + in));
  CHECK(names_permission(fatal.message(), "exchange.declare", "configure", in));
  fatal = fatal_error(loop, no_write.service, users.url(2), true);
  // A new wait queue dead-letters to the wait exchange.
  const std::string wait = "exchange '" + no_write.service.name + ".wait'";
  CHECK_THAT(fatal.message(), Catch::Contains("queue " + no_write.service.name + ".wait.200ms: ") &&
                                  Catch::Contains("access to " + wait));
  CHECK(names_permission(fatal.message(), "queue.declare", "write", wait));
  const std::string read_in = "exchange '" + no_read.service.input.exchange + "'";
  fatal = fatal_error(loop, no_read.service, users.url(3), true);
  CHECK_THAT(fatal.message(), Catch::Contains("access to " + read_in));
  CHECK(names_permission(fatal.message(), "queue.bind", "read", read_in));
}

TEST_CASE(
    "A consumer that does not declare its topology needs only the permissions to read its "
    "queue and write to its parking exchange (and wait exchange in republish mode)",
    "[integration][permissions]") {
  TestLoop loop;
  Service reject(loop, "reject"), republish(loop, "republish");
  std::vector<Permissions> sets;
  for (Service* s : {&reject, &republish}) {
    s->apply();
    const Documented d = s->documented();
    const Permissions exact = d.consumer(s->service.retry.mode);
    Permissions no_parking = exact, no_read = exact;
    no_parking.write = s == &republish ? only({d.n + "\\.wait"}) : "^$";
    no_read.read = "^$";
    sets.insert(sets.end(), {exact, no_parking, no_read});
  }
  Users users(sets);

  size_t user = 0;
  for (Service* s : {&reject, &republish}) {
    INFO("mode " << topology::to_string(s->service.retry.mode));
    consume_and_park(loop, *s, users.url(user++), false);

    // Without write on the parking exchange the parking copy is refused: the consumer stops
    // and the message is back in its queue.
    Error fatal = fatal_error(loop, s->service, users.url(user++), false, [&](ConsumerRun& run) {
      REQUIRE(loop.run_until([&] { return run.ready || run.stopped; }));
      s->publish(s->service.input.exchange, "key", "park-again");
    });
    CHECK(names_permission(fatal.message(), "basic.publish", "write",
                           "exchange '" + s->parking() + "'"));
    CHECK(s->drain(s->queue()) == std::vector<std::string>{"park-again"});

    // Without read on its queue it cannot consume.
    fatal = fatal_error(loop, s->service, users.url(user++), false);
    CHECK(names_permission(fatal.message(), "basic.consume", "read", "queue '" + s->queue() + "'"));
  }
}

TEST_CASE(
    "retryloop topology apply, verify and delete work with exactly the documented "
    "permissions and exit 3 naming what is missing with less",
    "[integration][permissions]") {
  TestLoop loop;
  Service s(loop, "reject");
  const Documented d = s.documented();
  Permissions apply_less = d.apply(), delete_less = d.remove();
  // Not the wait exchange, which a new wait queue dead-letters to.
  apply_less.write = only({d.q, d.n + "\\.wait\\..*", d.n + "\\.parking"});
  // Not parking.
  delete_less.configure = only({d.q, d.n + "\\.wait", d.n + "\\.wait\\..*",
                                d.n + "\\.breaker(\\..*)?", d.n + "\\.migration(\\..*)?"});
  enum {
    apply_less_user,
    apply_user,
    verify_user,
    nothing_user,
    exists_user,
    delete_less_user,
    delete_user
  };
  Users users(
      {apply_less, d.apply(), d.verify(), Permissions{}, d.look(), delete_less, d.remove()});

  auto apply = s.cli({"topology", "apply"}, users.url(apply_less_user));
  INFO(apply->out() << apply->err());
  CHECK(apply->wait() == 3);
  CHECK_THAT(apply->out(), Catch::Contains("access to exchange '" + s.service.name + ".wait'"));
  CHECK(says_permission(apply->out(), "write", "exchange '" + s.service.name + ".wait'"));

  apply = s.cli({"topology", "apply"}, users.url(apply_user));
  INFO(apply->out() << apply->err());
  CHECK(apply->wait() == 0);
  CHECK(s.depth(s.service.name + ".wait.200ms") == 0);

  auto verify = s.cli({"topology", "verify"}, users.url(verify_user));
  INFO(verify->out() << verify->err());
  CHECK(verify->wait() == 0);
  CHECK_THAT(verify->out(), Catch::Contains("6 match"));

  // Whether a user may look at an object it holds no permission on: RabbitMQ 4.2.6 and 4.3
  // refuse the passive declare, so --exists-only takes read on the objects there.
  const bool look_needs_permission = test::broker_version() == "4.3";
  verify = s.cli({"topology", "verify", "--exists-only"}, users.url(nothing_user));
  INFO(verify->out() << verify->err());
  CHECK(verify->wait() == (look_needs_permission ? 3 : 0));
  verify = s.cli({"topology", "verify", "--exists-only"}, users.url(exists_user));
  INFO(verify->out() << verify->err());
  CHECK(verify->wait() == 0);
  verify = s.cli({"topology", "verify"}, users.url(nothing_user));
  INFO(verify->out() << verify->err());
  CHECK(verify->wait() == 3);
  if (look_needs_permission) {
    CHECK(says_permission(verify->out(), "configure", "queue '" + s.parking() + "'"));
  } else {
    CHECK_THAT(verify->out(), Catch::Contains("403: it takes configure permission"));
  }

  // Deleting the parking queue is refused, so it and its exchange are kept.
  auto remove = s.cli({"topology", "delete", "--yes"}, users.url(delete_less_user));
  INFO(remove->out() << remove->err());
  CHECK(remove->wait() == 3);
  CHECK_THAT(remove->out(), Catch::Contains("access to queue '" + s.parking() + "'"));
  CHECK(says_permission(remove->out(), "configure", "queue '" + s.parking() + "'"));
  CHECK(s.depth(s.parking()) == 0);

  remove = s.cli({"topology", "delete", "--yes"}, users.url(delete_user));
  INFO(remove->out() << remove->err());
  CHECK(remove->wait() == 0);
  CHECK_THAT(remove->out(), Catch::Contains("2 deleted"));
}

TEST_CASE(
    "retryloop parking list, stats, replay and purge work with exactly the documented "
    "permissions and exit 3 naming what is missing with less",
    "[integration][permissions]") {
  TestLoop loop;
  Service s(loop, "reject");
  s.apply();
  s.publish(s.parking(), "", "parked-1");
  s.publish(s.parking(), "", "parked-2");
  const Documented d = s.documented();
  enum { nothing_user, read_user, replay_user };
  Users users({Permissions{}, d.parking_read(), d.replay()});

  auto list = s.cli({"parking", "list"}, users.url(nothing_user));
  INFO(list->out() << list->err());
  CHECK(list->wait() == 3);
  if (test::broker_version() == "4.3") {
    // 4.3 refuses even the look at the queue to a user without any permission on it.
    CHECK_THAT(list->err(), Catch::Contains("access to queue '" + s.parking() + "'") &&
                                Catch::Contains("read, which parking reads need, is enough"));
  } else {
    CHECK(names_permission(list->err(), "basic.consume", "read", "queue '" + s.parking() + "'"));
  }

  list = s.cli({"parking", "list"}, users.url(read_user));
  INFO(list->out() << list->err());
  CHECK(list->wait() == 0);
  CHECK_THAT(list->out(), Catch::Contains("parked-1") && Catch::Contains("parked-2"));
  auto stats = s.cli({"parking", "stats"}, users.url(read_user));
  INFO(stats->out() << stats->err());
  CHECK(stats->wait() == 0);
  // The wait queues' depths need a look at them, which 4.3 refuses to a user with no permission
  // on them: stats says which it left out, where it would otherwise list them as if they were
  // missing.
  const bool says_not_counted =
      stats->out().find("not counted, no permission to look at them") != std::string::npos;
  CHECK(says_not_counted == (test::broker_version() == "4.3"));
  if (says_not_counted) CHECK_THAT(stats->out(), Catch::Contains(s.queue()));
  auto dry_run = s.cli({"parking", "replay", "--dry-run"}, users.url(read_user));
  INFO(dry_run->out() << dry_run->err());
  CHECK(dry_run->wait() == 0);
  CHECK(s.depth(s.parking()) == 2);

  // Replay may read parking but not publish through the default exchange: nothing moves.
  auto replay = s.cli({"parking", "replay"}, users.url(read_user));
  INFO(replay->out() << replay->err());
  CHECK(replay->wait() == 3);
  CHECK(names_permission(replay->err(), "basic.publish", "write", "exchange 'amq.default'"));
  CHECK(s.depth(s.parking()) == 2);
  CHECK(s.depth(s.queue()) == 0);

  replay = s.cli({"parking", "replay"}, users.url(replay_user));
  INFO(replay->out() << replay->err());
  CHECK(replay->wait() == 0);
  CHECK(s.depth(s.parking()) == 0);
  CHECK(s.drain(s.queue()) == std::vector<std::string>{"parked-1", "parked-2"});

  // purge takes messages with acks: read is enough.
  s.publish(s.parking(), "", "parked-3");
  auto purge = s.cli({"parking", "purge", "--yes"}, users.url(read_user));
  INFO(purge->out() << purge->err());
  CHECK(purge->wait() == 0);
  CHECK(s.depth(s.parking()) == 0);

  // A replay to a queue that is gone moves nothing: the look-up says so where the user may look
  // (3.10, 4.0), and where it may not (4.3) each copy comes back unroutable and stays parked.
  s.publish(s.parking(), "", "parked-4");
  bool deleted = false;
  REQUIRE_FALSE(s.channel->queue_delete(s.queue(), false, false,
                                        [&](const Error&, uint32_t) { deleted = true; }));
  REQUIRE(loop.run_until([&] { return deleted; }));
  replay = s.cli({"parking", "replay"}, users.url(replay_user));
  INFO(replay->out() << replay->err());
  CHECK(replay->wait() == 3);
  CHECK(s.depth(s.parking()) == 1);
}

TEST_CASE(
    "A service with delay levels works with the documented permissions on the shared levels, "
    "declaring its topology or not",
    "[integration][permissions][delay-levels]") {
  TestLoop loop;
  const std::string levels_json = R"({"base": "9ms", "levels": 6})";
  Service declaring(loop, "republish", levels_json), fixed(loop, "republish", levels_json);
  fixed.apply();
  const std::string levels = "retryloop\\.delay\\.9ms\\..*";
  const Documented d = declaring.documented(), f = fixed.documented();
  Permissions apply{only(d.with(d.with(d.loop(), d.x), levels)), only(d.with(d.loop(), levels)),
                    only(d.with(d.with(d.loop(), d.x), levels))};
  Permissions consumer = f.consumer(topology::RetryMode::republish);
  consumer.write =
      only({f.n + "\\.wait", f.n + "\\.parking", "retryloop\\.delay\\.9ms\\.(\\d\\d|deliver)"});
  Permissions no_levels = f.consumer(topology::RetryMode::republish);
  Users users({apply, consumer, no_levels});
  size_t user = 0;
  for (Service* s : {&declaring, &fixed}) {
    INFO((s == &declaring ? "declaring" : "not declaring"));
    ConsumerRun run;
    auto c = start_consumer(loop, s->service, users.url(user++), s == &declaring, run);
    REQUIRE(loop.run_until([&] { return run.ready || run.stopped; }));
    INFO(run.fatal.message());
    REQUIRE(run.ready);
    s->publish(s->service.input.exchange, "key", "after");
    REQUIRE(loop.run_until([&] { return c->metrics().acked == 1 || run.stopped; }, 10s));
    stop_cleanly(loop, c, run);
    CHECK(run.attempts["after"] == std::vector<int64_t>{1, 2});
  }

  // Without write on the levels the retry's copy is refused: 50 ms is 6 units of 9 ms, so the
  // copy goes to level 2, the highest bit.
  Error fatal = fatal_error(loop, fixed.service, users.url(user), false, [&](ConsumerRun& run) {
    REQUIRE(loop.run_until([&] { return run.ready || run.stopped; }));
    fixed.publish(fixed.service.input.exchange, "key", "after-refused");
  });
  CHECK(names_permission(fatal.message(), "basic.publish", "write",
                         "exchange 'retryloop.delay.9ms.02'"));
  CHECK(fixed.drain(fixed.queue()) == std::vector<std::string>{"after-refused"});
}
