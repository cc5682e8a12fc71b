// The YAML side of config.hpp: reading with precise errors, --set overrides, writing, listing.
#include "amplab/infra/config.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "amplab/infra/config_json.hpp"
#include "amplab/infra/paths.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace amplab {

namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;  // a config is a few hundred bytes; refuse huge files

// What a plain (unquoted) YAML scalar means: true/false a boolean, a whole number an integer,
// another number a double, anything else a string.
nlohmann::json plain_scalar_value(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  int64_t whole = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), whole);
  if (error == std::errc() && end == text.data() + text.size()) return whole;
  try {
    size_t used = 0;
    double number = std::stod(text, &used);
    if (used == text.size()) return number;
  } catch (const std::exception&) {
  }
  return text;
}

// A number too large (or too small) for a double, like 1e400: what a failed conversion meant.
bool beyond_double(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return errno == ERANGE && end == text.c_str() + text.size() && !text.empty();
}

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string format_double(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  std::string text = out.str();
  // Round-trip shortest: try fewer digits while the value reads back identical.
  for (int digits = 1; digits < 17; ++digits) {
    std::ostringstream shorter;
    shorter.precision(digits);
    shorter << v;
    if (std::strtod(shorter.str().c_str(), nullptr) == v) return shorter.str();
  }
  return text;
}

// Keeps messages on one line: control bytes become \n, \t or \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '\n') out += "\\n";
    else if (ch == '\t') out += "\\t";
    else if (ch < 0x20 || ch == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", ch);
      out += hex;
    } else out += static_cast<char>(ch);
  }
  return out;
}

std::string quote(const std::string& s) { return "'" + printable(s) + "'"; }

std::string scalar_preview(const YAML::Node& node) {
  if (node.IsScalar()) {
    std::string s = printable(node.Scalar());
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return "'" + s + "'";
  }
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a section (map)";
  return "nothing";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

template <class T>
std::string Range<T>::describe() const {
  const bool is_int = std::is_integral_v<T>;
  const std::string kind = is_int ? "an integer" : "a number";
  // The limits of the field's type (an int's as well as an int64's) are no limits to mention.
  const bool has_min = min != std::numeric_limits<T>::lowest() && !(is_int && min == std::numeric_limits<int>::min());
  const bool has_max = max != std::numeric_limits<T>::max() && !(is_int && max == std::numeric_limits<int>::max());
  auto show = [](T v) {
    if constexpr (std::is_integral_v<T>) return std::to_string(v);
    else if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));  // 604800, not 6.048e+05
    else return format_double(v);
  };
  if (has_min && has_max && min_exclusive) return kind + " > " + show(min) + " and <= " + show(max);
  if (has_min && has_max) return kind + " in [" + show(min) + ", " + show(max) + "]";
  if (has_min) return kind + (min_exclusive ? " > " : " >= ") + show(min);
  if (has_max) return kind + " <= " + show(max);
  return is_int ? "an integer" : "a finite number";
}
template struct Range<int64_t>;
template struct Range<double>;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// ---------------------------------------------------------------------------------------------
// The document and where its values came from.

// Top-level sections of a config file that are overlays, not keys (ConfigSource::with_overlay).
constexpr const char* kOverlaySections[] = {"cpu"};

struct ConfigSource::Impl {
  std::string name;                            // file path, or what stands for it
  YAML::Node root;                             // a map (possibly empty): the file with the overrides
  std::string text;                            // the file's text (overlays re-read it: a copy of a node loses its lines)
  std::map<std::string, YAML::Node> overlays;  // overlay sections ("cpu"), taken out of the file
  std::map<std::string, std::string> overlay_origins;  // key path in an overlay -> "--set cpu.a.b=v"
  std::vector<std::string> overrides;          // --set assignments, in order
  std::map<std::string, std::string> origins;  // key path -> "--set a.b=v" for overridden keys

  // "configs/x.yaml:12" or "--set train.lr=abc"
  std::string where(const std::string& path, const YAML::Mark& mark) const {
    // An overridden key, a key inside an overridden section, or a section an override created.
    for (const auto& [key, origin] : origins) {
      if (key == path || key.rfind(path + ".", 0) == 0 || path.rfind(key + ".", 0) == 0) return origin;
    }
    return in_file(mark);
  }
  // "configs/x.yaml:12": for what only the file can hold (a key written twice).
  std::string in_file(const YAML::Mark& mark) const {
    if (mark.is_null()) return name;
    return name + ":" + std::to_string(mark.line + 1);
  }
};

