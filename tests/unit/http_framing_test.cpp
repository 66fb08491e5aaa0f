// Where an HTTP request ends and which limits it breaks, from bytes alone.

#include <catch2/catch.hpp>

#include <string>
#include <string_view>

#include "retryloop/http/request_framing.hpp"

using retryloop::http::frame_request;
using retryloop::http::RequestFramer;
using retryloop::http::RequestFraming;
using retryloop::http::RequestLimits;
using Status = RequestFraming::Status;

namespace {

std::string chunked(const std::string& chunks) {
  return "POST /api/note HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks;
}

}  // namespace

TEST_CASE("A request is complete once its head and the body its framing announces have come",
          "[http]") {
  const RequestLimits limits;
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  CHECK(frame_request(get.substr(0, get.size() - 1), limits).status == Status::incomplete);
  CHECK(frame_request(get, limits).status == Status::complete);
  CHECK(frame_request(get + "GET /next", limits).length == get.size());

  const std::string sized = "POST /api/note HTTP/1.1\r\nContent-Length: 5\r\n\r\n";
  const RequestFraming waiting = frame_request(sized + "abc", limits);
  CHECK(waiting.status == Status::incomplete);
  CHECK(waiting.head_read);
  CHECK(frame_request(sized + "abcde", limits).length == sized.size() + 5);

  // Without Content-Length or chunks there is no body: a POST is complete at its head.
  const std::string bare = "POST /api/note HTTP/1.1\r\nHost: x\r\n\r\n";
  CHECK(frame_request(bare, limits).length == bare.size());

  const std::string chunks = "3;name=value\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: t\r\n\r\n";
  CHECK(frame_request(chunked(chunks.substr(0, 20)), limits).status == Status::incomplete);
  CHECK(frame_request(chunked(chunks), limits).length == chunked(chunks).size());

  const RequestFraming expecting =
      frame_request("PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", limits);
  CHECK(expecting.status == Status::incomplete);
  CHECK(expecting.expects_continue);
}

TEST_CASE("A body over the limit is refused with 413 in every framing, as soon as it is known",
          "[http]") {
  RequestLimits limits;
  limits.max_body_bytes = 10;
  const RequestFraming sized =
      frame_request("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", limits);
  CHECK(sized.status == Status::refused);
  CHECK(sized.refusal_status == 413);
  CHECK(sized.reason == "the request body is larger than 10 bytes");
  // The second chunk passes the limit; its data has not even come yet.
  const RequestFraming chunks = frame_request(chunked("6\r\nabcdef\r\n6\r\nab"), limits);
  CHECK(chunks.status == Status::refused);
  CHECK(chunks.refusal_status == 413);
  // Nor can chunk extensions: a chunked body may be at most twice the limit as sent.
  std::string padding;
  for (int i = 0; i < 10; ++i)
    padding += "1;" + std::string(1000, 'x') + "\r\na\r\n";
  CHECK(frame_request(chunked(padding), limits).refusal_status == 413);
  CHECK(frame_request(chunked("a\r\n0123456789\r\n0\r\n\r\n"), limits).status == Status::complete);
}

TEST_CASE("A malformed or oversized head is refused with a status and a reason", "[http]") {
  RequestLimits limits;
  limits.max_head_bytes = 80;
  auto refusal = [&limits](const std::string& bytes) {
    const RequestFraming framing = frame_request(bytes, limits);
    CHECK(framing.status == Status::refused);
    return std::to_string(framing.refusal_status) + " " + framing.reason;
  };
  CHECK(refusal("GET / HTTP/1.1\r\nX: " + std::string(80, 'x')) ==
        "431 the request line and headers are larger than 80 bytes");
  CHECK(refusal("GET /\r\n\r\n") == "400 the request line is not METHOD TARGET HTTP/1.1");
  CHECK(refusal("GET / HTTP/2.0\r\n\r\n") == "505 only HTTP/1.0 and HTTP/1.1 are served");
  CHECK(refusal("GET / HTTP/1.1\r\nno colon\r\n\r\n") == "400 a header line is not NAME: VALUE");
  CHECK(refusal("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n") ==
        "400 Content-Length is not a number of bytes");
  CHECK(refusal("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n") ==
        "400 the request gives two different Content-Lengths");
  CHECK(refusal("GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n") ==
        "501 the only transfer coding served is chunked, once");
  CHECK(refusal("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n") ==
        "400 the request gives both Content-Length and Transfer-Encoding");
  CHECK(refusal(chunked("zz\r\n")).find("400 a chunk's size is not a hexadecimal number") == 0);
  CHECK(refusal(chunked("2\r\nabc\r\n")).find("400 a chunk is longer than its size says") == 0);
}

