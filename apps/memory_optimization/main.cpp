// Lab 3, memory optimization: where the memory of a training step goes and the four levers that
// cut it, on a deep residual MLP whose activations dominate (labs/memory_optimization/README.md):
// 1. memory and throughput per batch size, per precision, with and without checkpointing, under a
// memory cap; 2. your batch-size finder; 3. gradient accumulation beyond the largest batch, against
// the big batch itself; 4. activation checkpointing: memory saved, time paid; 5. one step's timeline;
// 6. a leak hunt: memory after each step with a leaky loss history and with yours.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>

#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/measure/fits.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/table.hpp"
#include "given/training_snapshot.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "config.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml
#include "harness.hpp"
#include "memory_optimization.hpp"
#include "runs.hpp"

namespace {

using amplab::Precision;
using namespace memory_optimization;  // the lab's functions and its given runs
using nlohmann::json;

std::string percent(double fraction) { return amplab::fixed(100.0 * fraction, 0) + "%"; }
json value_if(bool known, double value) { return known ? json(value) : json(); }
const amplab::Show integer = amplab::decimals(0);

// A table with lines between its title and its rows.
void print_with_intro(const amplab::ResultTable& table, const std::string& title, const std::string& intro,
                      const std::string& footer) {
  std::cout << "\n== " << title << " ==\n" << intro << table.console() << footer << std::flush;
}

// A section that could not run: why, under its title and in summary.json under `key`.
void skip(amplab::Results& results, const std::string& key, const std::string& title, const std::string& message,
          const std::string& why) {
  std::cout << "\n== " << title << " ==\n" << message << "\n" << std::flush;
  results.set(key, {{"skipped_because", why}});
}

// Refused before anything is made: no memory limit on the CPU, or a model too large for its memory
// (it is made on the CPU, with a copy of its initial weights).
std::optional<int> check_config(const LabConfig& config, const amplab::ConfigSource& source) {
  if (config.mem.cap_mib <= 0 && amplab::config_runs_on_cpu(config.run.device))
    throw amplab::Error(source.where("mem.cap_mib") +
                        ": mem.cap_mib: 0 (no cap) needs a GPU; on the CPU the limit is simulated: give it in MiB");
  const auto& shape = config.mem.model.shape;
  const double w = static_cast<double>(shape.width), h = static_cast<double>(shape.expansion) * w;
  const double params = static_cast<double>(shape.depth) * 2.0 * h * w + w * static_cast<double>(shape.classes);
  amplab::require_cpu_memory(static_cast<int64_t>(std::min(2.0 * 4.0 * params, 9e18)), "the model",
                             "mem.model.width, mem.model.depth or mem.model.expansion");
  return std::nullopt;
}

// ---- 1. Memory and throughput per batch size ------------------------------------------------------

void sweep(Harness& h, amplab::Results& results) {
  const bool cpu = h.cpu;  // on the CPU every OOM is the simulated limit's
  auto& table = results.table("memory_per_batch",
      {{"setting", "setting"}, {"precision", ""}, {"checkpoint_every", ""}, {"batch", "batch", integer},
       {"fits", "fits", [cpu](const json& v) -> std::string {
          return v.is_null() ? "(skipped)" : v.get<bool>() ? "yes" : cpu ? "OOM (simulated)" : "OOM"; }},
       {"simulated", ""}, {"peak_mib", "peak alloc MiB", integer}, {"reserved_mib", "peak reserved MiB", integer},
       {"estimate_mib", "estimate MiB", integer}, {"step_ms", "ms/step", amplab::decimals(2)},
       {"samples_per_s", "samples/s", integer}, {"memory_source", ""}, {"error", ""}});
  std::string notes;
  for (Precision precision : supported(h.mem.sweep.precisions, "mem.sweep.precisions", h.device, notes)) {
    for (int64_t every : h.mem.sweep.checkpoint_every) {
      const std::string setting = setting_name(precision, every), name = amplab::to_string(precision);
      auto fits = h.simulated_fits(precision, every);
      bool failed_smaller = false;  // a setting stops at its first OOM
      for (int64_t batch : h.mem.sweep.batches) {
        const double estimate = h.estimate_mib(precision, every, batch);
        if (failed_smaller) {
          table.add({setting, name, every, batch, nullptr, nullptr, nullptr, nullptr, estimate, nullptr, nullptr,
                     h.memory_source, "not run: a smaller batch did not fit"});
          continue;
        }
        Measurement m;
        const bool simulated = fits && !fits(batch);
        if (simulated) {
          m.error = "over the simulated limit of " + amplab::fixed(h.mem.cap_mib, 0) + " MiB";
        } else {
          amplab::stop_if_interrupted();  // the rows measured so far are in the table
          amplab::log::info("sweep: " + setting + ", batch " + std::to_string(batch));
          m = run_setting(h, precision, every, batch);
        }
        failed_smaller = !m.fits;
        table.add({setting, name, every, batch, m.fits, simulated, value_if(!simulated, m.peak_allocated_mib),
                   value_if(!simulated, m.peak_reserved_mib), estimate, value_if(m.fits, m.step_ms),
                   value_if(m.fits, samples_per_second(m, batch)), h.memory_source, m.error});
      }
    }
  }
  const std::string capped = h.cap_bytes > 0 ? " (GPU capped at " + amplab::fixed(mib(h.cap_bytes) / 1024, 1) + " GiB)" : "";
  results.print("memory_per_batch", "1. Memory and throughput per batch size" + capped, notes + (cpu
      ? "memory: process RSS high-water mark (it includes everything else in the process and rarely shrinks);\n'fits' "
        "is decided by a simulated limit of " + amplab::fixed(h.mem.cap_mib, 0) +
        " MiB on estimate_memory(). Peak allocated/reserved and real OOMs need a GPU.\n"
      : "peak alloc: bytes held by tensors; peak reserved: bytes the caching allocator took from the driver\n(the "
        "difference is cached free blocks and fragmentation). A setting stops at its first OOM.\n"));
}

// ---- 2. The batch-size finder -----------------------------------------------------------------------

std::vector<FinderResult> finder(Harness& h, amplab::Results& results) {
  const auto& c = h.mem.finder;
  std::vector<FinderResult> found;
  std::string unused;
  auto& trials = results.table("finder", {{"precision", ""}, {"phase", ""}, {"batch", ""}, {"fits", ""}, {"simulated", ""},
      {"step_ms", ""}, {"samples_per_s", ""}, {"peak_mib", ""}, {"reserved_mib", ""}, {"error", ""}});
  amplab::run_then_record([&] {
    for (Precision precision : supported(c.precisions, "mem.finder.precisions", h.device, unused)) {
      amplab::stop_if_interrupted();  // a precision at a time
      found.push_back(find_batch(h, precision, &trials));
    }
  }, [&] {
    auto& table = results.table("finder_results",
        {{"precision", "precision"}, {"trials", "trials", integer}, {"largest_fit", "largest fit", integer},
         {"smallest_oom", "first OOM", [](const json& v) { return v == 0 ? std::string("none") : integer(v); }},
         {"recommended", "recommended", integer}, {"best_throughput", "best throughput", integer},
         {"best_samples_per_second", "samples/s", integer}, {"brute_force_limit", "brute-force limit", integer},
         {"finder_over_true", "finder / true", amplab::decimals(3)}, {"brute_force_note", ""}});
    std::string checks;
    for (const auto& r : found) {
      const auto& s = r.search;
      const bool checked = r.brute_force_limit > 0;
      const double ratio = checked ? static_cast<double>(s.largest_fit) / static_cast<double>(r.brute_force_limit) : 0;
      table.add({amplab::to_string(r.precision), s.trials.size(), s.largest_fit, s.smallest_oom, s.recommended,
                 s.best_throughput, s.best_samples_per_second, checked ? json(r.brute_force_limit) : json(),
                 value_if(ratio > 0, ratio), r.brute_force_note});
      if (checked)
        checks += amplab::to_string(r.precision) + ": the finder's largest batch is " + amplab::fixed(100 * ratio, 1) +
                  "% of the true limit (" + r.brute_force_note + "): within 5%: " + (std::abs(1 - ratio) <= 0.05 ? "yes" : "NO") + "\n";
    }
    results.print("finder_results", "2. Batch-size finder (powers of two from " + std::to_string(c.search.start) +
                      ", then bisection to multiples of " + std::to_string(c.search.multiple_of) + "; " +
                      std::to_string(c.search.trial_steps) + " steps per trial; safety margin " +
                      percent(c.search.safety_margin) + ")",
                  checks + (h.cpu ? "(CPU: 'fits' comes from the simulated limit; on a GPU each trial runs until the "
                                    "allocator runs out)\n" : ""));
  });
  return found;
}

// ---- 3. Gradient accumulation -----------------------------------------------------------------------

void accumulation(Harness& h, const std::vector<FinderResult>& found, amplab::Results& results) {
  const auto& c = h.mem.accumulation;
  const std::string key = "accumulation_vs_big_batch", title = "3. Gradient accumulation";
  Precision precision = amplab::enum_from_string<Precision>(c.precision, "mem.accumulation.precision");
  std::string why;
  if (!amplab::is_supported(precision, h.device, &why)) return skip(results, key, title, "skipped: " + why, why);
  // The largest batch that fits at this precision: from the finder, or found now.
  std::optional<BatchSearch> search;
  for (const auto& r : found)
    if (r.precision == precision) search = r.search;
  if (!search) search = find_batch(h, precision, nullptr).search;
  if (search->largest_fit <= 0) return skip(results, key, title, "skipped: not even the smallest batch fits", "nothing fits");
  const int64_t largest = search->largest_fit, micro = search->recommended, effective = c.factor * largest;
  const int64_t chunks = (effective + micro - 1) / micro;
  const std::string big_batch_fits = try_big_batch(h, precision, effective);
  amplab::log::info("accumulation: " + std::to_string(c.steps) + " steps of " + std::to_string(effective) + " in " +
                    std::to_string(chunks) + " micro-batches");
  Curve accumulated;
  try {
    accumulated = train_curve(h, precision, effective, micro, c.steps);
  } catch (const std::exception& error) {
    if (!amplab::is_out_of_memory(error)) throw;
    h.release();
    return skip(results, key, title, "micro-batches of " + std::to_string(micro) + " ran out of memory (" +
                amplab::oom_summary(error) + "): raise mem.finder.search.safety_margin", amplab::oom_summary(error));
  }
  // The reference: the big batch itself, with the cap lifted (a GPU has the memory; the cap was
  // only there to make the limit small).
  const int64_t cap = h.cap_bytes;
  h.set_cap(0);
  amplab::log::info("accumulation: the big batch in one step, memory cap lifted");
  Curve big = train_curve(h, precision, effective, effective, c.steps);
  h.set_cap(cap);

  auto& table = results.table("accumulation", {{"step", "step", integer},
      {"loss_accumulated", "loss, accumulated", amplab::decimals(6)}, {"loss_big_batch", "loss, big batch", amplab::decimals(6)},
      {"abs_difference", "|difference|", amplab::si_units()}});
  double max_diff = 0, max_rel = 0;
  for (size_t s = 0; s < accumulated.loss.size(); ++s) {
    const double d = std::abs(accumulated.loss[s] - big.loss[s]);
    max_diff = std::max(max_diff, d);
    max_rel = std::max(max_rel, d / std::max(1e-12, std::abs(big.loss[s])));
    table.add({s, accumulated.loss[s], big.loss[s], d});
  }
  results.set(key, {{"precision", c.precision}, {"largest_fit", largest}, {"micro_batch", micro},
                    {"effective_batch", effective}, {"micro_batches", chunks}, {"big_batch_in_one_step", big_batch_fits},
                    {"max_abs_difference", max_diff}, {"max_rel_difference", max_rel},
                    {"peak_mib_accumulated", accumulated.peak_mib}, {"peak_mib_big_batch", big.peak_mib},
                    {"seconds_accumulated", accumulated.seconds}, {"seconds_big_batch", big.seconds}});
  print_with_intro(table, title + " (" + c.precision + ")",
      "largest batch that fits: " + std::to_string(largest) + "; effective batch " + std::to_string(effective) + " = " +
          std::to_string(c.factor) + " x that, in " + std::to_string(chunks) + " micro-batches of at most " +
          std::to_string(micro) + " (the finder's recommendation)\nthe effective batch in one step " + big_batch_fits + "\n",
      "max |difference| " + amplab::si(max_diff) + " (relative " + amplab::si(max_rel) + "): the same curve, up to float "
          "rounding\npeak memory: accumulated " + amplab::fixed(accumulated.peak_mib, 0) + " MiB, big batch " +
          amplab::fixed(big.peak_mib, 0) + " MiB" + (h.cpu ? " (RSS high-water marks)" : " (cap lifted for it)") +
          "; time: " + amplab::fixed(accumulated.seconds, 2) + " s vs " + amplab::fixed(big.seconds, 2) + " s\n");
}

// ---- 4. Activation checkpointing ----------------------------------------------------------------------

struct CheckpointRow {
  Precision precision;
  int64_t every;
  Measurement m;
};

// The lab's targets, stated where they are measured.
std::string checkpointing_targets(const CheckpointRow& r, const Comparison& same, const Comparison& vs_fp32) {
  std::string out;
  if (r.every == 1 && r.precision == Precision::fp32 && same.memory_saving > 0)
    out += "checkpointing every block, fp32: " + amplab::fixed(same.memory_saving, 2) + "x less peak memory for +" +
           percent(same.time_overhead) + " step time (target: >= 2x at < 40%: " +
           (same.memory_saving >= 2 && same.time_overhead < 0.4 ? "met" : "NOT met") + ")\n";
  if (r.every == 1 && amplab::is_mixed(r.precision) && vs_fp32.memory_saving > 0)
    out += amplab::to_string(r.precision) + " + checkpointing every block vs fp32: " +
           amplab::fixed(vs_fp32.memory_saving, 2) + "x less peak memory (target: >= 3x: " +
           (vs_fp32.memory_saving >= 3 ? "met" : "NOT met") + ")\n";
  return out;
}

void checkpointing(Harness& h, amplab::Results& results) {
  const auto& c = h.mem.checkpointing;
  std::string notes, checks;
  for (int64_t every : c.every)
    if (every >= h.shape.depth)
      notes += "  checkpointing/" + std::to_string(every) + ": left out, one segment of all " +
               std::to_string(h.shape.depth) + " blocks is no checkpointing\n";
  std::vector<CheckpointRow> rows;
  const auto run_rows = [&] {
    for (Precision precision : supported(c.precisions, "mem.checkpointing.precisions", h.device, notes))
      for (int64_t every : c.every) {
        if (every >= h.shape.depth) continue;
        amplab::stop_if_interrupted();  // a setting at a time
        amplab::log::info("checkpointing: " + setting_name(precision, every) + ", batch " + std::to_string(c.batch));
        rows.push_back({precision, every, run_setting(h, precision, every, c.batch)});
      }
  };
  amplab::run_then_record(run_rows, [&] {
    const auto baseline = [&rows](Precision precision) -> const CheckpointRow* {
      for (const auto& b : rows)
        if (b.precision == precision && b.every == 0) return &b;
      return nullptr;
    };
    auto& table = results.table("checkpointing", {{"setting", "setting"}, {"precision", ""}, {"checkpoint_every", ""},
        {"batch", ""}, {"fits", ""},
        {"peak_mib", "peak alloc MiB", [](const json& v) { return v.is_null() ? std::string("OOM") : integer(v); }},
        {"reserved_mib", "peak reserved MiB", integer}, {"estimate_mib", "estimate MiB", integer},
        {"step_ms", "ms/step", amplab::decimals(2)}, {"samples_per_s", "samples/s", integer},
        {"memory_saving", "memory saving", amplab::times(2)},
        {"time_overhead", "time overhead",
         [](const json& v) { return v.is_null() ? "-" : (v.get<double>() >= 0 ? "+" : "") + percent(v.get<double>()); }},
        {"memory_saving_vs_fp32", "saving vs fp32", amplab::times(2)}, {"time_overhead_vs_fp32", ""},
        {"estimated_saving_vs_fp32", "est. saving vs fp32", amplab::times(2)}, {"error", ""}});
    for (const auto& r : rows) {
      const CheckpointRow *base = baseline(r.precision), *fp32 = baseline(Precision::fp32);
      const Comparison same = base ? compare(base->m, r.m) : Comparison{};
      const Comparison vs_fp32 = fp32 ? compare(fp32->m, r.m) : Comparison{};
      const double estimate = h.estimate_mib(r.precision, r.every, c.batch);
      table.add({setting_name(r.precision, r.every), amplab::to_string(r.precision), r.every, c.batch, r.m.fits,
                 value_if(r.m.fits, r.m.peak_allocated_mib), value_if(r.m.fits, r.m.peak_reserved_mib), estimate,
                 value_if(r.m.fits, r.m.step_ms), value_if(r.m.fits, samples_per_second(r.m, c.batch)),
                 value_if(same.memory_saving > 0, same.memory_saving),
                 value_if(r.every > 0 && same.memory_saving > 0, same.time_overhead),
                 value_if(vs_fp32.memory_saving > 0, vs_fp32.memory_saving),
                 value_if(vs_fp32.memory_saving > 0, vs_fp32.time_overhead),
                 h.estimate_mib(Precision::fp32, 0, c.batch) / estimate, r.m.error});
      checks += checkpointing_targets(r, same, vs_fp32);
    }
    print_with_intro(table, "4. Activation checkpointing (batch " + std::to_string(c.batch) + (h.cpu ? "" : ", no memory cap") + ")",
        "memory saving and time overhead against the same precision without checkpointing; 'checkpointing/k': segments "
        "of k blocks\n", notes + (h.cpu ? "(CPU: the peaks are RSS high-water marks of the whole process and barely move; "
        "the estimates show\n what a GPU allocator would be asked for. The savings need a GPU to measure.)\n" : checks));
  });
}

// ---- 5. Memory timeline of one step -------------------------------------------------------------------

// Step 1 (when the optimizer state exists) of one setting, a sample after each block's forward
// and when backward reaches it: each sample, and the peak of each phase.
void record_timeline(Harness& h, int64_t every, amplab::ResultTable& samples, amplab::ResultTable& peaks) {
  const auto& c = h.mem.timeline;
  const std::string setting = setting_name(c.precision, every);
  h.reset(every);
  {
    amplab::Trainer trainer = h.trainer(c.precision, /*track=*/true);
    h.model->set_probe([&trainer] { trainer.memory().sample(); });
    amplab::Batch data = make_batch(c.batch, h.teacher, h.device);
    amplab::free_cached_memory(h.device);
    for (int step = 0; step < 2; ++step) trainer.step(data);
    h.model->set_probe({});
    int sample = 0;
    std::map<std::string, double> phase_peak;
    for (const auto& s : trainer.memory().timeline()) {
      if (s.step != 1) continue;
      const std::string phase = amplab::to_string(s.phase);
      phase_peak[phase] = std::max(phase_peak[phase], mib(s.reading.peak_allocated));
      samples.add({setting, sample++, s.step, phase, s.phase_end ? "phase_end" : "sample", s.seconds,
                   mib(s.reading.allocated), mib(s.reading.reserved), mib(s.reading.peak_allocated), h.memory_source});
    }
    peaks.add({setting, phase_peak["forward"], phase_peak["backward"], phase_peak["optimizer"], sample});
  }
  h.release();
}

void timeline(Harness& h, amplab::Results& results) {
  const auto& c = h.mem.timeline;
  std::string why;
  if (!amplab::is_supported(c.precision, h.device, &why))
    return skip(results, "memory_timeline", "5. Memory timeline", "skipped: " + why, why);
  results.table("memory_timeline", {{"setting", ""}, {"sample", ""}, {"step", ""}, {"phase", ""}, {"event", ""},
      {"seconds", ""}, {"allocated_mib", ""}, {"reserved_mib", ""}, {"peak_allocated_mib", ""}, {"source", ""}});
  results.table("memory_timeline_peaks", {{"setting", "setting"}, {"forward_peak_mib", "forward peak MiB", integer},
      {"backward_peak_mib", "backward peak MiB", integer}, {"optimizer_peak_mib", "optimizer peak MiB", integer},
      {"samples", "samples", integer}});
  for (int64_t every : {int64_t{0}, c.every})
    record_timeline(h, every, results.table("memory_timeline"), results.table("memory_timeline_peaks"));
  results.print("memory_timeline_peaks", "5. Memory timeline of one step (" + amplab::to_string(c.precision) +
      ", batch " + std::to_string(c.batch) + "; a sample after each block's forward and when backward reaches it)",
      "without checkpointing, memory climbs through the forward pass (every block's activations kept) and\nfalls "
      "through backward; with it, the forward climbs by one input per block, and backward recomputes\none segment at "
      "a time. memory_timeline.csv / memory_timeline.png\n");
}

// ---- 6. A leak hunt ----------------------------------------------------------------------------------

void leak_hunt(Harness& h, amplab::Results& results) {
  const auto& c = h.mem.leak;
  LossHistory history;
  LeakRun yours = run_leak_loop(h, [&history](const torch::Tensor& loss) { history.record(loss); },
                                [&history] { history.flush(); });
  history.flush();
  h.release();
  // Last, so that the end of memory_snapshot.pickle (the allocator's last 100 000 events) is its staircase.
  std::vector<torch::Tensor> kept;  // the leaky recording: every loss as it came, graph and all
  LeakRun leaky = run_leak_loop(h, [&kept](const torch::Tensor& loss) { kept.push_back(loss); }, [] {});
  kept.clear();
  h.release();
  auto& steps = results.table("leak_hunt_steps", {{"step", ""}, {"recording", ""}, {"allocated_mib", ""}, {"source", ""}});
  for (const auto& [name, run] : {std::pair{"leaky", &leaky}, std::pair{"yours", &yours}})
    for (size_t s = 0; s < run->allocated_mib.size(); ++s) steps.add({s + 1, name, run->allocated_mib[s], h.memory_source});
  // What one held-out forward keeps for backward, by your estimate (activations per sample x samples).
  const double forward_kib = static_cast<double>(h.estimate(Precision::fp32, 0).per_sample * c.held_out) / 1024;
  const std::string first = "allocated_mib_after_step_" + std::to_string(std::min(c.log_every, c.steps));
  auto& table = results.table("leak_hunt", {{"recording", "recording"}, {first, "MiB after step " +
      std::to_string(std::min(c.log_every, c.steps)), amplab::decimals(1)},
      {"allocated_mib_at_end", "MiB after step " + std::to_string(c.steps), amplab::decimals(1)},
      {"kib_per_step", "KiB/step", amplab::decimals(1)}, {"estimated_forward_kib", "one forward, est. KiB", integer},
      {"leak_report", ""}});
  table.add({"loss kept as it came (leaky)", leaky.allocated_mib[std::min(c.log_every, c.steps) - 1],
             leaky.allocated_mib.back(), leaky.bytes_per_step / 1024, forward_kib, leaky.leak_report});
  table.add({"your LossHistory", yours.allocated_mib[std::min(c.log_every, c.steps) - 1], yours.allocated_mib.back(),
             yours.bytes_per_step / 1024, forward_kib, yours.leak_report});
  results.set("leak_hunt_memory", {{"bytes_per_step_leaky", leaky.bytes_per_step}, {"bytes_per_step_yours", yours.bytes_per_step},
                            {"estimated_forward_bytes", forward_kib * 1024}, {"held_out_losses", history.values.size()},
                            {"held_out_loss_mean", history.mean()}});
  results.print("leak_hunt", "6. A leak hunt (" + std::to_string(c.steps) + " steps, the held-out loss of " +
      std::to_string(c.held_out) + " samples recorded each step, computed in grad mode)",
      "MemoryTracker, leaky recording: " + (leaky.leak_report.empty() ? "no steady growth reported" : leaky.leak_report) +
      "\nMemoryTracker, your LossHistory: " + (yours.leak_report.empty() ? "no steady growth reported" : yours.leak_report) +
      "\n" + (h.cpu ? "(CPU: allocated is the process RSS, which rarely shrinks; a GPU run gives exact bytes, and with "
      "--set run.memory_snapshot=true\n the allocator's history in memory_snapshot.pickle)\n" : "") +
      "leak_hunt_steps.csv: allocated memory after every step of both runs\n");
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::lab_main<LabConfig>(
      argc, argv,
      {.name = amplab::this_lab::kName,
       .title = amplab::this_lab::kTitle,
       .size_keys = "mem.model.width, mem.model.depth, mem.accumulation.factor or mem.timeline.batch"},
      check_config,
      [](amplab::Lab<LabConfig>& lab) {
        const auto& mem = lab.config.mem;
        Harness h(lab.config, lab.device);
        describe_setup(h, lab.results);
        // Each section a phase of its own (gpu_monitor.csv, summary.json's gpu_monitor).
        auto section = [&lab](bool enabled, const char* phase, const std::function<void()>& run) {
          if (!enabled) return;
          lab.phase(phase);
          run();
        };
        section(mem.sweep.enabled, "memory per batch", [&] { sweep(h, lab.results); });
        std::vector<FinderResult> found;
        section(mem.finder.enabled, "finder", [&] { found = finder(h, lab.results); });
        section(mem.accumulation.enabled, "accumulation", [&] { accumulation(h, found, lab.results); });
        h.set_cap(0);  // sections 4 and 5 compare settings at one batch, on the whole GPU
        section(mem.checkpointing.enabled, "checkpointing", [&] { checkpointing(h, lab.results); });
        section(mem.timeline.enabled, "memory timeline", [&] { timeline(h, lab.results); });
        section(mem.leak.enabled, "leak hunt", [&] { leak_hunt(h, lab.results); });
        lab.phase("");
        lab.draw_plots = mem.plots;
        return amplab::kExitOk;
      });
}
