#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "retryloop/amqp/field_table.hpp"

namespace retryloop::dispatch {

/// The request header that carries a message's AMQP headers (encode_headers).
inline constexpr std::string_view headers_field = "Retryloop-Headers";

/// A field table as one HTTP field value: a JSON object, ASCII only (every other character as a
/// `\uXXXX` escape, DEL and the controls included), so that it is a legal field value in HTTP/1.1
/// and HTTP/2 and keeps the names' case. Entries keep their order. A value is plain JSON where
/// JSON says enough, and a one-member object named by its type letter elsewhere
/// (docs/dispatch.md, "The header encoding"):
///
/// | AMQP | JSON |
/// |---|---|
/// | `S` long string, UTF-8 | a string |
/// | `S` long string, not UTF-8 | `{"S": "<base64>"}` |
/// | `l` int64 | an integer |
/// | `t` bool | `true`, `false` |
/// | `V` void | `null` |
/// | `A` array | an array |
/// | `F` table | `{"F": {...}}` |
/// | `b` `B` `s` `u` `I` `i` integers | `{"I": 42}` (the letter, then the number) |
/// | `f` float, `d` double | `{"d": 1.5}`; `"NaN"`, `"Infinity"` or `"-Infinity"` for those |
/// | `D` decimal | `{"D": "123.45"}`: the digits, as many after the point as the scale |
/// | `T` timestamp | `{"T": 1700000000}`: seconds since the epoch |
/// | `x` byte array | `{"x": "<base64>"}` |
///
/// Left out: an entry whose name is not UTF-8 (a JSON name cannot hold it), and every entry
/// after the first of the same name (the one AMQP readers see). decode_headers gives back any
/// other table exactly (type letters, order, NaN payloads aside).
std::string encode_headers(const amqp::FieldTable& table);

/// The table that encode_headers wrote into `field_value`. Also reads what another program
/// wrote by the same rules: any JSON whitespace and escapes, raw UTF-8, `{"l": n}` for an int64,
/// any number for a float or double tag, a plain number with a fraction or an exponent as a double,
/// and base64 with or without padding. nullopt for anything else (not JSON, not an object, an
/// unknown tag, a number out of its type's range, nesting deeper than AMQP allows, a name twice in
/// one object), and then, when `error` is given, the reason there. Never throws.
std::optional<amqp::FieldTable> decode_headers(std::string_view field_value,
                                               std::string* error = nullptr);

}  // namespace retryloop::dispatch