namespace {

// Counts the documents of a YAML text without building them, and where the second starts.
// (yaml-cpp's LoadAll never returns on some malformed input; this stops at the second.)
class DocumentCounter final : public YAML::EventHandler {
 public:
  int documents = 0;
  YAML::Mark second;
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents == 2) second = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Refuses a second document ('---'): yaml-cpp's Load would silently use the first alone.
void refuse_several_documents(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  for (int tries = 0; tries < 8 && counter.documents < 2 && parser.HandleNextDocument(counter); ++tries) {
  }
  if (counter.documents >= 2)
    throw Error(what + ":" + std::to_string(counter.second.line + 1) +
                ": a second YAML document (after '---'); a config is one document: merge them or keep one");
}

YAML::Node parse_yaml(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
    refuse_several_documents(text, name);
  } catch (const YAML::Exception& e) {
    std::string where = name;
    if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    throw Error(where + ": not valid YAML: " + printable(e.msg));
  }
  if (!root || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    throw Error(name + ":" + std::to_string(root.Mark().line + 1) +
                ": expected a map of keys (like 'train:' with fields under it) at the top of the file, got " +
                scalar_preview(root));
  return root;
}

// Whether `text` holds a '#' that YAML reads as a comment: at the start or after a blank, outside quotes.
bool has_comment(const std::string& text) {
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote == '"' && c == '\\') ++i;
    else if (quote && c == quote) quote = 0;
    else if (!quote && (c == '"' || c == '\'')) quote = c;
    else if (!quote && c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) return true;
  }
  return false;
}

std::string trimmed(const std::string& text) {
  auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// A --set value as YAML (3, 0.1, fp16-mixed, [1, 2], "quoted"), with nothing dropped silently: a
// plain value that YAML reads as less than its text ('runs #2' is 'runs' and a comment, '&a b'
// an anchor, '~' null) is kept whole as a string; a list or map with a comment, or several
// documents, is refused.
YAML::Node override_value(const std::string& text, const std::string& origin) {
  YAML::Node value;
  try {
    value = YAML::Load(text);
    refuse_several_documents(text, origin);
  } catch (const YAML::Exception& e) {
    throw Error(origin + ": the value is not valid YAML: " + printable(e.msg));
  }
  const std::string plain = trimmed(text);
  if (!value || value.IsNull()) {
    if (plain == "null" || plain == "Null" || plain == "NULL") return value;
    return YAML::Node(text);
  }
  if (value.IsScalar() && value.Tag() == "?" && value.Scalar() != plain) return YAML::Node(text);
  if (!value.IsScalar() && has_comment(text))
    throw Error(origin + ": the value has a '#' that YAML reads as the start of a comment, dropping what follows; "
                "quote that item (\"a #1\") or remove the '#'");
  return value;
}

void apply_override(ConfigSource::Impl& impl, const std::string& assignment) {
  const std::string origin = "--set " + printable(assignment);
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(origin + ": expected KEY=VALUE, for example --set train.lr=0.01");
  std::string path = assignment.substr(0, eq);
  std::string value_text = assignment.substr(eq + 1);
  if (value_text.empty()) throw Error(origin + ": the value after '=' is empty");

  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    auto dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (parts.back().empty()) throw Error(origin + ": '" + path + "' has an empty key part");
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  YAML::Node value = override_value(value_text, origin);

  YAML::Node node;
  node.reset(impl.root);
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix = join_path(prefix, parts[i]);
    YAML::Node child = node[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child = node[parts[i]];
    } else if (!child.IsMap()) {
      throw Error(origin + ": '" + prefix + "' is a value, not a section");
    }
    node.reset(child);
  }
  node[parts.back()] = value;
  impl.origins[path] = origin;
}

// Walks a config struct's fields against the document, converting and checking each value.
class YamlReader final : public FieldVisitor {
 public:
  explicit YamlReader(const ConfigSource::Impl& doc) : doc_(doc) {
    frames_.push_back({doc.root, ""});
  }

