// Small file helpers whose guarantees matter: an atomic write never leaves a torn file behind.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace amplab {

// Writes `content` to `path` so that a reader sees either the old file or the complete new one,
// even across a crash or kill -9: write a temporary file in the same directory, flush and fsync
// it, rename it over `path`, fsync the directory.
void write_file_atomic(const std::string& path, std::string_view content);
// Throws amplab::Error naming the path, and what it is when it is not a regular file.
std::string read_file(const std::string& path);

uint32_t crc32_of(std::string_view bytes);       // zlib's CRC-32
std::string hex32(uint32_t value);               // "0a1b2c3d"

// The temporary file an atomic write in progress is using ("" when none): a second SIGINT
// removes it before exiting (signals.cpp), so that no partial file is left behind.
const char* atomic_write_in_progress();

}  // namespace amplab
