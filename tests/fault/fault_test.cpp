// The fault suite: one fault per test case, injected while scripted messages flow through four
// services at once (reject and republish mode, each with classic and quorum queues). Each run ends
// with every message id classified: acked, parked with the right reason, lost, duplicated beyond
// the at-least-once window, or unexpected. A run passes with nothing lost, nothing unexpected,
// and every message where its script says.
//
// Faults restart, kill and block the whole broker, so the suite needs a broker of its own
// (scripts/test runs it as a separate stage); its ctest entries run one at a time.

#include <signal.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fault_harness.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace retryloop::test::fault;
using test::ChildProcess;
using test::TestLoop;

namespace {

uint16_t amqp_port() {
  const char* port = std::getenv("RETRYLOOP_TEST_AMQP_PORT");
  REQUIRE(port != nullptr);
  return uint16_t(std::stoi(port));
}

std::string url_with_port(uint16_t port, const std::string& query = "") {
  return "amqp://guest:guest@127.0.0.1:" + std::to_string(port) + "/" + query;
}

/// The memory watermark RabbitMQ starts with; restored however the test ends.
struct RestoreWatermark {
  ~RestoreWatermark() { test::broker_ctl("set_vm_memory_high_watermark 0.4"); }
};

}  // namespace

TEST_CASE(
    "A broker restart (stop_app then start_app) mid-loop loses nothing, retries waiting in the "
    "delay levels included",
    "[fault]") {
  BrokerBackUp back_up;
  InProcessRun::Options options;
  options.delay_levels = true;
  // Classic queues dead-letter at most once: RabbitMQ 4.0 once dropped 1 of 300 retries of a
  // classic lane whose delay ended as the broker stopped. Quorum lanes are checked for none.
  options.classic_may_lose = true;
  // The handlers are held from just before stop_app until the consumers have lost the broker:
  // on a loaded machine rabbitmqctl can take longer than the whole stream.
  options.gated = true;
  InProcessRun run("restart", options);
  std::string output;
  run.start(test::broker_url());
  run.wait_flowing(0.05);
  uint32_t waiting = 0;
  for (const auto& lane : run.lanes) {
    if (!lane->delay_levels) continue;
    for (const auto& queue : lane->waiting_queues())
      waiting += run.probe.depth(queue).messages;
  }
  INFO("retries waiting in the delay levels as the broker is told to stop: " << waiting);
  CHECK(waiting > 0);
  run.hold();
  expect_ok(ctl_async(run.loop, {"stop_app"}, &output), output);
  run.check_mid_stream();
  run.release();
  expect_ok(ctl_async(run.loop, {"start_app"}, &output), output);
  CHECK(run.wait_quiet_after_restart("broker restart"));
  for (const auto& c : run.consumers)
    CHECK(c->get().metrics().reconnects >= 1);
  run.finish("broker restart");
}

TEST_CASE("A broker killed with SIGKILL and restarted mid-loop loses nothing", "[fault]") {
  BrokerBackUp back_up;
  // The handlers are held from just before the kill until the consumers have lost the broker:
  // on a loaded machine scripts/broker can take longer than the whole stream.
  InProcessRun run("kill", true);
  std::string output;
  // The crash must hit the loop, not the creation of its queues: RabbitMQ 3.10 writes a new
  // quorum queue's Ra registration to disk lazily, and a queue created moments before a crash
  // can come back without a leader. Have the broker write it now.
  expect_ok(
      ctl_async(run.loop,
                {"eval", "ok = dets:sync(ra_directory_reverse), ok = dets:sync(ra_log_meta)."},
                &output),
      output);
  run.start(test::broker_url());
  run.wait_flowing(0.15);
  const auto kill_started = Clock::now();
  run.hold();
  expect_ok(broker_script_async(run.loop, "kill", &output), output);
  const auto killed_at = Clock::now();
  run.check_mid_stream();
  run.release();
  expect_ok(broker_script_async(run.loop, "restart", &output), output);
  CHECK(run.wait_quiet_after_restart("broker SIGKILL + restart"));
  for (const auto& c : run.consumers)
    CHECK(c->get().metrics().reconnects >= 1);
  // A crash widens the at-least-once window: classic queues write acks and rejects to disk
  // lazily, so what was settled shortly before the kill (about 0.6 s here) may come back. Every
  // message settled in the 2 s before the kill may be duplicated once.
  std::vector<size_t> settled_before_kill;
  for (const auto& ledger : run.ledgers) {
    std::set<std::string> ids;
    for (const auto& call : ledger->calls()) {
      if (call.at >= kill_started - 2s && call.at <= killed_at) ids.insert(call.id);
    }
    settled_before_kill.push_back(ids.size());
  }
  run.finish("broker SIGKILL + restart", settled_before_kill);
}

