// The results sink: tables recorded once, shown on the console, written as CSV and summary.json.
#include "amplab/report/results.hpp"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "amplab/infra/error.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/report/table.hpp"

namespace amplab {

namespace {

std::string text_or_dash(const nlohmann::json& v, const std::function<std::string(double)>& number) {
  if (v.is_null()) return "-";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) {
    double d = v.get<double>();
    return std::isfinite(d) ? number(d) : fixed(d, 0);
  }
  return v.dump();
}

// The CSV's cell: numbers in full precision, null as an empty cell.
std::string csv_text(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    double d = v.get<double>();
    if (std::isnan(d)) return "nan";
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.10g", d);
    return buffer;
  }
  return v.dump();
}

}  // namespace

Show decimals(int n) {
  return [n](const nlohmann::json& v) { return text_or_dash(v, [n](double d) { return fixed(d, n); }); };
}
Show percent_of_one(int n) {
  return [n](const nlohmann::json& v) { return text_or_dash(v, [n](double d) { return fixed(100 * d, n) + "%"; }); };
}
Show times(int n) {
  return [n](const nlohmann::json& v) { return text_or_dash(v, [n](double d) { return fixed(d, n) + "x"; }); };
}
Show si_units() {
  return [](const nlohmann::json& v) { return text_or_dash(v, [](double d) { return si(d); }); };
}

ResultTable::ResultTable(std::string name, std::vector<Column> columns)
    : name_(std::move(name)), columns_(std::move(columns)) {}

ResultTable& ResultTable::add(std::vector<nlohmann::json> values) {
  if (values.size() != columns_.size())
    throw std::logic_error("results table '" + name_ + "': a row of " + std::to_string(values.size()) +
                           " values for " + std::to_string(columns_.size()) + " columns");
  nlohmann::json row = nlohmann::json::object();
  for (size_t c = 0; c < columns_.size(); ++c) {
    // NaN and inf are not JSON: they are kept as null (shown "-"), like a missing value.
    const auto& v = values[c];
    row[columns_[c].key] = v.is_number_float() && !std::isfinite(v.get<double>()) ? nlohmann::json() : v;
  }
  rows_.push_back(std::move(row));
  return *this;
}

std::string ResultTable::console() const {
  std::vector<std::string> headers;
  for (const auto& c : columns_)
    if (!c.header.empty()) headers.push_back(c.header);
  Table table(headers);
  for (const auto& row : rows_) {
    std::vector<std::string> cells;
    for (const auto& c : columns_)
      if (!c.header.empty()) cells.push_back(c.show(row.at(c.key)));
    table.add_row(std::move(cells));
  }
  return table.to_string();
}

void ResultTable::write_csv(const std::string& path) const {
  std::vector<std::string> keys;
  for (const auto& c : columns_) keys.push_back(c.key);
  Table table(keys);
  for (const auto& row : rows_) {
    std::vector<std::string> cells;
    for (const auto& c : columns_) cells.push_back(csv_text(row.at(c.key)));
    table.add_row(std::move(cells));
  }
  table.write_csv(path);
}

ResultTable& Results::table(const std::string& name, std::vector<Column> columns) {
  for (auto& t : tables_)
    if (t.name() == name) return t;
  tables_.emplace_back(name, std::move(columns));
  return tables_.back();
}

ResultTable& Results::table(const std::string& name) {
  for (auto& t : tables_)
    if (t.name() == name) return t;
  throw std::logic_error("no results table '" + name + "'");
}

void Results::print(const std::string& name, const std::string& title, const std::string& footer) const {
  for (const auto& t : tables_) {
    if (t.name() != name) continue;
    std::cout << "\n== " << title << " ==\n" << t.console() << footer << std::flush;
    return;
  }
  throw std::logic_error("no results table '" + name + "'");
}

nlohmann::json Results::summary() const {
  nlohmann::json summary = nlohmann::json::object();
  for (const auto& [key, value] : values_) summary[key] = value;
  for (const auto& t : tables_) summary[t.name()] = t.to_json();
  return summary;
}

void Results::write(const RunDir& run) const {
  if (!run.enabled()) return;
  for (const auto& t : tables_)
    if (t.size()) t.write_csv(run.file(t.name() + ".csv"));
  run.write_summary(summary());
}

}  // namespace amplab
