// A run's resolved config (the YAML that config.yaml holds, from to_yaml) as JSON, for
// summary.json: scripts read it there with nothing but Python's json module (the GPU machines'
// python3 has no YAML parser). Plain scalars keep their types: true/false become booleans,
// whole numbers integers, other numbers doubles; quoted scalars and everything else stay strings.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace amplab {

nlohmann::json config_yaml_to_json(const std::string& yaml);

}  // namespace amplab
