#!/usr/bin/env python3
"""Generates the AMQP 0-9-1 method structs of retryloop::amqp from the RabbitMQ extended spec.

Reads amqp0-9-1.stripped.extended.xml (Debian package amqp-specs) and writes
include/retryloop/amqp/methods.hpp and src/amqp/methods.cpp. The output is already formatted
the way the repository's .clang-format formats it, so the generator needs nothing but Python's
standard library and gives the same bytes on every machine.

Usage: python3 tools/gen_amqp_methods.py [--spec SPEC_XML] [--out-dir DIR]
"""

import argparse
import os
import sys
import xml.etree.ElementTree as ET

DEFAULT_SPEC = "/usr/share/amqp/specs/0-9-1-rabbit/amqp0-9-1.stripped.extended.xml"
REGENERATE = "python3 tools/gen_amqp_methods.py"

# The stripped spec names the 14th basic property "reserved"; the full 0-9-1 spec, RabbitMQ and
# every client call it cluster-id.
PROPERTY_RENAMES = {("basic", "reserved"): "cluster-id"}

# connection.close and channel.close carry the ids of the method that caused the close; as
# plain class_id/method_id they would clash with every struct's static ids.
FIELD_RENAMES = {
    ("connection", "close", "class-id"): "failing-class-id",
    ("connection", "close", "method-id"): "failing-method-id",
    ("channel", "close", "class-id"): "failing-class-id",
    ("channel", "close", "method-id"): "failing-method-id",
}

FIELD_COMMENTS = {
    "failing-class-id":
        "The class of the method that caused the close (spec field class-id), or 0.",
    "failing-method-id": "The method that caused the close (spec field method-id), or 0.",
    "cluster-id": "Spec property cluster-id (named reserved in the stripped spec); deprecated.",
}

# The static members of every method struct; no field may take these names.
STATIC_MEMBERS = {"class_id", "method_id", "synchronous", "has_content", "name"}

CPP_TYPES = {
    "octet": "uint8_t",
    "short": "uint16_t",
    "long": "uint32_t",
    "longlong": "uint64_t",
    "timestamp": "uint64_t",
    "bit": "bool",
    "shortstr": "std::string",
    "longstr": "std::string",
    "table": "FieldTable",
}

DEFAULTS = {
    "uint8_t": " = 0",
    "uint16_t": " = 0",
    "uint32_t": " = 0",
    "uint64_t": " = 0",
    "bool": " = false",
    "std::string": "",
    "FieldTable": "",
}

ENCODE = {
    "octet": "w.u8({0});",
    "short": "w.u16({0});",
    "long": "w.u32({0});",
    "longlong": "w.u64({0});",
    "timestamp": "w.u64({0});",
    "shortstr": "w.short_string({0});",
    "longstr": "w.long_string({0});",
    "table": "w.table({0});",
}

DECODE = {
    "octet": "{0} = r.u8();",
    "short": "{0} = r.u16();",
    "long": "{0} = r.u32();",
    "longlong": "{0} = r.u64();",
    "timestamp": "{0} = r.u64();",
    "shortstr": "{0}.assign(r.short_string_view());",
    "longstr": "{0}.assign(r.long_string_view());",
    "table": "r.table({0});",
}

# Helpers for optional properties, one per wire type, used by the generated property decoders.
PROPERTY_READERS = {
    "octet": "read_octet",
    "short": "read_short",
    "long": "read_long",
    "longlong": "read_longlong",
    "timestamp": "read_longlong",
    "shortstr": "read_shortstr",
    "longstr": "read_longstr",
    "table": "read_table",
}

PROPERTY_WRITERS = {
    "octet": "w.u8(*{0});",
    "short": "w.u16(*{0});",
    "long": "w.u32(*{0});",
    "longlong": "w.u64(*{0});",
    "timestamp": "w.u64(*{0});",
    "shortstr": "w.short_string(*{0});",
    "longstr": "w.long_string(*{0});",
    "table": "w.table(*{0});",
}


def pascal(name):
    return "".join(part[:1].upper() + part[1:] for part in name.split("-"))


def snake(name):
    return name.replace("-", "_")


