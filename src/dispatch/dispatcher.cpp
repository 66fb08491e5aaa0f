#include "retryloop/dispatch/dispatcher.hpp"

#include <chrono>
#include <utility>

#include "retryloop/dispatch/answer.hpp"

namespace retryloop::dispatch {
namespace {

/// "POST http://app/orders", or the socket's path for a Unix socket target.
std::string target_text(const std::string& target) {
  return "POST " + target;
}

const char* const answer_classes[] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};

size_t answer_class(int status) {
  return status >= 100 && status <= 599 ? size_t(status / 100) : 0;
}

}  // namespace

std::shared_ptr<Dispatcher> Dispatcher::create(uv_loop_t* loop, DispatcherOptions options) {
  return std::make_shared<Dispatcher>(loop, std::move(options));
}

Dispatcher::Dispatcher(uv_loop_t* loop, DispatcherOptions options)
    : options_(std::move(options)),
      target_text_(target_text(options_.http.target)),
      client_(loop, options_.http) {
  stats_.pool_size = options_.http.pool_size;
}

consumer::AsyncHandler Dispatcher::handler() {
  return [self = shared_from_this()](const consumer::Message& message, consumer::Settle settle) {
    self->dispatch(message, std::move(settle));
  };
}

void Dispatcher::dispatch(const consumer::Message& message, consumer::Settle settle) {
  Request request = make_request(message, options_.request);
  // The callback keeps the dispatcher: close() fails what is in flight, inside close().
  client_.post({}, request.headers, message.body,
               [self = shared_from_this(), settle = std::move(settle)](Response response) {
                 self->answered(response, settle);
               });
}

void Dispatcher::answered(const Response& response, const consumer::Settle& settle) {
  stats_.latency.record(response.elapsed);
  if (response.failure == Failure::none) {
    ++stats_.answers[answer_class(response.status)];
  } else {
    ++stats_.failures[size_t(response.failure)];
  }
  retry::Outcome outcome =
      outcome_of(response, AnswerContext{std::chrono::system_clock::now(), target_text_});
  ++stats_.outcomes[size_t(outcome.kind)];
  settle(std::move(outcome));
}

DispatchStats Dispatcher::stats() const {
  DispatchStats stats = stats_;
  stats.client = client_.stats();
  return stats;
}

void Dispatcher::close(std::function<void()> closed) {
  client_.close(std::move(closed));
}

std::string prometheus_text(const DispatchStats& stats, const std::string& service) {
  using retry::prometheus_sample;
  std::string out;
  auto family = [&out](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  const retry::PrometheusLabels labels{{"service", service}};
  auto labelled = [&service](std::string_view name, std::string value) {
    return retry::PrometheusLabels{{"service", service}, {name, std::move(value)}};
  };

  family("retryloop_dispatch_answers_total", "counter",
         "Answers of the application, by status class (other: a status outside 100-599).");
  for (size_t i = 0; i < stats.answers.size(); ++i) {
    out +=
        prometheus_sample("retryloop_dispatch_answers_total", labelled("class", answer_classes[i]),
                          std::to_string(stats.answers[i]));
  }
  family("retryloop_dispatch_failures_total", "counter",
         "Requests that got no answer, by why: refused, resolve, connect-timeout, timeout, tls, "
         "broken.");
  for (size_t i = 1; i < stats.failures.size(); ++i) {
    out += prometheus_sample("retryloop_dispatch_failures_total",
                             labelled("failure", to_string(Failure(i))),
                             std::to_string(stats.failures[i]));
  }
  family("retryloop_dispatch_outcomes_total", "counter",
         "What the answers meant for the messages: ack, retry, permanent, poison, drop, "
         "unavailable.");
  for (size_t i = 0; i < stats.outcomes.size(); ++i) {
    out += prometheus_sample("retryloop_dispatch_outcomes_total",
                             labelled("outcome", retry::to_string(retry::OutcomeKind(i))),
                             std::to_string(stats.outcomes[i]));
  }
  family("retryloop_dispatch_request_duration_seconds", "histogram",
         "How long each request took, from its start to the answer's end or the failure.");
  out += retry::prometheus_histogram("retryloop_dispatch_request_duration_seconds", labels,
                                     stats.latency);
  family("retryloop_dispatch_in_flight", "gauge", "Requests waiting for their answer.");
  out += prometheus_sample("retryloop_dispatch_in_flight", labels,
                           std::to_string(stats.client.in_flight));
  family("retryloop_dispatch_connections_open", "gauge",
         "Connections to the application open now, busy or idle.");
  out += prometheus_sample("retryloop_dispatch_connections_open", labels,
                           std::to_string(stats.client.connections_open));
  family("retryloop_dispatch_pool_size", "gauge",
         "Connections to the application it may keep open (--pool).");
  out += prometheus_sample("retryloop_dispatch_pool_size", labels, std::to_string(stats.pool_size));
  family("retryloop_dispatch_connections_opened_total", "counter",
         "Connections to the application opened, attempts that failed included.");
  out += prometheus_sample("retryloop_dispatch_connections_opened_total", labels,
                           std::to_string(stats.client.connections_opened));
  family("retryloop_dispatch_bodies_cut_total", "counter",
         "Answers whose body was longer than the limit and was cut (--max-answer).");
  out += prometheus_sample("retryloop_dispatch_bodies_cut_total", labels,
                           std::to_string(stats.client.bodies_cut));
  return out;
}

}  // namespace retryloop::dispatch
