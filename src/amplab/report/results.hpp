// The results sink: a lab records each row of results once, and the sink prints it as a console
// table, writes it as <table>.csv in the run directory and keeps it for summary.json.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace amplab {

class RunDir;

// How a value shows on the console (the CSV and summary.json keep the value itself). A null
// value (no result: a skipped row) shows as "-".
using Show = std::function<std::string(const nlohmann::json&)>;
Show decimals(int n);             // 12.35 (numbers), strings as they are, booleans as yes/no
Show percent_of_one(int n = 1);   // 0.1234 -> "12.3%"
Show times(int n = 2);            // 1.234 -> "1.23x"
Show si_units();                  // 1.23e9 -> "1.23 G"

struct Column {
  std::string key;     // the CSV's header and the field of each row in summary.json
  std::string header;  // on the console; "" keeps the column off the console table
  Show show = decimals(3);
};

// A table of results: one row per measurement, one value per column.
class ResultTable {
 public:
  ResultTable(std::string name, std::vector<Column> columns);
  // One value per column, in the columns' order: a number, a string, a boolean or null.
  ResultTable& add(std::vector<nlohmann::json> values);
  const std::string& name() const { return name_; }
  size_t size() const { return rows_.size(); }
  const std::vector<nlohmann::json>& rows() const { return rows_; }  // each an object keyed by column

  std::string console() const;                    // aligned, for the terminal and the log
  void write_csv(const std::string& path) const;  // every column, values in full precision
  nlohmann::json to_json() const { return rows_; }

 private:
  std::string name_;
  std::vector<Column> columns_;
  std::vector<nlohmann::json> rows_;
};

// Every table and value of a run's results. write() puts each table in <name>.csv and
// summary.json (the tables under their names, the values under their keys).
class Results {
 public:
  // The table called `name`, made with `columns` the first time; the reference stays valid as
  // other tables are added.
  ResultTable& table(const std::string& name, std::vector<Column> columns);
  ResultTable& table(const std::string& name);  // an existing one
  // A value of summary.json (a figure, the device, a nested object), set or replaced.
  void set(const std::string& key, nlohmann::json value) { values_[key] = std::move(value); }
  // Prints "\n== <title> ==", the table, then `footer` (lines under it, "" for none).
  void print(const std::string& name, const std::string& title, const std::string& footer = "") const;
  nlohmann::json summary() const;
  // <run>/<table>.csv for each table with rows, and <run>/summary.json. Nothing when the run
  // directory writes nothing (other ranks).
  void write(const RunDir& run) const;

 private:
  std::deque<ResultTable> tables_;  // a deque: adding a table moves none of the others
  std::map<std::string, nlohmann::json> values_;
};

}  // namespace amplab