TEST_CASE("The broker closing every connection mid-loop loses nothing", "[fault]") {
  // The handlers are held from just before the command until the consumers have lost their
  // connections: on a loaded machine rabbitmqctl can take longer than the whole stream.
  InProcessRun run("closeall", true);
  std::string output;
  run.start(test::broker_url());
  run.wait_flowing(0.05);
  run.hold();
  expect_ok(ctl_async(run.loop, {"close_all_connections", "fault suite: closing every connection"},
                      &output),
            output);
  run.check_mid_stream();
  run.release();
  CHECK(run.wait_quiet());
  for (const auto& c : run.consumers)
    CHECK(c->get().metrics().reconnects >= 1);
  run.finish("close_all_connections");
}

TEST_CASE("A network path frozen until heartbeats expire loses nothing", "[fault]") {
  InProcessRun run("freeze");
  test::TcpProxy proxy(run.loop.get(), amqp_port());
  run.start(url_with_port(proxy.port(), "?heartbeat=2"));
  run.wait_flowing(0.25);
  proxy.freeze();
  const auto frozen_at = Clock::now();  // the proxy is in this process: frozen now
  run.check_mid_stream(frozen_at);
  // Both sides stop hearing each other; the consumers notice within two heartbeat intervals.
  REQUIRE(poll_until(run.loop, 60s, [&] {
    for (const auto& c : run.consumers) {
      if (c->get().is_consuming()) return false;
    }
    return true;
  }));
  const double noticed = seconds_since(frozen_at);
  CHECK(noticed < 10.0);
  proxy.thaw();
  CHECK(run.wait_quiet());
  for (const auto& c : run.consumers)
    CHECK(c->get().metrics().reconnects >= 1);
  run.finish("network frozen (heartbeat 2s)");
  proxy.close();
}

TEST_CASE("A 5 s memory alarm mid-stream loses nothing and acks keep flowing", "[fault]") {
  // An alarm closes no connection that would show when it came, and on a loaded machine
  // rabbitmqctl can take longer than the whole stream: the handlers are held, with every outcome
  // settled, from before the alarm until the broker is seen to block a publisher.
  InProcessRun run("alarm", true);
  run.start(test::broker_url());
  run.wait_flowing(0.05);
  run.hold_settled();
  AlarmWitness witness(run.loop, test::broker_url());
  RestoreWatermark restore;  // before the witness closes, which the alarm would hold up
  std::string output;
  const auto command_started = Clock::now();
  expect_ok(ctl_async(run.loop, {"set_vm_memory_high_watermark", "0"}, &output), output);
  const auto alarm_at = witness.wait_blocked();
  {
    INFO("the broker blocked no publisher within 60 s of the alarm");
    REQUIRE(alarm_at.has_value());
  }
  run.check_mid_stream(*alarm_at);
  // Counted once the alarm is in place: the broker has long since handed out what the last acks
  // before the hold made room for, and nothing has been settled since.
  std::vector<consumer::Metrics> at_alarm;
  std::vector<size_t> acks_at_alarm;
  for (size_t i = 0; i < run.lanes.size(); ++i) {
    at_alarm.push_back(run.consumers[i]->get().metrics());
    acks_at_alarm.push_back(run.ledgers[i]->acks().size());
  }
  run.release();
  // The fault lasts at least 5 s from when it was seen. Meanwhile acks keep flowing: every lane's
  // handlers ack more messages, and the broker, taking the acks on the consuming connections
  // (which the alarm does not block), delivers more; while each consumer's publishing connection
  // is blocked at its first copy, and no copy gets through. How soon the acks come depends on
  // the machine: they are waited for, up to 60 s, and the alarm lasts until then.
  auto acks_flowing = [&](size_t i) {
    return run.ledgers[i]->acks().size() > acks_at_alarm[i] &&
           run.consumers[i]->get().metrics().delivered > at_alarm[i].delivered;
  };
  poll_until(run.loop, 60s, [&] {
    for (size_t i = 0; i < run.lanes.size(); ++i) {
      if (!acks_flowing(i) || !run.consumers[i]->get().is_blocked()) return false;
    }
    return true;
  });
  const auto five_seconds_in = *alarm_at + 5s;
  if (Clock::now() < five_seconds_in) {
    run.loop.run_for(
        std::chrono::duration_cast<std::chrono::milliseconds>(five_seconds_in - Clock::now()));
  }
  CHECK(witness.blocked());  // the alarm was in place throughout
  std::string acked_meanwhile;
  for (size_t i = 0; i < run.lanes.size(); ++i) {
    INFO(run.lanes[i]->label());
    const auto& c = run.consumers[i]->get();
    acked_meanwhile += " " + run.lanes[i]->label() + " " +
                       std::to_string(run.ledgers[i]->acks().size() - acks_at_alarm[i]);
    CHECK(acks_flowing(i));
    CHECK(c.is_blocked());
    const auto now = c.metrics();
    CHECK(now.parked() == at_alarm[i].parked());
    if (run.lanes[i]->mode == topology::RetryMode::republish) {
      CHECK(now.retried == at_alarm[i].retried);
    }
  }
  const double lasted = seconds_since(*alarm_at);
  expect_ok(ctl_async(run.loop, {"set_vm_memory_high_watermark", "0.4"}, &output), output);
  CHECK(witness.wait_unblocked().has_value());
  CHECK(run.wait_quiet());
  run.finish("memory alarm 5s");
  char timing[160];
  std::snprintf(timing, sizeof timing,
                "memory alarm: seen by a publisher %.1f s after rabbitmqctl started, held %.1f s; "
                "acks meanwhile:",
                std::chrono::duration<double>(*alarm_at - command_started).count(), lasted);
  note(timing + acked_meanwhile);
}

