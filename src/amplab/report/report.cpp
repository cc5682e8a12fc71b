// report.md (report.hpp): the README's questions, each with this run's numbers and plots.
#include "amplab/report/report.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <vector>

#include "amplab/infra/env.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/infra/log.hpp"

namespace amplab {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxTableRows = 30;  // a longer CSV is cut, with a line saying how much is left

struct Question {
  std::string title;                   // "1. **...**"
  std::vector<std::string> lines;      // the explanation under it
  std::vector<std::string> artifacts;  // from <!-- report: ... -->
};

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

std::vector<Question> parse_questions(const std::string& readme) {
  static const std::regex numbered(R"(^\d+\.\s+.*)");
  static const std::regex report(R"(<!--\s*report:\s*(.*?)\s*-->)");
  std::vector<Question> questions;
  std::istringstream in(readme);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      inside = trim(line) == "## Questions";
      continue;
    }
    if (!inside) continue;
    std::smatch match;
    if (std::regex_match(line, numbered)) {
      questions.push_back({trim(line), {}, {}});
    } else if (!questions.empty() && std::regex_search(line, match, report)) {
      std::stringstream list(match[1].str());
      std::string item;
      while (std::getline(list, item, ',')) {
        if (!trim(item).empty()) questions.back().artifacts.push_back(trim(item));
      }
    } else if (!questions.empty() && !trim(line).empty()) {
      questions.back().lines.push_back(trim(line));
    }
  }
  return questions;
}

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"' && quoted && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return fields;
}

std::string markdown_table(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    if (!trim(line).empty()) rows.push_back(csv_fields(line));
  }
  if (rows.empty()) return "(" + csv.filename().string() + " is empty)\n";
  std::string out;
  auto row_text = [](const std::vector<std::string>& cells) {
    std::string text = "|";
    for (const auto& cell : cells) text += " " + (cell.empty() ? std::string("-") : cell) + " |";
    return text + "\n";
  };
  out += row_text(rows[0]);
  out += "|" + [&] {
    std::string rule;
    for (size_t i = 0; i < rows[0].size(); ++i) rule += " --- |";
    return rule;
  }() + "\n";
  for (size_t i = 1; i < rows.size() && i <= kMaxTableRows; ++i) out += row_text(rows[i]);
  if (rows.size() - 1 > kMaxTableRows)
    out += "\n(" + std::to_string(rows.size() - 1 - kMaxTableRows) + " more rows in " + csv.filename().string() + ")\n";
  return out;
}

std::string summary_value(const fs::path& run, const std::string& key) {
  std::ifstream in(run / "summary.json");
  if (!in) return "";
  nlohmann::json value = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::stringstream parts(key);
  std::string part;
  while (std::getline(parts, part, '.')) {
    if (value.is_object() && value.contains(part)) {
      value = value[part];
    } else if (value.is_array() && !part.empty() && part.find_first_not_of("0123456789") == std::string::npos &&
               std::stoul(part) < value.size()) {
      value = value[std::stoul(part)];
    } else {
      return "";
    }
  }
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// "Before you run", "predict", "prediction": the README asks for a guess before the measurement.
bool asks_for_prediction(const Question& q) {
  static const std::regex asks(R"(before you (run|trace)|predict)", std::regex::icase);
  if (std::regex_search(q.title, asks)) return true;
  for (const auto& line : q.lines)
    if (std::regex_search(line, asks)) return true;
  return false;
}

std::string artifact_text(const fs::path& run, const std::string& artifact) {
  if (artifact.rfind("summary:", 0) == 0) {
    const std::string key = artifact.substr(8);
    const std::string value = summary_value(run, key);
    return "- `" + key + "`: " + (value.empty() ? "(not in this run's summary.json)" : value) + "\n";
  }
  const fs::path file = run / artifact;
  if (!fs::is_regular_file(file)) return "(" + artifact + ": not written by this run)\n";
  const std::string ext = file.extension().string();
  if (ext == ".csv") return "`" + artifact + "`:\n\n" + markdown_table(file);
  if (ext == ".png" || ext == ".svg") return "![" + artifact + "](" + artifact + ")\n";
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  if (ext == ".md") return text.str();
  return "`" + artifact + "`:\n\n```\n" + text.str() + (text.str().ends_with("\n") ? "" : "\n") + "```\n";
}

}  // namespace

std::string report_text(const std::string& readme_text, const std::string& lab, const std::string& run_path) {
  const auto questions = parse_questions(readme_text);
  if (questions.empty()) return "";
  const fs::path run(run_path);
  std::string out = "# " + lab + ": report of run " + run.filename().string() + "\n\n";
  out += "The questions of labs/" + lab + "/README.md, each with what this run measured. Write your answers "
         "under them, from these numbers and plots.\n";
  const std::string gpu = summary_value(run, "environment.gpu"), cpu = summary_value(run, "environment.cpu");
  const std::string commit = summary_value(run, "environment.git_commit");
  if (!gpu.empty() || !cpu.empty())
    out += "\nMachine: " + (gpu.empty() || gpu == "null" ? std::string("no GPU") : gpu) + "; CPU " + cpu +
           (commit.empty() ? "" : "; commit " + commit) + "\n";
  if (summary_value(run, "status") == "interrupted")
    out += "\n**A partial run:** stopped by " + summary_value(run, "interrupted.by") + " " +
           summary_value(run, "interrupted.where") + "; the tables below hold what finished before it (" +
           summary_value(run, "interrupted.how_to_go_on") + ").\n";
  for (const auto& q : questions) {
    out += "\n## " + q.title + "\n";
    for (const auto& line : q.lines) out += line + "\n";
    // A question that asks for a prediction gets its place above the measurements, so that the
    // report sets the two side by side.
    if (asks_for_prediction(q)) out += "\n**Your prediction (from before the run):**\n\n";
    for (const auto& artifact : q.artifacts) out += "\n" + artifact_text(run, artifact);
    out += "\n**Your answer:**\n\n";
  }
  return out;
}

std::string write_report(const RunDir& run, const std::string& readme) {
  if (!run.enabled()) return "";
  const fs::path path = readme.empty() ? fs::path(source_dir()) / "labs" / run.lab() / "README.md" : fs::path(readme);
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  const std::string report = report_text(text.str(), run.lab(), run.path());
  if (report.empty()) return "";
  write_file_atomic(run.file("report.md"), report);
  log::info("report: " + run.file("report.md") + " (the README's questions with this run's numbers)");
  return run.file("report.md");
}

}  // namespace amplab