class Field:
    def __init__(self, name, wire_type):
        self.name = name
        self.member = snake(name)
        self.wire_type = wire_type
        self.cpp_type = CPP_TYPES[wire_type]


class Method:
    def __init__(self, cls, element, domains):
        self.class_name = cls.get("name")
        self.method_name = element.get("name")
        self.class_id = int(cls.get("index"))
        self.method_id = int(element.get("index"))
        self.synchronous = element.get("synchronous") == "1"
        self.has_content = element.get("content") == "1"
        self.struct = pascal(self.class_name) + pascal(self.method_name)
        self.full_name = self.class_name + "." + self.method_name
        self.fields = [
            field_of(f, domains,
                     FIELD_RENAMES.get((self.class_name, self.method_name, f.get("name"))))
            for f in element.findall("field")
        ]
        for f in self.fields:
            if f.member in STATIC_MEMBERS:
                sys.exit("field %s of %s clashes with a static member; add it to FIELD_RENAMES"
                         % (f.name, self.full_name))

    @property
    def key(self):
        return "0x%04X%04X" % (self.class_id, self.method_id)


def field_of(element, domains, rename=None):
    name = rename or element.get("name")
    if element.get("type"):
        wire_type = element.get("type")
    else:
        wire_type = domains[element.get("domain")]
    if wire_type not in CPP_TYPES:
        sys.exit("unknown wire type %r of field %r" % (wire_type, name))
    return Field(name, wire_type)


def load(spec_path):
    root = ET.parse(spec_path).getroot()
    domains = {d.get("name"): d.get("type") for d in root.findall("domain")}
    # Domains may name other domains; resolve to a primitive type.
    for name in list(domains):
        seen = set()
        while domains[name] not in CPP_TYPES and domains[name] in domains:
            if domains[name] in seen:
                sys.exit("domain cycle at %r" % name)
            seen.add(domains[name])
            domains[name] = domains[domains[name]]
    constants = []
    for c in root.findall("constant"):
        name = c.get("name")
        if c.get("class") is None and name != "reply-success":
            continue  # frame types, sizes and the end octet: frame.hpp defines them
        constants.append(("k" + pascal(name), int(c.get("value"))))
    methods = []
    properties = {}
    for cls in root.findall("class"):
        for m in cls.findall("method"):
            methods.append(Method(cls, m, domains))
        fields = cls.findall("field")
        if fields:
            cls_name = cls.get("name")
            props = [
                field_of(f, domains, PROPERTY_RENAMES.get((cls_name, f.get("name"))))
                for f in fields
            ]
            if len(props) > 15:
                sys.exit("class %s has more than 15 properties (continuation flags)" % cls_name)
            properties[cls_name] = props
    major, minor = root.get("major"), root.get("minor")
    revision = root.get("revision")
    return {
        "version": "%s-%s-%s" % (major, minor, revision),
        "constants": constants,
        "methods": methods,
        "properties": properties,
    }


def banner(spec_name):
    return [
        "// Generated by tools/gen_amqp_methods.py from %s," % spec_name,
        "// the RabbitMQ extended AMQP 0-9-1 spec (Debian package amqp-specs).",
        "// Do not edit: regenerate with",
        "//   " + REGENERATE,
    ]


def bit_groups(fields):
    """Yields ("bits", [fields]) for each run of consecutive bits (at most 8) and ("field", f)."""
    run = []
    for f in fields:
        if f.wire_type == "bit":
            run.append(f)
            if len(run) == 8:
                yield ("bits", run)
                run = []
            continue
        if run:
            yield ("bits", run)
            run = []
        yield ("field", f)
    if run:
        yield ("bits", run)