TEST_CASE(
    "A wait queue deleted mid-loop sends the retries that follow to parking, not to the "
    "floor",
    "[fault]") {
  InProcessRun run("waitdel", true);
  run.start(test::broker_url());
  run.wait_flowing(0.3);
  // Hold every handler, let the copies settle and the wait queues empty (a message enters a wait
  // queue for 200 ms, so several empty looks 100 ms apart mean it is empty), then delete them:
  // the operator's deletion itself drops nothing.
  for (auto& gate : run.gates)
    gate->close();
  std::vector<bool> deleted(run.lanes.size(), false);
  std::vector<int> empty_looks(run.lanes.size(), 0);
  REQUIRE(poll_until(
      run.loop, 60s,
      [&] {
        for (size_t i = 0; i < run.lanes.size(); ++i) {
          if (deleted[i]) continue;
          const Lane& lane = *run.lanes[i];
          const auto metrics = run.consumers[i]->get().metrics();
          const uint64_t settled = metrics.acked + metrics.retried + metrics.parked() +
                                   metrics.dropped + metrics.abandoned;
          const auto wait = run.probe.depth(lane.wait_queue());
          if (settled != run.ledgers[i]->size() || !wait.ok || wait.messages != 0) {
            empty_looks[i] = 0;
            continue;
          }
          if (++empty_looks[i] < 4) continue;
          const bool classic = lane.queue_type == topology::QueueType::classic;
          // Quorum queues refuse if-empty; the gate keeps them empty anyway.
          client::Error error = run.probe.delete_queue(lane.wait_queue(), classic);
          if (error) {
            empty_looks[i] = 0;
            continue;
          }
          deleted[i] = true;
          // From here on every retry lands in parking through the wait exchange's alternate
          // exchange; a message's next attempt decides whether it still needs one.
          std::map<std::string, int64_t> next_attempt;
          std::set<std::string> settled_ids;
          for (const auto& call : run.ledgers[i]->calls()) {
            if (call.outcome == consumer::OutcomeKind::retry) {
              next_attempt[call.id] = std::max(next_attempt[call.id], call.attempt + 1);
            } else {
              settled_ids.insert(call.id);
            }
          }
          for (const auto& script : lane.scripts) {
            if (settled_ids.count(script.id) != 0) continue;
            auto it = next_attempt.find(script.id);
            run.lanes[i]->expected[script.id] =
                expect_without_wait_queue(script, it == next_attempt.end() ? 1 : it->second);
          }
        }
        return std::all_of(deleted.begin(), deleted.end(), [](bool d) { return d; });
      },
      100ms));
  for (auto& gate : run.gates)
    gate->open();
  std::string unrouted;
  for (const auto& lane : run.lanes) {
    INFO(lane->label());
    const size_t n = lane->expected_count(Expect::parked_unrouted);
    CHECK(n > 0);
    unrouted += " " + lane->label() + " " + std::to_string(n);
  }
  CHECK(run.wait_quiet());
  for (const auto& c : run.consumers)
    CHECK(c->get().metrics().reconnects == 0);
  run.finish("wait queue deleted");
  note("wait queue deleted: parked through the alternate exchange, without retryloop-reason:" +
       unrouted);
}

