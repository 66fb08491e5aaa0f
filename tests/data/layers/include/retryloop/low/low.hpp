#pragma once

#include "retryloop/high/high.hpp"
