// YAML configs bound to plain structs.
//
// Every config struct lists its fields once, in a member template:
//
//   struct OptimConfig {
//     double lr = 0.01;
//     int epochs = 1;
//     template <class V> void fields(V& v) {
//       v.field("lr", lr, "learning rate", Range<double>::positive());
//       v.field("epochs", epochs, "passes over the training set", Range<int64_t>::at_least(1));
//     }
//   };
//
// and the same list drives reading (with errors naming file:line, key and what is allowed),
// --set overrides, --help's key listing, and writing the resolved config into the run directory.
// A key is described once, in its field() text: that is what --help and config.yaml print. A
// comment on the member is for the code only (why the default, how it is used), on a line of
// its own above it (scripts/check-config-descriptions.py checks).
// yaml-cpp stays inside config.cpp: this header only declares the visitor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "amplab/infra/error.hpp"

namespace amplab {

// An inclusive range of allowed values; open ends are the type's limits.
template <class T>
struct Range {
  T min = std::numeric_limits<T>::lowest();
  T max = std::numeric_limits<T>::max();
  bool min_exclusive = false;  // true: value must be > min

  static Range any() { return {}; }
  static Range at_least(T lo) { return {lo, std::numeric_limits<T>::max(), false}; }
  static Range positive() { return {T(0), std::numeric_limits<T>::max(), true}; }
  static Range between(T lo, T hi) { return {lo, hi, false}; }
  bool contains(T v) const { return (min_exclusive ? v > min : v >= min) && v <= max; }
  std::string describe() const;  // e.g. "a number > 0", "an integer in [1, 64]"
};

// Enums in configs are spelled by name: a struct declares its table once,
//   inline constexpr std::pair<Precision, const char*> kPrecisionNames[] = {...};
//   inline std::span<const std::pair<Precision, const char*>> enum_names(Precision) { ... }
// and v.field("precision", precision, ...) accepts exactly those names.
template <class E>
std::string enum_to_string(E value) {
  for (const auto& [e, name] : enum_names(E{}))
    if (e == value) return name;
  return "?";
}
template <class E>
std::vector<std::string> enum_choices() {
  std::vector<std::string> names;
  for (const auto& entry : enum_names(E{})) names.emplace_back(entry.second);
  return names;
}
// Parses a name; throws amplab::Error listing the allowed names.
template <class E>
E enum_from_string(const std::string& text, const std::string& what) {
  for (const auto& [e, name] : enum_names(E{}))
    if (text == name) return e;
  std::string allowed;
  for (const auto& entry : enum_names(E{})) allowed += (allowed.empty() ? "" : ", ") + std::string(entry.second);
  throw Error(what + ": '" + text + "' is not allowed; use one of: " + allowed);
}

// What a config struct's fields(v) talks to. Implemented by the YAML reader and writer and by
// the --help key lister in config.cpp.
class FieldVisitor {
 public:
  virtual ~FieldVisitor() = default;

  virtual void field(const char* key, bool& value, const char* doc) = 0;
  virtual void field(const char* key, int64_t& value, const char* doc, Range<int64_t> range = {}) = 0;
  virtual void field(const char* key, double& value, const char* doc, Range<double> range = {}) = 0;
  virtual void field(const char* key, std::string& value, const char* doc) = 0;
  // A string that `check` vets: it returns "" when the value is fine, else what is wrong with it
  // (the reader reports that with the file, line and key).
  virtual void field(const char* key, std::string& value, const char* doc,
                     const std::function<std::string(const std::string&)>& check) {
    field(key, value, doc);
  }
  // A string that must be one of `allowed`.
  virtual void choice(const char* key, std::string& value, const std::vector<std::string>& allowed,
                      const char* doc) = 0;
  // A list of strings, each one of `allowed` (any string when `allowed` is empty).
  virtual void field(const char* key, std::vector<std::string>& value, const char* doc,
                     const std::vector<std::string>& allowed = {}) = 0;
  virtual void field(const char* key, std::vector<int64_t>& value, const char* doc,
                     Range<int64_t> range = {}) = 0;

  void field(const char* key, int& value, const char* doc, Range<int64_t> range = {}) {
    int64_t wide = value;
    range.min = std::max<int64_t>(range.min, std::numeric_limits<int>::min());
    range.max = std::min<int64_t>(range.max, std::numeric_limits<int>::max());
    field(key, wide, doc, range);
    value = static_cast<int>(wide);
  }
  template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
  void field(const char* key, E& value, const char* doc) {
    std::string name = enum_to_string(value);
    choice(key, name, enum_choices<E>(), doc);
    value = enum_from_string<E>(name, key);
  }
  // A nested struct under `key`.
  template <class S>
  void section(const char* key, S& sub) {
    begin_section(key);
    sub.fields(*this);
    end_section();
  }

 protected:
  virtual void begin_section(const char* key) = 0;
  virtual void end_section() = 0;
};

// A parsed YAML document plus where each value came from, so errors can point at it.
// Opaque here (yaml-cpp stays in config.cpp).
class ConfigSource {
 public:
  // Reads `path` (an error names the path tried when it is missing or unreadable) and applies
  // `overrides`, each "a.b.c=value" (value parsed as YAML: 3, 0.1, fp16-mixed, [1, 2]).
  static ConfigSource load(const std::string& path, const std::vector<std::string>& overrides = {});
  // The same from YAML text; `name` stands for the file in messages.
  static ConfigSource parse(const std::string& yaml_text, const std::string& name,
                            const std::vector<std::string>& overrides = {});
  ConfigSource(ConfigSource&&) noexcept;
  ConfigSource& operator=(ConfigSource&&) noexcept;
  ~ConfigSource();

  // Fills `out` from the document (fields absent from it keep their defaults). Errors:
  // unknown key (with the closest valid key), wrong type, out of range, not one of the choices.
  template <class T>
  void bind(T& out) const {
    auto reader = make_reader();
    out.fields(*reader);
    finish(*reader);
  }
  const std::string& name() const;

  // A section of the file that holds values used instead of the file's own in some case, as
  // `cpu:` does for runs on the CPU (smaller sizes, fewer steps): the same source with that
  // section's values over the file's, --set still over both. Without such a section, the same
  // values as this source. The section itself is never a key of the config; --set cpu.a.b=v sets
  // a value of the section.
  ConfigSource with_overlay(const std::string& section) const;
  bool has_overlay(const std::string& section) const;
  // Whether the file or a --set gives `key` ("train.precision") a value (else it keeps its default).
  bool has(const std::string& key) const;

  // Where `key` ("bench.width") got its value, for errors about values that are each valid but
  // do not go together: "--set bench.width=256", "configs/ddp.yaml:12", or the file's name where
  // the key keeps its default.
  std::string where(const std::string& key) const;

  struct Impl;  // defined in config.cpp

 private:
  explicit ConfigSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<FieldVisitor> make_reader() const;
  void finish(FieldVisitor& reader) const;
  std::unique_ptr<Impl> impl_;
};

// The config as YAML with every field, documented: what the run directory keeps.
std::string to_yaml(const std::function<void(FieldVisitor&)>& fields);
template <class T>
std::string to_yaml(T& config) {
  return to_yaml([&](FieldVisitor& v) { config.fields(v); });
}

// One line per key: "  train.lr = 0.01  learning rate (a number > 0)", for --help.
std::string describe_keys(const std::function<void(FieldVisitor&)>& fields);
template <class T>
std::string describe_keys(T& config) {
  return describe_keys([&](FieldVisitor& v) { config.fields(v); });
}

// Edit distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace amplab
