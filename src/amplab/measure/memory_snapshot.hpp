// The CUDA caching allocator's history, recorded from C++ and written as the snapshot file that
// PyTorch's memory visualizer opens (https://pytorch.org/memory_viz: drag the file onto the page):
// every allocation and free with its size, time and C++ stack, and the segments the allocator
// reserved. What torch.cuda.memory._record_memory_history and _dump_snapshot do in Python.
#pragma once

#include <torch/types.h>

#include <string>

namespace amplab {

// Starts recording the allocator's history on a CUDA device (keeping the last `max_entries`
// events); false, and nothing recorded, on the CPU or in a build without CUDA.
bool start_memory_history(torch::Device device, size_t max_entries = 100000);

// Whether start_memory_history started a recording that is still going.
bool memory_history_recording();

// Writes the snapshot (a pickle) to `path` and stops recording. Throws IoError when it cannot.
void write_memory_snapshot(const std::string& path);

}  // namespace amplab
