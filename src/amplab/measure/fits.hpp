// A configuration that cannot fit in CPU memory is refused before it is allocated, naming the
// keys to lower and the bytes it needs, instead of c10's allocator failing mid-way (or the
// kernel's out-of-memory killer ending the run without a word).
#pragma once

#include <cstdint>
#include <string>

namespace amplab {

// Bytes the system can still give this process (MemAvailable in /proc/meminfo); -1 when unknown.
int64_t available_cpu_bytes();

// Throws amplab::Error when `bytes` exceed the available CPU memory:
// "<what> needs at least N bytes (X GiB) of CPU memory, Y GiB are available; lower <keys>".
void require_cpu_memory(int64_t bytes, const std::string& what, const std::string& keys);

}  // namespace amplab