  void field(const char* key, bool& value, const char* doc) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    bool parsed = false;
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, parsed))
      fail(key, node, "expected true or false, got " + scalar_preview(node));
    value = parsed;
  }

  void field(const char* key, int64_t& value, const char* doc, Range<int64_t> range) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    value = to_int(key, node, range);
  }

  void field(const char* key, double& value, const char* doc, Range<double> range) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    double parsed = 0;
    if (node.IsScalar() && !YAML::convert<double>::decode(node, parsed) && beyond_double(node.Scalar()))
      fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node) + ", which is beyond the range of a double");
    if (!node.IsScalar() || !YAML::convert<double>::decode(node, parsed))
      fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node));
    if (!std::isfinite(parsed) || !range.contains(parsed))
      fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node));
    value = parsed;
  }

  void field(const char* key, std::string& value, const char* doc) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    if (!node.IsScalar()) fail(key, node, "expected a string, got " + scalar_preview(node));
    value = node.Scalar();
  }

  void field(const char* key, std::string& value, const char* doc,
             const std::function<std::string(const std::string&)>& check) override {
    field(key, value, doc);
    auto found = lookup(key);
    if (!found) return;
    std::string problem = check(value);
    if (!problem.empty()) fail(key, *found, problem);
  }

  void choice(const char* key, std::string& value, const std::vector<std::string>& allowed,
              const char* doc) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    if (!node.IsScalar() || std::find(allowed.begin(), allowed.end(), node.Scalar()) == allowed.end())
      fail(key, node, "expected one of " + join(allowed) + "; got " + scalar_preview(node));
    value = node.Scalar();
  }

  void field(const char* key, std::vector<std::string>& value, const char* doc,
             const std::vector<std::string>& allowed) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    const std::string what = allowed.empty() ? "a list of strings" : "a list of: " + join(allowed);
    if (!node.IsSequence()) fail(key, node, "expected " + what + ", like [a, b]; got " + scalar_preview(node));
    std::vector<std::string> items;
    for (const auto& item : node) {
      if (!item.IsScalar()) fail(key, item, "expected " + what + "; an item is " + scalar_preview(item));
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), item.Scalar()) == allowed.end())
        fail(key, item, "expected " + what + "; got " + scalar_preview(item));
      items.push_back(item.Scalar());
    }
    value = std::move(items);
  }

  void field(const char* key, std::vector<int64_t>& value, const char* doc, Range<int64_t> range) override {
    auto found = lookup(key);
    if (!found) return;
    const YAML::Node& node = *found;
    if (!node.IsSequence())
      fail(key, node, "expected a list of integers, like [1, 2]; got " + scalar_preview(node));
    std::vector<int64_t> items;
    for (const auto& item : node) items.push_back(to_int(key, item, range));
    value = std::move(items);
  }

  // Unknown and duplicate keys, checked once every field has been visited so that a misplaced
  // key can be matched against every valid path.
  void check_unknown_keys() const {
    for (const auto& [node, prefix] : visited_maps_) {
      std::set<std::string> seen;
      for (const auto& entry : node) {
        const YAML::Node& key_node = entry.first;
        std::string key = key_node.IsScalar() ? printable(key_node.Scalar()) : "<non-scalar key>";
        std::string path = join_path(prefix, key);
        if (!seen.insert(key).second)
          throw Error(doc_.in_file(key_node.Mark()) + ": key '" + path + "' appears twice; keep one");
        if (known_.count(path)) continue;
        throw Error(doc_.where(path, key_node.Mark()) + ": unknown key '" + path + "'" + suggestion(path));
      }
    }
  }

 protected:
  void begin_section(const char* key) override {
    const auto& frame = frames_.back();
    std::string path = join_path(frame.prefix, key);
    known_.insert(path);
    // yaml-cpp: Node::operator= assigns into the referenced node; reset() rebinds the handle.
    YAML::Node child(YAML::NodeType::Map);
    if (frame.node.IsMap()) {
      const YAML::Node found = frame.node[key];
      if (found.IsDefined() && !found.IsNull()) {
        if (!found.IsMap())
          throw Error(doc_.where(path, found.Mark()) + ": '" + path +
                      "' is a section: expected keys under it (like '" + key +
                      ":' then indented 'name: value' lines), got " + scalar_preview(found));
        child.reset(found);
      }
    }
    frames_.push_back({child, path});
  }
  void end_section() override {
    visited_maps_.push_back({frames_.back().node, frames_.back().prefix});
    frames_.pop_back();
  }

 public:
  void finish_root() { visited_maps_.push_back({frames_.front().node, ""}); }

 private:
  struct Frame {
    YAML::Node node;
    std::string prefix;
  };

  // The value under `key` in the current section; nullopt when absent (the default stays).
  std::optional<YAML::Node> lookup(const char* key) {
    const auto& frame = frames_.back();
    known_.insert(join_path(frame.prefix, key));
    if (!frame.node.IsMap()) return std::nullopt;
    YAML::Node node = frame.node[key];
    if (!node.IsDefined()) return std::nullopt;
    if (node.IsNull()) fail(key, node, "has no value; give one or remove the key to keep the default");
    return node;
  }

  int64_t to_int(const char* key, const YAML::Node& node, const Range<int64_t>& range) {
    if (!node.IsScalar()) fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node));
    const std::string& text = node.Scalar();
    int64_t parsed = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    const bool whole = end == text.data() + text.size();
    if (ec == std::errc::result_out_of_range && whole)
      fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node) +
                          ", which is beyond the range of a 64-bit integer");
    if (ec != std::errc() || !whole) fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node));
    if (!range.contains(parsed)) {
      // The type's own limits are left out of describe(): name the one this value crosses.
      const bool above = parsed > range.max;
      fail(key, node, "expected " + range.describe() + ", got " + scalar_preview(node) + " (" +
                          (above ? "larger than " + std::to_string(range.max) + ", the largest"
                                 : "smaller than " + std::to_string(range.min) + ", the smallest") +
                          " value this key holds)");
    }
    return parsed;
  }

  [[noreturn]] void fail(const char* key, const YAML::Node& node, const std::string& problem) const {
    std::string path = join_path(frames_.back().prefix, key);
    throw Error(doc_.where(path, node.Mark()) + ": " + path + ": " + problem);
  }

  std::string suggestion(const std::string& path) const {
    // Same last component elsewhere ("lr" -> "train.lr"), else the closest path by edits.
    std::string leaf = path.substr(path.rfind('.') + 1);
    for (const auto& known : known_) {
      if (known != path && known.substr(known.rfind('.') + 1) == leaf) return "; did you mean '" + known + "'?";
    }
    std::string best;
    size_t best_distance = std::max<size_t>(2, path.size() / 3) + 1;
    for (const auto& known : known_) {
      size_t d = edit_distance(path, known);
      if (d < best_distance) best_distance = d, best = known;
    }
    std::string out;
    if (!best.empty()) out = "; did you mean '" + best + "'?";
    std::string prefix = path.find('.') == std::string::npos ? "" : path.substr(0, path.rfind('.'));
    std::vector<std::string> siblings;
    for (const auto& known : known_) {
      auto dot = known.rfind('.');
      std::string parent = dot == std::string::npos ? "" : known.substr(0, dot);
      if (parent == prefix) siblings.push_back(known.substr(dot == std::string::npos ? 0 : dot + 1));
    }
    if (best.empty() && !siblings.empty()) out += "; valid keys here: " + join(siblings);
    return out;
  }

  const ConfigSource::Impl& doc_;
  std::vector<Frame> frames_;
  std::vector<std::pair<YAML::Node, std::string>> visited_maps_;
  std::set<std::string> known_;
};

