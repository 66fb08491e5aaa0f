#pragma once

#include <string>
#include <string_view>

namespace retryloop::amqp {

/// Text from a message or a request (a message id, a header, a handler's error) made safe to put
/// in a log line or on a terminal: it can neither end the line nor restyle or reorder what
/// follows. Escaped: `\` as `\\`; newline, carriage return and tab as `\n`, `\r`, `\t`; other
/// C0 controls, DEL and bytes that are not UTF-8 as `\xNN`; C1 controls, the bidirectional
/// controls (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069) and the line and
/// paragraph separators U+2028 and U+2029 as `\uNNNN`. Other UTF-8 is kept as it is.
std::string printable(std::string_view text);

}  // namespace retryloop::amqp
