// The IDX reader (idx.hpp): gzip detection and decompression, header checks, the values.
#include "amplab/data/idx.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "amplab/infra/error.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
constexpr int kMaxDims = 4;
constexpr size_t kMaxBytes = size_t{1} << 31;  // 2 GiB: MNIST's training images are 47 MB

bool is_gzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f && static_cast<uint8_t>(bytes[1]) == 0x8b;
}

std::string gunzip(const std::string& compressed, const std::string& name) {
  z_stream stream{};
  // 16 + MAX_WBITS: expect a gzip header and check the gzip trailer (CRC-32 and length).
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK) throw Error(name + ": cannot start gzip decompression");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  stream.avail_in = static_cast<uInt>(compressed.size());
  std::string out;
  char buffer[1 << 16];
  int status = Z_OK;
  while (status == Z_OK) {
    stream.next_out = reinterpret_cast<Bytef*>(buffer);
    stream.avail_out = sizeof buffer;
    status = inflate(&stream, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) break;
    out.append(buffer, sizeof buffer - stream.avail_out);
    if (out.size() > kMaxBytes) {
      inflateEnd(&stream);
      throw Error(name + ": decompresses to more than 2 GiB; not an MNIST file");
    }
    if (status == Z_OK && stream.avail_in == 0 && stream.avail_out != 0) {
      status = Z_BUF_ERROR;  // input ended before the end of the gzip stream
      break;
    }
    // Several gzip members one after the other (`cat a.gz b.gz`, pigz) are one file to gzip -d:
    // go on with the next member.
    if (status == Z_STREAM_END && stream.avail_in >= 2 && stream.next_in[0] == 0x1f && stream.next_in[1] == 0x8b) {
      if (inflateReset(&stream) != Z_OK) break;
      status = Z_OK;
    }
  }
  std::string message = stream.msg ? stream.msg : "";
  inflateEnd(&stream);
  if (status == Z_BUF_ERROR)
    throw Error(name + ": gzip data is truncated (the file ends before the compressed stream does); "
                "download or copy it again");
  if (status != Z_STREAM_END)
    throw Error(name + ": gzip data is corrupt (" + (message.empty() ? "zlib error " + std::to_string(status) : message) +
                "); download or copy it again");
  return out;
}

uint32_t read_be32(const std::string& bytes, size_t offset) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

}  // namespace

IdxArray parse_idx(const std::string& file_bytes, const std::string& name) {
  const std::string bytes = is_gzip(file_bytes) ? gunzip(file_bytes, name) : file_bytes;
  if (bytes.size() < 4)
    throw Error(name + ": too short for an IDX file (" + std::to_string(bytes.size()) + " bytes, the header alone is 4+)");
  if (bytes[0] != 0 || bytes[1] != 0)
    throw Error(name + ": not an IDX file (the first two bytes must be zero; is this an MNIST file?)");
  uint8_t type = static_cast<uint8_t>(bytes[2]);
  int ndims = static_cast<uint8_t>(bytes[3]);
  if (type != kTypeUnsignedByte) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", type);
    throw Error(name + ": IDX value type " + hex + " is not supported; MNIST files hold unsigned bytes (0x08)");
  }
  if (ndims < 1 || ndims > kMaxDims)
    throw Error(name + ": IDX header says " + std::to_string(ndims) + " dimensions; expected 1 to " +
                std::to_string(kMaxDims));
  size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header)
    throw Error(name + ": truncated in the header (" + std::to_string(bytes.size()) + " bytes, header needs " +
                std::to_string(header) + ")");
  IdxArray array;
  size_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    uint32_t dim = read_be32(bytes, 4 + 4 * static_cast<size_t>(d));
    if (dim == 0) throw Error(name + ": dimension " + std::to_string(d) + " is 0");
    if (count > kMaxBytes / dim)
      throw Error(name + ": header dimensions describe more than 2 GiB of data; the header is corrupt");
    count *= dim;
    array.dims.push_back(dim);
  }
  size_t payload = bytes.size() - header;
  if (payload < count)
    throw Error(name + ": truncated: header promises " + std::to_string(count) + " values, file has " +
                std::to_string(payload) + "; download or copy it again");
  if (payload > count)
    throw Error(name + ": " + std::to_string(payload - count) + " unexpected bytes after the " +
                std::to_string(count) + " values the header describes");
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

IdxArray read_idx(const std::string& path) {
  // Before opening: a FIFO would block the open, a device would be read until memory runs out.
  if (std::string problem = regular_file_problem(path); !problem.empty()) throw Error(path + ": cannot open (it " + problem + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw Error(path + ": read error");
  return parse_idx(buffer.str(), path);
}

}  // namespace amplab