TEST_CASE(
    "A service queue deleted while retries wait (a redeploy) loses none of them: they are "
    "parked as unrouted and replayed once the queue is back",
    "[fault]") {
  // The wait queues dead-letter through the wait exchange under Q's name; with Q gone the
  // exchange's alternate exchange parks the retry (docs/topology.md, "Safety rules").
  TestLoop loop;
  Probe probe(loop, test::broker_url());
  // Retries wait 3 s here, so that the queue can be deleted while they wait.
  const std::chrono::milliseconds delay = 3s;
  auto lanes = make_lanes("qdel", delay);
  set_up(probe, lanes);
  const auto started = Clock::now();
  std::vector<std::unique_ptr<Ledger>> ledgers;
  std::vector<std::unique_ptr<LaneConsumer>> consumers;
  for (const auto& lane : lanes) {
    ledgers.push_back(std::make_unique<Ledger>());
    consumers.push_back(
        std::make_unique<LaneConsumer>(loop, *lane, test::broker_url(), *ledgers.back()));
    consumers.back()->start();
  }
  REQUIRE(poll_until(loop, 60s, [&] {
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (ledgers[i]->size() < messages_per_lane / 3) return false;
      if (probe.depth(lanes[i]->wait_queue()).messages < 10) return false;
    }
    return true;
  }));

  // The redeploy: the consumers stop, the operator moves the queue's messages aside (they are
  // not what this fault is about) and deletes the queue while retries wait. To move exactly what
  // is in the queue aside, its binding from the wait exchange goes first: a retry whose delay
  // ends from then on takes the path it takes once the queue is gone (quorum queues refuse the
  // if-empty delete that would otherwise catch one arriving between the drain and the delete).
  for (auto& c : consumers)
    c->stop();
  for (const auto& lane : lanes) {
    REQUIRE_FALSE(probe.unbind_queue(lane->input_queue(),
                                     topology::wait_exchange_name(lane->service.name),
                                     lane->input_queue()));
  }
  // What waits is counted as soon as every binding is gone, for all lanes at once: each of
  // these retries takes the unrouted path from now on, however long the drains below take.
  std::vector<uint32_t> waiting(lanes.size(), 0);
  std::vector<uint32_t> parked_before(lanes.size(), 0);
  for (size_t i = 0; i < lanes.size(); ++i) {
    parked_before[i] = probe.depth(lanes[i]->parking_queue()).messages;
    waiting[i] = probe.depth(lanes[i]->wait_queue()).messages;
    INFO(lanes[i]->label());
    CHECK(waiting[i] > 0);
  }
  std::vector<std::vector<std::pair<std::string, std::string>>> aside(lanes.size());
  for (size_t i = 0; i < lanes.size(); ++i) {
    const Lane& lane = *lanes[i];
    INFO(lane.label());
    bool deleted = false;
    for (int tries = 0; tries < 20 && !deleted; ++tries) {
      std::vector<client::GetResult> taken;
      REQUIRE(probe.drain(lane.input_queue(), taken));
      for (const auto& m : taken) {
        aside[i].emplace_back(m.message.properties.message_id.value_or(""), m.message.body);
      }
      // Classic: if-empty, so a retry that came back meanwhile stops it. Quorum queues refuse
      // if-empty; the drain just before is all there is.
      deleted =
          !probe.delete_queue(lane.input_queue(), lane.queue_type == topology::QueueType::classic);
    }
    REQUIRE(deleted);
  }

  // Their delay ends while the queue is gone: every one of them is parked. Quorum wait queues
  // dead-letter at-least-once: a retry that was on its way into Q when Q went is sent again,
  // so parking may get a few more than were waiting; it is read once it holds still.
  // The lanes are watched together, so that their quiet seconds overlap.
  std::vector<uint32_t> still_waiting(lanes.size(), 0);
  std::vector<uint32_t> parked_meanwhile(lanes.size(), 0);
  std::vector<uint32_t> last(lanes.size(), 0);
  std::vector<Clock::time_point> since_change(lanes.size(), Clock::now());
  std::string not_settled;
  const bool settled = poll_until(loop, delay + 30s, [&] {
    not_settled.clear();
    for (size_t i = 0; i < lanes.size(); ++i) {
      const uint32_t parked = probe.depth(lanes[i]->parking_queue()).messages;
      if (parked != last[i]) {
        last[i] = parked;
        since_change[i] = Clock::now();
      }
      if (probe.depth(lanes[i]->wait_queue()).messages != 0 ||
          parked < parked_before[i] + waiting[i] || Clock::now() - since_change[i] <= 3s) {
        not_settled += " " + lanes[i]->label();
      }
    }
    return not_settled.empty();
  });
  {
    INFO("lanes whose retries had not all been parked:" << not_settled);
    CHECK(settled);
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    still_waiting[i] = probe.depth(lanes[i]->wait_queue()).messages;
    parked_meanwhile[i] = probe.depth(lanes[i]->parking_queue()).messages - parked_before[i];
  }

  // The new deploy declares the queue again and puts back the messages set aside; the operator
  // replays what the broker parked; consumers start.
  std::vector<QuietCheck> checks;
  std::vector<std::unique_ptr<LaneConsumer>> second;
  for (size_t i = 0; i < lanes.size(); ++i) {
    INFO(lanes[i]->label());
    REQUIRE_FALSE(probe.apply(lanes[i]->plan()));
    REQUIRE(probe.publish("", lanes[i]->input_queue(), aside[i]) == aside[i].size());
    ChildProcess replay({test::built_program("retryloop"), "parking", "replay", "--url",
                         test::broker_url(), "-t", lanes[i]->topology_path, lanes[i]->service.name,
                         "--reason", "unrouted"});
    const int replay_exit = replay.wait();
    INFO(replay.err());
    CHECK(replay_exit == 0);
    // It takes every retry parked as unrouted by now: at least those counted above. A loaded
    // 3.10 broker parked a few more after the count had held still for 3 s; the ledgers below
    // check that each message is handled once.
    const size_t moved_at = replay.err().find("moved ");
    REQUIRE(moved_at != std::string::npos);
    CHECK(std::stoul(replay.err().substr(moved_at + 6)) >= parked_meanwhile[i]);
    second.push_back(
        std::make_unique<LaneConsumer>(loop, *lanes[i], test::broker_url(), *ledgers[i]));
    second.back()->start();
    LaneConsumer* c = second.back().get();
    Ledger* ledger = ledgers[i].get();
    checks.push_back(
        {lanes[i].get(), [c] { return c->idle(); }, [ledger] { return ledger->acks(); }});
  }
  wait_quiet(loop, probe, checks);
  for (auto& c : second)
    c->stop();
  const double seconds = seconds_since(started);
  std::string counts;
  for (size_t i = 0; i < lanes.size(); ++i) {
    Tally tally = classify(probe, *lanes[i], ledgers[i]->acks());
    counts += " " + lanes[i]->label() + ": " + std::to_string(waiting[i]) + " waiting, " +
              std::to_string(still_waiting[i]) + " still waiting after the delay, " +
              std::to_string(parked_meanwhile[i]) + " parked meanwhile, " +
              std::to_string(tally.lost) + " lost;";
    report("service queue deleted", *lanes[i], tally, seconds, 0);
  }
  note("service queue deleted while retries wait:" + counts);
  tear_down(probe, lanes);
}

