// IDX bytes for tests that write their own tiny (Fashion-)MNIST files.
#include "idx_files.hpp"

#include <zlib.h>

#include <cstdint>
#include <utility>

namespace amplab::test {

namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;

void write_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

}  // namespace

std::string gzip_member(std::string bytes) {
  z_stream stream{};
  deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&stream, bytes.size()) + 32, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::string encode_idx(const IdxArray& array, bool gzip) {
  std::string raw{'\0', '\0', static_cast<char>(kTypeUnsignedByte), static_cast<char>(array.dims.size())};
  for (auto d : array.dims) write_be32(raw, static_cast<uint32_t>(d));
  raw.append(array.data.begin(), array.data.end());
  return gzip ? gzip_member(std::move(raw)) : raw;
}

}  // namespace amplab::test
