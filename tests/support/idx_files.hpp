// IDX bytes for tests that write their own tiny (Fashion-)MNIST files: the inverse of
// amplab::parse_idx (src/amplab/data/idx.hpp).
#pragma once

#include <string>

#include "amplab/data/idx.hpp"

namespace amplab::test {

// `array` as an IDX file of unsigned bytes (type 0x08), gzip-compressed when `gzip`.
std::string encode_idx(const IdxArray& array, bool gzip);
// One gzip member holding `bytes` (a .gz file may hold several, one after another).
std::string gzip_member(std::string bytes);

}  // namespace amplab::test
