// The amqp091-go peer (Debian's golang-github-rabbitmq-amqp091-go-dev), as its examples use it.
//
//	amqp091 consume URL QUEUE COUNT PREFETCH   ack each delivery, no-op handler
//	amqp091 publish URL QUEUE COUNT WINDOW     confirms, at most WINDOW unconfirmed
//
// Prints one JSON line: the time from the first delivery (or publish) to the last ack (or
// confirm), and the process's CPU time over the same window.
package main

import (
	"encoding/json"
	"log"
	"os"
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func cpuSeconds() float64 {
	var u syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return float64(u.Utime.Sec+u.Stime.Sec) + float64(u.Utime.Usec+u.Stime.Usec)/1e6
}

func wallSeconds() float64 { return float64(time.Now().UnixMicro()) / 1e6 }

// Headers as a message has them after two trips through a retry loop.
func realisticHeaders() amqp.Table {
	death := func(queue, reason string) amqp.Table {
		return amqp.Table{"count": int64(2), "reason": reason, "queue": queue,
			"time": time.Unix(1700000000, 0), "exchange": "orders.in",
			"routing-keys": []interface{}{"order.created"}}
	}
	return amqp.Table{
		"x-death":                []interface{}{death("orders.wait.30s", "expired"), death("orders", "rejected")},
		"x-first-death-exchange": "orders.in",
		"x-first-death-queue":    "orders",
		"x-first-death-reason":   "rejected",
		"trace-id":               "4bf92f3577b34da6a3ce929d0e0e4736",
	}
}

func report(bench string, count int, setting string, value int, t0, t1, cpu float64) {
	out, _ := json.Marshal(map[string]interface{}{"client": "amqp091-go", "bench": bench,
		"messages": count, setting: value, "seconds": t1 - t0, "rate": float64(count) / (t1 - t0),
		"cpu_seconds": cpu, "t0": t0, "t1": t1})
	os.Stdout.Write(append(out, '\n'))
}

func consume(ch *amqp.Channel, queue string, count, prefetch int) {
	if err := ch.Qos(prefetch, 0, false); err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	var t0, cpu0 float64
	received := 0
	for d := range deliveries {
		if received == 0 {
			t0, cpu0 = wallSeconds(), cpuSeconds()
		}
		if err := d.Ack(false); err != nil {
			log.Fatal(err)
		}
		if received++; received == count {
			break
		}
	}
	report("consume", count, "prefetch", prefetch, t0, wallSeconds(), cpuSeconds()-cpu0)
}

func publish(ch *amqp.Channel, queue string, count, window int) {
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	msg := amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json",
		MessageId: "bench", Headers: realisticHeaders(), Body: make([]byte, 1024)}
	for i := range msg.Body {
		msg.Body[i] = 'x'
	}
	// Confirms arrive in order on this channel, one per publish (NotifyPublish splits multiple
	// acks); DeferredConfirmation.Wait can hang in this version (amqp091-go issue #182).
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	t0, cpu0 := wallSeconds(), cpuSeconds()
	published, confirmed := 0, 0
	for confirmed < count {
		for published < count && published-confirmed < window {
			if err := ch.Publish("", queue, false, false, msg); err != nil {
				log.Fatal(err)
			}
			published++
		}
		if confirm := <-confirms; !confirm.Ack {
			log.Fatal("publish was nacked")
		}
		confirmed++
	}
	report("publish", count, "window", window, t0, wallSeconds(), cpuSeconds()-cpu0)
}

func main() {
	if len(os.Args) != 6 {
		log.Fatal("usage: amqp091 consume|publish URL QUEUE COUNT PREFETCH|WINDOW")
	}
	count, _ := strconv.Atoi(os.Args[4])
	setting, _ := strconv.Atoi(os.Args[5])
	conn, err := amqp.Dial(os.Args[2])
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if os.Args[1] == "consume" {
		consume(ch, os.Args[3], count, setting)
	} else {
		publish(ch, os.Args[3], count, setting)
	}
}
