#pragma once

#include "retryloop/low/fine.hpp"
