// The amqplib peer (npm amqplib), with its promise API as its examples use it.
//
//   node amqplib.js consume URL QUEUE COUNT PREFETCH   ack each delivery, no-op handler
//   node amqplib.js handle URL QUEUE COUNT PREFETCH    parse each JSON body, read a field, ack
//   node amqplib.js publish URL QUEUE COUNT WINDOW     confirms, at most WINDOW unconfirmed
//
// Prints one JSON line: the time from the first delivery (or publish) to the last ack (or
// confirm), and the process's CPU time over the same window.
const amqp = require('amqplib');

const cpuSeconds = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const death = (queue, reason) => ({
  count: 2, reason, queue, time: { '!': 'timestamp', value: 1700000000 },
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
    client: 'amqplib', bench, messages: count, ...setting, seconds: t1 - t0,
    rate: count / (t1 - t0), cpu_seconds: cpuSeconds() - cpu0, t0, t1,
  }));
}

async function consume(conn, queue, count, prefetch, parse) {
  const ch = await conn.createChannel();
  await ch.prefetch(prefetch);
  let received = 0, t0, cpu0;
  await new Promise((resolve) => {
    ch.consume(queue, (msg) => {
      if (received === 0) { t0 = Date.now() / 1000; cpu0 = cpuSeconds(); }
      if (parse && !('order_id' in JSON.parse(msg.content))) throw new Error('not a JSON order');
      ch.ack(msg);
      if (++received === count) resolve();
    });
  });
  report(parse ? 'handle' : 'consume', count, { prefetch }, t0, cpu0);
}

async function publish(conn, queue, count, window) {
  const ch = await conn.createConfirmChannel();
  const body = Buffer.alloc(1024, 'x');
  const options = { persistent: true, contentType: 'application/json', messageId: 'bench', headers };
  const t0 = Date.now() / 1000, cpu0 = cpuSeconds();
  await new Promise((resolve, reject) => {
    let published = 0, confirmed = 0;
    const publishMore = () => {
      while (published < count && published - confirmed < window) {
        published++;
        ch.publish('', queue, body, options, (err) => {
          if (err) return reject(err);
          if (++confirmed === count) resolve(); else publishMore();
        });
      }
    };
    publishMore();
  });
  report('publish', count, { window }, t0, cpu0);
}

async function main() {
  const [mode, url, queue, count, setting] = process.argv.slice(2);
  const conn = await amqp.connect(url);
  if (mode === 'consume' || mode === 'handle') {
    await consume(conn, queue, Number(count), Number(setting), mode === 'handle');
  }
  else await publish(conn, queue, Number(count), Number(setting));
  await conn.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
