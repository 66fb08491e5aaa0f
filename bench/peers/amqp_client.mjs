// The @cloudamqp/amqp-client peer (npm), as its README uses it.
//
//   node amqp_client.mjs consume URL QUEUE COUNT PREFETCH   ack each delivery, no-op handler
//   node amqp_client.mjs publish URL QUEUE COUNT WINDOW     confirms, at most WINDOW unconfirmed
//
// Prints one JSON line: the time from the first delivery (or publish) to the last ack (or
// confirm), and the process's CPU time over the same window.
import { AMQPClient } from '@cloudamqp/amqp-client';

const cpuSeconds = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const death = (queue, reason) => ({
  count: 2, reason, queue, time: new Date(1700000000 * 1000),
  exchange: 'orders.in', 'routing-keys': ['order.created'],
});
// Headers as a message has them after two trips through a retry loop.
const headers = {
  'x-death': [death('orders.wait.30s', 'expired'), death('orders', 'rejected')],
  'x-first-death-exchange': 'orders.in',
  'x-first-death-queue': 'orders',
  'x-first-death-reason': 'rejected',
  'trace-id': '4bf92f3577b34da6a3ce929d0e0e4736',
};

function report(bench, count, setting, t0, cpu0) {
  const t1 = Date.now() / 1000;
  console.log(JSON.stringify({
    client: 'amqp-client.js', bench, messages: count, ...setting, seconds: t1 - t0,
    rate: count / (t1 - t0), cpu_seconds: cpuSeconds() - cpu0, t0, t1,
  }));
}

async function consume(ch, queue, count, prefetch) {
  await ch.prefetch(prefetch);
  let received = 0, t0, cpu0;
  await new Promise((resolve) => {
    ch.basicConsume(queue, { noAck: false }, (msg) => {
      if (received === 0) { t0 = Date.now() / 1000; cpu0 = cpuSeconds(); }
      msg.ack();
      if (++received === count) resolve();
    });
  });
  report('consume', count, { prefetch }, t0, cpu0);
}

async function publish(ch, queue, count, window) {
  await ch.confirmSelect();
  const body = new Uint8Array(1024).fill(0x78);
  const properties = { deliveryMode: 2, contentType: 'application/json', messageId: 'bench', headers };
  const t0 = Date.now() / 1000, cpu0 = cpuSeconds();
  const inFlight = [];
  for (let i = 0; i < count; i++) {
    if (inFlight.length === window) await inFlight.shift();
    inFlight.push(ch.basicPublish('', queue, body, properties)); // resolves when confirmed
  }
  await Promise.all(inFlight);
  report('publish', count, { window }, t0, cpu0);
}

const [mode, url, queue, count, setting] = process.argv.slice(2);
const conn = await new AMQPClient(url).connect();
const ch = await conn.channel();
if (mode === 'consume') await consume(ch, queue, Number(count), Number(setting));
else await publish(ch, queue, Number(count), Number(setting));
await conn.close();
