// PNG plots of a run, drawn by scripts/plot.py with matplotlib (the .venv's, or python3's on the
// GPU machine). A missing matplotlib costs the plots, never the run.
#pragma once

#include <string>

#include "amplab/report/run_dir.hpp"

namespace amplab {

// Runs `scripts/plot.py <kind> <run dir>`; logs the PNGs written, or why there are none.
void make_plots(const std::string& kind, const RunDir& run);

}  // namespace amplab