TEST_CASE("A consumer process killed with SIGKILL mid-handling and started again loses nothing",
          "[fault]") {
  TestLoop loop;
  Probe probe(loop, test::broker_url());
  auto lanes = make_lanes("sigkill");
  set_up(probe, lanes);
  const auto started = Clock::now();
  std::vector<std::unique_ptr<ChildProcess>> first;
  for (const auto& lane : lanes)
    first.push_back(start_demo_consumer(*lane, test::broker_url()));
  std::vector<Ledger> ledgers(lanes.size());
  // Each is killed once it has handled a quarter of its messages: mid-stream, two handlers
  // sleeping inside their 10 ms.
  std::vector<bool> killed(lanes.size(), false);
  REQUIRE(poll_until(
      loop, 60s,
      [&] {
        for (size_t i = 0; i < lanes.size(); ++i) {
          if (killed[i]) continue;
          const std::string out = first[i]->out();
          if (size_t(std::count(out.begin(), out.end(), '\n')) < messages_per_lane / 4) continue;
          first[i]->signal(SIGKILL);
          CHECK(first[i]->wait() == 128 + SIGKILL);
          killed[i] = true;
        }
        return std::all_of(killed.begin(), killed.end(), [](bool k) { return k; });
      },
      5ms));
  std::vector<std::unique_ptr<ChildProcess>> second;
  for (size_t i = 0; i < lanes.size(); ++i) {
    add_demo_output(ledgers[i], first[i]->out());
    INFO(first[i]->err());
    CHECK(ledgers[i].acks().size() < lanes[i]->expected_count(Expect::acked));
    second.push_back(start_demo_consumer(*lanes[i], test::broker_url()));
  }
  std::vector<QuietCheck> checks;
  for (size_t i = 0; i < lanes.size(); ++i) {
    ChildProcess* child = second[i].get();
    Ledger* before = &ledgers[i];
    checks.push_back({lanes[i].get(), [] { return true; },
                      [child, before] {
                        Ledger now;
                        add_demo_output(now, child->out());
                        auto acks = before->acks();
                        for (const auto& id : now.acks())
                          acks.insert(id);
                        return acks;
                      }});
  }
  CHECK(wait_quiet(loop, probe, checks));
  // At-least-once: what the killed process had handled but not yet acked comes back.
  finish_demo_consumers(probe, lanes, second, ledgers, "consumer SIGKILL + restart", started,
                        consumer_prefetch);
}

TEST_CASE(
    "A parking replay killed mid-run loses nothing: the replayed messages are handled "
    "again",
    "[fault]") {
  TestLoop loop;
  Probe probe(loop, test::broker_url());
  auto lanes = make_lanes("replay");
  set_up(probe, lanes);
  const auto started = Clock::now();

  park_everything(loop, probe, lanes);  // an outage

  // The cause is fixed; the on-call engineer replays the exhausted ones. The replay goes through
  // a proxy that freezes once a few of them have moved, so it is killed with copies in flight.
  const size_t replay_window = 5;
  test::TcpProxy proxy(loop.get(), amqp_port());
  for (const auto& lane : lanes) {
    const size_t exhausted =
        lane->expected_count(Expect::parked_exhausted) + lane->expected_count(Expect::acked);
    auto replay_command = [&](const std::string& url) {
      return std::vector<std::string>{test::built_program("retryloop"),
                                      "parking",
                                      "replay",
                                      "--url",
                                      url,
                                      "-t",
                                      lane->topology_path,
                                      lane->service.name,
                                      "--where",
                                      "retryloop-reason=exhausted",
                                      "--window",
                                      std::to_string(replay_window)};
    };
    INFO(lane->label());
    {
      ChildProcess replay(replay_command(url_with_port(proxy.port())));
      REQUIRE(poll_until(
          loop, 60s,
          [&] { return probe.depth(lane->input_queue()).messages >= 8 || !replay.running(); },
          2ms));
      proxy.freeze();
      const bool mid_run = replay.running();
      replay.signal(SIGKILL);
      INFO(replay.err());
      CHECK(replay.wait() == 128 + SIGKILL);
      proxy.cut();
      proxy.thaw();
      REQUIRE(mid_run);
      // Killed mid-run: some moved, some not, and none are gone once the broker has taken back
      // what the dead replay held (the copies in flight, and the messages it skipped).
      CHECK(probe.depth(lane->input_queue()).messages < exhausted);
      CHECK(poll_until(loop, 30s, [&] {
        return probe.depth(lane->parking_queue()).messages +
                   probe.depth(lane->input_queue()).messages >=
               uint32_t(messages_per_lane);
      }));
    }
    // Run again, to the end.
    std::string output;
    const int code = run_async(loop, replay_command(test::broker_url()), 60s, &output);
    INFO(output);
    CHECK(code == 0);
  }
  proxy.close();

  // Consumers drain what was replayed: the scripts run as written now. A copy confirmed whose
  // parked original was not yet acked is replayed twice: at most the replay window.
  drain_and_report(loop, probe, lanes, "parking replay SIGKILL", started, replay_window);
}

