#pragma once

/// The libuv loop the library runs on. Only its type is named here, so that a header of the
/// library does not bring <uv.h> in; include <uv.h> to create and run one.
typedef struct uv_loop_s uv_loop_t;
