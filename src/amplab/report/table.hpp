// A results table: aligned on screen, CSV in the run directory.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace amplab {

class Table {
 public:
  explicit Table(std::vector<std::string> columns);
  void add_row(std::vector<std::string> cells);  // one cell per column
  const std::vector<std::string>& columns() const { return columns_; }
  const std::vector<std::vector<std::string>>& rows() const { return rows_; }

  void print(std::ostream& out) const;             // aligned, numbers right-aligned
  std::string to_string() const;
  void write_csv(const std::string& path) const;   // RFC 4180 quoting where needed

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Number formatting for tables: fixed decimals ("12.35"), or "-" for NaN.
std::string fixed(double value, int decimals = 2);
// Three significant digits with a unit suffix scaled by 1000s: "1.23 G".
std::string si(double value);

}  // namespace amplab