TEST_CASE("Every start of a complete request is incomplete, at the edges of each limit too",
          "[http]") {
  RequestLimits limits;
  limits.max_head_bytes = 64;
  auto every_start_incomplete = [&limits](const std::string& request) {
    for (size_t length = 0; length < request.size(); ++length) {
      INFO("the first " << length << " bytes");
      CHECK(frame_request(request.substr(0, length), limits).status == Status::incomplete);
    }
  };
  // Trailers of 64 bytes with their empty line: the most the limit allows.
  const std::string trailer = "T: " + std::string(64 - 2 - 5, 'x') + "\r\n";
  const std::string fits = chunked("1\r\na\r\n0\r\n" + trailer + "\r\n");
  REQUIRE(frame_request(fits, limits).status == Status::complete);
  every_start_incomplete(fits);
  // One byte more is refused whole, where it was once complete while its start was refused.
  const std::string over = chunked("1\r\na\r\n0\r\nT: x" + trailer.substr(3) + "\r\n");
  CHECK(frame_request(over, limits).refusal_status == 431);

  // A chunk size line of the longest length, extensions and all.
  const std::string longest = "1;" + std::string(1024 - 2, 'e') + "\r\na\r\n0\r\n\r\n";
  const std::string sized_line = chunked(longest);
  REQUIRE(frame_request(sized_line, limits).status == Status::complete);
  every_start_incomplete(sized_line);
  CHECK(frame_request(chunked("1;e" + longest.substr(2)), limits).refusal_status == 400);
}

TEST_CASE("Framing goes through each byte a bounded number of times, however the bytes are split",
          "[http]") {
  // 2,000 chunks of one byte each, fed a byte at a time, as a client trickles them: framing all
  // the bytes so far on every read would go through about 72 million bytes.
  std::string chunks;
  for (int i = 0; i < 2000; ++i)
    chunks += "1\r\na\r\n";
  const std::string request = chunked(chunks + "0\r\nTrailer: t\r\n\r\n");
  RequestFramer framer{RequestLimits{}};
  for (size_t i = 0; i < request.size(); ++i) {
    INFO("byte " << i);
    REQUIRE(framer.feed(request.substr(i, 1)).status ==
            (i + 1 < request.size() ? Status::incomplete : Status::complete));
  }
  CHECK(framer.framing().length == request.size());
  CHECK(framer.bytes() == request);
  CHECK(framer.examined() <= 2 * request.size());

  // A head of the largest size, a byte at a time.
  std::string head = "GET /metrics HTTP/1.1\r\n";
  while (head.size() + 20 < RequestLimits{}.max_head_bytes)
    head += "X-Header: value\r\n";
  head += "\r\n";
  RequestFramer head_framer{RequestLimits{}};
  for (const char c : head)
    head_framer.feed(std::string_view(&c, 1));
  CHECK(head_framer.framing().status == Status::complete);
  CHECK(head_framer.examined() <= 2 * head.size());
}