// Emits every field with its current value and its doc line as a comment.
class YamlWriter final : public FieldVisitor {
 public:
  YamlWriter() { out_ << YAML::BeginMap; }
  std::string str() {
    out_ << YAML::EndMap;
    return std::string(out_.c_str()) + "\n";
  }

  void field(const char* key, bool& value, const char* doc) override { emit(key, value ? "true" : "false", doc); }
  void field(const char* key, int64_t& value, const char* doc, Range<int64_t>) override {
    emit(key, std::to_string(value), doc);
  }
  void field(const char* key, double& value, const char* doc, Range<double>) override {
    emit(key, format_double(value), doc);
  }
  // A string that would read back as a number or a boolean ("0", "true") is written quoted, so
  // that any YAML reader, config_yaml_to_json included, sees a string.
  void field(const char* key, std::string& value, const char* doc) override {
    if (plain_scalar_value(value).is_string()) return emit(key, value, doc);
    out_ << YAML::Key << key << YAML::Value << YAML::DoubleQuoted << value << YAML::Comment(doc);
  }
  void choice(const char* key, std::string& value, const std::vector<std::string>&, const char* doc) override {
    emit(key, value, doc);
  }
  void field(const char* key, std::vector<std::string>& value, const char* doc,
             const std::vector<std::string>&) override {
    out_ << YAML::Key << key << YAML::Value << YAML::Flow << value << YAML::Comment(doc);
  }
  void field(const char* key, std::vector<int64_t>& value, const char* doc, Range<int64_t>) override {
    out_ << YAML::Key << key << YAML::Value << YAML::Flow << value << YAML::Comment(doc);
  }