def header(spec, spec_name):
    out = banner(spec_name)
    out += [
        "#pragma once",
        "",
        "#include <cstdint>",
        "#include <optional>",
        "#include <string>",
        "#include <string_view>",
        "#include <system_error>",
        "#include <variant>",
        "",
        '#include "retryloop/amqp/buffer.hpp"',
        '#include "retryloop/amqp/field_table.hpp"',
        '#include "retryloop/amqp/properties.hpp"',
        "",
        "namespace retryloop::amqp {",
        "",
        "// Reply codes of connection.close and channel.close (the spec's <constant>s).",
    ]
    for name, value in spec["constants"]:
        out.append("inline constexpr uint16_t %s = %d;" % (name, value))
    out.append("")
    for m in spec["methods"]:
        out.append("/// %s (class %d, method %d)." % (m.full_name, m.class_id, m.method_id))
        out.append("struct %s {" % m.struct)
        out.append("  static constexpr uint16_t class_id = %d;" % m.class_id)
        out.append("  static constexpr uint16_t method_id = %d;" % m.method_id)
        out.append("  static constexpr bool synchronous = %s;" % str(m.synchronous).lower())
        out.append("  static constexpr bool has_content = %s;" % str(m.has_content).lower())
        out.append('  static constexpr const char* name = "%s";' % m.full_name)
        if m.fields:
            out.append("")
        for f in m.fields:
            if f.name in FIELD_COMMENTS:
                out.append("  /// " + FIELD_COMMENTS[f.name])
            out.append("  %s %s%s;" % (f.cpp_type, f.member, DEFAULTS[f.cpp_type]))
        out.append("")
        out.append("  /// Appends the arguments (not the class and method ids).")
        out.append("  void encode(Writer& w) const;")
        out.append("  /// Reads the arguments; errors are left in `r`.")
        out.append("  void decode(Reader& r);")
        out.append("")
        out.append("  friend bool operator==(const %s& a, const %s& b);" % (m.struct, m.struct))
        out.append("  friend bool operator!=(const %s& a, const %s& b);" % (m.struct, m.struct))
        out.append("};")
        out.append("")
    out.append("/// Any method of the spec, for code that dispatches on what arrived.")
    out.append("using AnyMethod = std::variant<")
    names = [m.struct for m in spec["methods"]]
    out += wrap_list(names, "    ", ">;")
    out.append("")
    out.append("/// Decodes a method frame payload (class and method ids first) into the matching "
               "alternative")
    out.append("/// of `out`. Unknown ids give CodecError::unknown_method, bytes after the last "
               "argument")
    out.append("/// CodecError::trailing_bytes.")
    out.append("std::error_code decode_method(std::string_view payload, AnyMethod& out);")
    out.append("")
    out.append('/// The spec name of a method ("queue.declare"), or nullptr for unknown ids.')
    out.append("const char* method_name(uint16_t class_id, uint16_t method_id);")
    out.append("")
    out.append("}  // namespace retryloop::amqp")
    return out


def properties_header(spec, spec_name):
    out = banner(spec_name)
    out += [
        "#pragma once",
        "",
        "#include <cstdint>",
        "#include <optional>",
        "#include <string>",
        "",
        '#include "retryloop/amqp/field_table.hpp"',
        "",
        "namespace retryloop::amqp {",
        "",
        "class Reader;",
        "class Writer;",
        "",
    ]
    for cls, props in spec["properties"].items():
        struct = pascal(cls) + "Properties"
        out.append("/// The properties of a %s content header, each present or absent." % cls)
        out.append("struct %s {" % struct)
        for f in props:
            if f.name in FIELD_COMMENTS:
                out.append("  /// " + FIELD_COMMENTS[f.name])
            out.append("  std::optional<%s> %s;" % (f.cpp_type, f.member))
        out.append("")
        out.append("  /// Appends the 16-bit property flags (bit 15 = %s), then the present" %
                   props[0].member)
        out.append("  /// properties in order.")
        out.append("  void encode(Writer& w) const;")
        out.append("  /// Reads flags and properties, replacing every member. Flags with the "
                   "continuation bit")
        out.append("  /// or an unused bit set fail with CodecError::bad_content_header.")
        out.append("  void decode(Reader& r);")
        out.append("")
        out.append("  friend bool operator==(const %s& a, const %s& b);" % (struct, struct))
        out.append("  friend bool operator!=(const %s& a, const %s& b);" % (struct, struct))
        out.append("};")
        out.append("")
    out.append("}  // namespace retryloop::amqp")
    return out


def wrap_list(items, indent, closing):
    """Comma-separated items packed into lines of at most 100 columns, as clang-format does."""
    lines = []
    line = indent
    for i, item in enumerate(items):
        token = item + ("," if i + 1 < len(items) else closing)
        candidate = token if line == indent else line + " " + token
        if line != indent and len(candidate) > 100:
            lines.append(line)
            line = indent + token
        else:
            line = candidate if line != indent else indent + token
    lines.append(line)
    return lines