TEST_CASE("Fed in pieces of any size, a request frames as it does at once", "[http]") {
  const std::string sized = "POST /api/note HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde";
  const std::string chunks =
      chunked("3;name=value\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: t\r\n\r\nGET / HTTP/1.1\r\n");
  for (const std::string& request : {sized, chunks, chunked("3\r\nabcX\r\n")}) {
    const RequestFraming whole = frame_request(request, RequestLimits{});
    for (size_t piece = 1; piece <= 7; ++piece) {
      INFO(request << " in pieces of " << piece);
      RequestFramer framer{RequestLimits{}};
      for (size_t at = 0; at < request.size(); at += piece)
        framer.feed(std::string_view(request).substr(at, piece));
      CHECK(framer.framing().status == whole.status);
      CHECK(framer.framing().length == whole.length);
      CHECK(framer.framing().refusal_status == whole.refusal_status);
      CHECK(framer.framing().reason == whole.reason);
    }
  }
}

TEST_CASE("A bare LF or another control character in a chunk's size line is refused with 400",
          "[http]") {
  const RequestLimits limits;
  auto refusal = [&limits](const std::string& chunks) {
    const RequestFraming framing = frame_request(chunked(chunks), limits);
    INFO(chunks);
    CHECK(framing.status == Status::refused);
    return std::to_string(framing.refusal_status) + " " + framing.reason;
  };
  // httplib reads a line up to a bare LF: it would take "1;a\n" for the size line, and "b" for
  // the chunk's data.
  CHECK(refusal("1;a\nb\r\nX\r\n0\r\n\r\n") == "400 a chunk's size line has a bare LF");
  CHECK(refusal("1\nX\r\n0\r\n\r\n") == "400 a chunk's size line has a bare LF");
  CHECK(refusal("0;\n\r\n\r\n") == "400 a chunk's size line has a bare LF");
  CHECK(refusal("1;a\rb\r\nX\r\n0\r\n\r\n") == "400 a chunk's size line has a control character");
  CHECK(refusal(std::string("1;a\0b\r\nX\r\n0\r\n\r\n", 15)) ==
        "400 a chunk's size line has a control character");
  // A tab may separate extensions, as it may in a header.
  CHECK(frame_request(chunked("1\t;a=b\r\nX\r\n0\r\n\r\n"), limits).status == Status::complete);
}

TEST_CASE(
    "A trailer with a bare LF or another control character, or not NAME: VALUE, is refused "
    "with 400",
    "[http]") {
  const RequestLimits limits;
  auto refusal = [&limits](const std::string& trailers) {
    const RequestFraming framing = frame_request(chunked("1\r\na\r\n0\r\n" + trailers), limits);
    INFO(trailers);
    CHECK(framing.status == Status::refused);
    return std::to_string(framing.refusal_status) + " " + framing.reason;
  };
  CHECK(refusal("T: a\nb\r\n\r\n") == "400 a trailer line has a bare LF");
  CHECK(refusal("T: a\r\n\n\r\n") == "400 a trailer line has a bare LF");
  CHECK(refusal("\n") == "400 a trailer line has a bare LF");
  CHECK(refusal("T: a\rb\r\n\r\n") == "400 a trailer line has a control character");
  CHECK(refusal("no colon\r\n\r\n") == "400 a trailer line is not NAME: VALUE");
  CHECK(frame_request(chunked("1\r\na\r\n0\r\nT: a\tb\r\nU:\r\n\r\n"), limits).status ==
        Status::complete);
}

TEST_CASE("With no body allowed, any body is refused with 413 and a request without one is served",
          "[http]") {
  RequestLimits limits;
  limits.max_body_bytes = 0;
  const RequestFraming sized =
      frame_request("GET /healthz HTTP/1.1\r\nContent-Length: 1\r\n\r\n", limits);
  CHECK(sized.status == Status::refused);
  CHECK(sized.refusal_status == 413);
  CHECK(sized.reason == "the request has a body, and none is taken here");
  CHECK(frame_request(chunked("1\r\n"), limits).refusal_status == 413);
  CHECK(frame_request("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", limits).status ==
        Status::complete);
  CHECK(frame_request(chunked("0\r\n\r\n"), limits).status == Status::complete);
}
