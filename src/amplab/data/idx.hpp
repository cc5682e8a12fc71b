// The IDX file format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
// a 4-byte magic (0, 0, type, number of dimensions), one big-endian uint32 per dimension, then
// the values. Read plain or gzip-compressed (detected from the content, not the name).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace amplab {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// Only unsigned-byte arrays (type 0x08), which is what (Fashion-)MNIST uses. Every problem (missing
// file, bad gzip stream, wrong magic, wrong type, truncated or over-long data) is an amplab::Error
// that names the file and what is wrong.
IdxArray read_idx(const std::string& path);
// The same from bytes already in memory (plain or gzip); `name` stands for the file in errors.
IdxArray parse_idx(const std::string& bytes, const std::string& name);

}  // namespace amplab