 protected:
  void begin_section(const char* key) override { out_ << YAML::Key << key << YAML::Value << YAML::BeginMap; }
  void end_section() override { out_ << YAML::EndMap; }

 private:
  void emit(const char* key, const std::string& value, const char* doc) {
    out_ << YAML::Key << key << YAML::Value << value << YAML::Comment(doc);
  }
  YAML::Emitter out_;
};

// "  train.lr = 0.01    learning rate (a number > 0)"
class KeyLister final : public FieldVisitor {
 public:
  std::string str() const { return out_.str(); }
  void field(const char* key, bool& value, const char* doc) override { line(key, value ? "true" : "false", doc, "true|false"); }
  void field(const char* key, int64_t& value, const char* doc, Range<int64_t> range) override {
    line(key, std::to_string(value), doc, range.describe());
  }
  void field(const char* key, double& value, const char* doc, Range<double> range) override {
    line(key, format_double(value), doc, range.describe());
  }
  void field(const char* key, std::string& value, const char* doc) override { line(key, quote(value), doc, ""); }
  void choice(const char* key, std::string& value, const std::vector<std::string>& allowed, const char* doc) override {
    line(key, value, doc, join(allowed));
  }
  void field(const char* key, std::vector<std::string>& value, const char* doc,
             const std::vector<std::string>& allowed) override {
    line(key, "[" + join(value) + "]", doc, allowed.empty() ? "list" : "list of " + join(allowed));
  }
  void field(const char* key, std::vector<int64_t>& value, const char* doc, Range<int64_t> range) override {
    std::vector<std::string> items;
    for (auto v : value) items.push_back(std::to_string(v));
    line(key, "[" + join(items) + "]", doc, "list of integers");
  }

 protected:
  void begin_section(const char* key) override { prefix_.push_back(key); }
  void end_section() override { prefix_.pop_back(); }

 private:
  void line(const char* key, const std::string& value, const char* doc, const std::string& allowed) {
    std::string path;
    for (const auto& p : prefix_) path += p + ".";
    path += key;
    std::string left = "  " + path + " = " + value;
    if (left.size() < 40) left.resize(40, ' ');
    out_ << left << "  " << doc;
    if (!allowed.empty()) out_ << " (" << allowed << ")";
    out_ << "\n";
  }
  std::vector<std::string> prefix_;
  std::ostringstream out_;
};

}  // namespace

ConfigSource::ConfigSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConfigSource::ConfigSource(ConfigSource&&) noexcept = default;
ConfigSource& ConfigSource::operator=(ConfigSource&&) noexcept = default;
ConfigSource::~ConfigSource() = default;

const std::string& ConfigSource::name() const { return impl_->name; }

