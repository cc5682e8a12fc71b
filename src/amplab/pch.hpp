// Precompiled once, reused by every target that includes torch (cmake/amplab.cmake).
#pragma once

#include <torch/torch.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
