// Table (table.hpp): rows aligned on screen and written as CSV, and number formatting.
#include "amplab/report/table.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"

namespace amplab {

Table::Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != columns_.size())
    throw std::logic_error("table row has " + std::to_string(cells.size()) + " cells, expected " +
                           std::to_string(columns_.size()));
  rows_.push_back(std::move(cells));
}

namespace {
bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end != s.c_str() && (*end == '\0' || *end == 'x' || *end == '%' || *end == ' ');
}
}  // namespace

void Table::print(std::ostream& out) const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells, bool header) {
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - cells[c].size(), ' ');
      bool right = !header && looks_numeric(cells[c]);
      out << (c ? "  " : "") << (right ? pad + cells[c] : cells[c] + (c + 1 < cells.size() ? pad : ""));
    }
    out << "\n";
  };
  line(columns_, true);
  size_t total = 0;
  for (auto w : width) total += w;
  out << std::string(total + 2 * (width.size() - 1), '-') << "\n";
  for (const auto& row : rows_) line(row, false);
}

std::string Table::to_string() const {
  std::ostringstream out;
  print(out);
  return out.str();
}

void Table::write_csv(const std::string& path) const {
  std::ostringstream out;
  auto cell = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string quoted = "\"";
    for (char ch : s) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return quoted + "\"";
  };
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) out << (c ? "," : "") << cell(cells[c]);
    out << "\n";
  };
  line(columns_);
  for (const auto& row : rows_) line(row);
  write_file_atomic(path, out.str());  // whole or not at all; an IoError names the file
}

std::string fixed(double value, int decimals) {
  if (std::isnan(value)) return "-";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string si(double value) {
  if (std::isnan(value)) return "-";
  const char* units[] = {"", " k", " M", " G", " T", " P"};
  int u = 0;
  while (std::fabs(value) >= 1000 && u < 5) value /= 1000, ++u;
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.3g%s", value, units[u]);
  return buffer;
}

}  // namespace amplab