def source(spec, spec_name):
    out = banner(spec_name)
    out += [
        '#include "retryloop/amqp/methods.hpp"',
        "",
        "namespace retryloop::amqp {",
        "",
        "namespace {",
        "",
    ]
    used = set()
    for props in spec["properties"].values():
        used.update(PROPERTY_READERS[f.wire_type] for f in props if f.wire_type != "bit")
    helpers = {
        "read_octet": ("uint8_t", "out = r.u8();"),
        "read_short": ("uint16_t", "out = r.u16();"),
        "read_long": ("uint32_t", "out = r.u32();"),
        "read_longlong": ("uint64_t", "out = r.u64();"),
    }
    for name in sorted(used):
        if name in helpers:
            cpp, body = helpers[name]
            out += [
                "void %s(Reader& r, bool present, std::optional<%s>& out) {" % (name, cpp),
                "  if (present) {",
                "    " + body,
                "  } else {",
                "    out.reset();",
                "  }",
                "}",
                "",
            ]
        elif name in ("read_shortstr", "read_longstr"):
            view = "r.short_string_view()" if name == "read_shortstr" else "r.long_string_view()"
            out += [
                "void %s(Reader& r, bool present, std::optional<std::string>& out) {" % name,
                "  if (!present) {",
                "    out.reset();",
                "  } else if (out) {",
                "    out->assign(%s);" % view,
                "  } else {",
                "    out.emplace(%s);" % view,
                "  }",
                "}",
                "",
            ]
        elif name == "read_table":
            out += [
                "void read_table(Reader& r, bool present, std::optional<FieldTable>& out) {",
                "  if (!present) {",
                "    out.reset();",
                "    return;",
                "  }",
                "  if (!out) out.emplace();",
                "  r.table(*out);",
                "}",
                "",
            ]
    out += ["}  // namespace", ""]

    for m in spec["methods"]:
        out += method_source(m)
    for cls, props in spec["properties"].items():
        out += properties_source(pascal(cls) + "Properties", props)

    out.append("std::error_code decode_method(std::string_view payload, AnyMethod& out) {")
    out.append("  Reader r(payload);")
    out.append("  uint32_t key = uint32_t{r.u16()} << 16;")
    out.append("  key |= r.u16();")
    out.append("  if (!r.ok()) return r.error();")
    out.append("  switch (key) {")
    for m in spec["methods"]:
        out.append("    case %s:" % m.key)
        out.append("      out.emplace<%s>().decode(r);" % m.struct)
        out.append("      break;")
    out.append("    default:")
    out.append("      return make_error_code(CodecError::unknown_method);")
    out.append("  }")
    out.append("  if (!r.ok()) return r.error();")
    out.append("  if (!r.at_end()) return make_error_code(CodecError::trailing_bytes);")
    out.append("  return {};")
    out.append("}")
    out.append("")
    out.append("const char* method_name(uint16_t class_id, uint16_t method_id) {")
    out.append("  switch ((uint32_t{class_id} << 16) | method_id) {")
    for m in spec["methods"]:
        out.append("    case %s:" % m.key)
        out.append("      return %s::name;" % m.struct)
    out.append("    default:")
    out.append("      return nullptr;")
    out.append("  }")
    out.append("}")
    out.append("")
    out.append("}  // namespace retryloop::amqp")
    return out