TEST_CASE("A topology mismatch at start-up stops the consumer with exit 3 and consumes nothing",
          "[fault]") {
  TestLoop loop;
  Probe probe(loop, test::broker_url());
  auto lanes = make_lanes("mismatch");
  const auto started = Clock::now();
  for (const auto& lane : lanes) {
    // Everything as the file says, except one object someone declared otherwise: classic lanes
    // find their wait queue with another TTL, quorum lanes find a classic input queue.
    const bool classic = lane->queue_type == topology::QueueType::classic;
    const std::string odd = classic ? lane->wait_queue() : lane->input_queue();
    topology::Plan plan = lane->plan();
    topology::Action odd_action;
    for (auto it = plan.actions.begin(); it != plan.actions.end(); ++it) {
      if (it->kind == topology::ActionKind::declare_queue && it->name == odd) {
        odd_action = *it;
        plan.actions.erase(it);
        break;
      }
    }
    REQUIRE(odd_action.name == odd);
    std::vector<topology::Action> bindings;
    for (auto it = plan.actions.begin(); it != plan.actions.end();) {
      if (it->kind == topology::ActionKind::bind_queue && it->name == odd) {
        bindings.push_back(*it);
        it = plan.actions.erase(it);
      } else {
        ++it;
      }
    }
    REQUIRE_FALSE(probe.apply(plan));
    amqp::FieldTable arguments;
    for (const auto& [name, value] : odd_action.arguments) {
      if (classic && name == "x-message-ttl") {
        arguments.append(name, int64_t(5000));
      } else if (!classic && (name == "x-queue-type" || name == "x-dead-letter-strategy" ||
                              name == "x-delivery-limit")) {
        continue;  // classic queues refuse the strategy and the delivery limit
      } else {
        arguments.append(name, value);
      }
    }
    client::Error error = probe.declare_queue(odd, arguments);
    INFO(error.message());
    REQUIRE_FALSE(error);
    for (const auto& binding : bindings) {
      REQUIRE_FALSE(probe.bind_queue(binding.name, binding.exchange, binding.routing_key));
    }
    std::vector<std::pair<std::string, std::string>> messages;
    for (auto& script : lane->scripts) {
      messages.emplace_back(script.id, script.body);
      lane->expected[script.id] = Expect::queued;
    }
    REQUIRE(probe.publish(lane->service.input.exchange, "key", messages) == messages.size());
  }

  std::vector<std::unique_ptr<ChildProcess>> consumers;
  for (const auto& lane : lanes)
    consumers.push_back(start_demo_consumer(*lane, test::broker_url()));
  for (size_t i = 0; i < lanes.size(); ++i) {
    const Lane& lane = *lanes[i];
    const bool classic = lane.queue_type == topology::QueueType::classic;
    INFO(lane.label());
    int code = -1;
    poll_until(loop, 60s, [&] { return !consumers[i]->running(); });
    code = consumers[i]->wait(1000);
    const std::string err = consumers[i]->err();
    INFO(err);
    CHECK(code == 3);
    CHECK(consumers[i]->out().empty());  // no handler call
    CHECK_THAT(err, Catch::Contains(classic ? lane.wait_queue() : lane.input_queue()));
    CHECK_THAT(err, Catch::Contains("exists with other arguments"));
    CHECK_THAT(err, Catch::Contains(classic ? "x-message-ttl" : "x-queue-type"));
    const auto depth = probe.depth(lane.input_queue());
    CHECK(depth.messages == messages_per_lane);
  }
  const double seconds = seconds_since(started);
  for (const auto& lane : lanes) {
    Tally tally = classify(probe, *lane, {});
    report("topology mismatch at start", *lane, tally, seconds, 0);
  }
  tear_down(probe, lanes);
}

