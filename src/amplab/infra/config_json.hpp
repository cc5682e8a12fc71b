// A run's resolved config (the YAML that config.yaml holds, from to_yaml) as JSON, for
// summary.json: scripts read it there with nothing but Python's json module (the GPU machines'
// python3 has no YAML parser). Plain scalars keep their types: true/false become booleans,
// whole numbers integers, other numbers doubles; quoted scalars and everything else stay strings.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace amplab {

nlohmann::json config_yaml_to_json(const std::string& yaml);

// The first key whose value differs between two resolved configs (config.yaml's text), skipping
// the keys that start with one of `free_keys`; an empty key when none differs.
struct ConfigDifference {
  std::string key, before, now;  // values as JSON ("(not set)" for a key one config lacks)
};
ConfigDifference first_config_difference(const std::string& before_yaml, const std::string& now_yaml,
                                         const std::vector<std::string>& free_keys = {});

}  // namespace amplab
