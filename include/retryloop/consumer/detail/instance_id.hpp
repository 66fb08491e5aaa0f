#pragma once

#include <string>

namespace retryloop::consumer::detail {

/// A consumer's id among its service's instances (outage::Coordinator): `host:pid#n.r`, where n
/// counts the consumers this process made and r is 8 hex digits drawn for this id alone. The
/// random part keeps two processes apart that share a host name and a pid (two containers on the
/// host's network, each its PID 1): each would ignore the other's signals as its own.
std::string instance_id();

}  // namespace retryloop::consumer::detail