TEST_CASE("A message at the frame size limit ends in a defined place without a reconnect loop",
          "[fault]") {
  // First in each queue: a message whose content header frame is exactly frame_max (131072, the
  // most a client may publish; on a quorum queue the broker adds x-delivery-count, so the consumer
  // gets a larger frame) that the handler acks, then one it fails until it is exhausted, whose
  // retry and parking copies cannot fit frame_max with retryloop's headers added. Behind them,
  // 100 ordinary messages.
  constexpr size_t ordinary = 100;
  InProcessRun run("frame-limit", false, [&](Lane& lane) {
    lane.scripts.resize(ordinary);
    const std::string name = lane.scripts.front().id.substr(0, lane.scripts.front().id.find('/'));
    Script acked;
    acked.id = name + "/big-ack";
    acked.kind = Kind::success;
    acked.body = "{\"id\": \"" + acked.id + "\", \"fail_times\": 0}";
    acked.header_frame_size = 131072;
    Script exhausted;
    exhausted.id = name + "/big-exhausted";
    exhausted.kind = Kind::exhausted;
    exhausted.fail_times = 9;
    exhausted.body = "{\"id\": \"" + exhausted.id + "\", \"fail_times\": 9}";
    exhausted.expect = Expect::parked_exhausted;
    exhausted.header_frame_size = 131072;
    lane.scripts.insert(lane.scripts.begin(), {acked, exhausted});
    lane.expected.clear();
    for (const auto& script : lane.scripts)
      lane.expected[script.id] = script.expect;
  });
  run.start(test::broker_url());
  CHECK(run.wait_quiet());
  std::vector<consumer::Metrics> metrics;
  for (const auto& c : run.consumers)
    metrics.push_back(c->get().metrics());
  run.finish("message at frame_max");
  for (size_t i = 0; i < run.lanes.size(); ++i) {
    INFO(run.lanes[i]->label() << ": " << metrics[i].summary());
    CHECK(metrics[i].reconnects <= 1);
    CHECK(metrics[i].copies_too_large >= 1);
    note("message at frame_max, " + run.lanes[i]->label() + ": " +
         std::to_string(metrics[i].reconnects) + " reconnects, " +
         std::to_string(metrics[i].copies_too_large) + " copies too large");
  }
}

