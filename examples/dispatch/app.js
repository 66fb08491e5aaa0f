// An order service for `retryloop dispatch`, on Node's standard library only.
//
//   node examples/dispatch/app.js 8000
//   retryloop dispatch -t topology/demo.json demo --to http://127.0.0.1:8000/orders
//
// retryloop POSTs each message here. The answer decides: 204 done, 422 parked (a message that
// can never succeed), 503 the dependency is down (held by the breaker, not charged), 500 a retry
// through the broker's wait queue (docs/dispatch.md).
const http = require("http");

http
  .createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      const attempt = Number(request.headers["retryloop-attempt"]);
      let order;
      try {
        order = JSON.parse(Buffer.concat(chunks));
      } catch {
        return response.writeHead(422).end("not JSON");
      }
      if ((order.fail_times || 0) >= attempt) {
        return response.writeHead(500).end("payment gateway timed out");
      }
      console.log(`order ${request.headers["ce-id"]} done on attempt ${attempt}`);
      response.writeHead(204).end();
    });
  })
  .listen(Number(process.argv[2]), "127.0.0.1");