std::string ConfigSource::where(const std::string& key) const {
  YAML::Node node;
  node.reset(impl_->root);
  for (size_t start = 0;;) {
    if (!node.IsMap()) return impl_->where(key, YAML::Mark::null_mark());
    auto dot = key.find('.', start);
    const YAML::Node& section = node;  // const: looking a key up must not add it
    YAML::Node child = section[key.substr(start, dot - start)];
    if (!child.IsDefined()) return impl_->where(key, YAML::Mark::null_mark());
    node.reset(child);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return impl_->where(key, node.Mark());
}

namespace {

// Takes the overlay sections (`cpu:`) out of impl.root and returns them.
std::map<std::string, YAML::Node> take_overlay_sections(ConfigSource::Impl& impl) {
  std::map<std::string, YAML::Node> overlays;
  for (const char* section : kOverlaySections) {
    const YAML::Node& file = impl.root;  // const: looking a key up must not add it
    if (!file.IsMap() || !file[section].IsDefined()) continue;
    const YAML::Node overlay = file[section];
    if (!overlay.IsMap() && !overlay.IsNull())
      throw Error(impl.in_file(overlay.Mark()) + ": '" + section + "' must be a section of keys (values used on the " +
                  section + ", e.g. " + section + ": {train: {epochs: 1}})");
    if (overlay.IsMap() && overlay["run"].IsDefined() && overlay["run"].IsMap() && overlay["run"]["device"].IsDefined())
      throw Error(impl.in_file(overlay["run"]["device"].Mark()) + ": '" + section +
                  ".run.device' cannot be set: the section applies once the device is known; set run.device instead");
    overlays[section] = overlay.IsMap() ? overlay : YAML::Node(YAML::NodeType::Map);
    impl.root.remove(section);
  }
  return overlays;
}

// Puts `overlay`'s values over `base`'s, section by section.
void merge_into(YAML::Node base, const YAML::Node& overlay) {
  for (const auto& entry : overlay) {
    const std::string key = entry.first.Scalar();
    const YAML::Node& view = base;  // const: looking a key up must not add it
    if (entry.second.IsMap() && view[key].IsDefined() && view[key].IsMap()) {
      merge_into(base[key], entry.second);
    } else {
      base[key] = entry.second;
    }
  }
}

// Whether `assignment` ("cpu.train.epochs=1") sets a key of an overlay section.
bool overlay_assignment(const std::string& assignment) {
  for (const char* section : kOverlaySections)
    if (assignment.rfind(std::string(section) + ".", 0) == 0) return true;
  return false;
}

// --set cpu.train.epochs=1 goes into the cpu: section, not among the file's keys. Returns
// whether `assignment` was one of those.
bool apply_overlay_override(ConfigSource::Impl& impl, const std::string& assignment) {
  for (const char* section : kOverlaySections) {
    const std::string prefix = std::string(section) + ".";
    if (assignment.rfind(prefix, 0) != 0) continue;
    const std::string inner = assignment.substr(prefix.size());
    if (inner.rfind("run.device", 0) == 0)
      throw Error("--set " + printable(assignment) + ": '" + prefix + "run.device' cannot be set: the section applies once "
                  "the device is known; set run.device instead");
    YAML::Node& overlay = impl.overlays[section];
    if (!overlay.IsDefined() || !overlay.IsMap()) overlay = YAML::Node(YAML::NodeType::Map);
    ConfigSource::Impl view;
    view.name = impl.name;
    view.root.reset(overlay);
    apply_override(view, inner);
    for (const auto& entry : view.origins) impl.overlay_origins[entry.first] = "--set " + printable(assignment);
    return true;
  }
  return false;
}

}  // namespace

bool ConfigSource::has(const std::string& key) const {
  YAML::Node node;
  node.reset(impl_->root);
  for (size_t start = 0;;) {
    if (!node.IsMap()) return false;
    auto dot = key.find('.', start);
    const YAML::Node& section = node;  // const: looking a key up must not add it
    YAML::Node child = section[key.substr(start, dot - start)];
    if (!child.IsDefined()) return false;
    node.reset(child);
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

ConfigSource ConfigSource::parse(const std::string& yaml_text, const std::string& name,
                                 const std::vector<std::string>& overrides) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  impl->root = parse_yaml(yaml_text, name);
  impl->text = yaml_text;
  impl->overlays = take_overlay_sections(*impl);
  impl->overrides = overrides;
  for (const auto& assignment : overrides)
    if (!apply_overlay_override(*impl, assignment)) apply_override(*impl, assignment);
  return ConfigSource(std::move(impl));
}


bool ConfigSource::has_overlay(const std::string& section) const { return impl_->overlays.count(section) > 0; }

ConfigSource ConfigSource::with_overlay(const std::string& section) const {
  // From the text again: fresh nodes that keep their lines, shared with no other source.
  auto impl = std::make_unique<Impl>();
  impl->name = impl_->name;
  impl->text = impl_->text;
  impl->overrides = impl_->overrides;
  impl->root = parse_yaml(impl->text, impl->name);
  impl->overlays = take_overlay_sections(*impl);
  for (const auto& assignment : impl->overrides) apply_overlay_override(*impl, assignment);  // --set cpu.a.b=v first
  if (auto found = impl->overlays.find(section); found != impl->overlays.end()) merge_into(impl->root, found->second);
  for (const auto& [key, origin] : impl->overlay_origins) impl->origins[key] = origin;
  for (const auto& assignment : impl->overrides)
    if (!overlay_assignment(assignment)) apply_override(*impl, assignment);
  return ConfigSource(std::move(impl));
}

ConfigSource ConfigSource::load(const std::string& path, const std::vector<std::string>& overrides) {
  // Checked before opening: an ifstream reads nothing from a directory (an empty config), and
  // opening a FIFO with no writer blocks forever.
  if (std::string problem = regular_file_problem(path); !problem.empty()) {
    const bool missing = problem.rfind("does not exist", 0) == 0;
    throw Error("config file '" + path + "' " + (missing ? "cannot be opened: it " : "") + problem +
                (missing ? " (tried that path relative to the current directory)" : "") +
                "; pass a YAML file with --config, e.g. configs/mnist.yaml");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("config file '" + path + "' cannot be opened: " + std::strerror(errno) +
                "; pass a YAML file with --config, e.g. configs/mnist.yaml");
  std::string text;
  char buffer[8192];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes)
      throw Error(path + ": config file is larger than 1 MiB; is this the right file?");
  }
  if (text.find('\0') != std::string::npos) throw Error(path + ": not a text file (contains NUL bytes)");
  return parse(text, path, overrides);
}

std::unique_ptr<FieldVisitor> ConfigSource::make_reader() const { return std::make_unique<YamlReader>(*impl_); }

void ConfigSource::finish(FieldVisitor& visitor) const {
  auto& reader = static_cast<YamlReader&>(visitor);
  reader.finish_root();
  reader.check_unknown_keys();
}

std::string to_yaml(const std::function<void(FieldVisitor&)>& fields) {
  YamlWriter writer;
  fields(writer);
  return writer.str();
}

std::string describe_keys(const std::function<void(FieldVisitor&)>& fields) {
  KeyLister lister;
  fields(lister);
  return lister.str();
}

namespace {

nlohmann::json scalar_to_json(const YAML::Node& node) {
  if (node.Tag() == "!") return node.Scalar();  // quoted: a string, whatever it spells
  return plain_scalar_value(node.Scalar());
}

nlohmann::json node_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) object[entry.first.Scalar()] = node_to_json(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node) array.push_back(node_to_json(item));
      return array;
    }
    case YAML::NodeType::Scalar:
      return scalar_to_json(node);
    default:
      return nullptr;
  }
}

}  // namespace

nlohmann::json config_yaml_to_json(const std::string& yaml) { return node_to_json(YAML::Load(yaml)); }

namespace {
void flatten(const nlohmann::json& value, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  out[prefix] = value.dump();
}
}  // namespace

ConfigDifference first_config_difference(const std::string& before_yaml, const std::string& now_yaml,
                                         const std::vector<std::string>& free_keys) {
  std::map<std::string, std::string> before, now;
  flatten(config_yaml_to_json(before_yaml), "", before);
  flatten(config_yaml_to_json(now_yaml), "", now);
  auto free = [&](const std::string& key) {
    for (const auto& prefix : free_keys)
      if (key.rfind(prefix, 0) == 0) return true;
    return false;
  };
  for (const auto& [key, value] : now) {
    if (free(key)) continue;
    auto found = before.find(key);
    const std::string old = found == before.end() ? "(not set)" : found->second;
    if (old != value) return {key, old, value};
  }
  for (const auto& [key, value] : before)
    if (!free(key) && now.count(key) == 0) return {key, value, "(not set)"};
  return {};
}

}  // namespace amplab