TEST_CASE("Scheduled messages wait through a broker restart, on classic and quorum delay levels",
          "[fault][schedule]") {
  BrokerBackUp back_up;
  TestLoop loop;
  Probe probe(loop, test::broker_url());
  std::string output;
  struct Target {
    std::string queue;
    topology::Schedule schedule;
    std::unique_ptr<schedule::Scheduler> scheduler;
  };
  std::vector<Target> targets;
  for (auto type : {topology::QueueType::classic, topology::QueueType::quorum}) {
    Target target;
    target.queue =
        test::unique_name(type == topology::QueueType::quorum ? "fault.sched.q" : "fault.sched.c");
    amqp::FieldTable arguments;
    if (type == topology::QueueType::quorum) arguments.append("x-queue-type", "quorum");
    REQUIRE_FALSE(probe.declare_queue(target.queue, arguments));
    target.schedule.levels = {std::chrono::milliseconds(500), 5, std::nullopt};  // up to 15.5 s
    target.schedule.queue_type = type;
    target.schedule.queues = {target.queue};
    topology::Topology file;
    file.schedule = target.schedule;
    client::Error applied = probe.apply(topology::make_plan(file));
    INFO(applied.message());
    REQUIRE_FALSE(applied);
    targets.push_back(std::move(target));
  }
  // The quorum level queues were made moments ago: have the broker write their registration now
  // (see the SIGKILL test).
  expect_ok(
      ctl_async(loop,
                {"eval", "ok = dets:sync(ra_directory_reverse), ok = dets:sync(ra_log_meta)."},
                &output),
      output);
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  std::map<std::string, int64_t> due;                  // by message id
  std::map<std::string, topology::QueueType> type_of;  // by message id
  size_t confirmed = 0;
  std::mt19937 random(23);
  constexpr int per_queue = 100;
  for (auto& target : targets) {
    target.scheduler = std::make_unique<schedule::Scheduler>(*channel, target.schedule);
    for (int i = 0; i < per_queue; ++i) {
      const auto delay = std::chrono::milliseconds(1000 + random() % 4000);
      REQUIRE_FALSE(target.scheduler->schedule_in(
          target.queue, {}, "scheduled", delay, [&](const schedule::ScheduleResult& result) {
            INFO(result.publish.error.message());
            CHECK(result.ok());
            due[result.message_id] = result.due_at_ms;
            type_of[result.message_id] = target.schedule.queue_type;
            ++confirmed;
          }));
    }
  }
  REQUIRE(loop.run_until([&] { return confirmed == 2 * per_queue; }, 30s));
  test::close(loop, connection);
  loop.run_for(800ms);  // most move between levels
  expect_ok(ctl_async(loop, {"stop_app"}, &output), output);
  expect_ok(ctl_async(loop, {"start_app"}, &output), output);

  // The messages the delay levels still hold (their queues and unrouted queues): the waits below
  // end once every message arrived or the levels hold none, whatever the machine's speed. Not
  // RabbitMQ 3.10's quorum levels, whose dead-letter worker can hold messages for minutes (below).
  std::vector<std::string> level_queues;
  for (const auto& target : targets) {
    if (target.schedule.queue_type == topology::QueueType::quorum && !test::broker_is_4x())
      continue;
    topology::Topology file;
    file.schedule = target.schedule;
    for (const topology::Action& action : topology::make_plan(file).actions) {
      if (action.kind == topology::ActionKind::declare_queue &&
          action.role == topology::Role::delay_queue)
        level_queues.push_back(action.name);
    }
  }
  REQUIRE_FALSE(level_queues.empty());
  auto in_levels = [&] {
    uint64_t held = 0;
    for (const std::string& queue : level_queues)
      held += probe.depth(queue).messages;
    return held;
  };
  std::map<std::string, int64_t> arrived;  // first arrival, by message id
  size_t copies = 0;
  size_t early = 0;
  // Every message falls due within 15.5 s of its publish; the bound only ends a hang.
  const auto deadline = Clock::now() + 180s;
  auto settled_at = Clock::now() + 2s;  // the levels were empty (and nothing arrived) since
  while (arrived.size() < due.size() && Clock::now() < deadline) {
    const size_t before = arrived.size();
    for (const auto& target : targets) {
      std::vector<client::GetResult> got;
      probe.drain(target.queue, got);
      const int64_t now = schedule::now_ms();
      for (const auto& message : got) {
        const std::string id = message.message.properties.message_id.value_or("");
        ++copies;
        if (due.count(id) && now < due[id]) ++early;
        arrived.emplace(id, now);
      }
    }
    if (arrived.size() != before || in_levels() > 0) {
      settled_at = Clock::now() + 2s;
    } else if (Clock::now() > settled_at) {
      break;  // what has not arrived is nowhere the levels hold it: see below
    }
    loop.run_for(100ms);
  }
  auto missing = [&] {
    std::map<topology::QueueType, size_t> count;
    for (const auto& [id, at] : due)
      count[type_of[id]] += arrived.count(id) == 0 ? 1 : 0;
    return count;
  };
  std::map<topology::QueueType, size_t> late = missing();
  note("scheduled through a broker restart: " + std::to_string(due.size()) + " scheduled, " +
       std::to_string(arrived.size()) + " arrived (" + std::to_string(copies) + " copies), " +
       std::to_string(late[topology::QueueType::classic]) + " on classic levels and " +
       std::to_string(late[topology::QueueType::quorum]) + " on quorum levels not delivered, " +
       std::to_string(early) + " early");
  if (arrived.size() < due.size()) {
    // RabbitMQ 3.10 can dead-letter what falls due while it starts before it has restored the
    // bindings: the levels' alternate exchange keeps those messages in the unrouted queue, and
    // `retryloop schedule redeliver` (this, through the library) sends them on.
    auto connection = test::connect(loop, test::broker_url());
    for (const auto& target : targets) {
      const topology::Service levels = topology::schedule_target(target.schedule, target.queue);
      note(std::string(topology::to_string(target.schedule.queue_type)) + " unrouted queue holds " +
           std::to_string(probe.depth(topology::delay_unrouted_name(levels)).messages));
      parking::ReplayOptions options;
      options.unrouted_retries = true;
      bool replayed = false;
      REQUIRE_FALSE(
          parking::replay(connection, levels, options, [&](const parking::ReplayResult& result) {
            CHECK_FALSE(result.error);
            note("redelivered " + std::to_string(result.progress.moved) + " to " + target.queue);
            replayed = true;
          }));
      REQUIRE(loop.run_until([&] { return replayed; }, 30s));
    }
    test::close(loop, connection);
    const auto redeliver_deadline = Clock::now() + 180s;
    auto redelivered_at = Clock::now() + 2s;
    while (arrived.size() < due.size() && Clock::now() < redeliver_deadline) {
      const size_t before = arrived.size();
      for (const auto& target : targets) {
        std::vector<client::GetResult> got;
        probe.drain(target.queue, got);
        for (const auto& message : got) {
          ++copies;
          arrived.emplace(message.message.properties.message_id.value_or(""), schedule::now_ms());
        }
      }
      if (arrived.size() != before || in_levels() > 0) {
        redelivered_at = Clock::now() + 2s;
      } else if (Clock::now() > redelivered_at) {
        break;
      }
      loop.run_for(100ms);
    }
  }
  const std::map<topology::QueueType, size_t> lost = missing();
  CHECK(early == 0);
  CHECK(lost.at(topology::QueueType::classic) == 0);
  if (test::broker_is_4x()) {
    CHECK(lost.at(topology::QueueType::quorum) == 0);
  } else if (lost.at(topology::QueueType::quorum) > 0) {
    // RabbitMQ 3.10's dead-letter worker holds such messages for its confirm timeout, then
    // routes them to the unrouted queue (measured: 53 of 100 arrived there 3 to 4 minutes after
    // the restart); docs/scheduling.md, "Failures". Too long to wait for here.
    note("RabbitMQ 3.10: " + std::to_string(lost.at(topology::QueueType::quorum)) +
         " scheduled messages held by the quorum levels' dead-letter worker");
  }

  for (const auto& target : targets)
    CHECK_FALSE(probe.delete_queue(target.queue, false));
}