def method_source(m):
    s = m.struct
    out = []
    if not m.fields:
        out.append("void %s::encode(Writer&) const {}" % s)
        out.append("")
        out.append("void %s::decode(Reader&) {}" % s)
        out.append("")
        out += function("bool operator==(const %s&, const %s&)" % (s, s), "return true;")
        out += function("bool operator!=(const %s&, const %s&)" % (s, s), "return false;")
        return out

    groups = list(bit_groups(m.fields))
    out.append("void %s::encode(Writer& w) const {" % s)
    declared = False
    for kind, item in groups:
        if kind == "field":
            out.append("  " + ENCODE[item.wire_type].format(item.member))
            continue
        if len(item) == 1:
            out.append("  w.u8(%s ? 1 : 0);" % item[0].member)
            continue
        out.append("  %sbits = 0;" % ("" if declared else "uint8_t "))
        declared = True
        for i, f in enumerate(item):
            out.append("  if (%s) bits |= 0x%02X;" % (f.member, 1 << i))
        out.append("  w.u8(bits);")
    out.append("}")
    out.append("")

    out.append("void %s::decode(Reader& r) {" % s)
    declared = False
    for kind, item in groups:
        if kind == "field":
            out.append("  " + DECODE[item.wire_type].format(item.member))
            continue
        if len(item) == 1:
            out.append("  %s = (r.u8() & 0x01) != 0;" % item[0].member)
            continue
        out.append("  %sbits = r.u8();" % ("" if declared else "uint8_t "))
        declared = True
        for i, f in enumerate(item):
            out.append("  %s = (bits & 0x%02X) != 0;" % (f.member, 1 << i))
    out.append("}")
    out.append("")

    out += equality_source(s, [f.member for f in m.fields])
    return out


def equality_source(struct, members):
    out = ["bool operator==(const %s& a, const %s& b) {" % (struct, struct)]
    for member in members:
        out.append("  if (a.%s != b.%s) return false;" % (member, member))
    out.append("  return true;")
    out.append("}")
    out.append("")
    out += function("bool operator!=(const %s& a, const %s& b)" % (struct, struct),
                    "return !(a == b);")
    return out


def function(signature, statement):
    """A one-statement function the way clang-format lays out a non-inline definition."""
    return [signature + " {", "  " + statement, "}", ""]


def properties_source(struct, props):
    out = ["void %s::encode(Writer& w) const {" % struct]
    out.append("  uint16_t flags = 0;")
    for i, f in enumerate(props):
        out.append("  if (%s) flags |= 0x%04X;" % (f.member, 1 << (15 - i)))
    out.append("  w.u16(flags);")
    for f in props:
        if f.wire_type == "bit":
            continue  # a bit property is carried by its flag alone
        out.append("  if (%s) %s" % (f.member, PROPERTY_WRITERS[f.wire_type].format(f.member)))
    out.append("}")
    out.append("")

    valid = 0
    for i in range(len(props)):
        valid |= 1 << (15 - i)
    out.append("void %s::decode(Reader& r) {" % struct)
    out.append("  uint16_t flags = r.u16();")
    out.append("  if ((flags & 0x%04X) != 0) {" % (~valid & 0xFFFF))
    out.append("    r.fail(CodecError::bad_content_header);")
    out.append("    return;")
    out.append("  }")
    for i, f in enumerate(props):
        present = "(flags & 0x%04X) != 0" % (1 << (15 - i))
        if f.wire_type == "bit":
            out.append("  %s = %s ? std::optional<bool>(true) : std::nullopt;"
                       % (f.member, present))
            continue
        out.append("  %s(r, %s, %s);" % (PROPERTY_READERS[f.wire_type], present, f.member))
    out.append("}")
    out.append("")
    out += equality_source(struct, [f.member for f in props])
    return out


def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = "\n".join(lines) + "\n"
    too_long = [l for l in lines if len(l) > 100]
    if too_long:
        sys.exit("generated line over 100 columns: %r" % too_long[0])
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=DEFAULT_SPEC, help="the spec XML (default: %(default)s)")
    parser.add_argument("--out-dir", default=repo,
                        help="root to write include/ and src/ under (default: the repository)")
    parser.add_argument("spec_path", nargs="?", help="the spec XML, same as --spec")
    args = parser.parse_args()
    spec_path = args.spec_path or args.spec
    if not os.path.exists(spec_path):
        sys.exit("spec not found: %s (install the Debian package amqp-specs, or pass --spec)"
                 % spec_path)
    spec = load(spec_path)
    spec_name = os.path.basename(spec_path)
    write(os.path.join(args.out_dir, "include", "retryloop", "amqp", "methods.hpp"),
          header(spec, spec_name))
    write(os.path.join(args.out_dir, "include", "retryloop", "amqp", "properties.hpp"),
          properties_header(spec, spec_name))
    write(os.path.join(args.out_dir, "src", "amqp", "methods.cpp"), source(spec, spec_name))


if __name__ == "__main__":
    main()
