// report.md, the run's hand-in: the questions at the end of the lab's README ("## Questions"),
// each followed by the numbers and plots of this run that answer it, and room for the answer.
//
// The README's format (labs/<lab>/README.md):
//   ## Questions
//   1. **At which size does your GPU overtake your CPU in fp32, and why there?**
//      Optional lines that explain the question.
//      <!-- report: matmul.csv, matmul.png, summary:device.name -->
// An artifact is a file of the run directory (a .csv becomes a table, a .png an image, a .md is
// included, a .txt shown as it is) or summary:<dotted.key>, a value of the run's summary.json.
// One the run did not write (a GPU-only plot on a CPU run) is named as missing.
#pragma once

#include <string>

#include "amplab/report/run_dir.hpp"

namespace amplab {

// Writes <run>/report.md from labs/<run.lab()>/README.md of the source tree (or `readme`), after
// the run has written its files and summary. Returns the report's path; "" when the run writes
// nothing (other ranks) or the README has no questions. Never throws for a missing README.
std::string write_report(const RunDir& run, const std::string& readme = "");

// The report's text from the README's text and the run directory (what write_report writes).
std::string report_text(const std::string& readme_text, const std::string& lab, const std::string& run_path);

}  // namespace amplab
